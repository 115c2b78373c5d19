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
import math
import time
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from servescope.core.errors import error_text
from servescope.core.gpu import GPU_COLUMNS, GpuInfo, GpuSampler, describe_gpus, list_gpus
from servescope.core.kvbudget import KVBudget, kv_budget_from_log, kv_budget_from_parsed
from servescope.core.results import ServerWindow, TelemetryWindow
from servescope.core.specdecode import LORA_INFO, SPEC_COUNTERS, lora_keys
from servescope.core.textsafe import clean_text

if TYPE_CHECKING:
    import httpx
    import polars as pl

__all__ = [
    "COLUMNS",
    "GPU_COLUMNS",
    "GpuInfo",
    "GpuSampler",
    "KVBudget",
    "MetricsSampler",
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

_WANTED: frozenset[str] = frozenset(
    [n for names in (*GAUGES.values(), *COUNTERS.values()) for n in names]
    + [f"{n}_{part}" for names in HISTOGRAMS.values() for n in names for part in ("sum", "count")]
    + [CACHE_INFO, *EXTRA]
)
_MAX_OVER_LABELS = frozenset(GAUGES["kv_cache_usage_perc"])  # a fraction: take the fullest engine


def _family_names(name: str) -> set[str]:
    out = {name}
    for suffix in ("_total", "_sum", "_count", "_bucket", "_created", "_info"):
        if name.endswith(suffix):
            out.add(name[: -len(suffix)])
    return out


_WANTED_FAMILIES: frozenset[str] = frozenset(f for n in _WANTED for f in _family_names(n))


def _prefilter(text: str) -> str:
    """Keep only the lines of the families we read (vLLM's /metrics is mostly histogram buckets we skip):
    prometheus_client's parser then has a tenth of the text to read."""
    keep: list[str] = []
    for line in text.splitlines():
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2] in _WANTED_FAMILIES:
                keep.append(line)
            continue
        end = len(line)
        for ch in "{ ":
            i = line.find(ch)
            if 0 <= i < end:
                end = i
        if line[:end] in _WANTED:
            keep.append(line)
    keep.append("")
    return "\n".join(keep)


def parse_metrics(text: str) -> dict[str, float | str]:
    """vLLM's /metrics text -> {sample name: value summed over label sets} for the samples servescope reads
    (KV usage: the highest over label sets), plus `cache_config.<label>` for every label of
    `vllm:cache_config_info` (numbers as float, others as str) and, from `vllm:lora_requests_info`, each running
    adapter's newest time (`lora.running.<name>`, core/specdecode.py). Uses prometheus_client's parser."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float | str] = {}
    for fam in text_string_to_metric_families(_prefilter(text)):
        for s in fam.samples:
            name = s.name
            if name not in _WANTED:
                continue
            if name == CACHE_INFO:
                for k, v in s.labels.items():
                    try:
                        out[f"cache_config.{k}"] = float(v)
                    except ValueError:
                        out[f"cache_config.{k}"] = v
                continue
            if name == LORA_INFO:
                lora_keys(s.labels, float(s.value), out)
                continue
            value = float(s.value)
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


class MetricsSampler:
    """Scrapes `/metrics` every `interval_s` in a background task (on the caller's event loop) and keeps the
    samples as columns stamped with `time.perf_counter_ns()` (the middle of each scrape).

    `await start()` scrapes once before it returns, so `available` is known at once (False: the first
    scrape failed, e.g. the server has no /metrics; the task then stops). `await sample_now()` adds a
    sample at once (call it at cell boundaries for exact per-cell deltas).
    """

    def __init__(self, http: httpx.AsyncClient, interval_s: float = 1.0, path: str = "/metrics",
                 timeout_s: float = 5.0) -> None:
        self.http = http
        self.interval_s = float(interval_s)
        self.path = path
        self.timeout_s = timeout_s
        self.t_ns: array[int] = array("q")
        self.cols: dict[str, array[float]] = {c: array("d") for c in COLUMNS}
        self.failures = 0
        self.failure_t_ns: array[int] = array("q")
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
            t_a = time.perf_counter_ns()
            try:
                r = await self.http.get(self.path, timeout=self.timeout_s)
                t_b = time.perf_counter_ns()
                if r.status_code != 200:
                    raise ValueError(f"HTTP {r.status_code}")
                parsed = parse_metrics(r.text)
                row = _row_from_parsed(parsed)
                if all(math.isnan(v) for v in row):
                    raise ValueError("no vLLM or llama.cpp metrics in the answer")
            except Exception as e:  # noqa: BLE001 - any failure is a missing sample
                self.failures += 1
                self.failure_t_ns.append(time.perf_counter_ns())
                self.last_error = clean_text(error_text(e))[:200]
                return None
            self.t_ns.append((t_a + t_b) // 2)
            for c, v in zip(COLUMNS, row, strict=True):
                self.cols[c].append(v)
            info = {k: v for k, v in parsed.items() if k.startswith("cache_config.")}
            if info:
                self.cache_info = info
            self.last = parsed
            return parsed

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
