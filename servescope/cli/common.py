"""Helpers the command-line front end shares: tags, API keys, naming a session."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from servescope.core.errors import ServescopeError
from servescope.sessions.store import load_session, session_dirs, sessions_home


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

def resolve_session(ref: str, sessions_dir: Path | None = None) -> Any:
    """A session named by its directory, or by a prefix of its directory name under the sessions dir."""
    p = Path(ref).expanduser()
    if (p / "session.toml").is_file():
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

