"""Messages the sweep worker posts to the app. They say what happened; widgets never see engine objects
directly, only these (posted from the worker thread with `post_message`, which is thread-safe)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from textual.message import Message

from servescope.core.results import CellResult
from servescope.tui.wire import CellInfo

__all__ = ["CellFinished", "CellInfo", "CellSkipped", "CellStarted", "EngineNotice", "RequestsMeasured",
           "SweepFinished", "SweepStarted", "TargetProbed", "TelemetryMeta", "TelemetryUpdated", "from_wire"]


class SweepStarted(Message):
    """The target answered and the session directory exists."""

    def __init__(self, session_dir: Path, cells: list[CellInfo], target: str, model: str, version: str | None,
                 tokenizer: str, metrics: bool, engine_pid: int = 0, started_at: float | None = None,
                 engine: str = "") -> None:
        super().__init__()
        self.engine = engine  # the engine and its version, e.g. "vLLM 0.32.0", "llama.cpp b4512" (older logs: "")
        self.started_at = started_at  # epoch seconds, when read from the session's event log
        self.engine_pid = engine_pid  # the process the engine runs in (the app's own in thread mode)
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
    """A batch of finished requests of the running cell, already reduced to the numbers the charts use.
    `turns` and `cached` run parallel to `ttft_ms` (one entry per successful request with a TTFT): the request's
    turn (0: single-turn) and [cached prompt tokens or None, prompt tokens or None]. Event logs written before
    they existed have neither: they are then empty (and ignored unless as long as `ttft_ms`)."""

    def __init__(self, cell: CellInfo, ttft_ms: list[float], tpot_ms: list[float], e2e_ms: list[float],
                 per_user_tok_s: list[float], output_tokens: int, done: int, failed: int, elapsed_s: float,
                 errors: list[tuple[str, str]] | None = None, turns: list[int] | None = None,
                 cached: list[Any] | None = None) -> None:
        super().__init__()
        self.turns = list(turns) if isinstance(turns, list) and len(turns) == len(ttft_ms) else []
        self.cached = list(cached) if isinstance(cached, list) and len(cached) == len(ttft_ms) else []
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
    """A finished cell with its summary, typed (a summary read back from the event log as a dict is read into
    CellResult here, once)."""

    def __init__(self, cell: CellInfo, summary: CellResult | Mapping[str, Any], status: str, reason: str = "") -> None:
        super().__init__()
        self.cell = cell
        self.summary = summary if isinstance(summary, CellResult) else CellResult.from_dict(summary)
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


class TelemetryUpdated(Message):
    """The newest live readings: `server` has kv_cache_usage (0..1), running, waiting, preemptions_total
    (see wire.LIVE_SERVER_KEYS) or is None; `gpus` one dict per GPU (telemetry.GPU_COLUMNS plus `gpu`)."""

    def __init__(self, server: dict[str, float] | None, gpus: list[dict[str, Any]] | None) -> None:
        super().__init__()
        self.server = server
        self.gpus = gpus


class TelemetryMeta(Message):
    """What the engine learned at the start: the KV budget (kv_cache_tokens, max_concurrency_by_workload)
    and whether NVML sees GPUs (available, reason)."""

    def __init__(self, kv_budget: dict[str, Any] | None, gpu: dict[str, Any] | None) -> None:
        super().__init__()
        self.kv_budget = kv_budget
        self.gpu = gpu


_KINDS: dict[str, type[Message]] = {c.__name__: c for c in (
    SweepStarted, CellStarted, RequestsMeasured, CellFinished, CellSkipped, EngineNotice, SweepFinished,
    TelemetryUpdated, TelemetryMeta)}


def from_wire(kind: str, fields: dict[str, Any]) -> Message:
    """The app message for a `(kind, fields)` item of servescope.tui.wire."""
    return _KINDS[kind](**fields)
