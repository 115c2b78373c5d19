"""The docs' text captures of the app (```text blocks after a `<!-- capture: NAME -->` line in docs/app.md; they
were the README's) are what the app draws at 80x24 with the fixed data of tests/tui/fixtures.py. When a screen
changes on purpose, run `pytest tests/tui/test_docs_captures.py -s`: a capture that differs is printed, ready to
paste."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from servescope.tui.app import make_app
from servescope.tui.screens.run import RunScreen

from .test_snapshots import _feed_run

# the --fast lane leaves this module out: 1 tests, ~1 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

APP_PAGE = Path(__file__).resolve().parents[2] / "docs" / "app.md"


def captures() -> dict[str, list[str]]:
    text = APP_PAGE.read_text(encoding="utf-8")
    out = {}
    for m in re.finditer(r"<!-- capture: ([\w-]+) -->\n```text\n(.*?)\n```", text, re.S):
        out[m.group(1)] = [ln.rstrip() for ln in m.group(2).split("\n")]
    return out


def screen_lines(app: Any) -> list[str]:
    return [s.text.rstrip() for s in app.screen._compositor.render_strips()]


class Clock:
    """The sweep started 95 s ago (every call after the first)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> float:
        self.calls += 1
        return 1000.0 if self.calls == 1 else 1095.0


async def test_docs_run_screen_capture_matches_the_app(home: Path) -> None:
    """The Run screen mid-sweep: three finished cells of sharegpt, the fourth (c=32) running."""
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"), workloads_dir=home / "workloads",
                   clock=Clock())
    async with app.run_test(size=(80, 24)) as pilot:
        await _feed_run(home)(pilot)
        run = app.get_screen("run", RunScreen)
        run._update_eta()
        await pilot.pause()
        got = screen_lines(app)
    want = captures().get("run-80x24")
    if want != got:
        print("\n".join(got))
    assert want is not None, "docs/app.md has no `<!-- capture: run-80x24 -->` block"
    assert got == want
