"""End to end: `servescope demo` in a real terminal (tmux), driven with send-keys, read with capture-pane.
It checks that a histogram and a finished cell are on screen, then quits with ctrl+q."""

from __future__ import annotations

import shutil
import sys
import time
import uuid
from pathlib import Path

import pytest

import servescope
from tests.support.tmux import open_session, tmux

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (.ci/run installs it); the e2e demo test needs it")

ROOT = Path(servescope.__file__).resolve().parent.parent
# TODO(lead): switch to [sys.executable, "-m", "servescope", "demo"] once `demo` calls run_app(demo=True)
DEMO_CMD = [sys.executable, "-m", "servescope", "demo"]




def wait_for(session: str, needles: list[str], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    screen = ""
    while time.monotonic() < deadline:
        screen = tmux("capture-pane", "-p", "-t", session)
        if all(n in screen for n in needles):
            return screen
        time.sleep(0.5)
    raise AssertionError(f"{needles} not on screen after {timeout:g} s; the screen was:\n{screen}")


def test_demo_in_tmux_shows_histograms_and_a_finished_cell(tmp_path: Path) -> None:
    session = f"servescope-e2e-{uuid.uuid4().hex[:8]}"
    open_session(session, DEMO_CMD, ROOT, size=(100, 30),
                 env={"SERVESCOPE_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}, linger_s=5)
    try:
        # the demo starts the simulator and a short sweep; the run screen shows the live histograms
        wait_for(session, ["cell 1/", "TTFT ms", "▲50", "▲99"], timeout=60)
        # the first cell finishes: its line in the event log and its row in the cell table
        screen = wait_for(session, ["✓ cell 1/", "done"], timeout=60)
        assert "sharegpt" in screen
        # keys work: help opens and closes, the sessions screen lists the demo session, ctrl+q quits
        tmux("send-keys", "-t", session, "F1")
        wait_for(session, ["servescope: keys", "Skip"], timeout=10)
        tmux("send-keys", "-t", session, "Escape")
        tmux("send-keys", "-t", session, "F4")
        wait_for(session, ["demo", "sim://"], timeout=10)
        tmux("send-keys", "-t", session, "C-q")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and "TTFT ms" in tmux("capture-pane", "-p", "-t", session):
            time.sleep(0.3)
        assert "session.toml" in {p.name for p in next((tmp_path / "sessions").iterdir()).iterdir()}
    finally:
        tmux("kill-session", "-t", session)
