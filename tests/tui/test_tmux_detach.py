"""End to end in a real terminal (tmux, 80x24): `servescope attach` opens on a sweep running in its own
process (finished cells rebuilt from the session's event log, the running cell's live histogram) and `s`
skips the running cell; a sweep started in the app goes on when the app's terminal is closed (SIGHUP) and
can be attached again."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from servescope.sessions.live import EventLogReader, runner_state, send_command
from tests.support.tmux import open_session, tmux
from tests.tui.test_tmux_skip_stop import ROOT, wait_for

from .helpers import poll_until

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
    poll_until(pred, timeout, what)  # type: ignore[arg-type]


def _alive(pid: int) -> bool:
    """Is process `pid` still running (a zombie, dead but not reaped yet, is not)?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _app_pid(name: str, runner_pid: int) -> int:
    """The app's process in tmux session `name`: the pane's shell's child (the runner is a process apart)."""
    shell = int(tmux("display-message", "-p", "-t", name, "#{pane_pid}").strip())
    kids = [int(k) for k in Path(f"/proc/{shell}/task/{shell}/children").read_text().split()]
    [pid] = [k for k in kids if k != runner_pid]
    return pid


def test_attach_mid_sweep_rebuilds_it_and_s_skips_the_running_cell(term: tuple[str, Path]) -> None:
    name, home = term
    (home / "slow.toml").write_text(SLOW)
    # cell 1 runs its 10 requests at once (one round, about a second), cell 3 in two; cell 2 one by one (ten rounds),
    # so it is still running when the app has opened on it and `s` arrives, even on a loaded machine
    p = subprocess.run([sys.executable, "-m", "servescope", "run", "--url", "sim://tiny", "-w", str(home / "slow.toml"),
                        "-c", "10,1,5", "-n", "10", "--detach"], capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env={**os.environ, "SERVESCOPE_HOME": str(home), "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    path = Path(p.stdout.strip().splitlines()[-1])
    _wait(lambda: (path / "session.toml").exists() and _cells(path)[0]["status"] == "done", 90, "the first cell")
    _open(name, home, "attach", str(path))
    # the finished cell (from the log, before the app opened) and the running cell's live histogram
    text = wait_for(name, ["cell 2/3", "[running]", "TTFT ms  p50"], timeout=60, pattern=r"1\s+c=10\s+(?:done|bound)\b")
    assert "n=" in text and "sweep 00:" in text, text
    tmux("send-keys", "-t", name, "s")
    _wait(lambda: _cells(path)[1]["status"] == "skipped", 60, "cell 2 to be skipped")
    assert _cells(path)[1]["reason"] == "skipped by the user"
    wait_for(name, ["completed"], timeout=90)  # cell 3 ran: the skip hit only the running cell
    assert [c["status"] for c in _cells(path)] == ["done", "skipped", "done"]


def test_a_closed_terminal_leaves_the_apps_sweep_running_and_attachable(term: tuple[str, Path]) -> None:
    name, home = term
    _open(name, home, "demo")
    wait_for(name, ["cell 1/3", "[running]"], timeout=90)
    [path] = list((home / "sessions").iterdir())
    pid = runner_state(path).pid
    assert pid and runner_state(path).running
    app = _app_pid(name, pid)
    tmux("kill-session", "-t", name)  # the terminal goes away: SIGHUP to the app
    _wait(lambda: not _alive(app), 60, f"the app (pid {app}) to end")
    # the sweep goes on without the app: the same runner holds the session and measures new requests
    log = EventLogReader(path)
    while log.poll():  # what was written while the app was there
        pass
    _wait(lambda: any(kind == "RequestsMeasured" for kind, _ in log.poll()), 60, "requests measured after the app left")
    log.close()
    st = runner_state(path)
    assert st.running and st.pid == pid, st
    _open(name, home, "attach")  # the most recent running sweep
    text = wait_for(name, ["[running]", "cell "], timeout=60)
    assert path.name[:15] in text or "sweep 00:" in text, text
    tmux("send-keys", "-t", name, "C-q")
    wait_for(name, ["leave it running"], timeout=30)
    tmux("send-keys", "-t", name, "s")
    _wait(lambda: not runner_state(path).running, 60, "the sweep to stop")
    assert tomllib.loads((path / "session.toml").read_text())["status"] == "interrupted"
