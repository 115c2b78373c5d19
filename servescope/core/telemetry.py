"""Server and GPU telemetry sampled during a run: vLLM's `/metrics` as a time series, the KV-cache budget,
and NVML readings (memory, utilisation, power, clocks, temperature) turned into energy and cost.

Nothing here raises because telemetry is missing: a failed scrape is a missing sample (counted), a server
without `/metrics` leaves `MetricsSampler.available` False, and a machine without NVML leaves
`GpuSampler.available` False with a `reason`. Summaries then say so instead of inventing numbers.

pynvml is imported lazily (only when a GpuSampler is built), so importing this module costs little.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
import threading
import time
import warnings
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx
    import polars as pl

__all__ = [
    "GpuSampler",
    "KVBudget",
    "MetricsSampler",
    "kv_budget_from_log",
    "kv_budget_from_metrics",
    "parse_metrics",
]

# --------------------------------------------------------------------------------------------------------
# /metrics
# --------------------------------------------------------------------------------------------------------

# column -> Prometheus sample names, newest first (older vLLM versions used the later ones)
GAUGES: dict[str, tuple[str, ...]] = {
    "kv_cache_usage_perc": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "num_requests_running": ("vllm:num_requests_running",),
    "num_requests_waiting": ("vllm:num_requests_waiting",),
}
COUNTERS: dict[str, tuple[str, ...]] = {
    "num_preemptions_total": ("vllm:num_preemptions_total", "vllm:num_preemptions"),
    "prompt_tokens_total": ("vllm:prompt_tokens_total", "vllm:prompt_tokens"),
    "generation_tokens_total": ("vllm:generation_tokens_total", "vllm:generation_tokens"),
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

COLUMNS: tuple[str, ...] = (
    *GAUGES,
    *COUNTERS,
    *(f"{h}_seconds_{part}" for h in HISTOGRAMS for part in ("sum", "count")),
)

_WANTED: frozenset[str] = frozenset(
    [n for names in (*GAUGES.values(), *COUNTERS.values()) for n in names]
    + [f"{n}_{part}" for names in HISTOGRAMS.values() for n in names for part in ("sum", "count")]
    + [CACHE_INFO]
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
    `vllm:cache_config_info` (numbers as float, others as str). Uses prometheus_client's parser."""
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
            value = float(s.value)
            prev = out.get(name)
            if isinstance(prev, float):
                value = max(prev, value) if name in _MAX_OVER_LABELS else prev + value
            out[name] = value
    return out


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
    def rows(self) -> dict[str, array[Any]]:
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
                    raise ValueError("no vLLM metrics in the answer")
            except Exception as e:  # noqa: BLE001 - any failure is a missing sample
                self.failures += 1
                self.failure_t_ns.append(time.perf_counter_ns())
                from servescope.core.textsafe import clean_text

                self.last_error = clean_text(f"{type(e).__name__}: {e}")[:200]
                return False
            self.t_ns.append((t_a + t_b) // 2)
            for c, v in zip(COLUMNS, row, strict=True):
                self.cols[c].append(v)
            info = {k: v for k, v in parsed.items() if k.startswith("cache_config.")}
            if info:
                self.cache_info = info
            self.last = parsed
            return True

    def kv_budget(self, max_model_len: int | None = None) -> KVBudget | None:
        """The KV budget from the last `vllm:cache_config_info` seen (None when the server has none)."""
        return kv_budget_from_metrics(self.cache_info, max_model_len) if self.cache_info else None

    def frame(self) -> pl.DataFrame:
        """The samples: `t_ns` (Int64) and one Float64 column per metric (null where the server lacks it)."""
        import polars as pl

        data: dict[str, Any] = {"t_ns": pl.Series("t_ns", self.t_ns.tolist(), dtype=pl.Int64)}
        for c, arr in self.cols.items():
            data[c] = pl.Series(c, arr.tolist(), dtype=pl.Float64).fill_nan(None)
        return pl.DataFrame(data)

    def window_summary(self, t0_ns: int, t1_ns: int) -> dict[str, Any]:
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
        out: dict[str, Any] = {
            "available": bool(self.available),
            "reason": self.reason or None,
            "samples": hi - lo,
            "scrape_failures": failures,
        }

        def inside(col: str) -> list[float]:
            return [v for v in self.cols[col][lo:hi] if not math.isnan(v)]

        kv = inside("kv_cache_usage_perc")
        out["kv_cache_usage_peak"] = max(kv) if kv else None
        out["kv_cache_usage_mean"] = sum(kv) / len(kv) if kv else None
        for col, key in (("num_requests_running", "running"), ("num_requests_waiting", "waiting")):
            vals = inside(col)
            out[f"{key}_mean"] = sum(vals) / len(vals) if vals else None
            out[f"{key}_max"] = max(vals) if vals else None

        def inc(col: str) -> float | None:
            if hi - base < 2:
                return None
            return _increase(self.cols[col][base:hi])

        out["preemptions"] = inc("num_preemptions_total")
        out["prompt_tokens"] = inc("prompt_tokens_total")
        out["generation_tokens"] = inc("generation_tokens_total")
        out["requests_success"] = inc("request_success_total")
        q = inc("prefix_cache_queries_total")
        h = inc("prefix_cache_hits_total")
        out["prefix_cache_queries"] = q
        out["prefix_cache_hits"] = h
        out["prefix_cache_hit_rate"] = (h / q) if q and h is not None else None
        for name in HISTOGRAMS:
            s = inc(f"{name}_seconds_sum")
            n = inc(f"{name}_seconds_count")
            out[f"{name}_ms_mean"] = (s / n * 1000.0) if s is not None and n else None
        return out


# --------------------------------------------------------------------------------------------------------
# KV-cache budget
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KVBudget:
    """How many tokens of KV cache the server holds, and what that means for concurrency.

    `concurrency_at` is vLLM's own statement `(tokens per request, max concurrency)` (from the log line
    `Maximum concurrency for 32,768 tokens per request: 2.41x` or cache_config_info's
    `kv_cache_max_concurrency` at max_model_len), rounded as vLLM printed it.
    """

    tokens: int
    source: str  # "metrics" or "log"
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    cache_dtype: str | None = None
    gpu_memory_utilization: float | None = None
    concurrency_at: tuple[int, float] | None = None

    def max_concurrency(self, tokens_per_request: int) -> float:
        """Requests of `tokens_per_request` (input + output) that fit in the KV cache at once.

        As vLLM: whole blocks per request (num_blocks / ceil(tokens / block_size)) when the block size is
        known, else tokens / tokens_per_request. For vLLM's own length its stated figure is returned
        (it also accounts for hybrid/sliding-window layers, which this arithmetic does not)."""
        if tokens_per_request <= 0:
            return math.inf
        if self.concurrency_at and self.concurrency_at[0] == tokens_per_request:
            return self.concurrency_at[1]
        if self.block_size:
            blocks = self.num_gpu_blocks if self.num_gpu_blocks else self.tokens // self.block_size
            return blocks / math.ceil(tokens_per_request / self.block_size)
        return self.tokens / tokens_per_request

    def same_budget(self, other: KVBudget) -> bool:
        """True when two sources state the same budget (tokens, and the concurrency both state)."""
        if self.tokens != other.tokens:
            return False
        if self.concurrency_at and other.concurrency_at and self.concurrency_at[0] == other.concurrency_at[0]:
            return abs(self.concurrency_at[1] - other.concurrency_at[1]) < 0.006
        return True

    def as_dict(self) -> dict[str, Any]:
        return {
            "kv_cache_tokens": self.tokens,
            "source": self.source,
            "num_gpu_blocks": self.num_gpu_blocks,
            "block_size": self.block_size,
            "cache_dtype": self.cache_dtype,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "concurrency_at_tokens": self.concurrency_at[0] if self.concurrency_at else None,
            "concurrency_at": self.concurrency_at[1] if self.concurrency_at else None,
        }


def _num(v: float | str | None) -> float | None:
    if v is None:
        return None
    try:
        return float(v)
    except ValueError:
        return None


def kv_budget_from_metrics(parsed: Mapping[str, float | str] | str,
                           max_model_len: int | None = None) -> KVBudget | None:
    """From `vllm:cache_config_info`: `parsed` is `parse_metrics()` output (keys `cache_config.<label>`) or
    raw /metrics text. Tokens: `kv_cache_size_tokens` when the server states it, else
    num_gpu_blocks x block_size. Its `kv_cache_max_concurrency` is for max_model_len, which the labels do
    not carry: pass it (from /v1/models) to keep that figure in `concurrency_at`.
    None when the labels are absent (older vLLM, other servers)."""
    if isinstance(parsed, str):
        parsed = parse_metrics(parsed)
    blocks = _num(parsed.get("cache_config.num_gpu_blocks"))
    bs = _num(parsed.get("cache_config.block_size"))
    stated = _num(parsed.get("cache_config.kv_cache_size_tokens"))
    if stated is not None and stated > 0:
        tokens = int(stated)
    elif blocks and bs:
        tokens = int(blocks * bs)
    else:
        return None
    dtype = parsed.get("cache_config.cache_dtype")
    conc = _num(parsed.get("cache_config.kv_cache_max_concurrency"))
    mml = max_model_len or _num(parsed.get("cache_config.max_model_len"))
    return KVBudget(
        tokens=tokens,
        source="metrics",
        num_gpu_blocks=int(blocks) if blocks else None,
        block_size=int(bs) if bs else None,
        cache_dtype=str(dtype) if dtype is not None and not isinstance(dtype, float) else None,
        gpu_memory_utilization=_num(parsed.get("cache_config.gpu_memory_utilization")),
        concurrency_at=(int(mml), conc) if conc is not None and mml else None,
    )


_KV_LINE = re.compile(r"(?:GPU|CPU)?\s*KV cache size:\s*([\d,_]+)\s*tokens", re.IGNORECASE)
_CONC_LINE = re.compile(
    r"Maximum concurrency for\s*([\d,_]+)\s*tokens per request:\s*([\d.,]+)\s*x", re.IGNORECASE
)


def kv_budget_from_log(text: str) -> KVBudget | None:
    """From vLLM's startup lines `GPU KV cache size: 12,752 tokens` (the CPU build says `GPU` too) and
    `Maximum concurrency for 32,768 tokens per request: 2.41x`. The last statement wins (a restart logged
    into the same file). None when the log has no KV cache size line yet."""
    kv = _KV_LINE.findall(text)
    if not kv:
        return None
    tokens = int(re.sub(r"[,_]", "", kv[-1]))
    conc = _CONC_LINE.findall(text)
    at: tuple[int, float] | None = None
    if conc:
        length, x = conc[-1]
        at = (int(re.sub(r"[,_]", "", length)), float(x.replace(",", "")))
    return KVBudget(tokens=tokens, source="log", concurrency_at=at)


# --------------------------------------------------------------------------------------------------------
# GPU (NVML)
# --------------------------------------------------------------------------------------------------------

GPU_COLUMNS: tuple[str, ...] = ("mem_used_gib", "mem_total_gib", "util_pct", "power_w", "sm_clock_mhz",
                                "temp_c", "energy_j")
_GIB = float(1 << 30)


def _import_pynvml() -> Any:
    with warnings.catch_warnings():  # the `pynvml` shim over nvidia-ml-py warns that it is deprecated
        warnings.simplefilter("ignore")
        import pynvml

    return pynvml


class GpuSampler:
    """NVML readings per GPU every `interval_s` in a background thread.

    Built without NVML (pynvml missing, no driver, no GPU), it is a no-op: `available` False and `reason`
    says why; `frame()` is empty and summaries carry the reason. `nvml` may be any object with pynvml's
    functions (tests pass a fake); `clock` returns perf_counter_ns-compatible stamps.
    """

    def __init__(self, interval_s: float = 1.0, nvml: Any = None, indices: Sequence[int] | None = None,
                 clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.interval_s = float(interval_s)
        self.clock = clock
        self.available = False
        self.reason = ""
        self.names: list[str] = []
        self.indices: list[int] = []
        self._handles: list[Any] = []
        self._nvml: Any = None
        self.t_ns: array[int] = array("q")
        self.gpu: array[int] = array("b")
        self.cols: dict[str, array[float]] = {c: array("d") for c in GPU_COLUMNS}
        self.errors = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        try:
            nv = nvml if nvml is not None else _import_pynvml()
        except Exception as e:  # noqa: BLE001 - ImportError and anything a broken install raises
            self.reason = f"pynvml cannot be imported ({type(e).__name__}: {e}); install nvidia-ml-py"
            return
        try:
            nv.nvmlInit()
        except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded...
            self.reason = f"NVML is not available: nvmlInit failed ({_err_text(e)}); no NVIDIA driver or GPU here?"
            return
        try:
            count = int(nv.nvmlDeviceGetCount())
            wanted = list(range(count)) if indices is None else [i for i in indices if 0 <= i < count]
            for i in wanted:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                name = nv.nvmlDeviceGetName(h)
                self.names.append(name.decode(errors="replace") if isinstance(name, bytes) else str(name))
                self.indices.append(i)
                self._handles.append(h)
        except Exception as e:  # noqa: BLE001
            self.reason = f"NVML could not list the GPUs ({_err_text(e)})"
            with contextlib.suppress(Exception):
                nv.nvmlShutdown()
            return
        if not self._handles:
            self.reason = "NVML found no GPU" if indices is None else f"NVML found none of the GPUs {list(indices)}"
            with contextlib.suppress(Exception):
                nv.nvmlShutdown()
            return
        self._nvml = nv
        self.available = True

    # --- sampling -------------------------------------------------------------------------------------
    def sample_once(self) -> None:
        """Read every GPU once (a field the GPU does not support stays NaN). No-op without NVML."""
        if not self.available:
            return
        nv = self._nvml
        t = self.clock()
        readings: list[list[float]] = []
        for h in self._handles:
            row = [math.nan] * len(GPU_COLUMNS)
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                row[0] = mem.used / _GIB
                row[1] = mem.total / _GIB
            except Exception:  # noqa: BLE001 - NotSupported on unified-memory GPUs (GB10)
                self.errors += 1
            try:
                row[2] = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
            except Exception:  # noqa: BLE001
                self.errors += 1
            try:
                row[3] = nv.nvmlDeviceGetPowerUsage(h) / 1000.0  # mW -> W
            except Exception:  # noqa: BLE001
                self.errors += 1
            try:
                row[4] = float(nv.nvmlDeviceGetClockInfo(h, getattr(nv, "NVML_CLOCK_SM", 1)))
            except Exception:  # noqa: BLE001
                self.errors += 1
            try:
                row[5] = float(nv.nvmlDeviceGetTemperature(h, getattr(nv, "NVML_TEMPERATURE_GPU", 0)))
            except Exception:  # noqa: BLE001
                self.errors += 1
            try:
                row[6] = nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0  # mJ -> J (Volta and later)
            except Exception:  # noqa: BLE001 - optional: the trapezoid of power is the reference
                pass
            readings.append(row)
        with self._lock:
            for k, row in enumerate(readings):
                self.t_ns.append(t)
                self.gpu.append(k)
                for c, v in zip(GPU_COLUMNS, row, strict=True):
                    self.cols[c].append(v)

    def start(self) -> None:
        """Sample in a daemon thread until `stop()` (no-op without NVML)."""
        if not self.available or self._thread is not None:
            return
        self._stop.clear()
        self.sample_once()
        self._thread = threading.Thread(target=self._run, name="servescope-gpu-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        nxt = time.perf_counter() + self.interval_s
        while not self._stop.wait(max(0.0, nxt - time.perf_counter())):
            try:
                self.sample_once()
            except Exception:  # noqa: BLE001 - never let telemetry kill a run
                self.errors += 1
            nxt += self.interval_s
            if nxt < time.perf_counter():
                nxt = time.perf_counter() + self.interval_s

    def stop(self) -> None:
        th, self._thread = self._thread, None
        if th is not None:
            self._stop.set()
            th.join(max(2.0, self.interval_s * 2))
            with contextlib.suppress(Exception):
                self.sample_once()  # a closing sample so the last window is covered

    def close(self) -> None:
        self.stop()
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()

    # --- results --------------------------------------------------------------------------------------
    def frame(self) -> pl.DataFrame:
        """Long format: `t_ns`, `gpu` (position in `indices`), `gpu_index`, `name` and one column per reading."""
        import polars as pl

        with self._lock:
            gpus = self.gpu.tolist()
            data: dict[str, Any] = {
                "t_ns": pl.Series("t_ns", self.t_ns.tolist(), dtype=pl.Int64),
                "gpu": pl.Series("gpu", gpus, dtype=pl.Int8),
                "gpu_index": pl.Series("gpu_index", [self.indices[g] for g in gpus], dtype=pl.Int16),
                "name": pl.Series("name", [self.names[g] for g in gpus], dtype=pl.Utf8),
            }
            for c, arr in self.cols.items():
                data[c] = pl.Series(c, arr.tolist(), dtype=pl.Float64).fill_nan(None)
        return pl.DataFrame(data)

    def _series(self, g: int, col: str) -> tuple[list[int], list[float]]:
        with self._lock:
            ts = [t for t, k in zip(self.t_ns, self.gpu, strict=True) if k == g]
            vs = [v for v, k in zip(self.cols[col], self.gpu, strict=True) if k == g]
        pairs = [(t, v) for t, v in zip(ts, vs, strict=True) if not math.isnan(v)]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def _energy_j(self, g: int, t0: int, t1: int) -> tuple[float | None, float]:
        """Trapezoid integral of power over [t0, t1] for GPU g: (joules, seconds covered). Ends between two
        samples are interpolated; within 2 intervals outside the samples the nearest reading is held."""
        ts, ps = self._series(g, "power_w")
        if not ts or t1 <= t0:
            return None, 0.0
        hold = int(2 * self.interval_s * 1e9)
        a = max(t0, ts[0] - hold) if ts[0] > t0 else t0
        b = min(t1, ts[-1] + hold) if ts[-1] < t1 else t1
        if b <= a:
            return None, 0.0

        def p_at(t: int) -> float:
            if t <= ts[0]:
                return ps[0]
            if t >= ts[-1]:
                return ps[-1]
            i = bisect_right(ts, t)
            ta, tb = ts[i - 1], ts[i]
            return ps[i - 1] + (ps[i] - ps[i - 1]) * (t - ta) / (tb - ta) if tb > ta else ps[i]

        pts = [(a, p_at(a))]
        i0 = bisect_right(ts, a)
        i1 = bisect_left(ts, b)
        pts += [(ts[i], ps[i]) for i in range(i0, i1)]
        pts.append((b, p_at(b)))
        joules = 0.0
        for (ta, pa), (tb, pb) in zip(pts, pts[1:], strict=False):
            joules += (pa + pb) / 2.0 * (tb - ta) / 1e9
        return joules, (b - a) / 1e9

    def window_summary(self, t0_ns: int, t1_ns: int, output_tokens: int = 0,
                       price_usd_per_kwh: float | None = None) -> dict[str, Any]:
        """GPU figures for one window (all GPUs together unless said per GPU):

        energy_wh = sum over GPUs of the trapezoid integral of power over [t0, t1] / 3600;
        wh_per_1m_output_tokens = energy_wh / output_tokens x 1e6;
        cost_usd_per_1m_output_tokens = wh_per_1m_output_tokens / 1000 x price_usd_per_kwh.
        """
        duration = max(0, t1_ns - t0_ns) / 1e9
        out: dict[str, Any] = {
            "available": self.available,
            "reason": self.reason or None,
            "gpus": len(self._handles),
            "names": list(self.names),
            "duration_s": duration,
            "samples": 0,
            "energy_wh": None,
            "energy_coverage": None,
            "energy_wh_counter": None,
            "output_tokens": output_tokens,
            "wh_per_1m_output_tokens": None,
            "price_usd_per_kwh": price_usd_per_kwh,
            "cost_usd_per_1m_output_tokens": None,
            "mem_used_gib_peak": None,
            "mem_total_gib": None,
            "util_pct_mean": None,
            "power_w_mean": None,
            "power_w_peak": None,
            "sm_clock_mhz_mean": None,
            "temp_c_max": None,
            "per_gpu": [],
        }
        if not self.available:
            return out
        with self._lock:
            lo = bisect_left(self.t_ns, t0_ns)
            hi = bisect_right(self.t_ns, t1_ns)
            gpu = self.gpu[lo:hi].tolist()
            t_in = self.t_ns[lo:hi].tolist()
            win = {c: self.cols[c][lo:hi].tolist() for c in GPU_COLUMNS}
        out["samples"] = len(set(t_in))

        def vals(col: str, g: int | None = None) -> list[float]:
            return [v for v, k in zip(win[col], gpu, strict=True) if (g is None or k == g) and not math.isnan(v)]

        def mean(xs: list[float]) -> float | None:
            return sum(xs) / len(xs) if xs else None

        # sums over GPUs at each sample time
        by_t: dict[int, dict[str, float]] = {}
        for i, t in enumerate(t_in):
            d = by_t.setdefault(t, {})
            for c in ("mem_used_gib", "power_w"):
                v = win[c][i]
                if not math.isnan(v):
                    d[c] = d.get(c, 0.0) + v
        mem_tot = [d["mem_used_gib"] for d in by_t.values() if "mem_used_gib" in d]
        pow_tot = [d["power_w"] for d in by_t.values() if "power_w" in d]
        out["mem_used_gib_peak"] = max(mem_tot) if mem_tot else None
        totals = [max(vals("mem_total_gib", g), default=0.0) for g in range(len(self._handles))]
        out["mem_total_gib"] = sum(totals) if any(totals) else None
        out["util_pct_mean"] = mean(vals("util_pct"))
        out["power_w_mean"] = mean(pow_tot)
        out["power_w_peak"] = max(pow_tot) if pow_tot else None
        out["sm_clock_mhz_mean"] = mean(vals("sm_clock_mhz"))
        temps = vals("temp_c")
        out["temp_c_max"] = max(temps) if temps else None

        energy_j = 0.0
        covered: list[float] = []
        counter_j: float | None = 0.0
        any_energy = False
        for g in range(len(self._handles)):
            j, secs = self._energy_j(g, t0_ns, t1_ns)
            e_counter = vals("energy_j", g)
            cj = (e_counter[-1] - e_counter[0]) if len(e_counter) >= 2 else None
            if cj is None or counter_j is None:
                counter_j = None
            else:
                counter_j += cj
            if j is not None:
                any_energy = True
                energy_j += j
                covered.append(secs)
            out["per_gpu"].append({
                "index": self.indices[g],
                "name": self.names[g],
                "energy_wh": j / 3600.0 if j is not None else None,
                "mem_used_gib_peak": max(vals("mem_used_gib", g), default=None),
                "mem_total_gib": totals[g] or None,
                "util_pct_mean": mean(vals("util_pct", g)),
                "power_w_mean": mean(vals("power_w", g)),
                "temp_c_max": max(vals("temp_c", g), default=None),
            })
        if any_energy:
            wh = energy_j / 3600.0
            out["energy_wh"] = wh
            out["energy_coverage"] = (min(covered) / duration) if duration > 0 and covered else None
            if output_tokens > 0:
                per_m = wh / output_tokens * 1e6
                out["wh_per_1m_output_tokens"] = per_m
                if price_usd_per_kwh is not None:
                    out["cost_usd_per_1m_output_tokens"] = per_m / 1000.0 * price_usd_per_kwh
        if counter_j is not None and len(self._handles):
            out["energy_wh_counter"] = counter_j / 3600.0
        return out


def _err_text(e: BaseException) -> str:
    from servescope.core.textsafe import clean_text

    return clean_text(f"{type(e).__name__}: {e}")[:200]
