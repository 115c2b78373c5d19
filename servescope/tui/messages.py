"""Messages the sweep worker posts to the app. They say what happened; widgets never see engine objects
directly, only these (posted from the worker thread with `post_message`, which is thread-safe)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from textual.message import Message


@dataclass
class CellInfo:
    """What the UI needs to know about a planned cell (a plain copy of the engine's Cell)."""

    index: int
    workload: str
    load_label: str
    concurrency: int | None
    rate: float | None
    requests: int | None
    duration_s: float | None
    shape: str = ""

    @property
    def label(self) -> str:
        return f"{self.workload} {self.load_label}"

    @property
    def x(self) -> float:
        """The load level as a number (concurrency, else rate) for curves."""
        return float(self.concurrency if self.concurrency is not None else (self.rate or 0.0))

    @classmethod
    def from_cell(cls, cell: Any) -> CellInfo:
        return cls(cell.index, cell.workload.name, cell.load.label, cell.load.concurrency, cell.load.rate,
                   cell.requests, cell.duration_s, cell.workload.shape())


class SweepStarted(Message):
    """The target answered and the session directory exists."""

    def __init__(self, session_dir: Path, cells: list[CellInfo], target: str, model: str, version: str | None,
                 tokenizer: str, metrics: bool) -> None:
        super().__init__()
        self.session_dir = session_dir
        self.cells = cells
        self.target = target
        self.model = model
        self.version = version
        self.tokenizer = tokenizer
        self.metrics = metrics


class CellStarted(Message):
    def __init__(self, cell: CellInfo, total: int) -> None:
        super().__init__()
        self.cell = cell
        self.total = total


class RequestsMeasured(Message):
    """A batch of finished requests of the running cell, already reduced to the numbers the charts use."""

    def __init__(self, cell: CellInfo, ttft_ms: list[float], tpot_ms: list[float], e2e_ms: list[float],
                 per_user_tok_s: list[float], output_tokens: int, done: int, failed: int, elapsed_s: float,
                 errors: list[tuple[str, str]] | None = None) -> None:
        super().__init__()
        self.cell = cell
        self.ttft_ms = ttft_ms
        self.tpot_ms = tpot_ms
        self.e2e_ms = e2e_ms
        self.per_user_tok_s = per_user_tok_s
        self.output_tokens = output_tokens
        self.done = done
        self.failed = failed
        self.elapsed_s = elapsed_s
        self.errors = errors or []


class CellFinished(Message):
    def __init__(self, cell: CellInfo, summary: dict[str, Any], status: str, reason: str = "") -> None:
        super().__init__()
        self.cell = cell
        self.summary = summary
        self.status = status
        self.reason = reason


class CellSkipped(Message):
    def __init__(self, cell: CellInfo, reason: str) -> None:
        super().__init__()
        self.cell = cell
        self.reason = reason


class EngineNotice(Message):
    def __init__(self, level: str, text: str) -> None:
        super().__init__()
        self.level = level
        self.text = text


class SweepFinished(Message):
    def __init__(self, session_dir: Path | None, status: str, message: str = "") -> None:
        super().__init__()
        self.session_dir = session_dir
        self.status = status  # "completed" | "interrupted" | "failed"
        self.message = message


class TargetProbed(Message):
    """A probe finished: `info` is a dict of what the server said, or `error` says why it failed."""

    def __init__(self, url: str, info: dict[str, Any] | None, error: str = "") -> None:
        super().__init__()
        self.url = url
        self.info = info
        self.error = error
