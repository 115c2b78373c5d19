"""A launched server dies with servescope, however servescope ends (kill -9 included).

A server such as `vllm serve` cannot run our code, so `ServerProcess` starts it in its own process group and
starts this guard beside it: `python -m servescope.core.orphanguard PARENT_PID PGID`. The guard polls; when its
parent (servescope) is gone it stops the server's whole group (SIGTERM, then SIGKILL after a grace period);
when the group is gone first (servescope stopped the server) it simply exits. It ignores SIGINT and SIGHUP,
and runs in a session of its own, so Ctrl-C in the terminal never ends it before servescope is done.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

POLL_S = 0.25
GRACE_S = 10.0


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def guard(parent: int, pgid: int, poll_s: float = POLL_S, grace_s: float = GRACE_S) -> int:
    """Wait while `parent` lives; then stop process group `pgid`. Returns 0 (nothing to do) or 1 (stopped it)."""
    while os.getppid() == parent:
        if not _group_alive(pgid):
            return 0
        time.sleep(poll_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    return 1


def start_guard(pgid: int) -> subprocess.Popen[bytes] | None:
    """Start the guard of process group `pgid` for this process; None where there are no process groups or
    it cannot start (the server then only dies with servescope when servescope stops it)."""
    if not hasattr(os, "killpg"):
        return None  # pragma: no cover (Windows)
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # this very servescope, installed or not
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        return subprocess.Popen([sys.executable, "-m", "servescope.core.orphanguard", str(os.getpid()), str(pgid)],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    except OSError:
        return None


def stop_guard(proc: subprocess.Popen[bytes] | None) -> None:
    """The server was stopped by servescope: the guard is not needed any more."""
    if proc is None:
        return
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5)


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        parent, pgid = int(argv[0]), int(argv[1])
    except (IndexError, ValueError):
        print("usage: python -m servescope.core.orphanguard PARENT_PID PGID", file=sys.stderr)
        return 2
    if pgid <= 1:
        return 2
    return guard(parent, pgid)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
