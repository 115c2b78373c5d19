"""Messages the sweep worker posts to the app. They say what happened; widgets never see engine objects
directly, only these (posted from the worker thread with `post_message`, which is thread-safe).

A sweep's messages wrap the event log's items (servescope.engine.wire), the same whether the engine runs in
the app's thread or in a runner process the app follows: `message(item)` makes one; each exposes its item's
fields under the names the screens read."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from textual.message import Message

from servescope.core.kvbudget import KvBudgetMeta
from servescope.core.results import CellResult
from servescope.engine import wire as w
from servescope.engine.wire import CellInfo, GpuReading
from servescope.sessions.meta import GpuTable

__all__ = ["CellFinished", "CellInfo", "CellSkipped", "CellStarted", "EngineNotice", "ProbeInfo", "RequestsMeasured",
           "SweepFinished", "SweepStarted", "SweepMessage", "TargetProbed", "TelemetryMeta", "TelemetryUpdated",
           "message"]


@dataclass
class SweepStarted(Message):
    """The target answered and the session directory exists."""

    item: w.SweepStarted

    @property
    def session_dir(self) -> Path:
        return self.item.session_dir

    @property
    def cells(self) -> list[CellInfo]:
        return self.item.cells

    @property
    def target(self) -> str:
        return self.item.target

    @property
    def model(self) -> str:
        return self.item.model

    @property
    def version(self) -> str | None:
        return self.item.version

    @property
    def tokenizer(self) -> str:
        return self.item.tokenizer

    @property
    def metrics(self) -> bool:
        return self.item.metrics

    @property
    def engine(self) -> str:
        """The engine and its version, e.g. "vLLM 0.32.0", "llama.cpp b4512" (older logs: "")."""
        return self.item.engine

    @property
    def engine_pid(self) -> int:
        """The process the engine runs in (the app's own in thread mode)."""
        return self.item.engine_pid

    @property
    def started_at(self) -> float | None:
        """Epoch seconds, when read from the session's event log."""
        return self.item.started_at


@dataclass
class CellStarted(Message):
    item: w.CellStarted

    @property
    def cell(self) -> CellInfo:
        return self.item.cell

    @property
    def total(self) -> int:
        return self.item.total


@dataclass
class RequestsMeasured(Message):
    """A batch of finished requests of the running cell, already reduced to the numbers the charts use.
    `turns` and `cached` run parallel to `ttft_ms` (one entry per successful request with a TTFT): the request's
    turn (0: single-turn) and [cached prompt tokens or None, prompt tokens or None]. Event logs written before
    they existed have neither: they are then empty (and ignored unless as long as `ttft_ms`)."""

    item: w.RequestsMeasured

    @property
    def cell(self) -> CellInfo:
        return self.item.cell

    @property
    def ttft_ms(self) -> list[float]:
        return self.item.ttft_ms

    @property
    def tpot_ms(self) -> list[float]:
        return self.item.tpot_ms

    @property
    def e2e_ms(self) -> list[float]:
        return self.item.e2e_ms

    @property
    def per_user_tok_s(self) -> list[float]:
        return self.item.per_user_tok_s

    @property
    def output_tokens(self) -> int:
        return self.item.output_tokens

    @property
    def done(self) -> int:
        return self.item.done

    @property
    def failed(self) -> int:
        return self.item.failed

    @property
    def rate_limited(self) -> int:
        return self.item.rate_limited

    @property
    def elapsed_s(self) -> float:
        return self.item.elapsed_s

    @property
    def errors(self) -> list[tuple[str, str]]:
        return self.item.errors

    @property
    def turns(self) -> list[int]:
        return self.item.turns if len(self.item.turns) == len(self.item.ttft_ms) else []

    @property
    def cached(self) -> list[list[int | None]]:
        return self.item.cached if len(self.item.cached) == len(self.item.ttft_ms) else []


@dataclass
class CellFinished(Message):
    """A finished cell with its summary, typed."""

    item: w.CellFinished

    @property
    def cell(self) -> CellInfo:
        return self.item.cell

    @property
    def summary(self) -> CellResult:
        return self.item.summary

    @property
    def status(self) -> str:
        return self.item.status

    @property
    def reason(self) -> str:
        return self.item.reason


@dataclass
class CellSkipped(Message):
    item: w.CellSkipped

    @property
    def cell(self) -> CellInfo:
        return self.item.cell

    @property
    def reason(self) -> str:
        return self.item.reason


@dataclass
class EngineNotice(Message):
    item: w.EngineNotice

    @property
    def level(self) -> str:
        return self.item.level

    @property
    def text(self) -> str:
        return self.item.text


@dataclass
class SweepFinished(Message):
    item: w.SweepFinished

    @property
    def session_dir(self) -> Path | None:
        return self.item.session_dir

    @property
    def status(self) -> str:
        """"completed" | "interrupted" | "failed"."""
        return self.item.status

    @property
    def message(self) -> str:
        return self.item.message


@dataclass
class TelemetryUpdated(Message):
    """The newest live readings: `server` has kv_cache_usage (0..1), running, waiting, preemptions_total
    (see wire.LIVE_SERVER_KEYS) or is None; `gpus` one reading per GPU (telemetry.GPU_COLUMNS plus `gpu`).
    Never replaced in the queue by a newer one: the live preemptions and prefix-cache hit rate are the
    differences between consecutive samples."""

    item: w.TelemetryUpdated

    @property
    def server(self) -> dict[str, float] | None:
        return self.item.server

    @property
    def gpus(self) -> list[GpuReading] | None:
        return self.item.gpus


@dataclass
class TelemetryMeta(Message):
    """What the engine learned at the start: the KV budget (kv_cache_tokens, max_concurrency_by_workload)
    and whether NVML sees GPUs (available, reason). A newer one replaces an older one still queued."""

    item: w.TelemetryMeta

    @property
    def kv_budget(self) -> KvBudgetMeta | None:
        return self.item.kv_budget

    @property
    def gpu(self) -> GpuTable | None:
        return self.item.gpu

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, TelemetryMeta)


class ProbeInfo(TypedDict):
    """What a probe learned (sweepworker.probe_target; `speed` feeds the Compose preview's estimate)."""

    url: str  # `sim://PROFILE` for a simulator
    models: list[tuple[str, int | None]]  # (id, max model length)
    version: str | None
    metrics: bool  # /metrics answered
    gpus: list[str]  # this machine's, as NVML describes them
    speed: dict[str, float]  # sweepworker.measure_speed's ttft_ms, tpot_ms; empty when not measured


@dataclass
class TargetProbed(Message):
    """A probe finished: `info` is what the server said, or `error` says why it failed."""

    url: str
    info: ProbeInfo | None
    error: str = ""


SweepMessage = (SweepStarted | CellStarted | RequestsMeasured | CellFinished | CellSkipped | EngineNotice
                | SweepFinished | TelemetryUpdated | TelemetryMeta)


def message(item: w.Item) -> SweepMessage:
    """The app message wrapping an item of the event log."""
    if isinstance(item, w.SweepStarted):
        return SweepStarted(item)
    if isinstance(item, w.CellStarted):
        return CellStarted(item)
    if isinstance(item, w.RequestsMeasured):
        return RequestsMeasured(item)
    if isinstance(item, w.CellFinished):
        return CellFinished(item)
    if isinstance(item, w.CellSkipped):
        return CellSkipped(item)
    if isinstance(item, w.EngineNotice):
        return EngineNotice(item)
    if isinstance(item, w.SweepFinished):
        return SweepFinished(item)
    if isinstance(item, w.TelemetryUpdated):
        return TelemetryUpdated(item)
    return TelemetryMeta(item)
