"""End to end in a real terminal (tmux, 80x24): `servescope demo` with a skip (`s`) and a stop (`x`): the
sweep runs in its own process, the skipped cell is marked `skipped`, the stopped one `stopped`; and ctrl+q
during a sweep asks, then `s` stops it and the app leaves, saying what it kept (how fast it leaves is a figure
of benchmarks/tui_quit.py)."""

from __future__ import annotations

import shutil
import sys
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import servescope
from servescope.sessions.live import runner_state
from tests.support.tmux import open_session, tmux

from .helpers import poll_until, wait_for_text

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (.ci/run installs it); the e2e tests need it")

ROOT = Path(servescope.__file__).resolve().parent.parent
DEMO_CMD = [sys.executable, "-m", "servescope", "demo"]


def screen(session: str) -> str:
    return tmux("capture-pane", "-p", "-J", "-t", session)  # -J: a wrapped line reads as one


def wait_for(session: str, needles: list[str], timeout: float, pattern: str | None = None) -> str:
    """The pane's text once it shows every needle (and `pattern`, a regex); polled, so the limit can be generous."""
    return wait_for_text(lambda: screen(session), needles, timeout, pattern)


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[str]:
    session = f"servescope-e2e-{uuid.uuid4().hex[:8]}"
    open_session(session, DEMO_CMD, ROOT, env={"SERVESCOPE_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)})
    try:
        yield session
    finally:
        tmux("kill-session", "-t", session)


def _cells(tmp_path: Path) -> list[dict[str, object]]:
    path = next((tmp_path / "sessions").iterdir())
    return list(tomllib.loads((path / "session.toml").read_text())["cells"])


def test_skip_and_stop_at_80x24(demo: str, tmp_path: Path) -> None:
    # a cell shown running has its requests in flight (a demo cell runs 8 s: the key comes well within it)
    wait_for(demo, ["cell 1/3", "[running]"], timeout=90)
    tmux("send-keys", "-t", demo, "s")
    wait_for(demo, ["cell 2/3", "[running]"], timeout=60)
    tmux("send-keys", "-t", demo, "x")
    # the finished-cells table: the "sweep interrupted" notice may cover its last row for a few seconds
    text = wait_for(demo, ["interrupted"], timeout=60, pattern=r"1\s+c=1\s+skipped\b[\s\S]*2\s+c=4\s+stopped\b")
    assert "in a thread" not in text, text
    cells = _cells(tmp_path)
    assert [c["status"] for c in cells] == ["skipped", "stopped", "planned"]
    assert cells[0]["reason"] == "skipped by the user"
    tmux("send-keys", "-t", demo, "C-q")  # the sweep has ended: the app leaves without asking
    wait_for_text(lambda: pane_command(demo), ["sleep"], 30, what="the app to leave")


def pane_command(session: str) -> str:
    """What runs in the pane now: the app's python, or the `sleep` that keeps the pane once it has left."""
    return tmux("display-message", "-p", "-t", session, "#{pane_current_command}")


def test_ctrl_q_during_a_sweep_asks_then_s_stops_it(demo: str, tmp_path: Path) -> None:
    wait_for(demo, ["cell 1/3", "[running]"], timeout=90)
    tmux("send-keys", "-t", demo, "C-q")
    wait_for(demo, ["leave it running", "stop the sweep"], timeout=30)
    tmux("send-keys", "-t", demo, "s")
    text = wait_for(demo, ["servescope: ", "stopping the sweep"], timeout=60)
    assert "servescope resume" in text
    wait_for_text(lambda: pane_command(demo), ["sleep"], 30, what="the app to leave")  # its process has ended
    path = next((tmp_path / "sessions").iterdir())
    poll_until(lambda: not runner_state(path).running, 60, "the runner to stop")
    assert _cells(tmp_path)[0]["status"] in ("stopped", "interrupted")
    assert tomllib.loads((path / "session.toml").read_text())["status"] == "interrupted"
