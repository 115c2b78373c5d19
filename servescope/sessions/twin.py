"""The twin a session holds, as stored data for reports: SESSION/twin/profile.toml's [fit] table (what was fitted,
from where, the residuals and the measured range) and SESSION/twin/confirm.jsonl (each predicted cell that was
later run for real: predicted, measured and the error per figure). Written by `servescope.engine.twin` and
`servescope.engine.whatif`; read here, without the engine, for `servescope report`
(servescope.reports.twin_doc shows it)."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field

from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text
from servescope.sessions.store import Session

TWIN_DIR = "twin"
PROFILE_FILE = "profile.toml"
CONFIRM_FILE = "confirm.jsonl"


@dataclass
class TwinRecord:
    """The files as read: each key is checked where the report reads it (a twin from another version may
    lack some, or hold others)."""

    fit: dict[str, object]
    efficiency: dict[str, object]
    confirmations: list[dict[str, object]] = field(default_factory=list)


def twin_record(session: Session) -> TwinRecord | None:
    """The session's twin, None when it has none; a damaged file is a one-line ServescopeError."""
    d = session.path / TWIN_DIR
    prof = d / PROFILE_FILE
    if not prof.is_file():
        return None
    try:
        data = tomllib.loads(prof.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ServescopeError(f"{prof}: cannot read the twin ({clean_text(str(e))}); delete it and run "
                              f"`servescope twin fit {session.path}` again") from None
    fit = as_table(data.get("fit"))
    eff = as_table(data.get("efficiency"))
    rows: list[dict[str, object]] = []
    conf = d / CONFIRM_FILE
    if conf.is_file():
        for i, line in enumerate(conf.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                raise ServescopeError(f"{conf}:{i}: not a JSON line; the file is damaged: delete the line") from None
            if isinstance(row, dict):
                rows.append(as_table(row))
    return TwinRecord(fit, eff, rows)


def as_table(v: object) -> dict[str, object]:
    return {str(k): x for k, x in v.items()} if isinstance(v, Mapping) else {}


def as_list(v: object) -> list[object]:
    return v if isinstance(v, list) else []
