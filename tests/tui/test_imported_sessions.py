"""Sessions imported from other tools in the app (issue 48): the Sessions screen names each one's tool where a
measured session names its server, and Compare opens them like any other, the figures a definition that differs
leaves unjudged said so."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import DataTable, Static

from servescope.sessions.importers import import_files
from servescope.tui.app import make_app
from servescope.tui.screens.sessions import SessionsScreen

from .helpers import drawn, open_compare, row_text

# the --fast lane leaves this module out: 1 tests, ~2 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

PEERS = Path(__file__).resolve().parents[1] / "sessions" / "data" / "peers"


async def test_imported_sessions_listed_with_their_tool_and_compared(home: Path) -> None:
    base = home / "sessions"
    import_files([PEERS / "guidellm-0.8.1" / "benchmarks.json"], sessions_dir=base, name="gl", workload="chat")
    import_files([PEERS / "aiperf-0.13.0"], sessions_dir=base, name="ap", workload="chat")
    app = make_app(sessions_dir=str(base))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        scr = app.screen
        assert isinstance(scr, SessionsScreen)
        t = scr.table
        rows = {row[2]: row for row in (row_text(t, i) for i in range(len(t.ordered_keys())))}
        assert "imported from GuideLLM 0.8.1" in rows["gl"] and "imported from AIPerf 0.13.0" in rows["ap"]
        await pilot.press("escape")
        cmp = await open_compare(pilot)
        assert sorted(cmp.comparison.labels) == ["AIPerf", "GuideLLM"]  # labelled by the tag that tells them apart
        assert [c.load for c in cmp.comparison.cells] == ["c=1", "c=2"]
        table = cmp.query_one("#compare-table", DataTable)
        itl = next(r for r in (row_text(table, i) for i in range(table.row_count)) if r[2] == "ITL p99 ms")
        assert any("not comparable" in x and "ITL definition" in x for x in itl)
        # the pane's head names each session's tool and what a differing definition leaves unjudged, as drawn
        head = " ".join(ln.strip() for ln in drawn(cmp.query_one("#compare-head", Static)))
        assert "measured with: GuideLLM GuideLLM 0.8.1, AIPerf AIPerf 0.13.0" in head or \
            "measured with: AIPerf AIPerf 0.13.0, GuideLLM GuideLLM 0.8.1" in head
        assert "ITL definition differs: ITL p99 ms not judged" in head
