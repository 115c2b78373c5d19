"""One tmux server for the test session's terminal tests, on a socket of its own.

A tmux server exits when its last session is killed; a test that starts a session at that moment gets
"server exited unexpectedly". The server here holds a placeholder session for as long as the test process
runs, so killing a test's session never takes the server down; it is killed when the tests end. Other tmux
users on the machine are never touched."""

from __future__ import annotations

import atexit
import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

SOCKET = f"servescope-tests-{os.getpid()}"
_started = False


def _env() -> dict[str, str]:
    """The environment the server (and so every pane) starts from: the app's colours and engine choice are
    its own, never the test runner's."""
    env = {**os.environ, "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    env.pop("SERVESCOPE_ENGINE", None)
    env.pop("TMUX", None)
    return env


def tmux(*args: str) -> str:
    """Run one tmux command on the tests' server; its stdout."""
    return subprocess.run(["tmux", "-L", SOCKET, *args], capture_output=True, text=True, timeout=20,
                          check=False, env=_env()).stdout


def _kill_server() -> None:
    subprocess.run(["tmux", "-L", SOCKET, "kill-server"], capture_output=True, timeout=20, check=False)


def _ensure_server() -> None:
    global _started
    if _started:
        return
    subprocess.run(["tmux", "-L", SOCKET, "new-session", "-d", "-s", "keepalive", "sleep 86400"],
                   check=True, capture_output=True, timeout=20, env=_env())
    atexit.register(_kill_server)
    _started = True


def open_session(name: str, argv: Sequence[str], cwd: Path, size: tuple[int, int] = (80, 24),
                 env: Mapping[str, str] | None = None, linger_s: int = 30) -> None:
    """Start `argv` in a new session `name` of `size` (columns, rows), with `env` set in it; the pane stays
    `linger_s` seconds after the command ends, so its last screen can still be read."""
    _ensure_server()
    sets = [a for k, v in (env or {}).items() for a in ("-e", f"{k}={v}")]
    cmd = f"{shlex.join(argv)}; sleep {linger_s}"
    p = subprocess.run(["tmux", "-L", SOCKET, "new-session", "-d", "-s", name, "-x", str(size[0]), "-y",
                        str(size[1]), "-c", str(cwd), *sets, cmd], capture_output=True, text=True, timeout=20,
                       env=_env())
    if p.returncode != 0:
        raise RuntimeError(f"tmux new-session {name} failed: {p.stderr.strip()}")
