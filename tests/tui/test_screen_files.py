"""F12 saves the screen as SVG into the session's folder (the sessions folder when no session is shown) with a
toast naming the file; `h` on a saved session writes report.html and report.md into its folder and shows their
paths."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from textual.widgets import Footer

from servescope.tui.app import make_app
from servescope.tui.screens.sessions import SessionScreen, SessionsScreen
from servescope.tui.widgets.panels import short_path
from tests.support.meta import quality_settings

from .fixtures import write_session

# the --fast lane leaves this module out: 3 tests, ~11 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

SIZE = (80, 24)


def toasts(app: object) -> list[str]:
    return [str(n.message) for n in app._notifications]  # type: ignore[attr-defined]


async def test_f12_saves_the_screen_where_the_session_is(home: Path) -> None:
    base = home / "sessions"
    path = write_session(base, "qwen", "2026-12-01T10:00:00+0000", {"quant": "FP8"})
    app = make_app(sessions_dir=str(base))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f12")  # the Compose screen: no session, the sessions folder
        await pilot.pause()
        shots = sorted(base.glob("screen-compose-*.svg"))
        assert len(shots) == 1 and ET.parse(shots[0]).getroot().tag.endswith("svg")
        assert any(t.startswith("saved the screen as ") and shots[0].name in t for t in toasts(app))
        await pilot.press("f4")
        await pilot.pause()
        assert isinstance(app.screen, SessionsScreen)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, SessionScreen)
        await pilot.press("f12")
        await pilot.pause()
        (shot,) = path.glob("screen-session-*.svg")
        assert "qwen" in shot.read_text()  # the session's own screen, drawn as SVG
        assert any(shot.name in t for t in toasts(app))


async def test_h_writes_the_reports_and_shows_their_paths(home: Path) -> None:
    pytest.importorskip("matplotlib")
    base = home / "sessions"
    path = write_session(base, "qwen", "2026-12-01T10:00:00+0000", {"quant": "FP8"}, loads=(1, 4))
    app = make_app(sessions_dir=str(base))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        scr = app.screen
        assert isinstance(scr, SessionScreen)
        await pilot.press("h")
        await pilot.pause()
        await app.workers.wait_for_complete()
        await pilot.pause()
        html, md = path / "report.html", path / "report.md"
        assert html.is_file() and md.is_file()
        assert "<svg" in html.read_text() and md.read_text().startswith("# servescope report: qwen")
        shown = "\n".join(toasts(app))
        assert f"report.html: {short_path(html)}" in shown and f"report.md: {short_path(md)}" in shown
        # the footer lists the new key beside the app's F1-F3
        shown = {k for k, ab in scr.active_bindings.items() if ab.binding.show}
        assert {"f1", "f2", "f3", "h"} <= shown
        assert scr.query_one(Footer).display


async def test_a_session_with_quality_keeps_f1_to_f3_in_its_footer(home: Path) -> None:
    from servescope.sessions.store import SessionWriter

    from .test_compare_quality import result

    base = home / "sessions"
    path = write_session(base, "qwen", "2026-12-01T10:00:00+0000", {"quant": "FP8"}, loads=(1,))
    SessionWriter.open(path).write_quality(result((100, 100), (10, 10), 0.012), quality_settings({"n": 100}))
    app = make_app(sessions_dir=str(base))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f4", "enter")
        await pilot.pause()
        scr = app.screen
        assert isinstance(scr, SessionScreen) and scr.quality is not None
        shown = {k for k, ab in scr.active_bindings.items() if ab.binding.show}
        assert {"f1", "f2", "f3", "q"} <= shown and "h" not in shown  # no room for `h Report`: F1 lists it
        assert "h" in scr.active_bindings  # the key still works
