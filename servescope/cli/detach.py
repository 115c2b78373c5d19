"""Sweeps that outlive the terminal, the command-line side: the runner process's entry point (`python -m
servescope.cli.detach`, started by servescope.engine.detached for `servescope run --detach` and for every sweep
the app starts: it reads its sweep from stdin and runs it as `servescope run` would, its output going to the
session's runner.log), `servescope watch` (progress and finished-cell tables of a running sweep, from its event
log) and `servescope attach` (the app on it).

Imported inside a function: the app (textual) only for `servescope attach`, so that `watch` stays headless."""

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
from typing import TextIO

from servescope.cli.common import resolve_session
from servescope.cli.run import format_cell, open_target, run_loop_for
from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text
from servescope.engine import wire as w
from servescope.engine.serving import sim_serving_args
from servescope.reports.tunereport import is_tune_session, running_of
from servescope.sessions.live import EVENTS, LOCK, EventLogReader, runner_state
from servescope.sessions.store import load_session, sessions_home


def runner_main() -> int:
    """The runner process: read (spec, ctx) from stdin and run the sweep, as `servescope run` would."""
    from contextlib import ExitStack

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
                url, label = open_target(spec.url, stack, sys.stdout, sim_serving_args(spec.workloads))
                ctx = replace(ctx, url=url, target_label=label)
            return run_loop_for(spec, ctx, sys.stdout, sys.stdout, False)
    except ServescopeError as e:
        print(f"servescope run: error: {clean_text(e.message)}", flush=True)  # as the command would say it
        return e.exit_code


# ---- choosing a session to follow --------------------------------------------------------------------------
def live_dirs(base: Path) -> list[Path]:
    """Directories under `base` whose runner is alive (a detached one still starting included), newest first."""
    if not base.is_dir():
        return []
    dirs = sorted((p for p in base.iterdir() if (p / LOCK).exists()), key=lambda p: p.name, reverse=True)
    return [d for d in dirs if runner_state(d).running]


def pick_session(ref: str | None, sessions_dir: Path | None) -> Path:
    """SESSION (a directory or an id), else the most recent running sweep or tune."""
    base = sessions_dir or sessions_home()
    if ref is None:
        running = live_dirs(base)
        if not running:
            raise ServescopeError(f"no running sweep or tune in {base}; name a session (see `servescope sessions`) or start "
                                  "one with `servescope run ... --detach`")
        return running[0]
    p = Path(ref).expanduser()
    if p.is_dir() and ((p / LOCK).exists() or (p / EVENTS).exists()):  # a runner's, maybe still starting
        return p
    return Path(resolve_session(ref, sessions_dir).path)


def attach_command(args: argparse.Namespace) -> int:
    from servescope.tui.app import run_app

    path = pick_session(args.session, Path(args.sessions_dir) if args.sessions_dir else None)
    return int(run_app(attach=path, sessions_dir=args.sessions_dir) or 0)


def tune_watch_refusal(path: Path) -> str:
    """Why `watch` does not follow a tune session, in one line with the commands that do: `attach` (the app's live
    tune view) and, while a cell is measured, `watch` on that cell."""
    import tomllib

    cell = ""
    try:
        meta = tomllib.loads((path / "session.toml").read_text(encoding="utf-8"))
        run = running_of(meta.get("tune"))
        if run is not None and runner_state(path).running:
            cell = f"; or the cell it measures now: servescope watch {path / str(run.get('cell'))}"
    except (OSError, ValueError):
        pass
    return (f"{path.name} is a tune session: watch follows sweeps; follow the search (its path, best so far and "
            f"the running cell) with servescope attach {path}{cell}")


def watch_command(args: argparse.Namespace, out: TextIO | None = None, poll_s: float = 0.2) -> int:
    """Print a running sweep's progress and each finished cell's table until it ends: exit 0 when it completes,
    1 when it fails, is interrupted or its runner dies. A finished session's log is printed as it was."""
    out = out or sys.stdout
    path = pick_session(args.session, Path(args.sessions_dir) if args.sessions_dir else None)
    if is_tune_session(path):
        raise ServescopeError(tune_watch_refusal(path))
    reader = EventLogReader(path)
    tty = out.isatty()
    total, progress, last_line = 0, "", 0.0
    print(f"watching {path} (ctrl+c leaves the sweep running)", file=out, flush=True)
    quiet_since, gone = time.monotonic(), 0
    try:
        while True:
            items = reader.poll()
            for item in (w.decode_item(k, f) for k, f in items):
                if isinstance(item, w.SweepStarted):
                    total = len(item.cells)
                    print(clean_text(f"{item.target} model {item.model}, {total} cells, tokenizer: "
                                     f"{item.tokenizer}"), file=out, flush=True)
                elif isinstance(item, w.CellStarted):
                    c = item.cell
                    progress = f"cell {c.index + 1}/{total} {c.label}: starting"
                elif isinstance(item, w.RequestsMeasured):
                    c = item.cell
                    progress = (f"cell {c.index + 1}/{total} {c.label}: {item.done}/{c.requests or '?'} done, "
                                f"{item.failed} failed, {item.elapsed_s:.1f} s")
                elif isinstance(item, w.CellFinished):
                    _clear(out, tty)
                    print(format_cell(item, total), file=out, flush=True)
                    progress = ""
                elif isinstance(item, w.CellSkipped):
                    _clear(out, tty)
                    c = item.cell
                    print(clean_text(f"cell {c.index + 1}/{total}  {c.label}  [skipped] {item.reason}"), file=out)
                elif isinstance(item, w.EngineNotice):
                    _clear(out, tty)
                    print(clean_text(f"{item.level}: {item.text}"), file=out)
                elif isinstance(item, w.SweepFinished):
                    _clear(out, tty)
                    status = item.status
                    msg = clean_text(item.message)
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
                    return _ended(path, st.reason or "no runner", reader.bad_lines, out)
                quiet_since = now
            time.sleep(poll_s)
    except KeyboardInterrupt:
        _clear(out, tty)
        print(f"stopped watching; the sweep goes on (servescope watch {path})", file=out)
        return 130
    finally:
        reader.close()


def _ended(path: Path, reason: str, bad_lines: int, out: TextIO) -> int:
    """The runner is gone and its event log never said how the sweep ended: session.toml says (a completed
    session is completed whatever its log holds); a damaged log is said as such. Exit 0 only when completed."""
    log = (f"; its event log {path / EVENTS} is damaged ({bad_lines} unreadable line{'s' * (bad_lines != 1)}), "
           "so the progress above is incomplete" if bad_lines else "")
    status, message = "interrupted", ""
    if (path / "session.toml").exists():
        try:
            s = load_session(path)
            status, message = s.status, clean_text(str(s.meta.get("message") or ""))
        except ServescopeError as e:
            print(f"the sweep is not running and its session is broken: {clean_text(e.message)}{log}", file=out,
                  flush=True)
            return 1
    if status in ("completed", "failed"):
        print(f"sweep {status}" + (f": {message}" if message and message != status else "") + f"; session {path}"
              + log, file=out, flush=True)
        return 0 if status == "completed" else 1
    print(f"the sweep is not running: {reason}; continue it with `servescope resume {path}`{log}", file=out,
          flush=True)
    return 1


def _clear(out: TextIO, tty: bool) -> None:
    if tty:
        out.write("\r\x1b[2K")
        out.flush()


if __name__ == "__main__":
    sys.exit(runner_main())
