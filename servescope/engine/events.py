"""What a sweep reports, in order: the events `run_sweep()` yields (the CLI, the app and the tests are three
consumers of the same stream), and `SweepControl`, the one way in (stop the sweep, skip the cell)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servescope.core.load import CellControl
from servescope.core.records import RequestRecord
from servescope.core.results import CellSummary
from servescope.core.target import TargetInfo
from servescope.engine.plan import Cell

__all__ = ["CellFinished", "CellSkipped", "CellStarted", "Event", "KvBudgetKnown", "Notice", "RequestsDone",
           "SweepControl", "SweepFinished", "SweepStarted", "TelemetrySample"]


@dataclass
class SweepStarted:
    session_dir: Path
    cells: list[Cell]
    target: TargetInfo
    model: str
    tokenizer: str


@dataclass
class CellStarted:
    cell: Cell
    total: int  # cells in the sweep


@dataclass
class RequestsDone:
    """A batch of the running cell's finished requests (a few batches a second)."""

    cell: Cell
    records: list[RequestRecord]
    done: int
    failed: int
    elapsed_s: float


@dataclass
class CellFinished:
    cell: Cell
    summary: CellSummary  # as saved (cells.parquet summary_json is `summary.to_dict()`)
    status: str  # "done" | "stopped" | "server_lost"
    reason: str = ""


@dataclass
class CellSkipped:
    cell: Cell
    reason: str


@dataclass
class TelemetrySample:
    """The newest server /metrics sample (parsed, vLLM names) and GPU readings, a few times a second."""

    server: dict[str, float] | None
    gpus: list[dict[str, Any]] | None = None


@dataclass
class Notice:
    level: str  # "info" | "warning" | "error"
    text: str


@dataclass
class KvBudgetKnown:
    """The server's KV-cache budget, at the start and after each relaunch: `budget` is what session.toml's
    `kv_budget` holds (kv_cache_tokens, source, max_concurrency_by_workload, ...), `text` one line for people."""

    budget: dict[str, Any]
    text: str

    @property
    def level(self) -> str:  # shown like an info Notice
        return "info"


@dataclass
class SweepFinished:
    session_dir: Path
    status: str  # "completed" | "interrupted" | "failed"
    message: str = ""


Event = (SweepStarted | CellStarted | RequestsDone | CellFinished | CellSkipped | Notice | KvBudgetKnown
         | TelemetrySample | SweepFinished)


@dataclass
class SweepControl:
    """Stop the sweep (finished cells are kept) or skip the current cell. Thread-safe setters for the TUI."""

    stopping: bool = False
    cell: CellControl | None = None
    loop: asyncio.AbstractEventLoop | None = None

    def stop(self, reason: str = "stopped by the user") -> None:
        self.stopping = True
        self._stop_cell(reason)

    def skip_cell(self, reason: str = "skipped by the user") -> None:
        self._stop_cell(reason)

    def _stop_cell(self, reason: str) -> None:
        c = self.cell
        if c is None:
            return
        if self.loop is not None and self.loop.is_running():
            try:
                if asyncio.get_running_loop() is self.loop:
                    c.request_stop(reason)
                    return
            except RuntimeError:
                pass
            self.loop.call_soon_threadsafe(c.request_stop, reason)
        else:
            c.request_stop(reason)
