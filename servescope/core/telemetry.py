"""Server and GPU telemetry sampled during a run: vLLM's `/metrics` as a time series (here), the KV-cache
budget (core/kvbudget.py) and NVML readings turned into energy and cost (core/gpu.py); every name of the
three is importable from here.

Nothing here raises because telemetry is missing: a failed scrape is a missing sample (counted), a server
without `/metrics` leaves `MetricsSampler.available` False, and a machine without NVML leaves
`GpuSampler.available` False with a `reason`. Summaries then say so instead of inventing numbers.

pynvml is imported lazily (only when a GpuSampler is built), so importing this module costs little.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
import zlib
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from servescope.core.errors import error_text
from servescope.core.gpu import GPU_COLUMNS, GpuInfo, GpuSampler, describe_gpus, list_gpus
from servescope.core.kvbudget import KVBudget, kv_budget_from_log, kv_budget_from_parsed
from servescope.core.rawhttp import RawClient
from servescope.core.results import ServerWindow, TelemetryWindow
from servescope.core.servermetrics import MetricsReader, labels_of
from servescope.core.specdecode import LORA_INFO, SPEC_COUNTERS, lora_keys
from servescope.core.textsafe import clean_text

if TYPE_CHECKING:
    import ssl

    import httpx
    import polars as pl

__all__ = [
    "COLUMNS",
    "GPU_COLUMNS",
    "GpuInfo",
    "GpuSampler",
    "KVBudget",
    "MetricsSampler",
    "MetricsSource",
    "RawMetrics",
    "describe_gpus",
    "kv_budget_from_log",
    "kv_budget_from_metrics",
    "list_gpus",
    "parse_metrics",
    "server_delta",
]

# --------------------------------------------------------------------------------------------------------
# /metrics
# --------------------------------------------------------------------------------------------------------

# column -> Prometheus sample names, newest first (older vLLM versions used the later ones; llama.cpp's server,
# with --metrics, has its own names for the same figures: requests processing / deferred, prompt tokens
# processed, tokens predicted; older builds had a KV-cache usage ratio)
GAUGES: dict[str, tuple[str, ...]] = {
    "kv_cache_usage_perc": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "llamacpp:kv_cache_usage_ratio"),
    "num_requests_running": ("vllm:num_requests_running", "llamacpp:requests_processing"),
    "num_requests_waiting": ("vllm:num_requests_waiting", "llamacpp:requests_deferred"),
}
COUNTERS: dict[str, tuple[str, ...]] = {
    "num_preemptions_total": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    "prompt_tokens_total": ("vllm:prompt_tokens_total", "vllm:prompt_tokens", "llamacpp:prompt_tokens_total"),
    "generation_tokens_total": ("vllm:generation_tokens_total", "vllm:generation_tokens",
                                "llamacpp:tokens_predicted_total"),
    "prefix_cache_queries_total": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_cache_hits_total": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "request_success_total": ("vllm:request_success_total", "vllm:request_success"),
}
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "e2e": ("vllm:e2e_request_latency_seconds",),
    "queue": ("vllm:request_queue_time_seconds",),
}
CACHE_INFO = "vllm:cache_config_info"
# speculative decoding's counters and the LoRA gauge (core/specdecode.py reads them from the boundary samples)
EXTRA = (*SPEC_COUNTERS, LORA_INFO)

COLUMNS: tuple[str, ...] = (
    *GAUGES,
    *COUNTERS,
    *(f"{h}_seconds_{part}" for h in HISTOGRAMS for part in ("sum", "count")),
)

# Every /metrics sample name a scrape reads, in one list: the columns above (each with its older names), the KV
# budget's labels, and EXTRA. A scrape reads these and skips the rest of the text unread (core/servermetrics.py's
# MetricsReader): to read another figure, add its sample name to EXTRA (or a column above).
READ: frozenset[str] = frozenset(
    [n for names in (*GAUGES.values(), *COUNTERS.values()) for n in names]
    + [f"{n}_{part}" for names in HISTOGRAMS.values() for n in names for part in ("sum", "count")]
    + [CACHE_INFO, *EXTRA]
)
_MAX_OVER_LABELS = frozenset(GAUGES["kv_cache_usage_perc"])  # a fraction: take the fullest engine
_READER = MetricsReader(READ)


@functools.lru_cache(maxsize=16)
def _cache_config(labels: bytes) -> dict[str, float | str]:
    """`vllm:cache_config_info`'s labels as `cache_config.<label>` (numbers as float): the same at every scrape."""
    out: dict[str, float | str] = {}
    for k, v in labels_of(labels).items():
        try:
            out[f"cache_config.{k}"] = float(v)
        except ValueError:
            out[f"cache_config.{k}"] = v
    return out


def parse_metrics(text: str | bytes) -> dict[str, float | str]:
    """vLLM's /metrics text -> {sample name: value summed over label sets} for the samples servescope reads
    (`READ`; KV usage: the highest over label sets), plus `cache_config.<label>` for every label of
    `vllm:cache_config_info` (numbers as float, others as str) and, from `vllm:lora_requests_info`, each running
    adapter's newest time (`lora.running.<name>`, core/specdecode.py). Every other family is skipped unread."""
    data = text.encode("utf-8", "replace") if isinstance(text, str) else text
    out: dict[str, float | str] = {}
    for name, labels, value in _READER.samples(data):
        if name == CACHE_INFO:
            out.update(_cache_config(labels))
            continue
        if name == LORA_INFO:
            lora_keys(labels_of(labels), value, out)
            continue
        prev = out.get(name)
        if isinstance(prev, float):
            value = max(prev, value) if name in _MAX_OVER_LABELS else prev + value
        out[name] = value
    return out


def kv_budget_from_metrics(parsed: Mapping[str, float | str] | str,
                           max_model_len: int | None = None) -> KVBudget | None:
    """The KV budget `vllm:cache_config_info` states: `parsed` is `parse_metrics()` output or raw /metrics
    text (see core.kvbudget.kv_budget_from_parsed). None when the labels are absent."""
    return kv_budget_from_parsed(parse_metrics(parsed) if isinstance(parsed, str) else parsed, max_model_len)


def _row_from_parsed(parsed: Mapping[str, float | str]) -> list[float]:
    """One row of COLUMNS (NaN where the server has no such metric)."""
    row: list[float] = []

    def pick(names: Sequence[str], suffix: str = "") -> float:
        for n in names:
            v = parsed.get(n + suffix)
            if isinstance(v, float):
                return v
        return math.nan

    for names in GAUGES.values():
        row.append(pick(names))
    for names in COUNTERS.values():
        row.append(pick(names))
    for names in HISTOGRAMS.values():
        row.append(pick(names, "_sum"))
        row.append(pick(names, "_count"))
    return row


def _increase(values: Sequence[float]) -> float | None:
    """Prometheus-style increase of a counter over consecutive samples (a drop is a server restart: the
    counter started again from zero). None when the server never reported it."""
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return None
    total = 0.0
    for a, b in zip(vals, vals[1:], strict=False):
        total += (b - a) if b >= a else b
    return total


class MetricsSource(Protocol):
    """Where a sampler's scrapes go: `fetch(path, timeout_s)` -> (HTTP status, body). `metrics_client` makes the
    real one (one kept-alive connection); an httpx.AsyncClient is taken too (tests)."""

    async def fetch(self, path: str, timeout_s: float) -> tuple[int, bytes]: ...


MAX_METRICS_BYTES = 32 * 2**20  # a /metrics answer larger than this is a failed scrape (vLLM's is ~70 kB)


class RawMetrics:
    """GET /metrics over core/rawhttp.py's transport on one kept-alive connection (re-opened only when the server
    closed it, or after `KEEPALIVE_S` idle), the body kept as bytes: no client library's per-request machinery."""

    def __init__(self, base_url: str, headers: Mapping[str, str] | None = None,
                 ssl_context: Callable[[], ssl.SSLContext] | None = None, idle_s: float = 4.0) -> None:
        self.http = RawClient(base_url, dict(headers or {}), 1, idle_s, connect_timeout_s=10.0,
                              ssl_context=ssl_context, log_connections=False)

    async def fetch(self, path: str, timeout_s: float) -> tuple[int, bytes]:
        heads: dict[str, str] = {}
        async with asyncio.timeout(timeout_s):
            status, body = await self.http.get(path, MAX_METRICS_BYTES, heads)
        enc = heads.get("content-encoding", "").strip().lower()
        if status == 200 and enc in ("gzip", "x-gzip", "deflate"):  # never asked for; undone if sent all the same
            d = zlib.decompressobj(16 + zlib.MAX_WBITS if enc != "deflate" else zlib.MAX_WBITS)
            body = d.decompress(body, MAX_METRICS_BYTES)
        return status, body

    async def aclose(self) -> None:
        await self.http.close()


class _HttpxSource:
    """An httpx.AsyncClient as a MetricsSource."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def fetch(self, path: str, timeout_s: float) -> tuple[int, bytes]:
        r = await self.http.get(path, timeout=timeout_s)
        return r.status_code, r.content


class MetricsSampler:
    """Scrapes `/metrics` every `interval_s` in a background task (on the caller's event loop) and keeps the
    samples as columns stamped with `time.perf_counter_ns()` (the middle of each scrape).

    `await start()` scrapes once before it returns, so `available` is known at once (False: the first
    scrape failed, e.g. the server has no /metrics; the task then stops). `await sample_now()` adds a
    sample at once (call it at cell boundaries for exact per-cell deltas).

    Each scrape measures its own cost: the CPU time of the thread it runs on from its start to its end (the request,
    the reads, the parse; `scrape_cost` sums them over a window). Run it on a loop of its own (engine/background.py)
    and that is the scrape's alone.
    """

    def __init__(self, http: MetricsSource | httpx.AsyncClient, interval_s: float = 1.0, path: str = "/metrics",
                 timeout_s: float = 5.0) -> None:
        self.http = http
        self.source: MetricsSource = http if hasattr(http, "fetch") else _HttpxSource(http)
        self.interval_s = float(interval_s)
        self.path = path
        self.timeout_s = timeout_s
        self.t_ns: array[int] = array("q")
        self.cols: dict[str, array[float]] = {c: array("d") for c in COLUMNS}
        self.failures = 0
        self.failure_t_ns: array[int] = array("q")
        # every scrape's end (perf_counter_ns) and its CPU time (ns), failed ones too
        self.cost_t_ns: array[int] = array("q")
        self.cost_cpu_ns: array[int] = array("q")
        self.available: bool | None = None  # None until the first scrape
        self.reason = ""
        self.last_error = ""
        self.cache_info: dict[str, float | str] = {}
        self.last: dict[str, float | str] = {}
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    # compact columns, row by row
    @property
    def rows(self) -> dict[str, array[int] | array[float]]:
        return {"t_ns": self.t_ns, **self.cols}

    def __len__(self) -> int:
        return len(self.t_ns)

    async def start(self) -> None:
        if self._task is not None:
            return
        ok = await self.sample_now()
        self.available = ok
        if not ok:
            self.reason = f"no usable {self.path} on the server ({self.last_error or 'no answer'})"
            return
        self._task = asyncio.create_task(self._run(), name="servescope-metrics-sampler")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        nxt = time.perf_counter() + self.interval_s
        while True:
            await asyncio.sleep(max(0.0, nxt - time.perf_counter()))
            await self.sample_now()
            nxt += self.interval_s
            now = time.perf_counter()
            if nxt < now:  # fell behind (a slow scrape): skip ahead instead of bursting
                nxt = now + self.interval_s

    async def sample_now(self) -> bool:
        """Scrape once and add a row; False (and a counted failure) when the scrape failed."""
        return await self.snapshot() is not None

    async def snapshot(self) -> dict[str, float | str] | None:
        """`sample_now()` that also returns that very sample, parsed (as `parse_metrics`), or None when the
        scrape failed: the cell boundaries' samples, from which `server_delta` gives a cell's counts."""
        async with self._lock:
            cpu0 = time.thread_time_ns()
            t_a = time.perf_counter_ns()
            try:
                status, body = await self.source.fetch(self.path, self.timeout_s)
                t_b = time.perf_counter_ns()
                if status != 200:
                    raise ValueError(f"HTTP {status}")
                parsed = parse_metrics(body)
                row = _row_from_parsed(parsed)
                if all(math.isnan(v) for v in row):
                    raise ValueError("no vLLM or llama.cpp metrics in the answer")
            except Exception as e:  # noqa: BLE001 - any failure is a missing sample
                self.failures += 1
                self.failure_t_ns.append(time.perf_counter_ns())
                self.last_error = clean_text(error_text(e))[:200]
                self._cost(cpu0)
                return None
            self.t_ns.append((t_a + t_b) // 2)
            for c, v in zip(COLUMNS, row, strict=True):
                self.cols[c].append(v)
            info = {k: v for k, v in parsed.items() if k.startswith("cache_config.")}
            if info:
                self.cache_info = info
            self.last = parsed
            self._cost(cpu0)
            return parsed

    def _cost(self, cpu0: int) -> None:
        self.cost_cpu_ns.append(time.thread_time_ns() - cpu0)
        self.cost_t_ns.append(time.perf_counter_ns())

    def scrape_cost(self, t0_ns: int, t1_ns: int) -> tuple[int, float]:
        """The scrapes that ended between t0 and t1 (perf_counter_ns; failed ones too) and their CPU time (s)."""
        lo, hi = bisect_left(self.cost_t_ns, t0_ns), bisect_right(self.cost_t_ns, t1_ns)
        return hi - lo, sum(self.cost_cpu_ns[lo:hi]) / 1e9

    def kv_budget(self, max_model_len: int | None = None) -> KVBudget | None:
        """The KV budget from the last `vllm:cache_config_info` seen (None when the server has none)."""
        return kv_budget_from_metrics(self.cache_info, max_model_len) if self.cache_info else None

    def frame(self) -> pl.DataFrame:
        """The samples: `t_ns` (Int64) and one Float64 column per metric (null where the server lacks it)."""
        import polars as pl

        # the sampler may be appending a sample on its own thread meanwhile: take the rows complete in every column
        n = min([len(self.t_ns), *(len(a) for a in self.cols.values())])
        data: dict[str, pl.Series] = {"t_ns": pl.Series("t_ns", self.t_ns[:n].tolist(), dtype=pl.Int64)}
        for c, arr in self.cols.items():
            data[c] = pl.Series(c, arr[:n].tolist(), dtype=pl.Float64).fill_nan(None)
        return pl.DataFrame(data)

    def window_summary(self, t0_ns: int, t1_ns: int) -> TelemetryWindow:
        """What the server reported between t0 and t1 (perf_counter_ns stamps).

        Gauges (KV usage, running, waiting) use the samples inside the window. Counters and histogram
        sums/counts are increases from the last sample at or before t0 (else the first inside) to the last
        sample at or before t1, so requests finishing after the last sample are missed unless
        `sample_now()` was called at t1. Latencies are in ms; None where unknown.
        """
        t = self.t_ns
        lo = bisect_left(t, t0_ns)
        hi = bisect_right(t, t1_ns)
        base = lo - 1 if lo > 0 else lo
        failures = bisect_right(self.failure_t_ns, t1_ns) - bisect_left(self.failure_t_ns, t0_ns)

        def inside(col: str) -> list[float]:
            return [v for v in self.cols[col][lo:hi] if not math.isnan(v)]

        def mean(vals: list[float]) -> float | None:
            return sum(vals) / len(vals) if vals else None

        def inc(col: str) -> float | None:
            if hi - base < 2:
                return None
            return _increase(self.cols[col][base:hi])

        def hist_ms(name: str) -> float | None:
            s = inc(f"{name}_seconds_sum")
            n = inc(f"{name}_seconds_count")
            return (s / n * 1000.0) if s is not None and n else None

        kv = inside("kv_cache_usage_perc")
        running = inside("num_requests_running")
        waiting = inside("num_requests_waiting")
        stamps = [ts for ts, v in zip(t[lo:hi], self.cols["num_requests_waiting"][lo:hi], strict=True)
                  if not math.isnan(v)]
        slope, slope_t = _slope([ts / 1e9 for ts in stamps], waiting)
        q = inc("prefix_cache_queries_total")
        h = inc("prefix_cache_hits_total")
        return TelemetryWindow(
            available=bool(self.available),
            reason=self.reason or None,
            samples=hi - lo,
            scrape_failures=failures,
            kv_cache_usage_peak=max(kv) if kv else None,
            kv_cache_usage_mean=mean(kv),
            running_mean=mean(running),
            running_max=max(running) if running else None,
            waiting_mean=mean(waiting),
            waiting_max=max(waiting) if waiting else None,
            preemptions=inc("num_preemptions_total"),
            prompt_tokens=inc("prompt_tokens_total"),
            generation_tokens=inc("generation_tokens_total"),
            requests_success=inc("request_success_total"),
            prefix_cache_queries=q,
            prefix_cache_hits=h,
            prefix_cache_hit_rate=(h / q) if q and h is not None else None,
            ttft_ms_mean=hist_ms("ttft"),
            itl_ms_mean=hist_ms("itl"),
            e2e_ms_mean=hist_ms("e2e"),
            queue_ms_mean=hist_ms("queue"),
            waiting_min=min(waiting) if waiting else None,
            waiting_slope_per_s=slope,
            waiting_slope_t=slope_t,
        )


def _slope(xs: Sequence[float], ys: Sequence[float]) -> tuple[float | None, float | None]:
    """The least-squares slope of ys over xs and its t statistic (1e9 for a perfect line with a slope, 0 for a flat
    one: kept finite, for JSON); (None, None) with fewer than 3 points or no spread in xs."""
    n = len(xs)
    if n < 3 or n != len(ys):
        return None, None
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx <= 0:
        return None, None
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    resid = sum((y - my - b * (x - mx)) ** 2 for x, y in zip(xs, ys, strict=True))
    se = math.sqrt(resid / (n - 2) / sxx)
    if se == 0:
        return b, (1e9 if b > 0 else -1e9 if b < 0 else 0.0)
    return b, b / se


# --------------------------------------------------------------------------------------------------------
# one cell's server counts, from its two boundary samples
# --------------------------------------------------------------------------------------------------------


def _hist_mean_ms(before: Mapping[str, float | str], after: Mapping[str, float | str], base: str) -> float | None:
    ds = _f(after.get(f"{base}_sum")) - _f(before.get(f"{base}_sum"))
    dc = _f(after.get(f"{base}_count")) - _f(before.get(f"{base}_count"))
    return ds / dc * 1000 if dc > 0 else None


def _f(v: float | str | None) -> float:
    return v if isinstance(v, float) else 0.0


def server_delta(before: Mapping[str, float | str] | None,
                 after: Mapping[str, float | str] | None) -> ServerWindow | None:
    """What the server counted between two samples (`MetricsSampler.snapshot()` at a cell's start, after its
    warmup, and at its end): the summary's "server" object, with the keys reports and `--json` read. None
    without both samples."""
    if not before or not after:
        return None

    def d(*names: str) -> float | None:
        for name in names:  # the first the server has (vLLM's, else llama.cpp's)
            v = after.get(name)
            if isinstance(v, float):
                return v - _f(before.get(name))
        return None

    q = d("vllm:prefix_cache_queries_total")
    h = d("vllm:prefix_cache_hits_total")
    return ServerWindow(
        requests_success=d("vllm:request_success_total"),
        prompt_tokens=d("vllm:prompt_tokens_total", "llamacpp:prompt_tokens_total"),
        generation_tokens=d("vllm:generation_tokens_total", "llamacpp:tokens_predicted_total"),
        preemptions=d("vllm:num_preemptions_total"),
        ttft_ms_mean=_hist_mean_ms(before, after, "vllm:time_to_first_token_seconds"),
        itl_ms_mean=_hist_mean_ms(before, after, "vllm:inter_token_latency_seconds")
        or _hist_mean_ms(before, after, "vllm:time_per_output_token_seconds"),
        e2e_ms_mean=_hist_mean_ms(before, after, "vllm:e2e_request_latency_seconds"),
        queue_ms_mean=_hist_mean_ms(before, after, "vllm:request_queue_time_seconds"),
        # the same figure as the KV budget (session.toml kv_budget, the app): stated size, else blocks x size
        kv_cache_tokens=float(kb.tokens) if (kb := kv_budget_from_parsed(after)) is not None else None,
        prefix_cache_hit_rate=(h / q) if q and h is not None else None,
    )
