"""A tune session as stored data: the session directory of its best cell, and why `compare` takes the best cells
instead of the search (servescope.engine.tunerun writes the [tune] table, servescope.sessions.meta.TuneMeta types
it; servescope.reports.tunereport renders it)."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from servescope.core.textsafe import clean_text
from servescope.sessions.meta import TuneMeta

if TYPE_CHECKING:
    from servescope.sessions.store import Session


def best_cell_dir(session_dir: Path, table: TuneMeta | None) -> Path | None:
    """The session directory of the tune's best cell (its first measurement), None when it has none."""
    if table is None or table.partial or table.best is None:
        return None
    best = table.best
    for st in table.path:
        if st.cell and st.server_args == best.server_args and st.concurrency == best.concurrency:
            return session_dir / st.cell
    return None


def compare_refusal(sessions: Sequence[Session]) -> str | None:
    """Why `compare` does not take a tune session, in one line with the command that compares what a user means:
    the searches' best cells (each a session of its own under the tune's cells/); None when no session is a tune."""
    tunes = [s for s in sessions if s.info.kind == "tune"]
    if not tunes:
        return None
    names = ", ".join(clean_text(s.path.name) for s in tunes)
    what = "is a tune session" if len(tunes) == 1 else "are tune sessions"
    refs: list[str] = []
    for s in sessions:
        if s.info.kind != "tune":
            refs.append(str(s.path))
            continue
        cell = best_cell_dir(s.path, s.info.tune)
        if cell is None:
            return (f"{names} {what}, and {clean_text(s.path.name)} has no best cell (its search did "
                    f"not finish): `servescope report {s.path}` shows what it measured")
        refs.append(str(cell))
    return (f"{names} {what}: a search, whose cells are sessions of their own; compare the searches' best cells "
            f"instead: servescope compare {' '.join(shlex.quote(r) for r in refs)}")
