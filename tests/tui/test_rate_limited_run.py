"""The Run screen counts a cell's rate-limited requests (HTTP 429) apart from its failures, and a cell the server's
rate limit refused for the most part says so in one line and in its status."""

from __future__ import annotations

from pathlib import Path

import pytest

from servescope.core.results import CellResult, Dist
from servescope.engine import wire as w
from servescope.tui import messages as m
from servescope.tui.app import make_app
from servescope.tui.screens.run import RunScreen
from servescope.tui.widgets import EventLog
from servescope.tui.widgets.panels import CellTable

# the --fast lane leaves this module out: 1 tests, ~2 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

CELLS = [m.CellInfo(i, "sharegpt", f"c={c}", c, None, 20, None, "in 200-512 (uniform) / out 256 (chat)")
         for i, c in enumerate((1, 4))]


def _summary(ok: int, failed: int, limited: int) -> CellResult:
    return CellResult(requests_ok=ok, requests_failed=failed, requests_rate_limited=limited, output_tok_s=100.0,
                      per_user_tok_s=Dist(mean=50.0), retry_after_s_max=2.0)


async def test_rate_limited_requests_are_counted_apart_and_a_mostly_limited_cell_says_so(home: Path) -> None:
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(120, 30)) as pilot:
        app.switch_mode("run")
        await pilot.pause()
        run = app.screen
        assert isinstance(run, RunScreen)
        run.reset("t")
        run.post_message(m.SweepStarted(w.SweepStarted(home / "sessions" / "x", CELLS, "sim://tiny", "tiny", None,
                                                       "t", True)))
        for cell, counts in zip(CELLS, ((18, 0, 2), (5, 1, 14)), strict=True):
            run.post_message(m.CellStarted(w.CellStarted(cell, 2)))
            run.post_message(m.CellFinished(w.CellFinished(cell, _summary(*counts), "done")))
        await pilot.pause()
        log = " ".join(" ".join(ln.text for ln in run.query_one(EventLog).lines).split())
        assert "cell 1/2 sharegpt c=1 done: 18 ok, 0 failed, 2 rate-limited (HTTP 429)," in log
        assert "cell 2/2 sharegpt c=4 done: 5 ok, 1 failed, 14 rate-limited (HTTP 429)," in log
        assert ("cell 2 rate-limited: 14 of 20 requests (70%) got HTTP 429, Retry-After up to 2 s; its figures are "
                "of the few served") in log
        assert "cell 1 rate-limited:" not in log  # 2 of 20: counted, not the cell's story
        table = run.query_one(CellTable)
        assert table.data["0"][3] == "done" and table.data["1"][3] == "done, rate-limited"
