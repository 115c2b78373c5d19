"""`run_sweep` in-process with fakes: a fake target (its load makes records without any network), a fake
server manager that can die and be relaunched, no telemetry, and the real session store in tmp_path. What
is under test is the runner's own logic: recovery of a lost server, variant switching, resume, the
session metadata. The watchdog, the cell attempt and the session store are the real ones."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from servescope.core.client import ClientOptions, RequestSpec
from servescope.core.errors import ServescopeError
from servescope.core.kvbudget import KVBudget
from servescope.core.load import CellControl, CellRun, Limits, Load
from servescope.core.records import RequestRecord
from servescope.core.results import CellResult, Saturation
from servescope.core.steady import ramp_from_probe
from servescope.core.target import EstimateTokenizer, ModelInfo, TargetInfo, Tokenizer
from servescope.engine.events import (
    CellFinished,
    CellStarted,
    Event,
    KvBudgetKnown,
    Notice,
    SweepControl,
    SweepFinished,
    SweepStarted,
)
from servescope.engine.measurefields import legacy_regime
from servescope.engine.plan import plan_cells
from servescope.engine.runner import run_sweep
from servescope.engine.series import SweepSeries
from servescope.engine.spec import RunContext, SweepSpec
from servescope.engine.telemetryhub import NoTelemetry
from servescope.sessions.store import load_session
from servescope.workloads.spec import Workload, fixed
from tests.support.meta import stored

WL = Workload("tiny", "completions", fixed(16), fixed(4), source="inline")


@dataclass
class FakeServer:
    """A server that can die (its health check fails, its requests hang) and come back when recovered."""

    url: str = "http://fake-0"
    variant: int = -1
    alive: bool = True
    come_back: bool = True
    launches: list[int] = field(default_factory=list)
    recoveries: int = 0
    closed: bool = False
    log_budget: KVBudget | None = None

    async def launch(self, variant: int, log_dir: Path) -> None:
        self.launches.append(variant)
        self.variant = variant
        self.url = f"http://fake-{variant}"
        self.alive = True

    async def healthy(self, timeout_s: float = 5.0) -> bool:
        return self.alive

    async def recover(self, timeout_s: float, stopping: Callable[[], bool]) -> bool:
        self.recoveries += 1
        if self.come_back and not stopping():
            self.alive = True
            return True
        return False

    def server_args(self) -> dict[str, Any] | None:
        return {"variant": self.variant} if self.launches else None

    def kv_budget(self) -> KVBudget | None:
        return self.log_budget

    async def close(self) -> None:
        self.closed = True


@dataclass
class FakeTarget:
    """Connects to whatever FakeServer serves; its load answers every request at once while the server is
    alive, and hangs (as a dead server's connections do) once it died, until the cell is stopped."""

    server: FakeServer
    die_in: dict[tuple[int, int], int] = field(default_factory=dict)  # (cell, run) -> die after N requests
    runs: list[tuple[int, str]] = field(default_factory=list)  # (seed = cell index, base URL) per run
    closed: bool = False
    cell_connections: None = None  # the fake load opens no connections

    async def connect(self, url: str, model: str | None) -> tuple[TargetInfo, ModelInfo]:
        assert url == self.server.url, "the runner connects to the server it launched"
        m = ModelInfo("fake-model", 4096)
        return TargetInfo(url, [m], version="0.0-fake", metrics_available=False), m

    async def tokenizer(self, model: str) -> Tokenizer:
        return EstimateTokenizer()

    async def run_cell(self, opts: ClientOptions, specs: Sequence[RequestSpec], load: Load, limits: Limits,
                       on_record: Callable[[RequestRecord], None], control: CellControl, seed: int,
                       before_measured: Callable[[], Awaitable[None]]) -> CellRun:
        self.runs.append((seed, opts.base_url))
        nrun = sum(1 for s, _ in self.runs if s == seed)
        die_after = self.die_in.get((seed, nrun))
        await before_measured()
        start = time.perf_counter_ns()
        records: list[RequestRecord] = []
        for i in range(limits.requests or 4):
            if die_after is not None and i == die_after:
                self.server.alive = False
            if not self.server.alive:
                await asyncio.wait_for(control.stop.wait(), timeout=60)  # a safety limit: the stop comes first
                break
            t = time.perf_counter_ns()
            spec = specs[limits.warmup + i % max(1, len(specs) - limits.warmup)]
            r = RequestRecord(i, 0, False, spec.input_tokens, spec.output_tokens, t, sent_ns=t,
                              first_token_ns=t + 1_000_000, first_content_ns=t + 1_000_000, end_ns=t + 4_000_000,
                              prompt_tokens=spec.input_tokens, output_tokens=spec.output_tokens, usage_reported=True)
            records.append(r)
            on_record(r)
            await asyncio.sleep(0)
        return CellRun(records, start, time.perf_counter_ns(), control.reason if control.stop.is_set() else "")

    async def close(self) -> None:
        self.closed = True


def _spec(**kw: Any) -> SweepSpec:
    # users start together (--ramp 0): these tests count the requests each cell sends, and --ramp auto sends one
    # alone before a closed loop's first cell when no c=1 cell ran before it (test_auto_ramp_* below)
    base: dict[str, Any] = {"url": "http://fake-0", "workloads": (WL,), "concurrency": (1, 2), "requests": 6,
                            "telemetry_interval_s": None, "ramp_s": 0.0}
    return SweepSpec(**(base | kw))


def _ctx(path: Path, **kw: Any) -> RunContext:
    return RunContext(**({"url": "http://fake-0", "save_dir": path, "health_interval_s": 0.02} | kw))


async def _run(spec: SweepSpec, ctx: RunContext, server: FakeServer, target: FakeTarget,
               control: SweepControl | None = None,
               on_event: Callable[[Event, SweepControl], None] | None = None) -> list[Event]:
    control = control or SweepControl()
    out: list[Event] = []
    async for ev in run_sweep(spec, ctx, control, target=target, servers=server, telemetry=NoTelemetry()):
        out.append(ev)
        if on_event is not None:
            on_event(ev, control)
    return out


def _finished(events: list[Event]) -> list[CellFinished]:
    return [e for e in events if isinstance(e, CellFinished)]


# ---- recovery -------------------------------------------------------------------------------------------
async def test_server_lost_mid_cell_is_recovered_and_the_cell_rerun(tmp_path: Path) -> None:
    server = FakeServer()
    target = FakeTarget(server, die_in={(1, 1): 2})  # cell 1's first run: the server dies after 2 requests
    events = await _run(_spec(), _ctx(tmp_path / "s"), server, target)

    assert [(f.cell.index, f.status) for f in _finished(events)] == [(0, "done"), (1, "server_lost"), (1, "done")]
    assert [s for s, _ in target.runs] == [0, 1, 1]
    assert server.recoveries == 1
    lost = _finished(events)[1]
    assert isinstance(lost.summary, CellResult) and lost.summary.requests_ok == 2
    assert lost.reason.startswith("server lost: http://fake-0 stopped answering")
    texts = [e.text for e in events if isinstance(e, Notice)]
    assert any("stopped answering during cell 2" in t for t in texts)
    assert any("is back after" in t and "re-running cell 2" in t for t in texts)
    assert sum(isinstance(e, CellStarted) and e.cell.index == 1 for e in events) == 2
    fin = events[-1]
    assert isinstance(fin, SweepFinished) and fin.status == "completed"

    s = load_session(tmp_path / "s")
    assert stored(s)["status"] == "completed"
    assert [c["status"] for c in stored(s)["cells"]] == ["done", "done"]
    assert [e["kind"] for e in stored(s)["events"]] == ["server_lost", "server_back"]
    assert (tmp_path / "s" / "requests" / "cell-0001-lost1.parquet").is_file()
    assert s.cells.filter(s.cells["index"] == 1)["requests_ok"].to_list() == [6]
    assert target.closed and server.closed


async def test_server_never_back_fails_the_sweep_with_the_message(tmp_path: Path) -> None:
    server = FakeServer(come_back=False)
    target = FakeTarget(server, die_in={(0, 1): 1})
    events = await _run(_spec(recover_timeout_s=1.0), _ctx(tmp_path / "s"), server, target)

    fin = events[-1]
    assert isinstance(fin, SweepFinished) and fin.status == "failed"
    assert "stopped answering during cell 1" in fin.message and "did not come back within 1 s" in fin.message
    assert f"servescope resume {tmp_path / 's'}" in fin.message
    assert [s for s, _ in target.runs] == [0]  # cell 2 never started
    assert any(isinstance(e, Notice) and e.level == "error" and e.text == fin.message for e in events)
    s = load_session(tmp_path / "s")
    assert stored(s)["status"] == "failed" and stored(s)["message"] == fin.message
    assert [c["status"] for c in stored(s)["cells"]] == ["server_lost", "planned"]


async def test_a_server_lost_three_times_is_not_retried_forever(tmp_path: Path) -> None:
    server = FakeServer()
    target = FakeTarget(server, die_in={(0, 1): 0, (0, 2): 0, (0, 3): 0})
    events = await _run(_spec(concurrency=(1,)), _ctx(tmp_path / "s"), server, target)
    assert [s for s, _ in target.runs] == [0, 0, 0]
    fin = events[-1]
    assert isinstance(fin, SweepFinished) and fin.status == "failed"


# ---- server variants ------------------------------------------------------------------------------------
async def test_variants_relaunch_the_server_once_per_variant_in_order(tmp_path: Path) -> None:
    server = FakeServer(url="")
    target = FakeTarget(server)
    spec = _spec(url="sim://", launch="fake-serve --port 1", variants=("--max-num-seqs 1", "--max-num-seqs 8"))
    events = await _run(spec, _ctx(tmp_path / "s", url=""), server, target)

    assert server.launches == [0, 1]
    assert target.runs == [(0, "http://fake-0"), (1, "http://fake-0"), (2, "http://fake-1"), (3, "http://fake-1")]
    done = _finished(events)
    assert [(f.cell.index, f.cell.variant, f.cell.variant_args) for f in done] == [
        (0, 0, "--max-num-seqs 1"), (1, 0, "--max-num-seqs 1"), (2, 1, "--max-num-seqs 8"), (3, 1, "--max-num-seqs 8")]
    relaunch = [e for e in events if isinstance(e, Notice) and e.text.startswith("relaunching")]
    assert [e.text for e in relaunch] == ["relaunching the server for variant 2: --max-num-seqs 8"]
    # the relaunch comes after variant 1's last cell and before variant 2's first
    order = [("relaunch" if isinstance(e, Notice) and e.text.startswith("relaunching") else e.cell.index)
             for e in events if isinstance(e, CellStarted) or (isinstance(e, Notice) and e.text.startswith("relaunching"))]
    assert order == [0, 1, "relaunch", 2, 3]

    s = load_session(tmp_path / "s")
    assert s.cells.sort("index")["server_variant"].to_list() == ["--max-num-seqs 1"] * 2 + ["--max-num-seqs 8"] * 2
    assert stored(s)["server"]["launch"] == "fake-serve --port 1"
    assert stored(s)["server"]["variants"] == ["--max-num-seqs 1", "--max-num-seqs 8"]
    assert stored(s)["server"]["args"] == {"variant": 0}
    assert stored(s)["server"]["variant_args"] == {"1": {"variant": 1}}
    assert [e["kind"] for e in stored(s)["events"]] == ["server_launched"]


# ---- resume -----------------------------------------------------------------------------------------------
async def test_resume_runs_only_the_unfinished_cells(tmp_path: Path) -> None:
    path = tmp_path / "s"
    spec = _spec(concurrency=(1, 2, 4, 8))
    server = FakeServer()
    target = FakeTarget(server)

    def stop_after_two(ev: Event, control: SweepControl) -> None:
        if isinstance(ev, CellFinished) and ev.cell.index == 1:
            control.stop("stopped by the test")

    events = await _run(spec, _ctx(path), server, target, on_event=stop_after_two)
    fin = events[-1]
    assert isinstance(fin, SweepFinished) and fin.status == "interrupted"
    assert [s for s, _ in target.runs] == [0, 1]
    assert [c["status"] for c in stored(load_session(path))["cells"]] == ["done", "done", "planned", "planned"]

    server2 = FakeServer()
    target2 = FakeTarget(server2)
    events = await _run(spec, _ctx(path, save_dir=None, resume=path), server2, target2)
    assert [s for s, _ in target2.runs] == [2, 3]  # seeds are the cells' indices
    assert [f.cell.index for f in _finished(events)] == [2, 3]
    started = next(e for e in events if isinstance(e, SweepStarted))
    assert started.session_dir == path and len(started.cells) == 4
    fin = events[-1]
    assert isinstance(fin, SweepFinished) and fin.status == "completed"
    s = load_session(path)
    assert [c["status"] for c in stored(s)["cells"]] == ["done"] * 4
    assert sorted(s.cells["index"].to_list()) == [0, 1, 2, 3]
    assert [e["kind"] for e in stored(s)["events"]] == ["resumed"]


# ---- what the session holds -------------------------------------------------------------------------------
async def test_session_holds_the_whole_sweep_and_arrival_defaults_to_poisson(tmp_path: Path) -> None:
    spec = _spec(concurrency=None, rates=(50.0,), tags={"quant": "FP8"}, slos={"ttft_ms": 100.0})
    server = FakeServer()
    events = await _run(spec, _ctx(tmp_path / "s"), server, FakeTarget(server))
    cell = _finished(events)[0].cell
    assert cell.load.arrival == "poisson"
    s = load_session(tmp_path / "s")
    sweep = stored(s)["sweep"]
    assert sweep == spec.to_table(inline_workloads=True)
    assert SweepSpec.from_table(sweep) == spec
    # the load stored once: the sweep's as asked in [sweep.load], each cell's in its plan ([[cells]])
    assert "load" not in stored(s) and sweep["load"]["rates"] == [50.0]
    [planned] = stored(s)["cells"]
    assert (planned["rate"], planned["arrival"], planned["load_label"]) == (50.0, "poisson", "rate 50/s poisson")
    on_disk = pl.read_parquet(tmp_path / "s" / "cells.parquet").columns
    assert not {"rate", "arrival", "load_label", "workload", "tokenizer"} & set(on_disk), on_disk
    assert stored(s)["tags"] == {"quant": "FP8"}
    row = s.cells.row(0, named=True)  # what the cell really ran with
    assert (row["tokenizer"], row["transport"], row["telemetry_interval"]) == (
        "estimate (1 token per word)", "raw", "off")
    assert "server" not in _finished(events)[0].summary.to_dict()  # no /metrics: no server part


async def test_kv_budget_is_a_typed_event(tmp_path: Path) -> None:
    server = FakeServer(log_budget=KVBudget(tokens=4096, source="log"))
    events = await _run(_spec(concurrency=(1,)), _ctx(tmp_path / "s"), server, FakeTarget(server))
    kv = [e for e in events if isinstance(e, KvBudgetKnown)]
    assert len(kv) == 1 and kv[0].budget["kv_cache_tokens"] == 4096 and kv[0].budget["source"] == "log"
    assert kv[0].budget["max_concurrency_by_workload"] == {"tiny": 204.8}
    assert kv[0].text.startswith("KV cache: 4,096 tokens (log)") and kv[0].level == "info"
    assert kv[0].text.endswith("fit at once) tiny 205x")  # as the app's KV line writes it, not 204.8x
    assert stored(load_session(tmp_path / "s"))["kv_budget"]["kv_cache_tokens"] == 4096


async def test_stop_before_a_cell_ends_interrupted(tmp_path: Path) -> None:
    control = SweepControl()
    control.stopping = True
    server = FakeServer()
    target = FakeTarget(server)
    events = await _run(_spec(), _ctx(tmp_path / "s"), server, target, control=control)
    assert target.runs == []
    fin = events[-1]
    assert isinstance(fin, SweepFinished) and fin.status == "interrupted"


async def test_a_failure_to_close_is_said_and_the_sweep_still_ends(tmp_path: Path) -> None:
    """The sweep is saved before its connections close: an error closing them is a warning, and the event log a
    detached runner writes still ends with SweepFinished (a viewer waits for it)."""

    class BadClose(FakeTarget):
        async def close(self) -> None:
            raise OSError("socket \x1b[2Jgone")

    server = FakeServer()
    events = await _run(_spec(concurrency=(1,)), _ctx(tmp_path / "s"), server, BadClose(server))
    fin = events[-1]
    assert isinstance(fin, SweepFinished) and fin.status == "completed"
    warn = [e for e in events if isinstance(e, Notice) and e.level == "warning" and "closing" in e.text]
    assert len(warn) == 1 and "socket gone" in warn[0].text and "\x1b" not in warn[0].text
    assert "OSError" not in warn[0].text  # its message, never a Python class name
    assert load_session(tmp_path / "s").status == "completed"


@pytest.mark.parametrize("bad", ["no workloads"])
async def test_a_sweep_without_cells_raises_before_anything(tmp_path: Path, bad: str) -> None:
    from servescope.core.errors import ServescopeError

    server = FakeServer()
    with pytest.raises(ServescopeError, match="no cells"):
        await _run(_spec(workloads=()), _ctx(tmp_path / "s"), server, FakeTarget(server))
    assert not (tmp_path / "s").exists()


async def test_the_runner_builds_prompts_bounded_by_the_load_not_the_warmup(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A huge --warmup built one prompt per warmup request before the cell started (issue 32): the runner asks
    for `prompts_to_build(cell)`, at most 1,024 warmup prompts (cycled) beside the measured pool."""
    import servescope.engine.runner as runner_mod
    from servescope.core.load import WARM_POOL
    from servescope.engine.plan import plan_cells, prompts_to_build

    asked: list[int] = []

    async def counting(workload: Any, n: int, *args: Any, **kw: Any) -> Any:
        asked.append(n)
        raise ServescopeError("enough: the count asked for is what this test reads")

    monkeypatch.setattr(runner_mod, "build_prompts", counting)
    spec = _spec(concurrency=(1,), requests=2, warmup=100_000_000)
    server = FakeServer()
    with pytest.raises(ServescopeError, match="enough"):
        await _run(spec, _ctx(tmp_path / "s"), server, FakeTarget(server))
    [cell] = plan_cells(spec)
    assert asked and asked[0] == prompts_to_build(cell) <= WARM_POOL + 2, asked


# ---- --ramp auto: a closed loop's users start over one request's E2E -------------------------------------------
async def test_auto_ramp_times_the_users_start_by_the_c1_cell_or_one_request_sent_alone(tmp_path: Path) -> None:
    """The default (--ramp auto): a closed loop of several users starts them one by one over one request's E2E
    measured alone, as tune does: the E2E p50 of the workload's c=1 cell when one ran before (no extra request), else
    one request sent alone first (not a cell's: its load runs before the cell's). The planned load stays as it was
    (its label and row: what comparisons join on); the cell's window says the ramp it ran with."""
    server = FakeServer()
    target = FakeTarget(server)
    events = await _run(_spec(ramp_s=None, concurrency=(1, 4)), _ctx(tmp_path / "a"), server, target)
    assert [s for s, _ in target.runs] == [0, 1]  # no request besides the cells' own: the c=1 cell timed the ramp
    c1, c4 = (f.summary for f in _finished(events))
    e2e = (c1.whole or c1).e2e_ms.p50
    assert e2e is not None and c4.window is not None and c4.window.ramp_s == ramp_from_probe(e2e / 1e3)
    assert _finished(events)[1].cell.label == "tiny c=4"  # the plan's label: no ramp in it
    assert any(isinstance(e, Notice) and "start one by one over" in e.text and "c=1 cell" in e.text for e in events)
    assert load_session(tmp_path / "a").cells["ramp_s"].to_list() == [None, None]

    server = FakeServer()
    target = FakeTarget(server)
    events = await _run(_spec(ramp_s=None, concurrency=(4, 8)), _ctx(tmp_path / "b"), server, target)
    assert [s for s, _ in target.runs] == [0, 0, 1]  # one request alone before the first cell, then the two cells
    assert any(isinstance(e, Notice) and "one request sent alone first" in e.text for e in events)
    assert [f.summary.window.ramp_s for f in _finished(events) if f.summary.window is not None] == [0.1, 0.1]

    server = FakeServer()  # --ramp 0: together, as before windows
    target = FakeTarget(server)
    events = await _run(_spec(ramp_s=0.0, concurrency=(4,)), _ctx(tmp_path / "c"), server, target)
    assert [s for s, _ in target.runs] == [0]
    [w] = [f.summary.window for f in _finished(events)]
    assert w is not None and w.ramp_s is None  # (the fake's requests take no time: its window is the whole cell)


def test_a_session_measured_before_windows_resumes_in_its_own_regime(tmp_path: Path) -> None:
    """A session.toml whose [sweep] has no `window` was measured over whole cells with users started together:
    `resume` and `run --sweep SESSION` go on the same way; a sweep of today keeps what it says."""
    old = Path(__file__).parents[1] / "sessions" / "old" / "v2" / "gptq" / "session.toml"
    spec = SweepSpec.from_toml(old)
    assert (spec.window, spec.ramp_s) == ("whole", 0.0)
    new = SweepSpec(workloads=(WL,), concurrency=(4,))
    assert (new.window, new.ramp_s) == ("steady", None)
    assert SweepSpec.from_table(legacy_regime(new.to_table())) == new


def test_stop_after_saturation_runs_one_load_past_the_first_saturated_one_and_skips_the_rest() -> None:
    """The series' record: saturated at c=8, so c=16 runs (it shows the plateau) and c=32, c=64 are skipped, saying
    why; another workload's series, and the sweep without the flag, run everything."""
    cells = plan_cells(SweepSpec(workloads=(WL, Workload("other", source="inline")), concurrency=(4, 8, 16, 32, 64)))
    sat = CellResult(saturation=Saturation(True, "saturated: the server's queue never emptied"), requests_ok=5)
    ok = CellResult(saturation=Saturation(False), requests_ok=5)
    for flag in (True, False):
        series = SweepSeries(stop_after_saturation=flag)
        skipped = []
        for cell in cells:
            why = series.skip_reason(cell)
            if why:
                skipped.append((cell.workload.name, cell.load.concurrency, why))
                continue
            series.record(cell, sat if cell.workload.name == "tiny" and cell.load.concurrency == 8 else ok)
        if not flag:
            assert skipped == []
            continue
        assert [(w, c) for w, c, _ in skipped] == [("tiny", 32), ("tiny", 64)]
        assert "the load 8 users was saturated (the server's queue never emptied) and 16 users was run past it" in \
            skipped[0][2]
    assert series.lower(cells[2]) == (8.0, sat)  # c=16's next lower load, for its saturation mark
