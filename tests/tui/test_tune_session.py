"""The app's session screen on a `servescope tune` session: its answer (best with its interval, serve line,
runner-up, cost) and the path of its search, instead of an empty cells table and charts."""

from __future__ import annotations

from pathlib import Path

from textual.widgets import DataTable, Static

from servescope.tui.app import make_app
from servescope.tui.screens.sessions import SessionScreen
from tests.sessions.tune_synth import write_tune_session

from .helpers import row_text, text_of, wait_until


async def test_a_tune_session_shows_its_best_runner_up_and_path(home: Path) -> None:
    path = write_tune_session(home / "sessions" / "20261207-012837-tune-short")
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        scr = SessionScreen(path)
        await app.push_screen(scr)
        await wait_until(pilot, lambda: bool(scr.query("#tune-path")), 10, "the tune view")
        summary = text_of(scr.query_one("#tune-summary", Static))
        assert "best: --max-num-seqs 32 at c=8: goodput 24.5 req/s (95% interval 18-30.9 req/s)" in summary
        assert "serve it: servescope sim --profile tiny --max-num-seqs 32" in summary
        assert "runner-up: --max-num-seqs 16: measured 21.2 req/s at c=8, 13% below the best [bold]x[/bold]" \
            in summary  # the why is data: shown as written
        assert "cells: 5 measured of 12 in the grid (budget 6), 2 relaunches" in summary
        table = scr.query_one("#tune-path", DataTable)
        assert table.row_count == 5
        heads = [str(getattr(c.label, "plain", c.label)) for c in table.columns.values()]
        assert heads == ["step", "server args", "users", "goodput req/s", "predicted before req/s", "why"]
        assert row_text(table, 2) == ["3", "--max-num-seqs 32 (relaunched)", "16", "0", "-", "design"]
        assert row_text(table, 3) == ["4", "--max-num-seqs 32", "8", "26", "15-29.5", "chance 62% to beat 21.2"]
        assert row_text(table, 4)[-1] == "measure again: the best"
        assert not scr.query("CellTable")  # no empty cells table or charts
        assert scr.check_action("whatif", ()) is False  # no cells a twin could be fitted to


async def test_an_unfinished_tune_session_says_so(home: Path) -> None:
    path = write_tune_session(home / "sessions" / "20261207-012837-tune-short", status="interrupted")
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        scr = SessionScreen(path)
        await app.push_screen(scr)
        await wait_until(pilot, lambda: bool(scr.query("#tune-summary")), 10, "the tune view")
        assert "no tune result: the search did not finish (session interrupted)" in text_of(
            scr.query_one("#tune-summary", Static))
        assert scr.query_one("#tune-path", DataTable).row_count == 0
