"""End to end in a real terminal (tmux, 80x24): `servescope attach` opens on a sweep running in its own
process (finished cells rebuilt from the session's event log, the running cell's live histogram) and `s`
skips the running cell; a sweep started in the app goes on when the app's terminal is closed (SIGHUP) and
can be attached again."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from servescope.sessions.live import runner_state, send_command
from tests.support.tmux import open_session, tmux
from tests.tui.test_tmux_skip_stop import ROOT, wait_for

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None,
                                reason="tmux is not installed (.ci/run installs it); the e2e tests need it")

SLOW = """
[workload]
name = "slow"
input_tokens = 64
output_tokens = 300
"""


@pytest.fixture
def term(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A tmux session name (not started yet) and the SERVESCOPE_HOME its commands use; killed at the end."""
    name = f"servescope-det-{uuid.uuid4().hex[:8]}"
    yield name, tmp_path
    tmux("kill-session", "-t", name)
    for d in (tmp_path / "sessions").glob("*"):  # never leave a runner behind
        if runner_state(d).running:
            send_command(d, "stop")
            send_command(d, "stop")


def _open(name: str, home: Path, *argv: str) -> None:
    open_session(name, [sys.executable, "-m", "servescope", *argv], ROOT,
                 env={"SERVESCOPE_HOME": str(home), "PYTHONPATH": str(ROOT)})


def _cells(path: Path) -> list[dict[str, object]]:
    return list(tomllib.loads((path / "session.toml").read_text())["cells"])


def _wait(pred: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_attach_mid_sweep_rebuilds_it_and_s_skips_the_running_cell(term: tuple[str, Path]) -> None:
    name, home = term
    (home / "slow.toml").write_text(SLOW)
    p = subprocess.run([sys.executable, "-m", "servescope", "run", "--url", "sim://tiny", "-w", str(home / "slow.toml"),
                        "-c", "1,2,3", "-n", "6", "--detach"], capture_output=True, text=True, timeout=30, cwd=ROOT,
                       env={**os.environ, "SERVESCOPE_HOME": str(home), "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    path = Path(p.stdout.strip().splitlines()[-1])
    _wait(lambda: (path / "session.toml").exists() and _cells(path)[0]["status"] == "done", 60, "the first cell")
    _open(name, home, "attach", str(path))
    # the finished cell (from the log, before the app opened) and the running cell's live histogram
    text = wait_for(name, ["cell 2/3", "[running]", "1  c=1   done", "TTFT ms  p50"], timeout=30)
    assert "n=" in text and "sweep 00:" in text, text
    tmux("send-keys", "-t", name, "s")
    _wait(lambda: _cells(path)[1]["status"] == "skipped", 30, "cell 2 to be skipped")
    assert _cells(path)[1]["reason"] == "skipped by the user"
    wait_for(name, ["completed"], timeout=60)  # cell 3 ran: the skip hit only the running cell
    assert [c["status"] for c in _cells(path)] == ["done", "skipped", "done"]


def test_a_closed_terminal_leaves_the_apps_sweep_running_and_attachable(term: tuple[str, Path]) -> None:
    name, home = term
    _open(name, home, "demo")
    wait_for(name, ["cell 1/3", "[running]"], timeout=60)
    [path] = list((home / "sessions").iterdir())
    pid = runner_state(path).pid
    assert pid and runner_state(path).running
    tmux("kill-session", "-t", name)  # the terminal goes away: SIGHUP to the app
    time.sleep(2.0)
    st = runner_state(path)
    assert st.running and st.pid == pid, st
    _open(name, home, "attach")  # the most recent running sweep
    text = wait_for(name, ["[running]", "cell "], timeout=30)
    assert path.name[:15] in text or "sweep 00:" in text, text
    tmux("send-keys", "-t", name, "C-q")
    wait_for(name, ["leave it running"], timeout=10)
    tmux("send-keys", "-t", name, "s")
    _wait(lambda: not runner_state(path).running, 30, "the sweep to stop")
    assert tomllib.loads((path / "session.toml").read_text())["status"] == "interrupted"
