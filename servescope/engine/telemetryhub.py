"""A sweep's telemetry: the server's /metrics (MetricsSampler, on the background loop with its own HTTP
client, so scrapes never queue behind requests) and the GPUs (GpuSampler, its own thread), their samples at
each cell's boundaries, the per-cell windows, and telemetry.parquet / gpu.parquet in the session."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NotRequired, Protocol, TypedDict

from servescope.core.client import KEEPALIVE_S, ssl_context
from servescope.core.gpu import GpuSampler, Nvml
from servescope.core.kvbudget import KVBudget, KvBudgetMeta, fmt_concurrency
from servescope.core.results import GpuWindow, TelemetryWindow
from servescope.core.telemetry import MetricsSampler, RawMetrics
from servescope.engine.background import Background
from servescope.engine.events import TelemetrySample
from servescope.sessions.store import write_parquet_atomic
from servescope.workloads.spec import Workload
from servescope.workloads.traces import workload_trace

if TYPE_CHECKING:
    import polars as pl

    from servescope.core.gpu import GpuSampler, Nvml
    from servescope.core.telemetry import MetricsSampler

__all__ = ["CellWindows", "GpuTable", "KvBudgetMeta", "NoTelemetry", "Telemetry", "TelemetryHub", "TelemetryStart",
           "TelemetryTable", "kv_budget_meta", "kv_budget_text"]

Metrics = dict[str, float | str]  # one parsed /metrics sample (core.telemetry.parse_metrics)


@dataclass(frozen=True)
class CellWindows:
    """A cell's telemetry over its measured window: the server's /metrics and the GPUs (None: not sampled)."""

    telemetry: TelemetryWindow | None = None
    gpu: GpuWindow | None = None
    scrapes: int = 0  # /metrics scrapes in the window, and their client CPU (s): what telemetry cost the client
    scrape_cpu_s: float | None = None


class TelemetryTable(TypedDict):
    """session.toml's [telemetry]: whether /metrics is sampled, how often, or why not."""

    metrics: bool
    interval_s: NotRequired[float | str]  # "cell boundaries" when sampled only there
    metrics_reason: NotRequired[str]


class GpuTable(TypedDict):
    """session.toml's [gpu]: how many GPUs are sampled, or why none is."""

    available: bool
    count: NotRequired[int]
    reason: NotRequired[str]


@dataclass
class TelemetryStart:
    """What `Telemetry.start()` learned, for session.toml and the notices."""

    telemetry: TelemetryTable  # session.toml [telemetry]
    kv_budget: KVBudget | None = None  # from /metrics
    gpu: GpuTable | None = None  # session.toml [gpu] (the first start only)
    notices: list[str] = field(default_factory=list)


class Telemetry(Protocol):
    async def start(self, url: str, max_model_len: int | None) -> TelemetryStart:
        """Start sampling the server at `url` (again after a relaunch: the earlier samples are kept)."""
        ...

    def begin_cell(self) -> None: ...

    async def boundary(self, metrics: bool = True) -> Metrics | None:
        """Sample now (a cell's start or end): the /metrics sample taken (None without /metrics, or when
        `metrics` is False: a lost server is not scraped), and the GPUs."""
        ...

    def latest(self) -> TelemetrySample | None:
        """The newest samples, when there are new ones since the last call (for live panels)."""
        ...

    async def window(self, t0_ns: int, t1_ns: int, output_tokens: int) -> CellWindows:
        """The cell's "telemetry" and "gpu" summaries over [t0, t1] (perf_counter_ns), those available."""
        ...

    def save(self, session_dir: Path) -> None: ...

    async def close(self, session_dir: Path | None) -> None: ...


class NoTelemetry:
    """Telemetry that samples nothing (tests; a summary then has no server, telemetry or gpu part)."""

    async def start(self, url: str, max_model_len: int | None) -> TelemetryStart:
        return TelemetryStart({"metrics": False, "metrics_reason": "telemetry off"})

    def begin_cell(self) -> None:
        pass

    async def boundary(self, metrics: bool = True) -> Metrics | None:
        return None

    def latest(self) -> TelemetrySample | None:
        return None

    async def window(self, t0_ns: int, t1_ns: int, output_tokens: int) -> CellWindows:
        return CellWindows()

    def save(self, session_dir: Path) -> None:
        pass

    async def close(self, session_dir: Path | None) -> None:
        pass


class TelemetryHub:
    """The real Telemetry. `interval_s` None samples only at cell boundaries (the GPU thread then does not run)."""

    def __init__(self, bg: Background, interval_s: float | None, api_key: str | None = None,
                 electricity_price: float | None = None, nvml: Nvml | None = None) -> None:
        self.bg = bg
        self.nvml = nvml  # a pynvml-like object (tests' fake NVML); None: pynvml
        self.interval_s = interval_s
        self.api_key = api_key
        self.price = electricity_price
        self.sampler: MetricsSampler | None = None
        self.http: RawMetrics | None = None
        self.frames: list[pl.DataFrame] = []  # samples of earlier servers (before a relaunch)
        self.gpu: GpuSampler | None = None
        self.seen_metrics = 0
        self.seen_gpu = 0

    @property
    def metrics_on(self) -> bool:
        return self.sampler is not None and bool(self.sampler.available)

    async def start(self, url: str, max_model_len: int | None) -> TelemetryStart:
        await self._stop_metrics(None)
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None

        async def make() -> tuple[RawMetrics, MetricsSampler]:
            http = RawMetrics(url, headers, ssl_context=ssl_context, idle_s=KEEPALIVE_S)
            sampler = MetricsSampler(http, self.interval_s or 1e9)
            await sampler.start()
            return http, sampler

        self.http, sampler = await self.bg.call(make())
        self.sampler = sampler
        self.seen_metrics = len(sampler)
        out = TelemetryStart({"metrics": True, "interval_s": self.interval_s or "cell boundaries"})
        if not sampler.available:
            out.telemetry = {"metrics": False, "metrics_reason": sampler.reason}
            out.notices.append(f"server telemetry off: {sampler.reason}")
        else:
            out.kv_budget = sampler.kv_budget(max_model_len)
        if self.gpu is None:
            self.gpu = GpuSampler(self.interval_s or 1.0, nvml=self.nvml)
            if self.gpu.available and self.interval_s:
                self.gpu.start()
                out.gpu = {"available": True, "count": len(self.gpu.indices)}
            else:
                out.gpu = {"available": False, "reason": self.gpu.reason}
        return out

    def begin_cell(self) -> None:
        self.seen_gpu = 0

    async def boundary(self, metrics: bool = True) -> Metrics | None:
        parsed = None
        if metrics and self.sampler is not None and self.sampler.available:
            parsed = await self.bg.call(self.sampler.snapshot())
        if self.gpu is not None and self.gpu.available:
            self.gpu.sample_once()
        return parsed

    def latest(self) -> TelemetrySample | None:
        srv = None
        s = self.sampler
        if s is not None and s.available and len(s) > self.seen_metrics:
            self.seen_metrics = len(s)
            srv = {k: v for k, v in s.last.items() if isinstance(v, float)}
        gpus = None
        if self.gpu is not None and self.gpu.available:
            self.seen_gpu, gpus = self.gpu.latest(self.seen_gpu)
        if srv is None and gpus is None:
            return None
        return TelemetrySample(srv, gpus)

    async def window(self, t0_ns: int, t1_ns: int, output_tokens: int) -> CellWindows:
        tele = gpu = None
        scrapes, cpu = 0, None
        if self.sampler is not None and self.sampler.available:
            tele = await self.bg.sync(self.sampler.window_summary, t0_ns, t1_ns)
            scrapes, cpu = await self.bg.sync(self.sampler.scrape_cost, t0_ns, t1_ns)
        if self.gpu is not None:
            gpu = self.gpu.window_summary(t0_ns, t1_ns, output_tokens, self.price)
        return CellWindows(tele, gpu, scrapes, cpu)

    def save(self, session_dir: Path) -> None:
        """telemetry.parquet (server /metrics samples) and gpu.parquet, rewritten after each cell."""
        import polars as pl

        frames = list(self.frames)
        if self.sampler is not None and len(self.sampler):
            frames.append(self.sampler.frame())
        frames = [f for f in frames if f.height]
        if frames:
            write_parquet_atomic(session_dir / "telemetry.parquet", pl.concat(frames, how="diagonal_relaxed"))
        if self.gpu is not None and self.gpu.available:
            g = self.gpu.frame()
            if g.height:
                write_parquet_atomic(session_dir / "gpu.parquet", g)

    async def _stop_metrics(self, session_dir: Path | None) -> None:
        if self.sampler is not None:
            await self.bg.call(self.sampler.stop())
            if session_dir is not None:
                self.save(session_dir)
            self.frames.append(self.sampler.frame())
            self.sampler = None
        if self.http is not None:
            await self.bg.call(self.http.aclose())
            self.http = None

    async def close(self, session_dir: Path | None) -> None:
        await self._stop_metrics(session_dir)
        if self.gpu is not None:
            self.gpu.stop()
            if session_dir is not None:
                self.save(session_dir)
            self.gpu.close()
            self.gpu = None


def kv_budget_meta(budget: KVBudget | None, log_budget: KVBudget | None,
                   workloads: Sequence[Workload]) -> KvBudgetMeta | None:
    """session.toml's `kv_budget`: the budget /metrics states and/or the launched server's log states,
    with the concurrency each (synthetic) workload's longest request allows. None when neither says."""
    kv: KvBudgetMeta
    if budget is not None:
        b, kv = budget, budget.as_dict()
        kv["source"] = "metrics+log" if log_budget is not None else "metrics"
        if log_budget is not None:
            kv["log_kv_cache_tokens"] = log_budget.tokens
    elif log_budget is not None:
        b = log_budget
        kv = {"kv_cache_tokens": log_budget.tokens, "log_kv_cache_tokens": log_budget.tokens, "source": "log"}
    else:
        return None
    kv["max_concurrency_by_workload"] = {
        w.name: round(b.max_concurrency(request_tokens(w)), 2)  # a conversation's whole history
        for w in workloads if not w.dataset
    }
    return kv


def request_tokens(w: Workload) -> int:
    """The workload's longest request (prompt + output): a conversation's last turn, a trace's longest entry."""
    if w.kind == "trace":
        return int(workload_trace(w).max_total()) or 1
    return int(w.max_request_tokens)


def kv_budget_text(kv: KvBudgetMeta) -> str:
    if kv.get("slots"):  # llama.cpp: its context shared by parallel slots, one request each
        return (f"KV: {int(kv['slots'])} slots x {int(kv['slot_tokens']):,} tokens ({kv['source']}): up to "
                f"{int(kv['slots'])} requests at once, more wait in the server; the longest request is "
                f"{int(kv['slot_tokens']):,} tokens")
    return (f"KV cache: {int(kv['kv_cache_tokens']):,} tokens ({kv['source']}); max concurrency (each "
            "workload's longest requests that fit at once) "
            + ", ".join(f"{k} {fmt_concurrency(v)}x" for k, v in kv["max_concurrency_by_workload"].items()))
