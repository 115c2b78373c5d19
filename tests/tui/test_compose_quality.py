"""The Compose screen's Quality pane (F9): the sweep's quality share (checked by SweepSpec's own parser, saved
and loaded with the sweep, said in the preview) and the standalone quality probe of the Target pane's server,
run here against the simulator the app starts for sim://tiny."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import Button, Input, Static, TabbedContent

from servescope.tui.app import make_app
from servescope.tui.screens.compose import ComposeScreen
from servescope.tui.widgets.table import FitTable

from .helpers import full_row, set_input, text_of, wait_until

# the --fast lane leaves this module out: 3 tests, ~15 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

SIZE = (100, 30)


def shown(app: object, wid: str) -> str:
    return text_of(app.screen.query_one(f"#{wid}", Static))  # type: ignore[attr-defined]


@pytest.mark.slow  # 10 s of the --fast lane on 2 cores
async def test_quality_share_goes_into_the_sweep_and_back(home: Path) -> None:
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        assert isinstance(screen, ComposeScreen)
        assert screen.collect().quality_share == 0.0  # empty: off
        assert "quality" not in shown(app, "preview")
        await pilot.press("f9")
        assert screen.query_one(TabbedContent).active == "tab-quality"
        assert app.focused is screen.query_one("#quality-share", Input)
        await set_input(pilot, "#quality-share", "0.9")
        assert shown(app, "quality-share-error") == (
            "quality-share: must be from 0 to 0.5; give a share of the cell's requests from 0 to 0.5, like 0.05")
        assert screen.collect() is None
        assert "fix: quality-share" in shown(app, "preview")
        await set_input(pilot, "#quality-share", "0.05")
        assert shown(app, "quality-share-error") == ""
        spec = screen.collect()
        assert spec is not None and spec.quality_share == 0.05
        assert "~5% quality probes" in shown(app, "preview")
        # saved with the sweep file and loaded back into the field
        await pilot.press("f8")
        await set_input(pilot, "#sweep-file", str(home / "q.toml"))
        await pilot.press("ctrl+s", "enter")  # ctrl+s asks where, offering the field's file: enter saves there
        await pilot.pause()
        assert "quality_share = 0.05" in (home / "q.toml").read_text()
        screen.query_one("#quality-share", Input).value = ""
        await pilot.pause()
        assert screen.collect().quality_share == 0.0
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert screen.query_one("#quality-share", Input).value == "0.05"
        assert screen.collect().quality_share == 0.05


async def test_probe_fields_are_checked_next_to_them(home: Path) -> None:
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f9")
        await set_input(pilot, "#q-tasks", "arithmetic,poetry")
        assert "unknown task 'poetry' in the tasks field" in shown(app, "q-tasks-error")
        await set_input(pilot, "#q-contexts", "100")
        assert "context 100 is too short" in shown(app, "q-contexts-error")
        await set_input(pilot, "#q-n", "0")
        assert "give the questions per task" in shown(app, "q-n-error")
        await set_input(pilot, "#q-reference", "nosuch")
        assert "no session 'nosuch'" in shown(app, "q-reference-error")
        app.screen.query_one("#q-probe", Button).press()
        await pilot.pause()
        assert shown(app, "q-status") == "✗ fix: tasks, contexts, n, reference"
        assert app.screen.quality is None  # type: ignore[attr-defined]  # nothing started


async def test_probe_quality_on_the_simulator_shows_the_result_and_saves_it(home: Path) -> None:
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=SIZE) as pilot:
        screen = app.screen
        assert isinstance(screen, ComposeScreen)
        await pilot.press("f9")
        await set_input(pilot, "#q-n", "3")
        await set_input(pilot, "#q-contexts", "1024")
        screen.query_one("#q-probe", Button).press()
        await pilot.pause()
        assert shown(app, "q-status").startswith("probing sim://tiny")
        await wait_until(pilot, lambda: shown(app, "q-status").startswith(("✓", "✗")), 120, "the quality probe")
        status = shown(app, "q-status")
        assert status.startswith("✓ quality of tiny at sim://tiny"), status
        assert shown(app, "q-log")  # the progress lines as they came
        table = screen.query_one("#q-table", FitTable)
        assert table.display
        # the table lays its rows out once it has a size (after the refresh that shows it), not with the status
        await wait_until(pilot, lambda: table.row_count == 4, 60, "the 4 task rows")
        rows = {full_row(table, i)[0]: full_row(table, i) for i in range(table.row_count)}
        assert set(rows) == {"arithmetic", "retrieval@1K", "needle@1K", "json"}
        for _task, acc, n, interval in rows.values():
            assert acc.endswith(" %") and n == "3" and interval.endswith(" %")
        assert "Wilson" in shown(app, "q-how")
        assert shown(app, "q-ppl").startswith("perplexity")
        assert shown(app, "q-div").startswith("divergence")
        saved = shown(app, "q-saved")
        assert saved.startswith("saved ")
        path = Path(saved.removeprefix("saved ").split(" (quality.json")[0])
        path = path if path.is_absolute() else home / path
        assert (path / "quality.json").is_file()
        assert path.parent == home / "sessions"
        assert screen.query_one("#q-probe", Button).label.plain == "Probe quality"


async def test_probe_quality_of_an_unreachable_server_says_why(home: Path) -> None:
    app = make_app(url="http://127.0.0.1:9", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f9")
        app.screen.query_one("#q-probe", Button).press()
        await wait_until(pilot, lambda: shown(app, "q-status").startswith(("✓", "✗")), 30, "the quality probe")
        assert "cannot connect" in shown(app, "q-status")
        assert not app.screen.query_one("#q-table", FitTable).display
        assert app.is_running and not (home / "sessions").exists()
