"""The cell table and the progress line show rate-limited requests (HTTP 429) once there are any: the ok/fail
column becomes ok/fail/429 for every row (a table without 429s keeps its column as it was), and the progress line
counts the running cell's 429s beside its failures, in a shorter form where the line has no room."""

from __future__ import annotations

from pathlib import Path

import pytest

from servescope.core.results import CellResult, Dist
from servescope.engine import wire as w
from servescope.tui import messages as m
from servescope.tui.app import make_app
from servescope.tui.screens.run import RunScreen
from servescope.tui.widgets import SweepProgress
from servescope.tui.widgets.panels import OK_FAIL_429, CellTable

# the --fast lane leaves this module out: 2 tests, ~6 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

CELLS = [m.CellInfo(i, "sharegpt", f"c={c}", c, None, 20, None, "in 200-512 (uniform) / out 256 (chat)")
         for i, c in enumerate((1, 4, 8))]


def _summary(ok: int, failed: int, limited: int | None) -> CellResult:
    return CellResult(requests_ok=ok, requests_failed=failed, requests_rate_limited=limited, output_tok_s=100.0,
                      per_user_tok_s=Dist(mean=50.0))


def _header(table: CellTable) -> list[str]:
    return [str(c.label) for c in table.columns.values()]



async def test_the_ok_fail_column_counts_429s_once_a_cell_has_any(home: Path) -> None:
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(160, 48)) as pilot:
        app.switch_mode("run")
        await pilot.pause()
        run = app.screen
        assert isinstance(run, RunScreen)
        run.reset("t")
        run.post_message(m.SweepStarted(w.SweepStarted(home / "sessions" / "x", CELLS, "sim://tiny", "tiny", None,
                                                       "t", True)))
        table = run.query_one(CellTable)
        cell = CELLS[0]
        run.post_message(m.CellStarted(w.CellStarted(cell, 3)))
        run.post_message(m.CellFinished(w.CellFinished(cell, _summary(20, 0, 0), "done")))
        await pilot.pause()
        assert table.data["0"][4] == "20/0" and "ok/fail" in _header(table)  # no 429 yet: as before
        # the running cell's progress counts its 429s beside the failed
        progress = run.query_one(SweepProgress)
        run.post_message(m.CellStarted(w.CellStarted(CELLS[1], 3)))
        run.post_message(m.RequestsMeasured(w.RequestsMeasured(CELLS[1], [90.0], [10.0], [500.0], [40.0], 50, 6, 1,
                                                               3.0, rate_limited=4)))
        await pilot.pause()
        run.flush_charts()  # the counts are shown with the charts (a few times a second), so that they agree
        assert progress.rate_limited == 4
        assert "requests 6/20 done, 1 failed, 4 rate-limited (HTTP 429)   cell 3.0 s" in str(progress.render())
        run.post_message(m.CellFinished(w.CellFinished(CELLS[1], _summary(14, 1, 5), "done")))
        await pilot.pause()
        assert table.data["0"][4] == "20/0/0" and table.data["1"][4] == "14/1/5"
        assert OK_FAIL_429 in _header(table)
        # a later cell without 429s counts its zero too; a new cell's progress starts again from none
        run.post_message(m.CellStarted(w.CellStarted(CELLS[2], 3)))
        await pilot.pause()
        assert progress.rate_limited == 0 and "rate-limited" not in str(progress.render())
        run.post_message(m.CellFinished(w.CellFinished(CELLS[2], _summary(20, 0, None), "done")))
        await pilot.pause()
        assert table.data["2"][4] == "20/0/0"
        # a new sweep's table starts without the column's 429 count
        run.reset("t2")
        await pilot.pause()
        run.post_message(m.SweepStarted(w.SweepStarted(home / "sessions" / "y", CELLS, "sim://tiny", "tiny", None,
                                                       "t2", True)))
        run.post_message(m.CellStarted(w.CellStarted(cell, 3)))
        run.post_message(m.CellFinished(w.CellFinished(cell, _summary(20, 0, 0), "done")))
        await pilot.pause()
        assert table.data["0"][4] == "20/0" and "ok/fail" in _header(table) and OK_FAIL_429 not in _header(table)


async def test_the_progress_line_shortens_its_429_count_at_80_columns(home: Path) -> None:
    # a fixed clock: the cell's time runs on between the engine's batches, and the line is read whole
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"), clock=lambda: 1000.0)
    async with app.run_test(size=(80, 24)) as pilot:
        app.switch_mode("run")
        await pilot.pause()
        run = app.screen
        assert isinstance(run, RunScreen)
        run.reset("t")
        run.post_message(m.SweepStarted(w.SweepStarted(home / "sessions" / "x", CELLS, "sim://tiny", "tiny", None,
                                                       "t", True)))
        run.post_message(m.CellStarted(w.CellStarted(CELLS[1], 3)))
        run.post_message(m.RequestsMeasured(w.RequestsMeasured(CELLS[1], [90.0], [10.0], [500.0], [40.0], 50, 126,
                                                               11, 123.4, rate_limited=140)))
        await pilot.pause()
        run.flush_charts()  # the counts are shown with the charts (a few times a second), so that they agree
        progress = run.query_one(SweepProgress)
        lines = str(progress.render()).splitlines()
        # the sweep time left out; the ETA: cells 1 and 3 still to run at this cell's 0.5 s a request (20 and 3 rounds)
        assert lines[1] == "requests 126/20 done, 11 failed, 140 HTTP 429   cell 123.4 s  ETA 00:12"
        assert all(len(ln) <= progress.content_size.width for ln in lines), ([len(x) for x in lines], progress.content_size)
