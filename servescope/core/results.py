"""Typed results: a finished cell's figures as one frozen msgspec Struct (`CellResult`), and the one table of metric
labels, units and directions.

`CellResult` is the one shape of a finished cell: `core.metrics.summarize()` makes it, the runner adds the server's,
the telemetry's, the client's and the quality figures with `msgspec.structs.replace`, the store writes it and reads it
back, and events, the live view, reports, compare, gate, twin and the app all take it. `CellResult.from_dict()` reads any summary servescope ever wrote (missing keys take their defaults, unknown
keys are ignored, a value of the wrong type becomes the default), and `CellResult.to_dict()` gives back the
exact dict (and so JSON) shape, which is what sessions store in
cells.parquet's `summary_json` and what `--json` prints.

This module imports neither polars nor textual.
"""

from __future__ import annotations

import json
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeGuard, TypeVar

import msgspec

from servescope.core.jsontypes import Json

STATS = ("mean", "std", "min", "max", "p50", "p90", "p95", "p99")
DIST_KEYS = ("ttft_ms", "ttfo_ms", "tpot_ms", "e2e_ms", "per_user_tok_s", "prefill_tok_s", "client_queue_ms",
             "itl_ms", "itl_token_ms")

S = TypeVar("S", bound=msgspec.Struct)


# --------------------------------------------------------------------------------------------------------
# lenient reading
# --------------------------------------------------------------------------------------------------------


def _is_num(v: object) -> TypeGuard[int | float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _convert(v: object, tp: object) -> tuple[bool, object]:
    """(ok, value): `v` read as type `tp`, leniently; ok is False when it does not fit."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if v is None and type(None) in args:
            return True, None
        for a in args:
            if a is type(None):
                continue
            ok, got = _convert(v, a)
            if ok:
                return True, got
        return False, None
    if tp is Any:
        return True, v
    if tp is float:
        return (True, v) if _is_num(v) else (False, None)  # ints stay ints, so to_dict() gives them back as written
    if tp is int:
        if _is_num(v) and (isinstance(v, int) or (math.isfinite(v) and v == int(v))):
            return True, v if isinstance(v, int) else int(v)
        return False, None
    if tp is bool:
        return (True, v) if isinstance(v, bool) else (False, None)
    if tp is str:
        return (True, v) if isinstance(v, str) else (False, None)
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return (True, _lenient(tp, v)) if isinstance(v, Mapping) else (False, None)
    if origin is list:
        if not isinstance(v, (list, tuple)):
            return False, None
        (item,) = typing.get_args(tp) or (Any,)
        out: list[object] = []
        for x in v:
            ok, y = _convert(x, item)
            if ok:
                out.append(y)
        return True, out
    if origin is dict:
        if not isinstance(v, Mapping):
            return False, None
        args = typing.get_args(tp)
        value_type = args[1] if len(args) == 2 else Any
        items: dict[str, object] = {}
        for k, x in v.items():  # a value of the wrong type is left out, as a list's item is
            ok, y = _convert(x, value_type)
            if ok:
                items[str(k)] = y
        return True, items
    return False, None


_HINTS: dict[type, dict[str, object]] = {}


def _lenient(cls: type[S], d: Mapping[str, object]) -> S:
    hints = _HINTS.get(cls)
    if hints is None:
        hints = _HINTS[cls] = typing.get_type_hints(cls)
    kw: dict[str, object] = {}
    for f in msgspec.structs.fields(cls):
        if f.encode_name not in d:
            continue
        ok, v = _convert(d[f.encode_name], hints[f.name])
        if ok:
            kw[f.name] = v
    return cls(**kw)


class _Base(msgspec.Struct, kw_only=True, frozen=True):
    @classmethod
    def from_dict(cls, d: object) -> typing.Self:
        """Read leniently: missing keys take their defaults, unknown keys are ignored, wrong types -> default.
        Never raises (anything that is not a mapping gives all defaults)."""
        return _lenient(cls, d if isinstance(d, Mapping) else {})

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out

    def value(self, name: str) -> float | None:
        """A numeric field chosen at run time; None when unknown, missing, NaN or infinite."""
        return finite(getattr(self, name)) if name in self.__struct_fields__ else None


# --------------------------------------------------------------------------------------------------------
# the structs
# --------------------------------------------------------------------------------------------------------


class Dist(_Base, frozen=True):
    """One metric's distribution over a cell's requests (or ITL gaps); None where no request had it."""

    mean: float | None = None
    std: float | None = None
    min: float | None = None
    max: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    n: int | None = None  # how many values (requests, or ITL gaps) the figures are over; None: written before it was kept

    def stat(self, name: str) -> float | None:
        """A stat by name ("p50"); None for an unknown name, a missing value, NaN or infinity."""
        return finite(getattr(self, name, None)) if name in STATS else None


class Mismatch(_Base, frozen=True):
    """Prompt tokens the server counted minus those requested."""

    mean: float | None = None
    max_abs: int | None = None


class OutputCheck(_Base, frozen=True):
    """Whether a cell's output token counts hold up (core/metrics.py output_check), over its successful requests:
    `usage_vs_stream` whose usage.completion_tokens differ from the tokens counted in their stream (each
    token-carrying piece one token, or the growth the server's running usage said), `said` and `streamed` their
    totals; `over_max_tokens` whose usage says more than the max_tokens they were sent; `short` (ignore_eos sent)
    that ended before max_tokens. `notes`: one line per finding, for people (CLI, app, report)."""

    requests: int = 0
    usage_vs_stream: int = 0
    said: int = 0
    streamed: int = 0
    over_max_tokens: int = 0
    short: int = 0
    notes: list[str] = msgspec.field(default_factory=list)


class ErrorCount(_Base, frozen=True):
    """One of a cell's most frequent failures."""

    status: str | None = None
    error: str | None = None
    len: int = 0


class ServerWindow(_Base, frozen=True):
    """What vLLM's /metrics counted during one cell (core/telemetry.py server_delta, from the cell's two boundary
    samples; the start sample is taken after the warmup, so warmup requests are not counted)."""

    requests_success: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    preemptions: float | None = None
    ttft_ms_mean: float | None = None
    itl_ms_mean: float | None = None
    e2e_ms_mean: float | None = None
    queue_ms_mean: float | None = None
    kv_cache_tokens: float | None = None
    prefix_cache_hit_rate: float | None = None


class TelemetryWindow(_Base, frozen=True):
    """The sampled /metrics series over a cell's measured window (core/telemetry.py
    MetricsSampler.window_summary)."""

    available: bool = False
    reason: str | None = None
    samples: int = 0
    scrape_failures: int = 0
    kv_cache_usage_peak: float | None = None
    kv_cache_usage_mean: float | None = None
    running_mean: float | None = None
    running_max: float | None = None
    waiting_mean: float | None = None
    waiting_max: float | None = None
    preemptions: float | None = None
    prompt_tokens: float | None = None
    generation_tokens: float | None = None
    requests_success: float | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    prefix_cache_hit_rate: float | None = None
    ttft_ms_mean: float | None = None
    itl_ms_mean: float | None = None
    e2e_ms_mean: float | None = None
    queue_ms_mean: float | None = None
    # the waiting queue over the window: its smallest sample, and its least-squares slope (requests per second) with
    # that slope's t statistic (None with fewer than 3 samples); engine/saturation.py reads them
    waiting_min: float | None = None
    waiting_slope_per_s: float | None = None
    waiting_slope_t: float | None = None


class GpuStat(_Base, frozen=True):
    """One GPU's figures over a window."""

    index: int | None = None
    name: str | None = None
    energy_wh: float | None = None
    mem_used_gib_peak: float | None = None
    mem_total_gib: float | None = None
    util_pct_mean: float | None = None
    power_w_mean: float | None = None
    temp_c_max: float | None = None


class GpuWindow(_Base, frozen=True):
    """GPU figures over a cell's measured window, all GPUs together (core/telemetry.py
    GpuSampler.window_summary)."""

    available: bool = False
    reason: str | None = None
    gpus: int = 0
    names: list[str] = msgspec.field(default_factory=list)
    duration_s: float | None = None
    samples: int = 0
    energy_wh: float | None = None
    energy_coverage: float | None = None
    energy_wh_counter: float | None = None
    output_tokens: int = 0
    wh_per_1m_output_tokens: float | None = None
    price_usd_per_kwh: float | None = None
    cost_usd_per_1m_output_tokens: float | None = None
    mem_used_gib_peak: float | None = None
    mem_total_gib: float | None = None
    util_pct_mean: float | None = None
    power_w_mean: float | None = None
    power_w_peak: float | None = None
    sm_clock_mhz_mean: float | None = None
    temp_c_max: float | None = None
    per_gpu: list[GpuStat] = msgspec.field(default_factory=list)


class TurnStat(_Base, frozen=True):
    """One turn index of a multi-turn cell (core/metrics.py per_turn): turn 1 is every conversation's first."""

    turn: int = 0
    requests_ok: int = 0
    requests_failed: int = 0
    ttft_ms_p50: float | None = None
    ttft_ms_p90: float | None = None
    input_tokens_mean: float | None = None
    output_tokens_mean: float | None = None
    prefix_cache_hit_rate: float | None = None  # from the usage's cached tokens; None when the server sent none
    prompt_tokens_cached: int | None = None
    prompt_tokens_uncached: int | None = None


class ConversationStats(_Base, frozen=True):
    """A multi-turn cell's conversations (core/metrics.py per_conversation); the Dists are over the complete ones."""

    started: int = 0
    complete: int = 0
    turns_mean: float | None = None
    duration_s: Dist = msgspec.field(default_factory=Dist)
    input_tokens: Dist = msgspec.field(default_factory=Dist)
    output_tokens: Dist = msgspec.field(default_factory=Dist)


class LoopLag(_Base, frozen=True):
    """How late the client's event loop ran a timer due every 10 ms, over a cell's measured part (ms)."""

    p50: float | None = None
    p99: float | None = None
    max: float | None = None


class ClientHealth(_Base, frozen=True):
    """The load generator's own health over a cell (core/health.py judge_client): is the client the bottleneck?
    `verdict` "ok" | "strained" | "bound", `reasons` one line per figure past a threshold."""

    verdict: str | None = None
    loop_lag_ms: LoopLag = msgspec.field(default_factory=LoopLag)
    cpu_util: float | None = None  # the (busiest) worker process's CPU time / wall time: a share of one core
    workers: int = 1
    reasons: list[str] = msgspec.field(default_factory=list)
    cpu_wait_share: float | None = None  # the (busiest) loop's time ready but waiting for a CPU / wall time
    cpu_s: float | None = None  # every worker's CPU time together (s)
    wall_s: float | None = None
    loop_cpu_s: float | None = None  # the event loops' own threads' CPU time (s)
    bunched_share: float | None = None  # tokens stamped at the same ns as the request's previous one
    send_late_p99_ms: float | None = None  # an uncapped open loop's sends after their schedule, p99
    nodes: dict[str, int] | None = None  # Ray: node -> requests (left out of to_dict() when None)
    clock_error_ms: float | None = None  # several hosts: the bound on their clocks' offset (left out when None)
    start_skew_ms: float | None = None  # several workers: how far the last one started after t0 (left out when None)
    # an open loop that did not reach its rate: its send schedule was this far behind when its duration ended (s;
    # left out when None: it kept up, or it is no such cell)
    rate_behind_s: float | None = None
    # what sampling the server's /metrics cost the client over the cell: CPU ms per second of the cell, and per
    # scrape (left out when None: no scrape in the cell; with --telemetry-interval off, the scrapes at its ends)
    telemetry_cpu_ms_per_s: float | None = None
    telemetry_ms_per_scrape: float | None = None

    @property
    def bound(self) -> bool:
        return self.verdict == "bound"

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        for k in ("nodes", "clock_error_ms", "start_skew_ms", "rate_behind_s", "telemetry_cpu_ms_per_s",
                  "telemetry_ms_per_scrape"):
            if out.get(k) is None:
                out.pop(k, None)
        return out


class TaskTally(_Base, frozen=True):
    """One task's probe questions answered during a cell: `correct` of `n` (accuracy = correct / n)."""

    accuracy: float | None = None
    n: int = 0
    correct: int = 0


class CellQuality(_Base, frozen=True):
    """The probe questions answered during a cell (`--quality-share`), overall and per task, the probes that
    failed (and why), and, when any greedy probe came back, the divergence from the same prompts' traces at idle
    (engine/quality.py QualityMixer makes it; sessions/quality.py reads it with intervals)."""

    accuracy: float | None = None
    n: int = 0
    correct: int = 0
    tasks: dict[str, TaskTally] = msgspec.field(default_factory=dict)
    failed: int = 0
    errors: list[str] | None = None  # the first few distinct one-line reasons probes failed
    kl_mean: float | None = None
    kl_p99: float | None = None
    top1_agreement: float | None = None
    first_divergence_mean: float | None = None
    positions: int | None = None
    prompts: int | None = None
    diverged: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """As stored: the failures' reasons and the divergence figures only when there are some."""
        return {k: v for k, v in super().to_dict().items() if v is not None or k == "accuracy"}


class CellCost(_Base, frozen=True):
    """What the cell's tokens cost, USD per 1M (core/cost.py cell_cost: a hosted API's list price over the
    measured token mix, or a GPU's hourly price over the measured throughput, plus energy where measured);
    `basis` says which, in a few words."""

    usd_per_1m_output_tokens: float | None = None
    usd_per_1m_total_tokens: float | None = None
    basis: str = ""


class CellConnections(_Base, frozen=True):
    """The connections a cell's load opened (core/tls.py; engine/connection.py HttpTarget.cell_connections): with
    keep-alive about one per user, not one per request; the TCP connect and TLS handshake p50 of those (ms),
    apart from the TTFT (the handshake None over plain HTTP, and with aiohttp, which times both as the connect)."""

    opened: int = 0
    connect_ms_p50: float | None = None
    tls_handshake_ms_p50: float | None = None


class CellWindow(_Base, frozen=True):
    """Which of a cell's requests its figures are over (core/steady.py): `kind` "steady" (sent while the load was at
    its target: a closed loop's users all in flight, an open loop past its ramp, before the last send) or "whole"
    (every measured request, the cell's wall time). Times are seconds from the cell's first send; `requests` were
    sent inside it, `ramp_requests` before it and `drain_requests` after it (in the whole cell's figures only);
    `ramp_s` the ramp the load started with; `basis` one line saying where the window starts and ends."""

    kind: str = "whole"
    start_s: float | None = None
    end_s: float | None = None
    requests: int = 0
    requests_ok: int = 0
    ramp_requests: int = 0
    drain_requests: int = 0
    ramp_s: float | None = None
    basis: str = ""


class FigureInterval(_Base, frozen=True):
    """One figure's 95% interval over the cell's window (core/precision.py: batch means over `batches` spans of
    time, requests by the span they were sent in), and with --precision the share it was held to."""

    figure: str = ""
    estimate: float | None = None  # the figure over the window (as the summary holds it)
    low: float | None = None
    high: float | None = None
    reached: float | None = None  # half the interval's width over the value (None: no interval)
    target: float | None = None  # --precision's share for this figure (None: not a stop figure)
    batches: int = 0


class CellPrecision(_Base, frozen=True):
    """`--precision`: the cell ran until every named figure's interval was within its share (`imprecise` False), or
    until its ceiling (`-n`/`--duration`) came first (`imprecise` True). `figure` is the named figure furthest from its
    share, `target` its share and `reached` its half-width over its value (shares as fractions: 0.05 for 5%);
    `requests` the measured requests the cell sent; `method` how the intervals were made."""

    target: float | None = None
    reached: float | None = None
    requests: int = 0
    figure: str = ""
    imprecise: bool = False
    ceiling: str = ""  # "48 requests", "60 s"
    method: str = ""


class Saturation(_Base, frozen=True):
    """Whether the server was past saturation during the cell's steady window (engine/saturation.py): its queue
    stood or grew the whole window (`queue`: what showed it) and its throughput no longer rose with the load
    (`elasticity`: ln(throughput ratio) / ln(load ratio) against the next lower load, None without one)."""

    saturated: bool = False
    reason: str = ""
    basis: str = ""  # "server waiting" | "TTFT trend" | "" (nothing to judge by)
    waiting_mean: float | None = None
    waiting_min: float | None = None
    waiting_slope_per_s: float | None = None
    ttft_slope_ms_per_s: float | None = None
    elasticity: float | None = None


class CellProbes(_Base, frozen=True):
    """Interference probes (`--probe-rate`): small requests sent on their own Poisson schedule during the cell's
    measured part; their TTFT and E2E show what the main load does to a newcomer. Not in the cell's own figures."""

    rate: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    sent: int = 0
    ok: int = 0
    failed: int = 0
    ttft_ms: Dist = msgspec.field(default_factory=Dist)
    e2e_ms: Dist = msgspec.field(default_factory=Dist)
    errors: list[str] = msgspec.field(default_factory=list)


class SpecDecode(_Base, frozen=True):
    """Speculative decoding over a cell, from the server's /metrics counters (core/specdecode.py spec_decode_delta):
    acceptance_rate = accepted / drafted tokens; mean_accepted_tokens = accepted tokens per draft (vLLM's logged
    "mean acceptance length" is 1 + this); drafts_per_step = drafts / the requests' steps (a step samples one token
    plus its accepted drafts: steps = generated tokens - accepted tokens), below 1 where the proposer had nothing to
    offer (an n-gram proposer finding no match)."""

    acceptance_rate: float | None = None
    mean_accepted_tokens: float | None = None
    drafts_per_step: float | None = None


class LoraServer(_Base, frozen=True):
    """LoRA as the server's /metrics tell it over a cell (core/specdecode.py lora_window): the adapters vLLM's
    `vllm:lora_requests_info` showed running during the cell, and its --max-loras. vLLM counts no requests per
    adapter."""

    adapters_running: list[str] = msgspec.field(default_factory=list)
    max_loras: int | None = None


class AdapterFigures(_Base, frozen=True):
    """One LoRA adapter's requests in a cell (core/lorafigures.py): those that named it as their model ("base": the
    base model's), ok ones; output tok/s is their output tokens over the cell's wall time."""

    requests: int = 0
    output_tok_s: float | None = None
    ttft_ms: Dist = msgspec.field(default_factory=Dist)
    tpot_ms: Dist = msgspec.field(default_factory=Dist)


class Startup(_Base, frozen=True):
    """A launched server's start (engine/startup.py): seconds from starting its command to a healthy /health and to
    the first token of a one-token request; `phases`: what vLLM's log says its start spent (weights_s, compile_s,
    cuda_graphs_s, engine_init_s; core/startup.py), left out when it says none."""

    healthy_s: float | None = None
    first_token_s: float | None = None
    phases: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        if not out.get("phases"):
            out.pop("phases", None)
        return out


class Energy(_Base, frozen=True):
    """The GPUs' energy over a cell, from NVML (core/energy.py): joules per output token (the power's integral over
    the cell's window / its output tokens) and the mean power over the window (W)."""

    j_per_output_token: float | None = None
    mean_w: float | None = None


_OPTIONAL = ("server", "telemetry", "gpu", "client", "source", "prefix_cache_hit_rate", "prefix_cache_source",
             "prompt_tokens_cached", "prompt_tokens_uncached", "conversations", "quality", "cost", "connections",
             "output_check", "spec_decode", "adapters", "lora_server", "prefix_cache_reset", "prefix_cache_target",
             "startup", "energy", "window", "whole", "precision", "saturation", "probes")


class CellResult(_Base, frozen=True):
    """One cell's summary (core/metrics.py summarize), plus what the runner adds: `server` (/metrics
    deltas), `telemetry` (/metrics window), `gpu` (GPU window), `client` (the load generator's own health) and
    `quality` (probe questions mixed into the load); `source` marks imported cells."""

    requests_ok: int = 0
    requests_failed: int = 0
    requests_bad_usage: int | None = None  # of the failed, how many had usage that was not a token count (None:
    # written before servescope counted them, and left out of to_dict())
    # HTTP 429s: requests the server refused by its rate limit, apart from requests_ok and requests_failed (None:
    # written before servescope counted them); with --retry-after, the 429s sent again, the time waited before
    # them (s, all the cell's requests together) and the longest Retry-After the server named (s)
    requests_rate_limited: int | None = None
    rate_limit_retries: int | None = None
    retry_wait_s: float | None = None
    retry_after_s_max: float | None = None
    # how the prompts were sized: "calibrated" (no /tokenize: on the server's usage, workloads/prompts.py),
    # "estimated" (1 token per word); None: exact (the server's or a local tokenizer), left out of to_dict()
    input_lengths: str | None = None
    wall_s: float | None = None
    input_tokens_requested: float | None = None
    input_tokens_mean: float | None = None
    input_tokens_mismatch: Mismatch | None = None
    output_tokens_requested: float | None = None
    output_tokens_mean: float | None = None
    reasoning_tokens_mean: float | None = None
    output_tokens_total: int | None = None
    input_tokens_total: int | None = None
    request_s: float | None = None
    output_tok_s: float | None = None
    total_tok_s: float | None = None
    goodput_req_s: float | None = None
    slo_met_fraction: float | None = None
    errors: list[ErrorCount] = msgspec.field(default_factory=list)
    ttft_ms: Dist = msgspec.field(default_factory=Dist)
    ttfo_ms: Dist = msgspec.field(default_factory=Dist)
    tpot_ms: Dist = msgspec.field(default_factory=Dist)
    e2e_ms: Dist = msgspec.field(default_factory=Dist)
    per_user_tok_s: Dist = msgspec.field(default_factory=Dist)
    prefill_tok_s: Dist = msgspec.field(default_factory=Dist)
    client_queue_ms: Dist = msgspec.field(default_factory=Dist)
    itl_ms: Dist = msgspec.field(default_factory=Dist)
    itl_token_ms: Dist = msgspec.field(default_factory=Dist)
    # the prefix cache (None: unknown, and left out of to_dict()): from the usage's cached tokens ("usage"), else
    # from the server's /metrics ("server_metrics"); the token counts only from the usage
    prefix_cache_hit_rate: float | None = None
    prefix_cache_source: str | None = None
    prompt_tokens_cached: int | None = None
    prompt_tokens_uncached: int | None = None
    turns: list[TurnStat] = msgspec.field(default_factory=list)  # multi-turn cells only (else empty, left out)
    conversations: ConversationStats | None = None  # multi-turn cells only
    server: ServerWindow | None = None
    telemetry: TelemetryWindow | None = None
    gpu: GpuWindow | None = None
    client: ClientHealth | None = None  # the load generator's own health (None: not measured, left out)
    source: str | None = None  # the import format ("vllm-bench-serve") for cells imported from other tools
    quality: CellQuality | None = None  # --quality-share (None: no probe request, left out of to_dict())
    cost: CellCost | None = None  # per 1M tokens, with --price/--gpu-hour/--electricity-price (core/cost.py)
    connections: CellConnections | None = None  # the connections its load opened (None: not counted, left out)
    # the window its figures are over (steady state by default; None: written before windows, the whole cell); with a
    # steady window, `whole` holds the whole cell's figures beside them. The request counts (requests_ok, _failed,
    # _rate_limited, errors) are always the whole cell's: every request it measured
    window: CellWindow | None = None
    whole: CellResult | None = None
    intervals: list[FigureInterval] = msgspec.field(default_factory=list)  # 95%, batch means (left out when empty)
    precision: CellPrecision | None = None  # --precision (None: not asked, left out)
    saturation: Saturation | None = None  # the saturation mark (None: not judged, left out)
    probes: CellProbes | None = None  # --probe-rate (None: none sent, left out)
    # output counts that do not hold up: usage against the stream, above max_tokens, short despite ignore_eos (None:
    # all held up, or written before servescope checked; left out of to_dict())
    output_check: OutputCheck | None = None
    # what GPU-box users change (each None: not measured or not asked, and left out of to_dict()): speculative
    # decoding's figures (/metrics), each LoRA adapter's, whether the server's prefix cache was reset before the cell
    # (--reset-prefix-cache) and the hit rate the workload aimed at, the launched server's start, energy (NVML)
    spec_decode: SpecDecode | None = None
    adapters: dict[str, AdapterFigures] | None = None
    lora_server: LoraServer | None = None
    prefix_cache_reset: bool | None = None
    prefix_cache_target: float | None = None
    startup: Startup | None = None
    energy: Energy | None = None

    DISTS: ClassVar[tuple[str, ...]] = DIST_KEYS

    @classmethod
    def from_json(cls, text: str | bytes | None) -> CellResult | None:
        """A stored summary_json; None for a cell without a summary (no text, `{}`, or unreadable JSON)."""
        if not text:
            return None
        try:
            d = json.loads(text)  # not msgspec: Python's json.dumps wrote NaN as NaN
        except ValueError:
            return None
        return cls.from_dict(d) if isinstance(d, Mapping) and d else None

    def to_dict(self) -> dict[str, Any]:
        """Exactly the dict summarize() (plus the runner) writes: server/telemetry/gpu/client/source, the prefix cache's
        figures and the multi-turn ones only when set."""
        out = super().to_dict()
        if self.client is not None:
            out["client"] = self.client.to_dict()
        if self.quality is not None:
            out["quality"] = self.quality.to_dict()
        if self.whole is not None:
            out["whole"] = self.whole.to_dict()
        if not out.get("intervals"):
            out.pop("intervals", None)
        if self.startup is not None:
            out["startup"] = self.startup.to_dict()
        for k in (*_OPTIONAL, "requests_bad_usage", "requests_rate_limited", *LEFT_OUT_WHEN_NONE):
            if out.get(k) is None:
                out.pop(k, None)
        if not out.get("turns"):
            out.pop("turns", None)
        return out

    @property
    def requests(self) -> int:
        return self.requests_ok + self.requests_failed + (self.requests_rate_limited or 0)

    @property
    def mostly_rate_limited(self) -> bool:
        """More than half of the cell's requests were refused by the server's rate limit (HTTP 429)."""
        return bool(self.requests_rate_limited) and (self.requests_rate_limited or 0) * 2 > self.requests

    @property
    def client_bound(self) -> bool:
        """The client, not the server, limited this cell (its figures measure the load generator)."""
        return self.client is not None and self.client.bound

    def dist(self, metric: str) -> Dist | None:
        """The distribution of a metric by name ("ttft_ms"), None when it has none."""
        return getattr(self, metric) if metric in DIST_KEYS else None

    def value(self, key: str) -> float | None:
        """A figure chosen at run time by its key, its one spelling (`Figure`): value("output_tok_s"),
        value("ttft_ms.p50"), value("server.queue_ms_mean"). None when missing, unknown, NaN or infinite (so tables
        and comparisons can skip it)."""
        metric, _, stat = key.partition(".")
        if metric in DIST_KEYS:
            dist: Dist = getattr(self, metric)
            return dist.stat(stat or "mean")
        if stat:
            part = getattr(self, metric, None) if metric in PARTS else None
            return finite(getattr(part, stat, None)) if part is not None and stat in part.__struct_fields__ else None
        if metric not in _SCALARS:
            return None
        return finite(getattr(self, metric))


# the parts whose figures are named `part.field`
PARTS = ("server", "telemetry", "gpu", "client", "cost", "spec_decode", "startup", "energy")
LEFT_OUT_WHEN_NONE = ("rate_limit_retries", "retry_wait_s", "retry_after_s_max", "input_lengths")


def rate_limit_line(s: CellResult) -> str:
    """The one line a mostly rate-limited cell gets (CLI, app, report); "" for any other cell."""
    if not s.mostly_rate_limited:
        return ""
    n, total = s.requests_rate_limited or 0, s.requests
    after = f", Retry-After up to {s.retry_after_s_max:g} s" if s.retry_after_s_max is not None else ""
    return (f"rate-limited: {n} of {total} requests ({100 * n / max(total, 1):.0f}%) got HTTP 429{after}; "
            "its figures are of the few served: lower the load or raise the API's limit")


_SCALARS = frozenset(f for f in CellResult.__struct_fields__
                     if f not in (*DIST_KEYS, *_OPTIONAL, "errors", "input_tokens_mismatch", "turns", "intervals")) | {
    "prefix_cache_hit_rate", "prompt_tokens_cached", "prompt_tokens_uncached", "prefix_cache_target"}


def finite(v: object) -> float | None:
    """A number as a float; None for None, NaN, infinity or anything that is not a number."""
    if not _is_num(v):
        return None
    f = float(v)
    return None if math.isnan(f) or math.isinf(f) else f


# --------------------------------------------------------------------------------------------------------
# the metrics table
# --------------------------------------------------------------------------------------------------------

Better = Literal["lower", "higher"] | None
Direction = Literal["higher", "lower", "neutral"]  # a figure's better direction as compare judges it


@dataclass(frozen=True)
class Metric:
    """A metric declared once: its key (with its unit in its name), label, unit, which direction is better (None:
    not judged), how it is computed, and what its formula leaves implicit (`note`, for docs/metrics.md). A metric
    whose CellResult field is a `Dist` has the statistics STATS (`ttft_ms.p50`); the others are one number."""

    key: str
    label: str
    unit: str
    better: Better
    formula: str = ""
    note: str = ""

    @property
    def stats(self) -> tuple[str, ...]:
        return STATS if self.key in DIST_KEYS else ()


METRICS: dict[str, Metric] = {m.key: m for m in (
    Metric("ttft_ms", "TTFT", "ms", "lower",
           "first token-carrying chunk (content or reasoning) - request sent",
           "counts the first chunk carrying a token, content *or* reasoning; TTFO the first carrying content. They "
           "differ only in thinking mode."),
    Metric("ttfo_ms", "TTFO", "ms", "lower", "first content chunk - request sent",
           "is missing for a request that streamed reasoning and never any content (it fails a TTFO SLO: SLOs and "
           "goodput, below)."),
    Metric("itl_ms", "ITL", "ms", "lower",
           "gap between consecutive token-carrying chunks after the first, pooled over requests",
           "pools every gap between consecutive token-carrying chunks after the first, over all requests (as vLLM "
           "does)."),
    Metric("itl_token_ms", "ITL per token", "ms", "lower", "that gap / tokens in the later chunk",
           "divides each gap by the tokens in the later chunk (a server that sends several tokens a chunk)."),
    Metric("tpot_ms", "TPOT", "ms", "lower", "(e2e - ttft) / (output_tokens - 1), per request",
           "is per request; a request with one output token has none."),
    Metric("e2e_ms", "E2E", "ms", "lower", "end of stream - request sent"),
    Metric("client_queue_ms", "client queue", "ms", "lower", "actual send - scheduled send",
           "is the actual send minus the scheduled send: coordinated omission made visible (an open loop whose "
           "client falls behind shows it here instead of hiding it in a later send)."),
    Metric("per_user_tok_s", "per-user tok/s", "tok/s", "higher", "output_tokens / e2e, per request",
           "is per request (then summarised as a distribution)."),
    Metric("prefill_tok_s", "prefill tok/s", "tok/s", "higher", "prompt_tokens / ttft, per request",
           "is per request (then summarised as a distribution)."),
    Metric("output_tok_s", "output tok/s (aggregate)", "tok/s", "higher",
           "sum of output tokens of successful requests / cell wall time",
           "is per cell, as are total tok/s, req/s and goodput: the cell's wall time runs from the first measured "
           "request's scheduled send to the last measured request's end."),
    Metric("total_tok_s", "total tok/s", "tok/s", "higher",
           "(input + output tokens of successful requests) / cell wall time"),
    Metric("request_s", "req/s", "req/s", "higher", "successful requests / cell wall time"),
    Metric("goodput_req_s", "goodput req/s", "req/s", "higher",
           "successful requests meeting every SLO / cell wall time"),
    Metric("slo_met_fraction", "SLO met", "", "higher"),
    Metric("prefix_cache_hit_rate", "prefix cache hit rate", "", None),
    Metric("input_tokens_mean", "input tokens (mean)", "tokens", None),
    Metric("output_tokens_mean", "output tokens (mean)", "tokens", None),
    Metric("reasoning_tokens_mean", "reasoning tokens (mean)", "tokens", None),
    Metric("requests_ok", "ok", "requests", None),
    Metric("requests_failed", "failed", "requests", None),
    Metric("requests_rate_limited", "requests rate-limited (HTTP 429)", "requests", None),
    Metric("wall_s", "wall", "s", None),
    Metric("cost.usd_per_1m_output_tokens", "cost $/1M out tok", "USD", "lower", note=(
        "is what a million output tokens cost at the cell's measured token mix and throughput, from the prices a "
        "sweep was given (--price for an API, --gpu-hour and --electricity-price for a GPU: docs/hosted.md)")),
    Metric("energy.j_per_output_token", "energy J/out tok", "J", "lower", note=(
               "is the trapezoid integral of every GPU's power over the cell's measured window divided by its output "
               "tokens, where NVML reads the GPUs' power (none without it: docs/telemetry.md)")),
)}


def metric_label(key: str) -> str:
    """A column label from the table: "ttft_ms.p50" -> "TTFT p50 ms", "per_user_tok_s.mean" ->
    "per-user tok/s (mean)", "output_tok_s" -> "output tok/s (aggregate)"."""
    if key in METRICS:
        return METRICS[key].label
    head, _, stat = key.partition(".")
    m = METRICS[head]
    if not stat:
        return m.label
    return f"{m.label} {stat} {m.unit}" if m.unit == "ms" else f"{m.label} ({stat})"


def metric_better(key: str) -> Better:
    """"lower", "higher" or None (not judged) for "ttft_ms.p50", "output_tok_s", ..."""
    return METRICS[key if key in METRICS else key.partition(".")[0]].better


@dataclass(frozen=True)
class Figure:
    """One figure of a cell, spelled once: its key, a metric (`output_tok_s`), a statistic of a metric's
    distribution (`ttft_ms.p50`) or a declared part's figure (`cost.usd_per_1m_output_tokens`). The key is the figure's
    column in cells.parquet and in the CSV report, its name in `gate --fail-on` and in the compare JSON, and what
    `CellResult.value` reads; its label, unit and direction are its metric's declaration. `figure(key)` checks it."""

    key: str
    metric: Metric
    stat: str | None = None

    @property
    def label(self) -> str:
        return metric_label(self.key)

    @property
    def unit(self) -> str:
        return self.metric.unit

    @property
    def better(self) -> Direction:
        return self.metric.better or "neutral"

    def value(self, summary: CellResult) -> float | None:
        return summary.value(self.key)


def figure(key: str) -> Figure:
    """The figure `key` names; a ValueError saying what is wrong with it otherwise."""
    if key in METRICS:
        return Figure(key, METRICS[key])
    head, _, stat = key.partition(".")
    m = METRICS.get(head)
    if m is None:
        raise ValueError(f"unknown figure {head!r}")
    if not m.stats:
        raise ValueError(f"{head} has no statistic (write it without .{stat})")
    if stat not in m.stats:
        raise ValueError(f"{head} needs one of .{', .'.join(m.stats)}" + (f" (not .{stat})" if stat else ""))
    return Figure(key, m, stat)


ColumnValue = str | int | float | bool | list[Json] | None


def summary_columns(summary: Mapping[str, object], lists: bool = False) -> dict[str, ColumnValue]:
    """A stored summary (`CellResult.to_dict()`) as flat columns, each named by its figure's key, the one spelling:
    `ttft_ms.p50`, `server.preemptions`, `client.loop_lag_ms.p99`. cells.parquet holds them beside the summary (its
    lists left out: they are in summary_json); the CSV report holds them all (`lists`: as they are, written as
    JSON)."""
    out: dict[str, ColumnValue] = {}

    def walk(d: Mapping[str, object], prefix: str) -> None:
        for k, v in d.items():
            if isinstance(v, Mapping):
                walk(v, f"{prefix}{k}.")
            elif isinstance(v, list):
                if lists:
                    out[f"{prefix}{k}"] = list(v)
            elif v is None or isinstance(v, (str, int, float, bool)):
                out[f"{prefix}{k}"] = v

    # the whole cell's figures beside a steady window's (`whole`: a second summary) stay in summary_json, read
    # through CellResult: cells.parquet's columns are the figures a cell is judged by
    walk({k: v for k, v in summary.items() if k != "whole"}, "")
    return out
