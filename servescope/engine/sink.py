"""Where a sweep's results go: the session store's `SessionWriter` surface the runner uses, as Protocols
(the real one is `servescope.sessions.store.SessionWriter`; tests may pass their own)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import polars as pl

    from servescope.core.results import CellResult

__all__ = ["FINISHED", "SessionSink", "SinkFactory"]

FINISHED = ("done", "skipped")  # cell statuses a resumed sweep does not run again


class SessionSink(Protocol):
    path: Path
    meta: dict[str, object]  # session.toml as written; the runner sets its tables, then calls save_meta()

    def save_meta(self) -> None: ...

    def cell_statuses(self) -> dict[int, str]: ...  # each planned cell's status by its index

    # the arguments a relaunched server variant runs with ([server.variant_args])
    def set_variant_args(self, variant: int, args: Mapping[str, object]) -> None: ...

    def add_event(self, kind: str, text: str) -> None: ...

    def write_cell(self, plan_row: Mapping[str, object], requests: pl.DataFrame | None, summary: CellResult | None,
                   suffix: str = "") -> None: ...

    def set_cell_status(self, index: int, status: str, reason: str = "") -> None: ...

    def finish(self, status: str, message: str = "") -> None: ...


class SinkFactory(Protocol):
    """Makes the session: a new one (`create`) or a resumed one (`open`)."""

    def create(self, path: Path, meta: Mapping[str, object], exist_ok: bool = False) -> SessionSink: ...

    def open(self, path: Path) -> SessionSink: ...
