"""Where a sweep's results go: the session store's `SessionWriter` surface the runner uses, as Protocols
(the real one is `servescope.sessions.store.SessionWriter`; tests may pass their own)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Unpack

if TYPE_CHECKING:
    import polars as pl

    from servescope.core.results import CellResult
    from servescope.sessions.meta import MetaUpdate, ServerArgs, SessionMeta

__all__ = ["FINISHED", "SessionSink", "SinkFactory"]

FINISHED = ("done", "skipped")  # cell statuses a resumed sweep does not run again


class SessionSink(Protocol):
    path: Path

    @property
    def meta(self) -> SessionMeta: ...  # session.toml as written

    def update(self, **changes: Unpack[MetaUpdate]) -> None: ...  # change session.toml's tables, and save it

    def cell_statuses(self) -> dict[int, str]: ...  # each planned cell's status by its index

    # the arguments a relaunched server variant runs with ([server.variant_args])
    def set_variant_args(self, variant: int, args: ServerArgs) -> None: ...

    def add_event(self, kind: str, text: str) -> None: ...

    def write_cell(self, plan_row: Mapping[str, object], requests: pl.DataFrame | None, summary: CellResult | None,
                   suffix: str = "") -> None: ...

    def set_cell_status(self, index: int, status: str, reason: str = "") -> None: ...

    def finish(self, status: str, message: str = "") -> None: ...


class SinkFactory(Protocol):
    """Makes the session: a new one (`create`) or a resumed one (`open`)."""

    def create(self, path: Path, meta: SessionMeta, exist_ok: bool = False) -> SessionSink: ...

    def open(self, path: Path) -> SessionSink: ...
