"""A cell split across worker processes (`--workers`) measures what one process measures, against the simulator:
the same requests and tokens, the same latencies within noise, an open loop's sends at the single-process
schedule; a drain reaches every worker, a worker's own early stop ends the others, and a worker killed mid-cell
fails the cell in one line with every process reaped."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from servescope.core.client import ClientOptions, RequestSpec
from servescope.core.errors import ServescopeError
from servescope.core.load import CellControl, CellRun, Limits, Load
from servescope.core.records import RequestRecord
from servescope.core.workers import run_cell_workers
from servescope.engine.connection import HttpTarget

# the --fast lane leaves this module out: 6 tests, ~9 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

SPECS = [RequestSpec("completions", f"request {i}: " + "lorem ipsum dolor " * 40, 128, 32) for i in range(170)]
# two runs of one load on a busy 2-core host (the simulator, the load and the test share the cores) differ by
# up to about 15% in median TTFT/TPOT from one run to the next; 25% leaves room for that noise and would still
# catch a split that changes the load (half the users, or all of them twice, moves TTFT by far more)
TOLERANCE = 0.25


@pytest.fixture(scope="module")
def sim() -> Iterator[ClientOptions]:
    import httpx

    from servescope.sim.launcher import start_sim

    with start_sim("tiny", ["--no-enable-prefix-caching"]) as s:
        model = httpx.get(s.url + "/v1/models").json()["data"][0]["id"]
        yield ClientOptions(base_url=s.url, model=model)


def _no_children_left() -> None:
    assert multiprocessing.active_children() == []


async def _noop() -> None:
    return None


async def _until(cond: Callable[[], bool], task: asyncio.Task[CellRun], limit_s: float, what: str) -> None:
    """Wait for `cond` while the cell runs (generous limit: it returns as soon as the condition holds)."""
    deadline = asyncio.get_running_loop().time() + limit_s
    while not cond():
        if task.done():
            task.result()  # its error, if it failed
            raise AssertionError(f"the cell ended before {what}")
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def _both_workers(seen: list[RequestRecord]) -> Callable[[], bool]:
    """Worker k of 2 runs users k, k + 2, ...: a reply to each worker's users means both are sending."""
    return lambda: {r.user % 2 for r in seen} == {0, 1}


def _median(runs: list[CellRun], metric: str) -> float:
    vals = []
    for run in runs:
        for r in run.records:
            if metric == "ttft":
                vals.append((r.first_token_ns - r.sent_ns) / 1e6)
            elif r.output_tokens > 1:
                vals.append((r.end_ns - r.first_token_ns) / 1e6 / (r.output_tokens - 1))
    return statistics.median(vals)


@pytest.mark.slow  # 12 s of the --fast lane on 2 cores
async def test_two_workers_measure_what_one_process_measures(sim: ClientOptions) -> None:
    load, limits = Load(concurrency=16), Limits(requests=160, warmup=4)
    one: list[CellRun] = []
    two: list[CellRun] = []
    target = HttpTarget(None, workers=2)  # the engine's seam, as `--workers 2` sets it
    marks: list[int] = []

    async def before() -> None:
        marks.append(1)

    for i in range(2):  # interleaved, so slow drift of the host hits both alike
        one.append(await run_cell_workers(sim, SPECS, load, limits, workers=1))
        seen: list[RequestRecord] = []
        two.append(await target.run_cell(sim, SPECS, load, limits, seen.append, CellControl(), 0, before))
        assert len(seen) == 160 and len(marks) == i + 1  # every record reached on_record; before_measured: once
    for a, b in zip(one, two, strict=True):
        assert len(a.records) == len(b.records) == 160
        assert all(r.status == "ok" for r in a.records + b.records)
        assert sum(r.output_tokens for r in a.records) == sum(r.output_tokens for r in b.records) == 160 * 32
        assert sum(r.prompt_tokens for r in a.records) == sum(r.prompt_tokens for r in b.records)
        assert sorted(r.index for r in b.records) == list(range(160))
        assert sorted({r.user for r in b.records}) == list(range(16))
        # the workers start together: the latest began a small part of the cell after the common start (a
        # worker started as it was spawned would be late by its start-up, a large part of this short cell)
        assert b.client is not None and b.client.workers == 2
        assert b.client.start_skew_ms < 0.1 * (b.end_ns - b.start_ns) / 1e6, (b.client, b.end_ns - b.start_ns)
        assert b.start_ns <= min(r.scheduled_ns for r in b.records) and b.end_ns == max(r.end_ns for r in b.records)
    for metric in ("ttft", "tpot"):
        m1, m2 = _median(one, metric), _median(two, metric)
        assert abs(m2 - m1) <= TOLERANCE * m1, (metric, m1, m2)
    _no_children_left()


async def test_open_loop_workers_keep_the_single_process_schedule(sim: ClientOptions) -> None:
    load, limits = Load(rate=25.0, arrival="poisson"), Limits(requests=40)
    a = await run_cell_workers(sim, SPECS, load, limits, seed=5, workers=1)
    b = await run_cell_workers(sim, SPECS, load, limits, seed=5, workers=2)
    assert len(a.records) == len(b.records) == 40
    ra, rb = sorted(a.records, key=lambda r: r.index), sorted(b.records, key=lambda r: r.index)
    assert [r.input_tokens_requested for r in ra] == [r.input_tokens_requested for r in rb]
    # each send at the same offset from the cell's start: the workers start together (within a few ms on a
    # loaded host; the start skew is stated) and deal out one schedule
    skew_ms = b.client.start_skew_ms if b.client else 0.0
    for x, y in zip(ra, rb, strict=True):
        assert abs((x.scheduled_ns - a.start_ns) - (y.scheduled_ns - b.start_ns)) / 1e6 <= 5.0 + skew_ms
    # sent on time (the median send), as one process sends them on the same host at the same moment
    late_a = statistics.median((r.sent_ns - r.scheduled_ns) / 1e6 for r in ra)
    late_b = statistics.median((r.sent_ns - r.scheduled_ns) / 1e6 for r in rb)
    assert late_b < 10.0 + 2 * late_a, (late_a, late_b)
    _no_children_left()


async def test_a_drain_reaches_every_worker(sim: ClientOptions) -> None:
    control = CellControl()
    seen: list[RequestRecord] = []
    task = asyncio.create_task(run_cell_workers(sim, SPECS, Load(concurrency=4), Limits(requests=2000), seen.append,
                                                control, 0, _noop, workers=2))
    await _until(_both_workers(seen), task, 120, "both workers' first replies")
    control.request_drain("drained by the test")
    run = await asyncio.wait_for(task, 60)
    assert run.stopped == "drained by the test"
    assert 0 < len(run.records) < 2000 and all(r.status == "ok" for r in run.records)  # in flight: finished
    assert {r.user % 2 for r in run.records} == {0, 1}  # both workers had sent
    _no_children_left()


async def test_a_worker_that_fails_every_request_stops_the_cell(sim: ClientOptions) -> None:
    dead = ClientOptions(base_url="http://127.0.0.1:9", model=sim.model, timeout_s=5)  # nothing listens there
    run = await asyncio.wait_for(run_cell_workers(dead, SPECS, Load(concurrency=4), Limits(requests=1000),
                                                  workers=2), 60)
    assert "in a row failed" in run.stopped and len(run.records) < 1000
    _no_children_left()


async def test_a_killed_worker_fails_the_cell_in_one_line_and_leaves_no_process(sim: ClientOptions) -> None:
    seen: list[RequestRecord] = []
    task = asyncio.create_task(run_cell_workers(sim, SPECS, Load(concurrency=4), Limits(requests=5000), seen.append,
                                                workers=2))
    await _until(_both_workers(seen), task, 120, "both workers' first replies")  # mid-cell, sending
    victims = [p for p in multiprocessing.active_children() if p.name == "servescope-load-2"]
    assert len(victims) == 1
    pids = [p.pid or 0 for p in multiprocessing.active_children()]
    os.kill(victims[0].pid or 0, signal.SIGKILL)
    with pytest.raises(ServescopeError) as e:
        await asyncio.wait_for(task, 60)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("load worker 2 of 2") and "died: killed by signal 9" in msg, msg
    _no_children_left()
    for pid in pids:  # reaped, not zombies
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_a_sweep_with_worker_processes_counts_exactly_its_measured_requests(tmp_path: Path) -> None:
    """Through the engine (`run_sweep` with the target `--workers 2` makes): the server's own counters over the
    measured window see exactly the measured requests, so every worker's warmup ended before the window's
    start sample and every measured request began after it (the barrier and the common start)."""
    from servescope.engine.events import CellFinished, SweepFinished
    from servescope.engine.runner import run_sweep
    from servescope.engine.spec import RunContext, SweepSpec
    from servescope.sim.launcher import start_sim
    from servescope.workloads.spec import Workload, fixed

    wl = Workload("tiny", "completions", fixed(64), fixed(8), source="inline")
    with start_sim("tiny") as s:
        spec = SweepSpec(url="sim://tiny", workloads=(wl,), concurrency=(4,), requests=24, warmup=4)
        ctx = RunContext(url=s.url, target_label="sim://tiny", save_dir=tmp_path / "s")
        events = [ev async for ev in run_sweep(spec, ctx, target=HttpTarget(None, workers=2))]
    fin = events[-1]
    assert isinstance(fin, SweepFinished) and fin.status == "completed", fin
    done = [e for e in events if isinstance(e, CellFinished)]
    assert [d.status for d in done] == ["done"]
    srv = done[0].summary.server
    assert srv is not None and srv.requests_success == 24 and srv.generation_tokens == 24 * 8
    _no_children_left()


async def test_a_cancelled_cell_leaves_no_worker_behind(sim: ClientOptions) -> None:
    """The app closed or a second Ctrl-C: the task running the cell is cancelled; its workers are stopped and
    reaped before the cancellation completes."""
    seen: list[RequestRecord] = []
    task = asyncio.create_task(run_cell_workers(sim, SPECS, Load(concurrency=4), Limits(requests=5000), seen.append,
                                                workers=2))
    await _until(_both_workers(seen), task, 120, "both workers' first replies")  # mid-cell, sending
    pids = [p.pid or 0 for p in multiprocessing.active_children()]
    assert len(pids) == 2
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    _no_children_left()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
