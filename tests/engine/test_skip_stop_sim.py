"""Skip and stop against the built-in simulator, with the real engine: a skipped cell is saved as `skipped`
(not as a failed cell), `stop(let_in_flight_finish=True)` (the app's `x`) lets the in-flight requests finish
and a second stop cancels them, cancelled requests never count against the SLOs, and the answers (capacity,
knee, peak) and the report use completed cells only and say which cells they left out. They count the cells
the client's health calls client-bound (`include_bound`): on a busy host the client is (its loop lags), and
leaving those out is tests/sessions/test_client_bound.py's to check, not these."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import polars as pl
import pytest

from servescope.engine.events import (
    CellFinished,
    CellSkipped,
    Event,
    RequestsDone,
    SweepControl,
    SweepFinished,
)
from servescope.engine.runner import run_sweep
from servescope.engine.spec import RunContext, SweepSpec
from servescope.reports.report import render_report
from servescope.sessions.answers import derive
from servescope.sessions.store import load_session
from servescope.sessions.views import cell_views
from servescope.sim.launcher import SimHandle, start_sim
from servescope.workloads.spec import Workload, fixed
from tests.support.meta import stored

# the --fast lane leaves this module out: 1 tests, ~4 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

# long enough outputs that requests are still in flight when the first batch of finished ones arrives
WL = Workload("slow", "completions", fixed(32), fixed(150), source="inline")


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    h = start_sim("tiny")
    try:
        yield h
    finally:
        h.stop()


async def _sweep(sim: SimHandle, path: Path, conc: tuple[int, ...], on: Callable[[Event, SweepControl], None],
                 **kw: object) -> list[Event]:
    spec = SweepSpec(url="sim://tiny", workloads=(WL,), concurrency=conc, requests=12,
                     telemetry_interval_s=None, **kw)  # type: ignore[arg-type]
    control = SweepControl()
    events: list[Event] = []
    async for ev in run_sweep(spec, RunContext(url=sim.url, target_label="sim://tiny", save_dir=path), control):
        events.append(ev)
        on(ev, control)
    return events


def _first_batch(cell: int, act: Callable[[SweepControl], object]) -> Callable[[Event, SweepControl], None]:
    done: list[bool] = []

    def on(ev: Event, control: SweepControl) -> None:
        if isinstance(ev, RequestsDone) and ev.cell.index == cell and ev.done >= 1 and not done:
            done.append(True)
            act(control)
    return on


@pytest.mark.slow  # 5 s of the --fast lane on 2 cores
async def test_a_skipped_cell_is_saved_as_skipped_and_left_out_of_the_answers(sim: SimHandle, tmp_path: Path) -> None:
    events = await _sweep(sim, tmp_path / "s", (2, 4, 8), _first_batch(0, lambda c: c.skip_cell()))
    skipped = [e for e in events if isinstance(e, CellSkipped)]
    assert [(e.cell.index, e.reason) for e in skipped] == [(0, "skipped by the user")]
    assert [(e.cell.index, e.status) for e in events if isinstance(e, CellFinished)] == [(1, "done"), (2, "done")]
    fin = events[-1]
    assert isinstance(fin, SweepFinished) and fin.status == "completed"  # the sweep went on
    s = load_session(tmp_path / "s")
    first = stored(s)["cells"][0]
    assert (first["status"], first["reason"]) == ("skipped", "skipped by the user")
    row = s.cells.filter(pl.col("index") == 0).row(0, named=True)
    assert row["status"] == "skipped" and not row.get("requests_failed")  # not "0 ok, 1 failed"
    [ans] = derive("s", cell_views(s, include_skipped=True), include_bound=True)
    assert ans.left_out == ["c=2 (skipped: skipped by the user)"]
    assert ans.knee.concurrency is not None  # two completed levels: c=4 and c=8
    assert ans.peak_load in ("c=4", "c=8")
    md = render_report(s, include_bound=True)
    assert "needs at least two" not in md and "even the lowest load" not in md
    assert "c=2 (skipped: skipped by the user)" in md


@pytest.mark.slow  # 9 s of the --fast lane on 2 cores
async def test_stop_lets_the_in_flight_requests_finish(sim: SimHandle, tmp_path: Path) -> None:
    events = await _sweep(sim, tmp_path / "s", (1, 4, 8),
                          _first_batch(1, lambda c: c.stop("stopped by the user", let_in_flight_finish=True)),
                          slos={"ttft_ms": 60_000.0})
    fin = events[-1]
    assert isinstance(fin, SweepFinished) and fin.status == "interrupted"
    finished = [e for e in events if isinstance(e, CellFinished)]
    assert [(e.cell.index, e.status) for e in finished] == [(0, "done"), (1, "stopped")]
    stopped = finished[1]
    assert stopped.reason == "stopped by the user"
    assert stopped.summary.requests_failed == 0 and stopped.summary.requests_ok >= 5  # the 4 in flight finished
    s = load_session(tmp_path / "s")
    reqs = s.requests(1)
    assert "cancelled" not in reqs["status"].to_list()
    assert [c["status"] for c in stored(s)["cells"]] == ["done", "stopped", "planned"]
    [ans] = derive("s", cell_views(s, include_skipped=True), include_bound=True)
    assert ans.left_out == ["c=4 (stopped: stopped by the user)"]
    assert ans.capacity.level == 1  # c=1 completed and meets the SLOs; the stopped c=4 is not judged
    assert ans.knee.text() == "needs at least two completed concurrency levels (one completed)"
    md = render_report(s, include_bound=True)
    assert "even the lowest load misses the SLOs" not in md
    assert "c=4 (stopped: stopped by the user)" in md


async def test_a_second_stop_cancels_and_cancelled_requests_never_count_against_the_slos(
        sim: SimHandle, tmp_path: Path) -> None:
    def stop_twice(c: SweepControl) -> None:
        assert c.stop("stopped by the user", let_in_flight_finish=True) == "draining"
        assert c.stop("stopped by the user: in-flight requests cancelled",
                      let_in_flight_finish=True) == "cancelling"

    events = await _sweep(sim, tmp_path / "s", (4,), _first_batch(0, stop_twice), slos={"ttft_ms": 60_000.0})
    [cell] = [e for e in events if isinstance(e, CellFinished)]
    assert cell.status == "stopped"
    s = load_session(tmp_path / "s")
    statuses = s.requests(0)["status"].to_list()
    assert "cancelled" in statuses and "ok" in statuses
    assert cell.summary.slo_met_fraction == 1.0  # every request that ran met the SLO; cancelled ones are not judged
    [view] = cell_views(s)
    from servescope.sessions.views import apply_slos

    apply_slos(s, [view], {"ttft_ms": 60_000.0, "e2e_ms": 1e9})  # re-judged from the raw requests: the same
    assert view.summary.slo_met_fraction == 1.0
