"""`servescope tune` against a real server: each cell is a one-cell sweep (`run_sweep`) saved under the tune
session (`cells/NNN-.../`, a full session each, so its requests are there for the model and for `report`); a
launched server is kept running between cells of the same setting and relaunched only when the setting changes
(`KeptServers`). A setting's first cell is preceded by one request alone (`probes/NN-.../`), whose E2E is the ramp
its cells' users start over (`LiveMeasurer.ramp`). The tune session's own session.toml has `kind = "tune"` and a
[tune] table: the search space, the recommendation, the runner-up, the path (`tune_table`)."""

from __future__ import annotations

import asyncio
import math
import shlex
import signal
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import msgspec

from servescope.core.errors import ServescopeError
from servescope.core.jsontypes import JsonObject
from servescope.core.kvbudget import KVBudget
from servescope.core.launchspec import ArgValue
from servescope.core.secrets import redact_command
from servescope.core.slo import attains
from servescope.core.steady import ramp_from_probe
from servescope.engine.aio import run_loop
from servescope.engine.background import Background
from servescope.engine.events import Event, SweepControl, SweepFinished
from servescope.engine.runner import run_sweep
from servescope.engine.server import Servers
from servescope.engine.spec import RunContext, SweepSpec
from servescope.engine.specsearch import SPEC_TOKENS_FLAG, with_spec_tokens
from servescope.engine.tune import (
    Measured,
    Objective,
    Setting,
    Space,
    Step,
    TuneResult,
    best_cell,
    margins_of,
    pooled_value,
)
from servescope.engine.tunemodel import request_rows
from servescope.sessions.live import HEARTBEAT_S, RunnerLock
from servescope.sessions.meta import (
    TuneBest,
    TuneDim,
    TuneMeta,
    TunePrediction,
    TuneRunnerUp,
    TuneRunning,
    TuneStep,
)
from servescope.sessions.store import load_session


def serve_line(launch: str, setting: Setting) -> str:
    """The launch command with the setting's flags set (replaced where given, else added), secrets as ••••: a
    line to copy and paste."""
    return redact_command(with_setting(launch, setting))


ROUNDS = 3  # a cell sends at least this many requests per user: the first round ramps up, the rest are steady


def requests_for(minimum: int) -> Callable[[int], int]:
    """A cell's requests: at least `minimum`, and `ROUNDS` rounds of its users."""
    return lambda c: max(minimum, ROUNDS * c)


class KeptServers:
    """A ServerManager (servescope.engine.server) that keeps the launched server between sweeps: `want(spec)`
    names the setting the next sweep runs; `launch` starts it only when another one runs (or none); `close`
    leaves it running until `shutdown`."""

    def __init__(self, api_key: str | None, log_dir: Path) -> None:
        self.api_key = api_key
        self.log_dir = log_dir
        self.bg = Background()
        self.inner: Servers | None = None
        self.key: str | None = None
        self.pending: SweepSpec | None = None
        self.launches = 0

    def want(self, spec: SweepSpec) -> None:
        self.pending = spec

    @property
    def url(self) -> str:
        return self.inner.url if self.inner is not None else ""

    @property
    def variant(self) -> int:
        return 0 if self.inner is not None else -1

    async def launch(self, variant: int, log_dir: Path) -> None:
        """Start the setting's server, unless the one running is that setting's and still answers (a server that
        died or stopped answering since the last cell is launched again, as `run --launch` relaunches one)."""
        spec = self.pending
        assert spec is not None and spec.launch
        running = self.inner is not None and self.inner.proc is not None and self.inner.proc.alive()
        if running and self.key == spec.launch and await self.healthy():
            return
        if self.inner is not None:
            await self.inner.close()
        self.inner = Servers(spec, "", self.api_key, self.bg)
        await self.inner.launch(0, self.log_dir / f"launch-{self.launches + 1:02d}")
        self.key = spec.launch
        self.launches += 1

    async def healthy(self, timeout_s: float = 5.0) -> bool:
        return self.inner is not None and await self.inner.healthy(timeout_s)

    async def recover(self, timeout_s: float, stopping: Callable[[], bool]) -> bool:
        return self.inner is not None and await self.inner.recover(timeout_s, stopping)

    def server_args(self) -> dict[str, ArgValue] | None:
        return self.inner.server_args() if self.inner is not None else None

    def kv_budget(self) -> KVBudget | None:
        return self.inner.kv_budget() if self.inner is not None else None

    async def close(self) -> None:
        """Kept running: the next cell of the same setting uses it (`shutdown` stops it)."""

    def shutdown(self) -> None:
        if self.inner is not None:
            run_loop(self.inner.close())
            self.inner = None
        self.bg.close()


MEASUREMENT_SEED_STEP = 1_000  # measurement k of a search runs with the search's seed + k x this: its own prompts
PROBE_SEED_OFFSET = 500  # probe k: the search's seed + this + k x MEASUREMENT_SEED_STEP (no measurement's seed)


@dataclass
class LiveMeasurer:
    """Measures a cell with a one-cell sweep of `base` (its workload, requests, repeat, SLOs, seed) at the
    setting and concurrency asked."""

    base: SweepSpec
    ctx: RunContext
    root: Path
    objective: Objective
    minimum_requests: int
    on_event: Callable[[Event], None] | None = None
    on_cell: Callable[[int, Setting, int, Path], None] | None = None  # (step, setting, concurrency, cell folder)
    servers: KeptServers | None = None
    count: int = 0
    control: SweepControl | None = None
    probes: dict[str, float | None] = field(default_factory=dict)  # setting -> its probe's ramp (s), None: failed

    def __post_init__(self) -> None:
        if self.base.launch:
            self.servers = KeptServers(self.ctx.api_key, self.root / "servers")

    @property
    def relaunches(self) -> int:
        return max(0, self.servers.launches - 1) if self.servers is not None else 0

    @property
    def launches(self) -> int:
        return self.servers.launches if self.servers is not None else 0

    def ramp(self, setting: Setting, concurrency: int) -> float | None:
        """The cell's ramp: the search's own `--ramp` where given, else from the setting's probe (measured the
        first time the setting runs); none for one user."""
        if self.base.ramp_s:
            return self.base.ramp_s
        if concurrency <= 1:
            return None
        if setting.text not in self.probes:
            self.probes[setting.text] = self._probe(setting)
        return self.probes[setting.text]

    def _probe(self, setting: Setting) -> float | None:
        """One request alone at this setting (its own prompt, saved under probes/): its E2E sets the ramp."""
        k = len(self.probes) + 1
        spec = self.base.replace(concurrency=(1,), rates=None, requests=1, variants=(), warmup=0, repeat=1,
                                 name=f"{self.base.name or 'tune'} probe {k}",
                                 seed=self.base.seed + PROBE_SEED_OFFSET + MEASUREMENT_SEED_STEP * k)
        if self.base.launch:
            spec = spec.replace(launch=with_setting(self.base.launch, setting))
        save = self.root / "probes" / f"{k:02d}{'-' + _slug(setting) if setting.args else ''}"
        self._sweep(spec, save)
        e2e = [x for summ in load_session(str(save)).summaries() if summ is not None
               and isinstance(x := summ.value("e2e_ms.p50"), (int, float)) and math.isfinite(x) and x > 0]
        return ramp_from_probe(e2e[0] / 1e3) if e2e else None

    def measure(self, setting: Setting, concurrency: int) -> Measured:
        ramp = self.ramp(setting, concurrency)
        self.count += 1
        n = requests_for(self.minimum_requests)(concurrency)
        # each measurement its own prompts: a one-cell sweep's cell is always its cell 0, whose prompts derive from
        # the seed, so one seed would send every measurement the prompts of the one before, and a server's prefix
        # cache would serve them (a cell after a larger one on the same server measured up to 1.6 times its goodput)
        spec = self.base.replace(concurrency=(concurrency,), rates=None, requests=n, variants=(), ramp_s=ramp,
                                 name=f"{self.base.name or 'tune'} cell {self.count}",
                                 seed=self.base.seed + MEASUREMENT_SEED_STEP * self.count)
        if self.base.launch:
            spec = spec.replace(launch=with_setting(self.base.launch, setting))
        slug = _slug(setting)
        save = self.root / "cells" / f"{self.count:03d}-c{concurrency}{'-' + slug if slug else ''}"
        if self.on_cell is not None:
            self.on_cell(self.count, setting, concurrency, save)
        self._sweep(spec, save)
        return measured_from(str(save), self.objective, dict(self.base.slos), concurrency)

    def _sweep(self, spec: SweepSpec, save: Path) -> None:
        """Run the one-cell sweep `spec` into `save` on the setting's server (launched when another one runs);
        KeyboardInterrupt when Ctrl-C, SIGTERM or the app stopped it; ServescopeError when the sweep failed (a server
        lost for good also stops the sweep, and is not an interrupt)."""
        ctx = replace(self.ctx, save_dir=save)
        if self.servers is not None:
            self.servers.want(spec)
        control = self.control or SweepControl()
        failed: list[str] = []

        async def go() -> None:
            loop = asyncio.get_running_loop()
            hooked = []
            for sig in (signal.SIGINT, signal.SIGTERM):  # as `servescope run`: end the cell, keep what it measured
                try:
                    loop.add_signal_handler(sig, control.stop, "stopped by Ctrl-C or SIGTERM")
                    hooked.append(sig)
                except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
                    pass
            try:
                async for ev in run_sweep(spec, ctx, control, servers=self.servers):
                    if isinstance(ev, SweepFinished) and ev.status == "failed":
                        failed.append(ev.message)
                    if self.on_event is not None:
                        self.on_event(ev)
            finally:
                for sig in hooked:
                    loop.remove_signal_handler(sig)

        run_loop(go())
        if failed:
            raise ServescopeError(failed[0])
        if control.stopping:
            raise KeyboardInterrupt

    def close(self) -> None:
        if self.servers is not None:
            self.servers.shutdown()


def _slug(setting: Setting) -> str:
    return "-".join(f"{f.lstrip('-')}{v}" for f, v in setting.args)[:60]


def with_setting(launch: str, setting: Setting) -> str:
    words = shlex.split(launch)
    for flag, value in setting.args:
        if flag == SPEC_TOKENS_FLAG:  # the --speculative-config JSON's num_speculative_tokens (engine/specsearch.py)
            words = with_spec_tokens(words, value)
            continue
        for i, w in enumerate(words):
            if w == flag and i + 1 < len(words):
                words[i + 1] = value
                break
            if w.startswith(flag + "="):
                words[i] = f"{flag}={value}"
                break
        else:
            words += [flag, value]
    return shlex.join(words)


def measured_from(path: str, objective: Objective, slos: dict[str, float], concurrency: int) -> Measured:
    """A measured cell from its one-cell session, judged by `slos` (from its requests, whatever SLOs it ran with):
    the median of its repeats, and a 95% interval (goodput: a Poisson interval on the count of requests within the
    SLOs over the cells' wall time, widened to the repeats' range; capacity: none here, the search gives it)."""
    s = load_session(path)
    goodputs, attain, walls, goods, pooled = [], [], [], [], []
    for row, summ in zip(s.cells.to_dicts(), s.summaries(), strict=False):
        if summ is None or row.get("status") != "done":
            continue
        rows, wall = request_rows(path, int(row["index"]))
        m = margins_of(rows, slos)
        good = sum(1 for x in m if x >= 0)
        wall = max(wall, 1e-9)
        goodputs.append(good / wall)
        attain.append(good / len(m) if m else 0.0)
        walls.append(wall)
        goods.append(good)
        pooled += m
    if not goodputs:
        # skipped by the user (the app's `s` on the running cell): no value; a failed cell is a 0 (a server that
        # fails at this setting and load serves nothing there)
        skipped = any(r.get("status") == "skipped" for r in s.cells.to_dicts())
        return Measured(0.0, [], 0.0, False, 0.0, 0.0, path, (0.0, 0.0), skipped=skipped)
    gp, at = statistics.median(goodputs), statistics.median(attain)
    meets = attains(at)
    wall_mean = sum(walls) / len(walls)
    if objective == "capacity":
        return Measured(float(concurrency) if meets else 0.0, sorted(pooled), wall_mean, meets, gp, at, path, None)
    half = 1.96 * math.sqrt(max(sum(goods), 1.0))
    lo, hi = max(0.0, sum(goods) - half) / sum(walls), (sum(goods) + half) / sum(walls)
    if len(goodputs) > 1:
        lo, hi = min(lo, min(goodputs)), max(hi, max(goodputs))
    return Measured(gp, sorted(pooled), wall_mean, meets, gp, at, path, (lo, hi))


# ---- the session ----------------------------------------------------------------------------------------
def tune_table(result: TuneResult, launch: str | None, root: Path, started: float, fits: str) -> TuneMeta:
    """The [tune] table of the tune session's session.toml, when the search has ended."""
    sp = result.space
    best = result.best_setting
    out = msgspec.structs.replace(
        _space_table(sp, result.objective, result.budget), cells_measured=result.cells_measured,
        relaunches=result.relaunches, confirmed=result.confirmed, stop=result.stop_reason,
        seconds=round(time.monotonic() - started, 1), fits=fits, path=path_table(sp, result.steps, root),
        predicted=[TunePrediction(server_args=sp.settings[s].text, concurrency=sp.loads[ld], low=round(lo, 6),
                                  mid=round(mid, 6), high=round(hi, 6))
                   for (s, ld), (lo, mid, hi) in sorted(result.predictions.items())])
    if best is not None and result.best is not None:
        out = msgspec.structs.replace(out, best=TuneBest(
            server_args=best.text, concurrency=sp.loads[result.best[1]], objective=round(result.best_value, 6),
            ci=[round(x, 6) for x in result.best_ci] if result.best_ci else [],
            serve=serve_line(launch, best) if launch else ""))
    if result.runner_up is not None:
        rs = sp.settings[result.runner_up[0]]
        out = msgspec.structs.replace(out, runner_up=TuneRunnerUp(
            server_args=rs.text, concurrency=sp.loads[result.runner_up[1]],
            objective=round(result.runner_up_value or 0.0, 6), measured=result.runner_up_measured,
            why=result.runner_up_why))
    return out


def _space_table(sp: Space, objective: Objective, budget: int) -> TuneMeta:
    """What the [tune] table says of the search itself, running or finished: objective, unit, space, budget."""
    return TuneMeta(objective=objective, unit="req/s" if objective == "goodput" else "users",
                    search=[TuneDim(flag=d.flag, values=list(d.values), scale="log" if d.log_scale else "list")
                            for d in sp.dims],
                    loads=list(sp.loads), grid_cells=sp.cells, budget=budget)


def path_table(sp: Space, steps: Sequence[Step], root: Path) -> list[TuneStep]:
    """The [tune] table's `path`: one row a measured cell, in order."""
    return [TuneStep(step=st.n, server_args=sp.settings[st.setting].text, concurrency=st.concurrency, why=st.why,
                     objective=round(st.value, 6), relaunch=st.relaunch, skipped=st.skipped,
                     band=[round(x, 6) for x in st.band] if st.band else [],
                     cell=str(Path(st.session).relative_to(root)) if st.session else "")
            for st in steps]


def progress_table(sp: Space, objective: Objective, budget: int, steps: Sequence[Step], root: Path,
                   running: TuneRunning | None = None) -> TuneMeta:
    """The [tune] table while the search runs (rewritten after every step and when a cell starts): the space, the
    budget, the path so far, the best measured so far and, while a cell is measured, `running` (its step, server
    args, concurrency and folder under the session). The finished search replaces it with `tune_table`, which has
    no `running`."""
    out = msgspec.structs.replace(_space_table(sp, objective, budget), cells_measured=len(steps),
                                  path=path_table(sp, steps, root), running=running)
    values: dict[tuple[int, int], list[float]] = {}
    for st in steps:
        if not st.skipped:
            values.setdefault((st.setting, st.load), []).append(st.value)
    if values:  # the best measured cell as the search judges it (a cell measured again: its pooled value)
        judged = {c: pooled_value(v, objective) for c, v in values.items()}
        top = best_cell(judged)
        out = msgspec.structs.replace(out, best=TuneBest(server_args=sp.settings[top[0]].text,
                                                         concurrency=sp.loads[top[1]],
                                                         objective=round(judged[top], 6)))
    return out


def running_entry(step: int, setting: Setting, concurrency: int, cell: Path, root: Path) -> TuneRunning:
    """The [tune] table's `running` while a cell is measured."""
    return TuneRunning(step=step, server_args=setting.text, concurrency=concurrency,
                       cell=str(cell.relative_to(root)) if cell.is_relative_to(root) else str(cell))


class TuneLock:
    """The tune session's runner lock (servescope.sessions.live.RunnerLock), held for as long as the search runs,
    its heartbeat touched every HEARTBEAT_S by a thread: a viewer tells a live search from a dead one (kill -9
    included: the flock goes with the process)."""

    def __init__(self, session_dir: Path) -> None:
        self.lock = RunnerLock.acquire(session_dir)
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._run, name="tune-heartbeat", daemon=True)
        self._beat.start()

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self.lock.heartbeat()

    def release(self) -> None:
        self._stop.set()
        self._beat.join(timeout=HEARTBEAT_S + 1)
        self.lock.release()


def result_json(session: str, result: TuneResult) -> JsonObject:
    """What `tune --json` prints: exactly these keys."""
    best = result.best_setting
    return {"session": session,
            "best": {"server_args": best.text if best is not None else None,
                     "objective": result.best_value if best is not None else None,
                     "ci": list(result.best_ci) if result.best_ci else None},
            "cells_measured": result.cells_measured, "relaunches": result.relaunches,
            "confirmed": result.confirmed}

