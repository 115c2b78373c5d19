"""A snapshot of the Run screen's throughput chart under NO_COLOR (zoomed, 80x24): the aggregate (■, its line ·)
and per-user (◆, its line -) series, the SLO capacity (┃) and the running cell (□◇) told apart by their glyphs,
with no colour. Update with `pytest tests/tui/test_no_color_snapshots.py --snapshot-update`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from servescope.tui.app import make_app
from servescope.tui.screens.run import RunScreen

from .fixtures import live_sweep_messages

# the --fast lane leaves this module out: 1 tests, ~2 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow


def test_run_curve_no_color_80x24(home: Path, snap_compare: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")

    async def before(pilot: Any) -> None:
        app = pilot.app
        await app.switch_mode("run")
        run = app.get_screen("run", RunScreen)
        run.slos = True  # the cells' SLO verdicts: the capacity marker
        run.reset("sim://tiny: 1 workload")
        for msg in live_sweep_messages(home / "sessions" / "20261202-100000-demo"):
            run.post_message(msg)
        await pilot.pause()
        await pilot.pause()
        run.flush_charts()  # charts redraw on a 0.5 s timer; draw now so the snapshot does not race it
        await pilot.pause()
        run.query_one("#curve").focus()
        await pilot.press("z")
        await pilot.pause()

    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"), workloads_dir=home / "workloads",
                   clock=lambda: 1000.0)
    assert snap_compare(app, terminal_size=(80, 24), run_before=before)
