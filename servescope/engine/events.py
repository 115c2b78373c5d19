"""What a sweep reports, in order: the events `run_sweep()` yields (the CLI, the app and the tests are three
consumers of the same stream), and `SweepControl`, the one way in (stop the sweep, skip the cell)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from servescope.core.kvbudget import KvBudgetMeta
from servescope.core.load import CellControl
from servescope.core.records import RequestRecord
from servescope.core.results import CellResult
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
    failed: int  # rate-limited requests (HTTP 429) not among them: `rate_limited`
    elapsed_s: float
    rate_limited: int = 0


@dataclass
class CellFinished:
    cell: Cell
    summary: CellResult  # as saved (cells.parquet summary_json is `summary.to_dict()`)
    status: str  # "done" | "stopped" (ended early: `x`, Ctrl-C, failing requests) | "server_lost"
    reason: str = ""


@dataclass
class CellSkipped:
    """A cell that was not measured: it does not fit the model, or the user skipped it (`skip_cell`)."""

    cell: Cell
    reason: str


@dataclass
class TelemetrySample:
    """The newest server /metrics sample (parsed, vLLM names) and GPU readings (GpuSampler.latest: GPU_COLUMNS
    plus `gpu`, its NVML index), a few times a second."""

    server: dict[str, float] | None
    gpus: list[dict[str, float]] | None = None


@dataclass
class Notice:
    level: str  # "info" | "warning" | "error"
    text: str


@dataclass
class KvBudgetKnown:
    """The server's KV-cache budget, at the start and after each relaunch: `budget` is what session.toml's
    `kv_budget` holds (kv_cache_tokens, source, max_concurrency_by_workload, ...), `text` one line for people."""

    budget: KvBudgetMeta  # session.toml's table as the runner wrote it (telemetryhub.kv_budget_meta)
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
    """The one way into a running sweep: stop it (finished cells are kept) or skip the current cell.
    Thread-safe: the app calls it from its own thread; what touches the running cell runs on the sweep's loop.

    - `stop(reason)`: stop after the current cell, cancelling its in-flight requests (Ctrl-C in the CLI).
    - `stop(reason, let_in_flight_finish=True)`: send no more requests; the in-flight ones finish, the cell is
      saved as `stopped` and the sweep ends (the app's `x`). Called again, it cancels them.
    - `skip_cell(reason)`: cancel the current cell's requests and record it as `skipped`; the sweep goes on."""

    stopping: bool = False
    cell: CellControl | None = None
    loop: asyncio.AbstractEventLoop | None = None
    skipped: CellControl | None = None  # the running cell's control when the user skipped it

    def stop(self, reason: str = "stopped by the user", *, let_in_flight_finish: bool = False) -> str:
        """Stop the sweep; "draining" when the in-flight requests may finish, else "cancelling"."""
        again = self.stopping
        self.stopping = True
        if let_in_flight_finish and not again:
            self._on_cell(lambda c: c.request_drain(reason))
            return "draining"
        self._on_cell(lambda c: c.request_stop(reason))
        return "cancelling"

    def skip_cell(self, reason: str = "skipped by the user") -> None:
        def skip(c: CellControl) -> None:
            self.skipped = c
            c.request_stop(reason)

        self._on_cell(skip)

    def _on_cell(self, fn: Callable[[CellControl], None]) -> None:
        """Run `fn(running cell's control)` on the sweep's loop (nothing when no cell runs then)."""
        def run() -> None:
            c = self.cell
            if c is not None:
                fn(c)

        loop = self.loop
        if loop is not None and loop.is_running():
            try:
                if asyncio.get_running_loop() is loop:
                    run()
                    return
            except RuntimeError:
                pass
            try:
                loop.call_soon_threadsafe(run)
            except RuntimeError:  # the loop closed meanwhile: nothing runs any more
                pass
        else:
            run()
