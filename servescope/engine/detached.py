"""A sweep in a runner process of its own (`servescope run --detach`, and every sweep the app starts): it lives
in its own session (setsid: a closed SSH connection's SIGHUP never reaches it), its stdin closed and its
output in the session's runner.log, so it outlives the terminal that started it. Viewers follow it through
the session directory (servescope.sessions.live).

The runner gets its sweep (the SweepSpec and the RunContext, API key included) pickled over its stdin, never
on its command line (where `ps` shows it) nor on disk; it runs `python -m servescope.cli.detach`, which runs
the sweep as `servescope run` does.

Imported inside functions, to keep polars off the app's start-up: sessions.store (benchmarks/import_cost.py; the
README's Layout gives the figures)."""

from __future__ import annotations

import pickle
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from servescope.core.errors import ServescopeError
from servescope.engine.wire import SweepFinished, decode_item
from servescope.sessions.live import BUS_FILES, RUNNER_LOG, EventLogReader, runner_log_tail

if TYPE_CHECKING:
    from servescope.engine.spec import RunContext, SweepSpec

START_WAIT_S = 3.5  # how long `run --detach` waits to see the runner take its session (the contract: exit in 5 s)


# ---- starting a runner ---------------------------------------------------------------------------------
def session_name(spec: SweepSpec) -> str:
    """The session's name before the server is asked for its model: the sweep's name, else the model (or the
    simulator's profile) and the workloads."""
    if spec.name:
        return str(spec.name)
    who = (spec.model or "").rstrip("/").split("/")[-1]
    if not who and str(spec.url).startswith("sim://"):
        who = str(spec.url)[len("sim://"):].strip("/") or "sim"
    wl = "-".join(sorted({w.name.split("/")[0] for w in spec.workloads}))
    return f"{who or 'sweep'}-{wl}"


def start_runner(spec: SweepSpec, ctx: RunContext) -> tuple[Path, subprocess.Popen[bytes]]:
    """Start the sweep in its own runner process; the session directory and the process. The directory is
    chosen here (ctx.save_dir, else a new one under the sessions folder) so it can be printed at once."""
    from servescope.sessions.store import new_session_dir

    path = ctx.save_dir or new_session_dir(ctx.sessions_dir, session_name(spec))
    payload = pickle.dumps((spec, replace(ctx, save_dir=path)))  # before anything starts: it may not pickle
    try:
        path.mkdir(parents=True, exist_ok=True)
        log = open(path / RUNNER_LOG, "ab")  # noqa: SIM115 - handed to the child
    except OSError as e:
        raise ServescopeError(f"cannot create the session directory {path}: {e.strerror}; choose another "
                              "--save or --sessions-dir") from None
    with log:
        proc = subprocess.Popen([sys.executable, "-m", "servescope.cli.detach"], stdin=subprocess.PIPE,
                                stdout=log, stderr=log, start_new_session=True, close_fds=True)
    assert proc.stdin is not None
    try:
        proc.stdin.write(payload)
        proc.stdin.close()
    except OSError:
        pass  # it died at once: its log says why
    return path, proc


def wait_started(path: Path, proc: subprocess.Popen[bytes], wait_s: float = START_WAIT_S) -> str | None:
    """Wait until the runner's sweep has started (its event log says SweepStarted: None) or ended first (why,
    in one line). After `wait_s` it goes on alone (None): a simulator or a server may take a while to start."""
    reader = EventLogReader(path)
    deadline = time.monotonic() + wait_s
    try:
        while time.monotonic() < deadline:
            for kind, fields in reader.poll():
                if kind == "SweepStarted":
                    return None
                if kind == "SweepFinished":
                    done = decode_item(kind, fields)
                    return (done.message or done.status) if isinstance(done, SweepFinished) else "the sweep ended"
            rc = proc.poll()
            if rc is not None:
                if rc == 0:
                    return None  # a very short sweep: already done
                tail = runner_log_tail(path, 1)
                return tail.removeprefix("servescope: error: ") or f"the runner exited with code {rc}; see {path}/runner.log"
            time.sleep(0.05)
        return None
    finally:
        reader.close()


def discard_unstarted(path: Path) -> None:
    """Remove the directory of a runner that failed before its session was made (it holds only the bus files:
    the reason was already said); a directory with anything else in it stays."""
    import shutil

    try:
        if path.is_dir() and all(p.name in BUS_FILES for p in path.iterdir()):
            shutil.rmtree(path, ignore_errors=True)
    except OSError:
        pass
