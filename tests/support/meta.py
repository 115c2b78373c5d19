"""Session tables for tests, typed as the store writes and reads them (servescope.sessions.meta.SessionMeta): a
test names session.toml's keys as the file holds them, and gets the Struct, or changes a test session's table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from servescope.sessions.meta import QualityMeta, SessionMeta
from servescope.sessions.store import Session, SessionWriter, toml_clean


def meta_of(**table: object) -> SessionMeta:
    """A session's table from session.toml's keys (`import` for the import table), checked as a file's is."""
    return SessionMeta.from_dict(table, "test")


def set_meta(w: SessionWriter, **table: object) -> None:
    """Change keys of a test session's table (as session.toml holds them: nested tables as dicts) and save it."""
    w.meta = SessionMeta.from_dict({**toml_clean(w.meta.to_table()), **table}, "test")
    w.save_meta()


def stored(session: Session) -> dict[str, Any]:
    """A session's table as its session.toml holds it (plain TOML values), for tests that assert on what is kept."""
    return toml_clean(session.info.to_table())


def quality_settings(table: Mapping[str, object]) -> QualityMeta:
    """The quality probe's settings as a [quality] table holds them (keys the table has no place for are dropped)."""
    return msgspec.convert(dict(table), QualityMeta)
