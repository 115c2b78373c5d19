"""Sweeps that outlive the terminal, the command-line side: the runner process's entry point (`python -m
servescope.cli.detach`, started by servescope.engine.detached for `servescope run --detach` and for every sweep
the app starts: it reads its sweep from stdin and runs it as `servescope run` would, its output going to the
session's runner.log), `servescope watch` (progress and finished-cell tables of a running sweep, from its event
log) and `servescope attach` (the app on it)."""

from __future__ import annotations

import argparse
import contextlib
import os
import pickle
import signal
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, TextIO

from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text


def runner_main() -> int:
    """The runner process: read (spec, ctx) from stdin and run the sweep, as `servescope run` would."""
    from contextlib import ExitStack

    from servescope.cli.run import open_target, run_loop_for

    with contextlib.suppress(ValueError, OSError):
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a closed terminal never ends a detached sweep
    spec, ctx = pickle.loads(sys.stdin.buffer.read())  # noqa: S301 - our own parent wrote it
    with contextlib.suppress(OSError):
        fd = os.open(os.devnull, os.O_RDONLY)
        os.dup2(fd, 0)
        os.close(fd)
    print(f"servescope runner pid {os.getpid()} started {time.strftime('%Y-%m-%d %H:%M:%S')}", flush=True)
    try:
        with ExitStack() as stack:
            if not spec.launch:
                url, label = open_target(spec.url, stack, sys.stdout)
                ctx = replace(ctx, url=url, target_label=label)
            return run_loop_for(spec, ctx, sys.stdout, sys.stdout, False)
    except ServescopeError as e:
        print(f"servescope: error: {clean_text(e.message)}", flush=True)
        return e.exit_code


# ---- choosing a session to follow --------------------------------------------------------------------------
def live_dirs(base: Path) -> list[Path]:
    """Directories under `base` whose runner is alive (a detached one still starting included), newest first."""
    from servescope.sessions.live import LOCK, runner_state

    if not base.is_dir():
        return []
    dirs = sorted((p for p in base.iterdir() if (p / LOCK).exists()), key=lambda p: p.name, reverse=True)
    return [d for d in dirs if runner_state(d).running]


def pick_session(ref: str | None, sessions_dir: Path | None) -> Path:
    """SESSION (a directory or an id), else the most recent running sweep."""
    from servescope.cli.common import resolve_session
    from servescope.sessions.live import EVENTS, LOCK
    from servescope.sessions.store import sessions_home

    base = sessions_dir or sessions_home()
    if ref is None:
        running = live_dirs(base)
        if not running:
            raise ServescopeError(f"no running sweep in {base}; name a session (see `servescope sessions`) or start "
                                  "one with `servescope run ... --detach`")
        return running[0]
    p = Path(ref).expanduser()
    if p.is_dir() and ((p / LOCK).exists() or (p / EVENTS).exists()):  # a runner's, maybe still starting
        return p
    return Path(resolve_session(ref, sessions_dir).path)


# ---- watch -------------------------------------------------------------------------------------------------
def add_watch_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("session", nargs="?", help="session directory or id (default: the most recent running sweep)")
    p.add_argument("--sessions-dir", help="where sessions are (default $SERVESCOPE_HOME/sessions or the user data dir)")


def add_attach_args(p: argparse.ArgumentParser) -> None:
    add_watch_args(p)


def attach_command(args: argparse.Namespace) -> int:
    from servescope.tui.app import run_app

    path = pick_session(args.session, Path(args.sessions_dir) if args.sessions_dir else None)
    return int(run_app(attach=path, sessions_dir=args.sessions_dir) or 0)


class _CellView:
    """A finished cell of the log, shaped as `run.format_cell` reads an engine event."""

    def __init__(self, fields: dict[str, Any]) -> None:
        from servescope.core.results import CellResult

        self.cell = fields["cell"]
        self.summary = CellResult.from_dict(fields["summary"])
        self.status = str(fields.get("status", ""))
        self.reason = str(fields.get("reason", ""))


def watch_command(args: argparse.Namespace, out: TextIO | None = None, poll_s: float = 0.2) -> int:
    """Print a running sweep's progress and each finished cell's table until it ends: exit 0 when it completes,
    1 when it fails, is interrupted or its runner dies. A finished session's log is printed as it was."""
    from servescope.cli.run import format_cell
    from servescope.engine.wire import decode_item
    from servescope.sessions.live import EventLogReader, runner_state

    out = out or sys.stdout
    path = pick_session(args.session, Path(args.sessions_dir) if args.sessions_dir else None)
    reader = EventLogReader(path)
    tty = out.isatty()
    total, progress, last_line = 0, "", 0.0
    print(f"watching {path} (ctrl+c leaves the sweep running)", file=out, flush=True)
    quiet_since, gone = time.monotonic(), 0
    try:
        while True:
            items = reader.poll()
            for kind, fields in (decode_item(k, f) for k, f in items):
                if kind == "SweepStarted":
                    total = len(fields["cells"])
                    print(clean_text(f"{fields['target']} model {fields['model']}, {total} cells, tokenizer: "
                                     f"{fields['tokenizer']}"), file=out, flush=True)
                elif kind == "CellStarted":
                    c = fields["cell"]
                    progress = f"cell {c.index + 1}/{total} {c.label}: starting"
                elif kind == "RequestsMeasured":
                    c = fields["cell"]
                    progress = (f"cell {c.index + 1}/{total} {c.label}: {fields['done']}/{c.requests or '?'} done, "
                                f"{fields['failed']} failed, {fields['elapsed_s']:.1f} s")
                elif kind == "CellFinished":
                    _clear(out, tty)
                    print(format_cell(_CellView(fields), total), file=out, flush=True)
                    progress = ""
                elif kind == "CellSkipped":
                    _clear(out, tty)
                    c = fields["cell"]
                    print(clean_text(f"cell {c.index + 1}/{total}  {c.label}  [skipped] {fields['reason']}"), file=out)
                elif kind == "EngineNotice":
                    _clear(out, tty)
                    print(clean_text(f"{fields['level']}: {fields['text']}"), file=out)
                elif kind == "SweepFinished":
                    _clear(out, tty)
                    status = str(fields["status"])
                    msg = clean_text(str(fields.get("message") or ""))
                    print(f"sweep {status}" + (f": {msg}" if msg and msg != status else "") + f"; session {path}",
                          file=out, flush=True)
                    return 0 if status == "completed" else 1
            now = time.monotonic()
            if items:
                quiet_since = now
            if progress and (tty or now - last_line >= 10.0):
                last_line = now
                if tty:
                    out.write("\r\x1b[2K" + clean_text(progress)[:200])
                    out.flush()
                else:
                    print(clean_text(progress), file=out, flush=True)
            if not items and now - quiet_since > 1.0:
                st = runner_state(path)
                gone = gone + 1 if not st.running else 0  # twice in a row, with nothing new read between
                if gone >= 2:
                    _clear(out, tty)
                    print(f"the sweep is not running: {st.reason or 'no runner'}; continue it with "
                          f"`servescope resume {path}`", file=out, flush=True)
                    return 1
                quiet_since = now
            time.sleep(poll_s)
    except KeyboardInterrupt:
        _clear(out, tty)
        print(f"stopped watching; the sweep goes on (servescope watch {path})", file=out)
        return 130
    finally:
        reader.close()


def _clear(out: TextIO, tty: bool) -> None:
    if tty:
        out.write("\r\x1b[2K")
        out.flush()


if __name__ == "__main__":
    sys.exit(runner_main())
