"""The engine's events as plain data: each `servescope.engine.events` event becomes items, one frozen msgspec
Struct per kind (the kinds named as the app's messages are), reduced to what viewers draw (a batch of requests
becomes its TTFT/TPOT/E2E lists). The runner writes these items to the session's event log
(servescope.sessions.live) as `{"kind": <the Struct's name>, "fields": <its fields>}`, so the app, `servescope
watch` and any number of viewers rebuild a sweep from it, live or later, as the same types (`Item`, their
union): an item's `fields()` are what is written, `decode_item` reads them back (leniently: a field an older
log lacks takes its default).

Imported inside functions, to keep httpx and polars off the app's start-up: core.metrics, engine.events,
sessions.store (benchmarks/import_cost.py; docs/developer.md's Layout gives the figures)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Self

import msgspec

from servescope.core.jsontypes import JsonObject
from servescope.core.kvbudget import KvBudgetMeta
from servescope.core.results import CellResult
from servescope.core.textsafe import clean_text
from servescope.sessions import series_name
from servescope.sessions.meta import GpuTable

if TYPE_CHECKING:
    from servescope.core.records import RequestRecord
    from servescope.engine.events import Event
    from servescope.engine.plan import Cell

# the /metrics gauges and counters the live panel draws (vLLM names, as parse_metrics returns them;
# older vLLM names are mapped to the new ones)
LIVE_SERVER_KEYS: dict[str, tuple[str, ...]] = {
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "llamacpp:kv_cache_usage_ratio"),
    "running": ("vllm:num_requests_running", "llamacpp:requests_processing"),
    "waiting": ("vllm:num_requests_waiting", "llamacpp:requests_deferred"),
    "preemptions_total": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    "prefix_queries_total": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_hits_total": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
}


GpuReading = dict[str, int | float | None]  # one GPU's live NVML reading: GPU_COLUMNS, `gpu` (its index); NaN -> None


class CellInfo(msgspec.Struct, frozen=True):
    """What the UI needs to know about a planned cell (a plain copy of the engine's Cell)."""

    index: int
    workload: str
    load_label: str
    concurrency: int | None
    rate: float | None
    requests: int | None
    duration_s: float | None
    shape: str = ""
    variant: str = ""  # the server variant's arguments in a server-config sweep

    @property
    def series(self) -> str:
        """The workload, with the server variant when there is one: one curve per series."""
        return series_name(self.workload, self.variant)

    @property
    def label(self) -> str:
        return f"{self.series} {self.load_label}"

    @property
    def x(self) -> float:
        """The load level as a number (concurrency, else rate) for curves."""
        return float(self.concurrency if self.concurrency is not None else (self.rate or 0.0))

    @classmethod
    def from_cell(cls, cell: Cell) -> CellInfo:
        return cls(cell.index, cell.workload.name, cell.load.label, cell.load.concurrency, cell.load.rate,
                   cell.requests, cell.duration_s, cell.workload.shape(), clean_text(cell.variant_args))


# ---- the items ---------------------------------------------------------------------------------------------
class ItemBase(msgspec.Struct, frozen=True):
    """An item of the event log; its kind is its class's name."""

    @property
    def kind(self) -> str:
        return type(self).__name__

    def fields(self) -> JsonObject:
        """The item as plain JSON values, as the event log's `fields` holds them."""
        out: JsonObject = msgspec.to_builtins(self, enc_hook=_encode)
        return out

    @classmethod
    def read(cls, fields: Mapping[str, object]) -> Self:
        """The item from an event log's `fields` (msgspec.ValidationError when they do not fit)."""
        return msgspec.convert(fields, cls, dec_hook=_decode)


class SweepStarted(ItemBase, frozen=True, omit_defaults=True):
    """The target answered and the session directory exists. `started_at` is not written: a reader takes it
    from the line's time (epoch s); the other defaults are what logs written before those fields read as."""

    session_dir: Path
    cells: list[CellInfo]
    target: str
    model: str
    version: str | None
    tokenizer: str
    metrics: bool
    engine_pid: int = 0  # the process the engine runs in
    started_at: float | None = None
    engine: str = ""  # the engine and its version, e.g. "vLLM 0.32.0", "llama.cpp b4512"


class CellStarted(ItemBase, frozen=True):
    cell: CellInfo
    total: int  # cells in the sweep


class RequestsMeasured(ItemBase, frozen=True):
    """A batch of finished requests of the running cell, reduced to the numbers the charts use (`reduce_batch`).
    `turns` and `cached` run parallel to `ttft_ms`; logs written before they existed have neither."""

    cell: CellInfo
    ttft_ms: list[float]
    tpot_ms: list[float]
    e2e_ms: list[float]
    per_user_tok_s: list[float]
    output_tokens: int
    done: int
    failed: int
    elapsed_s: float
    errors: list[tuple[str, str]] = msgspec.field(default_factory=list)  # (status, error text)
    turns: list[int] = msgspec.field(default_factory=list)
    cached: list[list[int | None]] = msgspec.field(default_factory=list)
    rate_limited: int = 0  # of the cell's requests so far, answered HTTP 429 (not among `failed`)

    def fields(self) -> JsonObject:
        """As logged: `rate_limited` only when a request was (a log's lines keep the shape readers know)."""
        out = super().fields()
        if not self.rate_limited:
            out.pop("rate_limited", None)
        return out


class CellFinished(ItemBase, frozen=True):
    """A finished cell with its summary as saved; in the log the summary is `CellResult.to_dict()` (as
    cells.parquet's summary_json holds it) and it is read back with `CellResult.from_dict` (any summary
    servescope ever wrote)."""

    cell: CellInfo
    summary: CellResult
    status: str  # "done" | "stopped" | "server_lost"
    reason: str = ""

    def fields(self) -> JsonObject:
        return super().fields() | {"summary": self.summary.to_dict()}

    @classmethod
    def read(cls, fields: Mapping[str, object]) -> Self:
        return super().read({**fields, "summary": CellResult.from_dict(fields.get("summary"))})


class CellSkipped(ItemBase, frozen=True):
    cell: CellInfo
    reason: str


class EngineNotice(ItemBase, frozen=True):
    level: str  # "info" | "warning" | "error"
    text: str


class SweepFinished(ItemBase, frozen=True):
    session_dir: Path | None  # None: it ended before its session was made
    status: str  # "completed" | "interrupted" | "failed"
    message: str = ""


class TelemetryUpdated(ItemBase, frozen=True):
    """The newest live readings: `server` the LIVE_SERVER_KEYS found in the newest /metrics sample, or None;
    `gpus` one reading per GPU, or None."""

    server: dict[str, float] | None
    gpus: list[GpuReading] | None


class TelemetryMeta(ItemBase, frozen=True):
    """session.toml's `kv_budget` (kv_cache_tokens, source, max_concurrency_by_workload, ...) and `gpu`
    (available, count or reason) tables as the runner wrote them, at the start and after each relaunch."""

    kv_budget: KvBudgetMeta | None
    gpu: GpuTable | None


Item = (SweepStarted | CellStarted | RequestsMeasured | CellFinished | CellSkipped | EngineNotice | SweepFinished
           | TelemetryUpdated | TelemetryMeta)
KINDS: dict[str, type[Item]] = {c.__name__: c for c in (
    SweepStarted, CellStarted, RequestsMeasured, CellFinished, CellSkipped, EngineNotice, SweepFinished,
    TelemetryUpdated, TelemetryMeta)}


def _encode(v: object) -> object:
    if isinstance(v, Path):
        return str(v)
    raise TypeError(f"{type(v).__name__} is not an event log value")


def _decode(tp: type, v: object) -> object:
    if tp is object:  # with a dec_hook msgspec hands `object` values (a session.toml table's) here: any JSON value
        return v
    if tp is Path and isinstance(v, str):
        return Path(v)
    raise TypeError(f"expected {tp.__name__}, got {type(v).__name__}")


def decode_item(kind: str, fields: Mapping[str, object]) -> Item | None:
    """An item read back from the event log; None for a kind this servescope does not know or fields that do
    not fit it (a damaged line is skipped, as a line cut short is)."""
    cls = KINDS.get(kind)
    if cls is None:
        return None
    try:
        return cls.read(fields)
    except msgspec.ValidationError:
        return None


# ---- from the engine's events ------------------------------------------------------------------------------
def reduce_batch(records: Sequence[RequestRecord]) -> tuple[list[float], list[float], list[float], list[float], int,
                                                            list[tuple[str, str]], list[int], list[list[int | None]]]:
    """Per-request TTFT, TPOT, E2E (ms) and per-user tok/s of a batch, computed by core.metrics
    (`request_figures`: `per_request`'s formulas, row by row), its output tokens and errors, plus two lists
    parallel to the TTFT list (one entry per successful request with a TTFT): the request's turn (from 1 in a conversation or agent session, 0 for a single-turn request) and
    `[cached prompt tokens or None when the usage did not say, prompt tokens or None]`."""
    from servescope.core.metrics import request_figures

    ttft: list[float] = []
    tpot: list[float] = []
    e2e: list[float] = []
    per_user: list[float] = []
    out_tok = 0
    errors: list[tuple[str, str]] = []
    turns: list[int] = []
    cached: list[list[int | None]] = []
    for r in records:
        if r.warmup:
            continue
        if r.status != "ok":
            if r.status != "cancelled":  # a request cancelled by a stop or skip is no server error
                errors.append((str(r.status), clean_text(str(r.error))[:200]))
            continue
        f = request_figures(r)
        out_tok += r.output_tokens
        if f.tpot_ms is not None:
            tpot.append(f.tpot_ms)
        if f.e2e_ms is not None:
            e2e.append(f.e2e_ms)
        if f.per_user_tok_s is not None:
            per_user.append(f.per_user_tok_s)
        if f.ttft_ms is not None:
            ttft.append(f.ttft_ms)
            turns.append(int(r.turn or 0))
            p = r.prompt_tokens
            cached.append([r.cached_tokens, p if p is not None and p >= 0 else None])
    return ttft, tpot, e2e, per_user, out_tok, errors, turns, cached


def live_server(sample: Mapping[str, object] | None) -> dict[str, float] | None:
    """The few /metrics values the live panel draws, under short names (None when there is no sample)."""
    if not sample:
        return None
    out: dict[str, float] = {}
    for key, names in LIVE_SERVER_KEYS.items():
        for n in names:
            v = sample.get(n)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[key] = float(v)
                break
    return out


def telemetry_meta(session_dir: Path) -> TelemetryMeta | None:
    """The KV budget and GPU availability the engine wrote into session.toml (at the start, and again
    after a relaunch)."""
    try:
        from servescope.sessions.store import load_session

        meta = load_session(session_dir).info
    except Exception:
        return None
    kv, gpu = meta.kv_budget, meta.gpu
    if kv is None and gpu is None:
        return None
    return TelemetryMeta(kv or None, gpu or None)


class Translator:
    """Runner events -> app items; remembers the session folder to re-read the KV budget and GPU
    availability when the engine announces a KV budget (at the start, and after a relaunch)."""

    def __init__(self, target_label: str | None) -> None:
        self.target_label = target_label
        self.session_dir: Path | None = None

    def __call__(self, ev: Event) -> list[Item]:
        from servescope.engine import events as r

        if isinstance(ev, r.SweepStarted):
            self.session_dir = ev.session_dir
        items = translate(ev, self.target_label)
        if isinstance(ev, r.KvBudgetKnown) and self.session_dir is not None:
            items.append(telemetry_meta(self.session_dir) or TelemetryMeta(ev.budget, None))
        return items


def translate(ev: Event, target_label: str | None) -> list[Item]:
    """One runner event -> the items the app needs (usually one)."""
    from servescope.engine import events as r

    if isinstance(ev, r.RequestsDone):
        ttft, tpot, e2e, per_user, out_tok, errors, turns, cached = reduce_batch(ev.records)
        return [RequestsMeasured(CellInfo.from_cell(ev.cell), ttft, tpot, e2e, per_user, out_tok, ev.done, ev.failed,
                                 ev.elapsed_s, errors, turns, cached, ev.rate_limited)]
    if isinstance(ev, r.TelemetrySample):
        gpus: list[GpuReading] | None = [{**g} for g in ev.gpus] if ev.gpus else None
        return [TelemetryUpdated(live_server(ev.server), gpus)]
    if isinstance(ev, r.CellStarted):
        return [CellStarted(CellInfo.from_cell(ev.cell), ev.total)]
    if isinstance(ev, r.CellFinished):
        return [CellFinished(CellInfo.from_cell(ev.cell), ev.summary, ev.status, clean_text(ev.reason))]
    if isinstance(ev, r.CellSkipped):
        return [CellSkipped(CellInfo.from_cell(ev.cell), clean_text(ev.reason))]
    if isinstance(ev, (r.Notice, r.KvBudgetKnown)):
        return [EngineNotice(ev.level, clean_text(ev.text))]
    if isinstance(ev, r.SweepStarted):
        meta = telemetry_meta(ev.session_dir)
        return [SweepStarted(ev.session_dir, [CellInfo.from_cell(c) for c in ev.cells], target_label or ev.target.url,
                             ev.model, ev.target.version, ev.tokenizer, ev.target.metrics_available,
                             engine_pid=os.getpid(), engine=ev.target.engine_text),
                *([meta] if meta else [])]
    if isinstance(ev, r.SweepFinished):
        return [SweepFinished(ev.session_dir, ev.status, clean_text(ev.message))]
    return []
