"""The Run screen shows each finished cell's client verdict, and leaves a client-bound cell off the curve (so
off its knee and SLO capacity), saying why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servescope.core.health import ClientPart, judge_client
from servescope.core.results import CellResult, Dist, LoopLag
from servescope.engine import wire as w
from servescope.tui import messages as m
from servescope.tui.app import make_app
from servescope.tui.screens.run import RunScreen
from servescope.tui.widgets import EventLog
from servescope.tui.widgets.curve import ThroughputCurve
from servescope.tui.widgets.panels import CELL_COLUMNS, CellTable

# the --fast lane leaves this module out: 2 tests, ~5 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow


def _summary(cpu: float) -> CellResult:
    client = judge_client(ClientPart(loop_lag_ms=LoopLag(p50=0.3, p99=0.4, max=1.0), cpu_s=cpu, wall_s=1.0,
                                     cpu_util=cpu, workers=1), bunched_share=0.0)
    return CellResult(requests_ok=20, output_tok_s=900.0 * cpu, per_user_tok_s=Dist(mean=50.0), client=client)


CELLS = [m.CellInfo(i, "sharegpt", f"c={c}", c, None, 20, None, "in 200-512 (uniform) / out 256 (chat)")
         for i, c in enumerate((1, 4))]


async def _started(app: Any, pilot: Any, home: Path) -> RunScreen:
    """The Run screen with a two-cell sweep (c=1, c=4) started on it."""
    app.switch_mode("run")
    await pilot.pause()
    run = app.screen
    assert isinstance(run, RunScreen)
    run.reset("t")
    run.post_message(m.SweepStarted(w.SweepStarted(home / "sessions" / "x", CELLS, "sim://tiny", "tiny", None, "t", True)))
    return run


async def test_run_screen_shows_the_verdict_and_leaves_bound_cells_off_the_curve(home: Path) -> None:
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(100, 30)) as pilot:
        run = await _started(app, pilot, home)
        for cell, cpu in zip(CELLS, (0.23, 0.96), strict=True):
            run.post_message(m.CellStarted(w.CellStarted(cell, 2)))
            run.post_message(m.CellFinished(w.CellFinished(cell, _summary(cpu), "done")))
        await pilot.pause()
        log = " ".join(" ".join(ln.text for ln in run.query_one(EventLog).lines).split())
        assert "cell 1 client" not in log  # ok: in the table's client column, the event log stays for problems
        assert ("cell 2 client: BOUND (CPU 96% of a core (bound above 90%)): the client, not the server, limited "
                "this cell") in log
        assert "cell 2 (sharegpt c=4) is left out of the curve, knee and capacity: its client was bound" in log
        table = run.query_one(CellTable)
        assert table.data["1"][3] == "done, client BOUND" and table.data["0"][3] == "done"
        client = CELL_COLUMNS.index("client")
        assert table.data["0"][client] == "ok" and table.data["1"][client] == "BOUND"
        assert [p.label for p in run._points["sharegpt"]] == ["c=1"]


async def test_a_curve_whose_only_finished_cell_was_bound_says_so(home: Path) -> None:
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(100, 30)) as pilot:
        run = await _started(app, pilot, home)
        run.post_message(m.CellStarted(w.CellStarted(CELLS[0], 2)))
        await pilot.pause()
        curve = run.query_one(ThroughputCurve)
        assert curve.empty == "waiting for the first finished cell…"
        run.post_message(m.CellFinished(w.CellFinished(CELLS[0], _summary(0.96), "done")))
        run.post_message(m.CellStarted(w.CellStarted(CELLS[1], 2)))
        await pilot.pause()
        assert not curve.points
        assert curve.empty == "c=1 client-bound: not plotted (see events)"  # a cell did finish: not "waiting"
        assert "c=1 client-bound: not plotted" in str(curve.render())
