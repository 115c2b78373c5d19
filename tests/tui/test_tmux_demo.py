"""End to end: `servescope demo` in a real terminal (tmux), driven with send-keys, read with capture-pane.
It checks that a histogram and a finished cell are on screen, that help and the sessions screen open, then
quits with ctrl+q (stopping the sweep if it still runs) and checks the app has left and the session is saved."""

from __future__ import annotations

import shutil
import sys
import tomllib
import uuid
from pathlib import Path

import pytest

import servescope
from servescope.sessions.live import runner_state
from tests.support.tmux import open_session, tmux

from .helpers import poll_until, wait_for_text
from .test_tmux_e2e import BOTH_MARKERS, check_markers

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (.ci/run installs it); the e2e demo test needs it")

ROOT = Path(servescope.__file__).resolve().parent.parent
# TODO(lead): switch to [sys.executable, "-m", "servescope", "demo"] once `demo` calls run_app(demo=True)
DEMO_CMD = [sys.executable, "-m", "servescope", "demo"]


def wait_for(session: str, needles: list[str], timeout: float) -> str:
    return wait_for_text(lambda: tmux("capture-pane", "-p", "-t", session), needles, timeout)


def pane_command(session: str) -> str:
    """What runs in the pane: the app's python, then the `sleep` that keeps the pane once it has left."""
    return tmux("display-message", "-p", "-t", session, "#{pane_current_command}")


def test_demo_in_tmux_shows_histograms_and_a_finished_cell(tmp_path: Path) -> None:
    session = f"servescope-e2e-{uuid.uuid4().hex[:8]}"
    open_session(session, DEMO_CMD, ROOT, size=(100, 30),
                 env={"SERVESCOPE_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}, linger_s=120)
    try:
        # the demo starts the simulator and a short sweep; the run screen shows the live histograms
        screen = wait_for_text(lambda: tmux("capture-pane", "-p", "-t", session), ["cell 1/", "TTFT ms"], 90,
                               pattern=BOTH_MARKERS, what="the histograms with p50's and p99's markers")
        check_markers(screen)  # `▲50` / `99▲` / `▲50,99`, none glued to a label
        # the first cell finishes: its row in the finished-cells table (its line in the 4-line event log may already
        # have scrolled away behind the cell's warnings: on a busy machine the c=1 cell can be judged client-bound)
        screen = wait_for_text(lambda: tmux("capture-pane", "-p", "-t", session), ["sharegpt"], 90,
                               pattern=r"(?m)[│┃]\s*1\s+(?:sharegpt\s+)?c=1\s+(?:done|bound)\b",
                               what="cell 1's row, done (or done, client-bound), in the cell table")
        assert "cell 1/" in screen or "cell 2/" in screen or "cell 3/" in screen
        # keys work: help opens and closes, the sessions screen lists the demo session
        tmux("send-keys", "-t", session, "F1")
        wait_for(session, ["servescope: keys", "Skip"], timeout=30)
        tmux("send-keys", "-t", session, "Escape")
        wait_for_text(lambda: "" if "servescope: keys" in tmux("capture-pane", "-p", "-t", session) else "closed",
                      ["closed"], 30, what="the help to close")
        tmux("send-keys", "-t", session, "F4")
        wait_for(session, ["saved session", "demo", "sim://"], timeout=30)
        [path] = list((tmp_path / "sessions").iterdir())
        # ctrl+q quits: while the sweep runs it asks first (s stops it); once it has ended it leaves at once
        tmux("send-keys", "-t", session, "C-q")
        asked = wait_for_text(lambda: "leave it running" if "leave it running" in tmux(
            "capture-pane", "-p", "-t", session) else pane_command(session), [], 30,
            pattern="leave it running|sleep", what="the question, or the app gone")
        if "leave it running" in asked:
            tmux("send-keys", "-t", session, "s")
            wait_for(session, ["servescope: stopping the sweep"], timeout=60)
        wait_for_text(lambda: pane_command(session), ["sleep"], 30, what="the app to leave")
        poll_until(lambda: not runner_state(path).running, 60, "the sweep's runner to end")
        status = tomllib.loads((path / "session.toml").read_text())["status"]
        assert status == ("interrupted" if "leave it running" in asked else "completed"), status
    finally:
        tmux("kill-session", "-t", session)
