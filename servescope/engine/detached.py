"""A sweep in a runner process of its own (`servescope run --detach`, and every sweep the app starts): it lives
in its own session (setsid: a closed SSH connection's SIGHUP never reaches it), its stdin closed and its
output in the session's runner.log, so it outlives the terminal that started it. Viewers follow it through
the session directory (servescope.sessions.live).

Its output reaches runner.log through the log filter (servescope.core.secrets.start_log_pump), which keeps the
API key and the launch command's secrets out of the file; the filter ends when the runner and its children have.

The runner gets its sweep (the SweepSpec and the RunContext, API key included) pickled over its stdin, never
on its command line (where `ps` shows it) nor on disk; it runs `python -m servescope.cli.detach`, which runs
the sweep as `servescope run` does.

Imported inside functions, to keep polars off the app's start-up: sessions.store (benchmarks/import_cost.py; the
docs/developer.md's Layout gives the figures)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from servescope.core.errors import ServescopeError
from servescope.core.secrets import command_secrets, env_secrets, start_log_pump
from servescope.engine.wire import SweepFinished, decode_item
from servescope.sessions.live import BUS_FILES, RUNNER_LOG, EventLogReader, runner_log_tail

if TYPE_CHECKING:
    from servescope.engine.spec import RunContext, SweepSpec

START_WAIT_S = 3.5  # how long `run --detach` waits to see the runner take its session (the contract: exit in 5 s)
_LOG_PUMPS: dict[int, subprocess.Popen[bytes]] = {}  # runner pid -> the process writing its runner.log


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
        log = open(path / RUNNER_LOG, "ab")  # noqa: SIM115 - handed to the log filter
    except OSError as e:
        raise ServescopeError(f"cannot create the session directory {path}: {e.strerror}; choose another "
                              "--save or --sessions-dir") from None
    with log:
        try:
            pump, out = start_log_pump(log, runner_secrets(spec, ctx))
        except OSError as e:
            raise ServescopeError(f"cannot start the runner's log filter: {e.strerror or e}") from None
    try:
        proc = subprocess.Popen([sys.executable, "-m", "servescope.cli.detach"], stdin=subprocess.PIPE,
                                stdout=out, stderr=out, start_new_session=True, close_fds=True)
    except BaseException:
        os.close(out)
        pump.wait()  # nothing holds its pipe now: it ends at once
        raise
    os.close(out)  # the runner and its children hold it now: the filter ends when they all have
    _LOG_PUMPS[proc.pid] = pump
    # the filter is this process's child: reaped when it ends (no `<defunct>` left in the app)
    threading.Thread(target=_reap_pump, args=(proc.pid, pump), name="servescope-reap-log-filter", daemon=True).start()
    assert proc.stdin is not None
    try:
        proc.stdin.write(payload)
        proc.stdin.close()
    except OSError:
        pass  # it died at once: its log says why
    return path, proc


def runner_secrets(spec: SweepSpec, ctx: RunContext) -> list[str]:
    """What runner.log must never hold: the API key, the secrets of the launch command and of its variants, and
    those of this environment (the runner's, and a launched server's, unless the command sets its own)."""
    out = [ctx.api_key or "", *command_secrets(spec.launch), *env_secrets(os.environ)]
    for v in spec.variants:
        out += command_secrets(v)
    return [s for s in out if s]


def _reap_pump(pid: int, pump: subprocess.Popen[bytes]) -> None:
    pump.wait()
    _LOG_PUMPS.pop(pid, None)


def _runner_log_written(proc: subprocess.Popen[bytes], timeout_s: float = 5.0) -> None:
    """Wait (at most `timeout_s`) for the log filter of the ended runner `proc` to write its last lines."""
    pump = _LOG_PUMPS.pop(proc.pid, None)
    if pump is not None:
        try:
            pump.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:  # a child of the runner still holds the pipe: read what is there
            pass


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
                _runner_log_written(proc)
                tail = runner_log_tail(path, 1)
                return tail.removeprefix("servescope run: error: ") or f"the runner exited with code {rc}; see {path}/runner.log"
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
