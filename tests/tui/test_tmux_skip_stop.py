"""End to end in a real terminal (tmux, 80x24): `servescope demo` with a skip (`s`) and a stop (`x`): the
sweep runs in its own process, the skipped cell is marked `skipped`, the stopped one `stopped`; and ctrl+q
during a sweep asks, then `s` stops it and the app leaves within a couple of seconds, saying what it kept."""

from __future__ import annotations

import shutil
import sys
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import servescope
from tests.support.tmux import open_session, tmux

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (.ci/run installs it); the e2e tests need it")

ROOT = Path(servescope.__file__).resolve().parent.parent
DEMO_CMD = [sys.executable, "-m", "servescope", "demo"]




def screen(session: str) -> str:
    return tmux("capture-pane", "-p", "-J", "-t", session)  # -J: a wrapped line reads as one


def wait_for(session: str, needles: list[str], timeout: float) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = screen(session)
        if all(n in text for n in needles):
            return text
        time.sleep(0.3)
    raise AssertionError(f"{needles} not on screen after {timeout:g} s; the screen was:\n{text}")


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
    wait_for(demo, ["cell 1/3"], timeout=60)
    time.sleep(1.5)  # a few requests of cell 1 are in flight
    tmux("send-keys", "-t", demo, "s")
    wait_for(demo, ["cell 2/3"], timeout=30)
    time.sleep(1.5)
    tmux("send-keys", "-t", demo, "x")
    # the finished-cells table: the "sweep interrupted" notice may cover its last row for a few seconds
    text = wait_for(demo, ["interrupted", " skipped ", " stopped "], timeout=60)
    assert "in a thread" not in text, text
    cells = _cells(tmp_path)
    assert [c["status"] for c in cells] == ["skipped", "stopped", "planned"]
    assert cells[0]["reason"] == "skipped by the user"
    tmux("send-keys", "-t", demo, "C-q")


def test_ctrl_q_during_a_sweep_asks_then_s_stops_it_fast(demo: str, tmp_path: Path) -> None:
    wait_for(demo, ["cell 1/3"], timeout=60)
    time.sleep(1.5)
    tmux("send-keys", "-t", demo, "C-q")
    wait_for(demo, ["leave it running", "stop the sweep"], timeout=10)
    t0 = time.monotonic()
    tmux("send-keys", "-t", demo, "s")
    text = wait_for(demo, ["servescope: ", "stopping the sweep"], timeout=10)
    took = time.monotonic() - t0
    assert took < 2.5, f"stopping took {took:.1f} s to leave"
    assert "servescope resume" in text
    from servescope.sessions.live import runner_state

    path = next((tmp_path / "sessions").iterdir())
    deadline = time.monotonic() + 30
    while runner_state(path).running:
        assert time.monotonic() < deadline, "the runner did not stop"
        time.sleep(0.2)
    assert _cells(tmp_path)[0]["status"] in ("stopped", "interrupted")
