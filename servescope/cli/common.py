"""Helpers the command-line front end shares: tags, API keys, naming a session, checking the paths it is given."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from servescope.core.errors import ServescopeError


def parse_tags(items: list[str]) -> dict[str, str]:
    tags = {}
    for t in items:
        k, sep, v = t.partition("=")
        if not sep or not k.strip():
            raise ServescopeError(f"bad --tag {t!r}; use KEY=VALUE, e.g. --tag quant=FP8")
        tags[k.strip()] = v.strip()
    return tags


def api_key_from(args: argparse.Namespace, env_name: str | None = None) -> str | None:
    """--api-key, else the variable named by --api-key-env (or `env_name`, the sweep's), else None."""
    if getattr(args, "api_key", None):
        return str(args.api_key)
    return os.environ.get(getattr(args, "api_key_env", None) or env_name or "OPENAI_API_KEY") or None

# the commands that write into --sessions-dir (a new session) or into --save
_WRITES_SESSIONS = frozenset({"run", "import", "quality", "tune"})
# the commands whose --save is always a new session (run's is checked by cli/run.py: it also names a live runner)
_NEW_SESSION_ONLY = frozenset({"tune", "import"})
# the path flags: (flag, attribute); each is checked by check_paths in every command that has it
_DIR_FLAGS = (("--sessions-dir", "sessions_dir"), ("--save", "save"))
_FILE_FLAGS = (("-o", "output"), ("--save-baseline", "save_baseline"), ("--markdown", "markdown"))


def check_paths(args: argparse.Namespace) -> None:
    """The one check of the paths every command is given, before it does anything: --sessions-dir and --save
    name directories (made when missing), -o/--output, --save-baseline and gate's --markdown files. A path that
    is empty, a file where a directory goes (or the reverse), under a file, or where nothing can be written (a
    read-only disk, no permission) is a one-line ServescopeError saying which flag and what to do; so is a
    --sessions-dir that does not exist for a command that only reads sessions from it."""
    cmd = getattr(args, "command", None)
    writes = cmd in _WRITES_SESSIONS or (cmd == "whatif" and getattr(args, "confirm", False))
    for flag, attr in (*_DIR_FLAGS, *_FILE_FLAGS):
        v = getattr(args, attr, None)
        if v is not None and not v.strip():  # an empty flag is a mistake, never "the default"
            raise ServescopeError(f"{flag}: empty; give a path (or leave the flag out for the default)")
    save = getattr(args, "save", None)
    if getattr(args, "sessions_dir", None):
        if not writes and not Path(args.sessions_dir).expanduser().exists():
            raise ServescopeError(f"--sessions-dir {args.sessions_dir}: no such directory; give the directory the "
                                  "sessions were saved in (see `servescope sessions --help`)")
        _dir_path("--sessions-dir", args.sessions_dir, writable=writes and not save)
    if save:
        _dir_path("--save", save, writable=True)
        p = Path(save).expanduser()
        if cmd in _NEW_SESSION_ONLY and p.is_dir() and any(p.iterdir()):
            raise ServescopeError(f"{p} already exists and is not empty; choose another --save directory")
    for flag, attr in _FILE_FLAGS:
        if getattr(args, attr, None):
            if cmd == "export" and attr == "output":  # export writes a folder of files
                _dir_path(flag, args.output, writable=True)
            else:
                _file_path(flag, getattr(args, attr))


def check_writable_session(path: Path, what: str) -> None:
    """A command that writes into an existing session (`twin fit`: SESSION/twin/) checks it can, before its
    work: a read-only disk or a directory without permission is one line."""
    if not os.access(path, os.W_OK | os.X_OK):
        raise ServescopeError(f"{what}: cannot write in {path} (a read-only disk, or no permission); copy the "
                              "session to a writable place and name the copy")


def _existing_parent(p: Path) -> Path:
    """`p`'s nearest ancestor that exists (what making `p` needs to be a writable directory)."""
    for q in p.parents:
        if q.exists():
            return q
    return Path("/")


def _dir_path(flag: str, value: str, writable: bool) -> None:
    p = Path(value).expanduser()
    if p.exists() and not p.is_dir():
        raise ServescopeError(f"{flag} {value}: a file is there, not a directory; {flag} names a directory "
                              "(made when missing): give another path")
    where = p if p.exists() else _existing_parent(p)
    if not where.is_dir():
        raise ServescopeError(f"{flag} {value}: {where} is a file, not a directory; give another path")
    if writable and not os.access(where, os.W_OK | os.X_OK):
        raise ServescopeError(f"{flag} {value}: cannot write in {where} (a read-only disk, or no permission); "
                              "give a writable path")
    if writable and _virtual(where):
        raise ServescopeError(f"{flag} {value}: {where} is a virtual filesystem (the kernel's): nothing can be saved "
                              "there; give another path")


def _virtual(p: Path) -> bool:
    """A filesystem of no blocks (/proc, /sys): the kernel's, where no file or directory can be made."""
    try:
        return os.statvfs(p).f_blocks == 0
    except OSError:
        return False


def _file_path(flag: str, value: str) -> None:
    p = Path(value).expanduser()
    if p.is_dir():
        raise ServescopeError(f"{flag} {value}: a directory is there; {flag} names a file: give a file name")
    parent = p.parent
    if not parent.is_dir():
        raise ServescopeError(f"{flag} {value}: {parent} is not a directory (make it first, or give another path)")
    if not os.access(p if p.exists() else parent, os.W_OK):
        raise ServescopeError(f"{flag} {value}: cannot write {'it' if p.exists() else f'in {parent}'} (a read-only "
                              "disk, or no permission); give a writable path")


def resolve_session(ref: str, sessions_dir: Path | None = None) -> Any:
    """A session named by its directory, or by a prefix of its directory name under the sessions dir."""
    # polars is imported when a session is needed, not by every command's path check
    from servescope.sessions.store import load_session, session_dirs, sessions_home

    p = Path(ref).expanduser()
    if (p / "session.toml").exists():  # not a file: load_session says it is damaged
        return load_session(p)
    if p.is_dir():
        raise ServescopeError(f"{ref}: not a servescope session (no session.toml in it); see `servescope sessions`")
    base = sessions_dir or sessions_home()
    dirs = session_dirs(base)
    exact = [d for d in dirs if d.name == ref]
    hits = exact or [d for d in dirs if d.name.startswith(ref)]
    if len(hits) == 1:
        return load_session(hits[0])
    if len(hits) > 1:
        shown = ", ".join(d.name for d in hits[:4]) + (" ..." if len(hits) > 4 else "")
        raise ServescopeError(f"{ref!r} names {len(hits)} sessions in {base} ({shown}); give a longer id")
    raise ServescopeError(f"no session {ref!r}: not a session directory, nor an id under {base}; "
                          "see `servescope sessions` (or pass --sessions-dir)")

