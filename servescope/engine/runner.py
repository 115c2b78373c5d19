"""The sweep runner: plans cells (workload x load), builds their prompts, runs them, saves each finished
cell to the session before the next starts, and yields a stream of events. The headless CLI, the TUI and
the tests are three consumers of the same `run_sweep()` async generator."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from servescope.core.client import ClientOptions, RequestSpec, async_client
from servescope.core.errors import ServescopeError
from servescope.core.load import CellControl, Limits, Load, run_cell
from servescope.core.metrics import records_frame, summarize
from servescope.core.records import RequestRecord
from servescope.core.servermetrics import cell_delta, scrape
from servescope.core.target import (
    EstimateTokenizer,
    LocalTokenizer,
    ServerTokenizer,
    TargetInfo,
    Tokenizer,
    has_tokenize,
    probe,
)
from servescope.core.textsafe import clean_text
from servescope.sessions.store import SessionWriter, new_session_dir
from servescope.workloads.prompts import build_prompts
from servescope.workloads.spec import Workload

DEFAULT_CONCURRENCY = (1, 4, 16)
DEFAULT_REQUESTS = 100


@dataclass
class SweepPlan:
    url: str
    workloads: list[Workload]
    concurrency: list[int] | None = None  # None: each workload's default, else DEFAULT_CONCURRENCY
    rates: list[float] | None = None
    arrival: str = "constant"
    max_concurrency: int | None = None
    requests: int | None = None  # None: the workload's default, else DEFAULT_REQUESTS (unless duration)
    duration_s: float | None = None
    warmup: int = 0
    slos: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    model: str | None = None
    api_key: str | None = None  # never written anywhere
    timeout_s: float = 600.0
    tokenizer: str | None = None  # a local HF tokenizer path when the server has no /tokenize
    save_dir: Path | None = None
    sessions_dir: Path | None = None
    name: str = ""
    ignore_eos: bool = True
    target_label: str | None = None  # e.g. "sim://tiny" (shown and stored instead of the local URL)
    launch: str | None = None  # "vllm serve MODEL ..." started (and stopped) by servescope
    launch_timeout_s: float = 900.0
    variants: list[str] = field(default_factory=list)  # server argument sets; the sweep runs once per variant
    recover_timeout_s: float = 300.0
    health_interval_s: float = 2.0
    telemetry_interval_s: float | None = 1.0  # None: sample only at cell boundaries
    electricity_price: float | None = None  # USD per kWh, for cost per 1M tokens
    resume: Path | None = None  # continue this session from its first unfinished cell
    transport: str = "aiohttp"  # HTTP client for the load: "aiohttp" or "httpx"


@dataclass
class Cell:
    index: int
    workload: Workload
    load: Load
    requests: int | None
    duration_s: float | None
    warmup: int
    variant: int = 0
    variant_args: str = ""

    def row(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "server_variant": self.variant_args,
            "workload": self.workload.name,
            "api": self.workload.api,
            "concurrency": self.load.concurrency,
            "rate": self.load.rate,
            "arrival": self.load.arrival if self.load.rate is not None else None,
            "max_concurrency": self.load.max_concurrency,
            "requests_planned": self.requests,
            "duration_s_planned": self.duration_s,
            "warmup": self.warmup,
            "load_label": self.load.label,
        }

    @property
    def label(self) -> str:
        v = f" [{self.variant_args}]" if self.variant_args else ""
        return f"{self.workload.name} {self.load.label}{v}"


# ---- events -----------------------------------------------------------------------------------------
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
    cell: Cell
    records: list[RequestRecord]
    done: int
    failed: int
    elapsed_s: float


@dataclass
class CellFinished:
    cell: Cell
    summary: dict[str, Any]
    status: str  # "done" | "stopped"
    reason: str = ""


@dataclass
class CellSkipped:
    cell: Cell
    reason: str


@dataclass
class TelemetrySample:
    """The newest server /metrics sample (parsed, vLLM names) and GPU readings, a few times a second."""

    server: dict[str, float] | None
    gpus: Any = None


@dataclass
class Notice:
    level: str  # "info" | "warning" | "error"
    text: str


@dataclass
class SweepFinished:
    session_dir: Path
    status: str  # "completed" | "interrupted" | "failed"
    message: str = ""


Event = (SweepStarted | CellStarted | RequestsDone | CellFinished | CellSkipped | Notice | TelemetrySample
         | SweepFinished)


@dataclass
class SweepControl:
    """Stop the sweep (finished cells are kept) or skip the current cell. Thread-safe setters for the TUI."""

    stopping: bool = False
    cell: CellControl | None = None
    loop: asyncio.AbstractEventLoop | None = None

    def stop(self, reason: str = "stopped by the user") -> None:
        self.stopping = True
        self._stop_cell(reason)

    def skip_cell(self, reason: str = "skipped by the user") -> None:
        self._stop_cell(reason)

    def _stop_cell(self, reason: str) -> None:
        c = self.cell
        if c is None:
            return
        if self.loop is not None and self.loop.is_running():
            try:
                if asyncio.get_running_loop() is self.loop:
                    c.request_stop(reason)
                    return
            except RuntimeError:
                pass
            self.loop.call_soon_threadsafe(c.request_stop, reason)
        else:
            c.request_stop(reason)


def _plain(args: dict[str, Any]) -> dict[str, Any]:
    """Server arguments as TOML-safe values."""
    return {k: (v if isinstance(v, (str, int, float, bool)) else str(v)) for k, v in args.items() if v is not None}


def plan_cells(plan: SweepPlan) -> list[Cell]:
    cells: list[Cell] = []
    variants = list(enumerate(plan.variants)) or [(0, "")]
    for v, vargs in variants:
        cells.extend(_workload_cells(plan, len(cells), v, vargs))
    return cells


def _workload_cells(plan: SweepPlan, first: int, variant: int, vargs: str) -> list[Cell]:
    cells: list[Cell] = []
    for w in plan.workloads:
        if plan.rates:
            loads = [Load(rate=r, arrival=plan.arrival, max_concurrency=plan.max_concurrency) for r in plan.rates]
        else:
            conc = plan.concurrency or list(w.default_concurrency) or list(DEFAULT_CONCURRENCY)
            loads = [Load(concurrency=c) for c in conc]
        for ld in loads:
            req = plan.requests
            if req is None and plan.duration_s is None:
                req = w.default_requests or DEFAULT_REQUESTS
            cells.append(Cell(first + len(cells), w, ld, req, plan.duration_s, plan.warmup, variant, vargs))
    return cells


def _pool_size(cell: Cell) -> int:
    if cell.requests is not None:
        return cell.requests
    # duration-limited: enough distinct prompts for most cells, cycled beyond that
    per = cell.load.concurrency or max(1, int((cell.load.rate or 1) * 4))
    return max(64, min(1024, per * 16))


def _fits(w: Workload, max_len: int | None) -> str | None:
    if not max_len or w.dataset:
        return None
    need = w.input_tokens.upper + w.output_tokens.upper
    if need > max_len:
        return (f"input {w.input_tokens.upper} + output {w.output_tokens.upper} tokens exceed the model's "
                f"max length {max_len}")
    return None


async def _health(url: str, api_key: str | None, timeout_s: float = 5.0) -> bool:
    """Does the server answer /v1/models? A fresh connection each time (a dead server's pooled one lies)."""
    try:
        async with async_client(base_url=url, timeout=timeout_s,
                                limits=httpx.Limits(max_keepalive_connections=0)) as c:
            r = await c.get("/v1/models", headers={"Authorization": f"Bearer {api_key}"} if api_key else None)
            return r.status_code < 500
    except Exception:
        return False


async def run_sweep(plan: SweepPlan, control: SweepControl | None = None) -> AsyncIterator[Event]:
    """Run the sweep and yield events. Setup problems raise ServescopeError before any cell runs."""
    control = control or SweepControl()
    control.loop = asyncio.get_running_loop()
    run = _SweepRun(plan, control)
    async for ev in run.events():
        yield ev


FINISHED = ("done", "skipped")


class _Background:
    """An event loop in a daemon thread for the side work of a sweep (/metrics scrapes and their parsing,
    health checks), so that none of it ever runs on the load's loop between a token's arrival and its stamp."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="servescope-telemetry", daemon=True)
        self.thread.start()

    async def call(self, coro: Any) -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def sync(self, fn: Any, *args: Any) -> Any:
        async def run() -> Any:
            return fn(*args)

        return await self.call(run())

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            self.loop.close()


class _SweepRun:
    """State of one sweep: the target, the session writer, the server (when servescope launched it)."""

    def __init__(self, plan: SweepPlan, control: SweepControl) -> None:
        self.plan = plan
        self.control = control
        self.cells = plan_cells(plan)
        if not self.cells:
            raise ServescopeError("the sweep has no cells: give at least one workload and one load level")
        self.url = plan.url
        self.label = plan.target_label or plan.url
        self.server: Any = None  # servescope.core.launch.ServerProcess when we launched the server
        self.variant = -1
        self.http: httpx.AsyncClient | None = None
        self.writer: SessionWriter | None = None
        self.sampler: Any = None
        self.bg = _Background()
        self.sampler_http: httpx.AsyncClient | None = None
        self.sampler_frames: list[Any] = []
        self.gpu: Any = None

    # ---- target ------------------------------------------------------------------------------------
    async def _connect(self) -> tuple[TargetInfo, Any]:
        target = await probe(self.url, self.plan.api_key)
        minfo = target.model(self.plan.model)
        if self.http is not None:
            await self.http.aclose()
        self.http = async_client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {self.plan.api_key}"} if self.plan.api_key else None,
            timeout=httpx.Timeout(120.0, connect=10.0),
            limits=httpx.Limits(max_connections=16),
        )
        if self.plan.target_label is None:
            self.label = target.url
        return target, minfo

    async def _tokenizer(self, model: str) -> Tokenizer:
        assert self.http is not None
        if self.plan.tokenizer:
            return LocalTokenizer(self.plan.tokenizer)
        if await has_tokenize(self.http, model):
            return ServerTokenizer(self.http, model)
        return EstimateTokenizer()

    async def _launch(self, variant: int, path: Path) -> None:
        from servescope.core.launch import ServerProcess, parse_launch, with_variant

        assert self.plan.launch is not None
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)
            self.server = None
        spec = parse_launch(self.plan.launch)
        vargs = self.plan.variants[variant] if self.plan.variants else ""
        if vargs:
            spec = with_variant(spec, vargs)
        await asyncio.to_thread(path.mkdir, parents=True, exist_ok=True)
        self.server = await asyncio.to_thread(ServerProcess.start, spec, path / f"server-{variant}.log", None,
                                              self.plan.launch_timeout_s)
        self.url = self.server.url
        self.variant = variant

    # ---- the sweep ---------------------------------------------------------------------------------
    async def events(self) -> AsyncIterator[Event]:
        plan = self.plan
        resume = plan.resume is not None
        path = plan.resume or plan.save_dir
        try:
            if plan.launch:
                path = path or new_session_dir(plan.sessions_dir, plan.name or "launch")
                await self._launch(self.cells[0].variant, path)
            target, minfo = await self._connect()
        except BaseException:
            await self._close()
            raise
        model = minfo.id
        tok = await self._tokenizer(model)
        name = plan.name or f"{model.rstrip('/').split('/')[-1]}-{'-'.join(sorted({w.name.split('/')[0] for w in plan.workloads}))}"
        path = path or new_session_dir(plan.sessions_dir, name)
        if resume:
            self.writer = SessionWriter.open(path)
            self.writer.meta["status"] = "running"
            self.writer.add_event("resumed", "the sweep was resumed")
        else:
            self.writer = SessionWriter.create(path, self._meta(name, target, minfo, tok), exist_ok=bool(plan.launch))
        writer = self.writer
        tele_notes = await self._start_telemetry(minfo.max_model_len)
        yield SweepStarted(path, self.cells, target, model, tok.name)
        for n in tele_notes:
            yield n
        if not tok.exact:
            yield Notice("warning", f"{self.label} has no /tokenize: input lengths are estimated (1 token per word); "
                                    "pass --tokenizer PATH for exact lengths. Each cell shows requested vs measured.")
        done_before = {int(c["index"]) for c in writer.meta.get("cells", []) if c.get("status") in FINISHED} if resume else set()
        status, message = "completed", ""
        try:
            for cell in self.cells:
                if cell.index in done_before:
                    continue
                if self.control.stopping:
                    if status == "completed":
                        status = "interrupted"
                    break
                if plan.launch and cell.variant != self.variant:
                    yield Notice("info", f"relaunching the server for variant {cell.variant + 1}: {cell.variant_args}")
                    await self._launch(cell.variant, path)
                    target, minfo = await self._connect()
                    tok = await self._tokenizer(model)
                    writer.add_event("server_launched", f"variant {cell.variant + 1}: {cell.variant_args}")
                    writer.meta.setdefault("server", {}).setdefault("variant_args", {})[str(cell.variant)] = _plain(
                        self.server.spec.server_args)
                    writer.save_meta()
                    for n in await self._start_telemetry(minfo.max_model_len):
                        yield n
                reason = _fits(cell.workload, minfo.max_model_len)
                if reason:
                    writer.write_cell({**cell.row(), "status": "skipped", "reason": reason}, None, None)
                    yield CellSkipped(cell, reason)
                    continue
                attempt = 0
                while True:
                    attempt += 1
                    try:
                        prompts = await build_prompts(cell.workload, _pool_size(cell) + cell.warmup,
                                                      f"cell{cell.index}", tok)
                    except httpx.HTTPError as e:
                        raise ServescopeError(f"lost {self.label} while building prompts: "
                                              f"{clean_text(str(e)) or type(e).__name__}") from None
                    specs = [RequestSpec(cell.workload.api, p.text, p.input_tokens, p.output_tokens,
                                         cell.workload.thinking) for p in prompts]
                    yield CellStarted(cell, len(self.cells))
                    lost = False
                    async for ev in self._run_one(cell, specs, model, attempt):
                        yield ev
                        if isinstance(ev, CellFinished) and ev.status in ("stopped", "server_lost"):
                            lost = ev.status == "server_lost" or (
                                not self.control.stopping and not await self._healthy())
                    if not lost:
                        break
                    t_lost = time.monotonic()
                    writer.add_event("server_lost", f"cell {cell.index + 1} ({cell.label}), attempt {attempt}")
                    yield Notice("error", f"{self.label} stopped answering during cell {cell.index + 1} ({cell.label}); "
                                          f"waiting up to {plan.recover_timeout_s:g} s for it to come back")
                    back = await self._recover()
                    if back and attempt < 3 and not self.control.stopping:
                        waited = time.monotonic() - t_lost
                        writer.add_event("server_back", f"after {waited:.0f} s; re-running cell {cell.index + 1}")
                        yield Notice("info", f"{self.label} is back after {waited:.0f} s: re-running cell "
                                             f"{cell.index + 1} ({cell.label})")
                        target, minfo = await self._connect()
                        tok = await self._tokenizer(model)
                        continue
                    status = "failed"
                    message = (f"{self.label} stopped answering during cell {cell.index + 1} ({cell.label}) and did "
                               f"not come back within {plan.recover_timeout_s:g} s; finished cells are saved in {path}"
                               f" (continue later with `servescope resume {path}`)")
                    yield Notice("error", message)
                    self.control.stopping = True
                    break
                if self.control.stopping and status == "completed":
                    status = "interrupted"
        except (asyncio.CancelledError, KeyboardInterrupt, GeneratorExit):
            writer.finish("interrupted", "interrupted")
            await self._close()
            raise
        except ServescopeError as e:
            writer.finish("failed", e.message)
            await self._close()
            raise
        writer.finish(status, message)
        await self._close()
        yield SweepFinished(path, status, message)

    def _latest_sample(self, seen: list[int]) -> Event | None:
        """The newest /metrics and GPU samples, when there are new ones (for live panels)."""
        srv = None
        if self.sampler is not None and self.sampler.available and len(self.sampler) > seen[0]:
            seen[0] = len(self.sampler)
            srv = {k: v for k, v in self.sampler.last.items() if not isinstance(v, str)}
        gpus = None
        if self.gpu is not None and self.gpu.available:
            g = self.gpu
            with g._lock:
                n = len(g.t_ns)
                if n > seen[1]:
                    seen[1] = n
                    k = len(g.indices)
                    gpus = [{c: g.cols[c][i] for c in g.cols} | {"gpu": g.indices[g.gpu[i]]} for i in range(n - k, n)]
        if srv is None and gpus is None:
            return None
        return TelemetrySample(srv, gpus)

    def _meta(self, name: str, target: TargetInfo, minfo: Any, tok: Tokenizer) -> dict[str, Any]:
        plan = self.plan
        meta: dict[str, Any] = {
            "name": name,
            "target": {"url": self.label, "version": target.version, "metrics": target.metrics_available,
                       "tokenizer": tok.name},
            "model": minfo.id,
            "max_model_len": minfo.max_model_len,
            "models_json": json.dumps(target.raw_models, default=str),
            "workloads": [w.to_dict() for w in plan.workloads],
            "load": {
                "concurrency": plan.concurrency, "rates": plan.rates, "arrival": plan.arrival,
                "max_concurrency": plan.max_concurrency, "requests": plan.requests, "duration_s": plan.duration_s,
                "warmup": plan.warmup, "timeout_s": plan.timeout_s, "ignore_eos": plan.ignore_eos,
            },
            "slos": plan.slos,
            "tags": plan.tags,
            "cells": [{**c.row(), "status": "planned"} for c in self.cells],
        }
        if plan.launch:
            meta["server"] = {"launch": plan.launch, "variants": plan.variants,
                              "args": _plain(self.server.spec.server_args) if self.server is not None else None}
        if plan.electricity_price is not None:
            meta["electricity_usd_per_kwh"] = plan.electricity_price
        return meta

    async def _healthy(self, timeout_s: float = 5.0) -> bool:
        return bool(await self.bg.call(_health(self.url, self.plan.api_key, timeout_s)))

    async def _recover(self) -> bool:
        """Relaunch the server when we launched it, else wait for it to answer again."""
        deadline = time.monotonic() + self.plan.recover_timeout_s
        if self.server is not None:
            while not self.control.stopping:
                try:
                    await asyncio.to_thread(self.server.restart)
                    return True
                except ServescopeError:  # e.g. the dead server's port not free yet: try again
                    if time.monotonic() + 2 > deadline:
                        return False
                    await asyncio.sleep(2)
            return False
        while time.monotonic() < deadline and not self.control.stopping:
            if await self._healthy():
                return True
            await asyncio.sleep(min(2.0, max(0.1, deadline - time.monotonic())))
        return False

    async def _start_telemetry(self, max_model_len: int | None) -> list[Event]:
        """Sample /metrics (own HTTP client, so scrapes never queue behind requests) and the GPUs."""
        from servescope.core.telemetry import GpuSampler, MetricsSampler

        assert self.writer is not None
        notes: list[Event] = []
        await self._stop_metrics()
        async def make() -> Any:
            self.sampler_http = async_client(base_url=self.url, timeout=10.0,
                                             headers={"Authorization": f"Bearer {self.plan.api_key}"}
                                             if self.plan.api_key else None)
            sampler = MetricsSampler(self.sampler_http, self.plan.telemetry_interval_s or 1e9)
            await sampler.start()
            return sampler

        self.sampler = await self.bg.call(make())
        meta = self.writer.meta
        if not self.sampler.available:
            meta["telemetry"] = {"metrics": False, "metrics_reason": self.sampler.reason}
            notes.append(Notice("info", f"server telemetry off: {self.sampler.reason}"))
        else:
            meta["telemetry"] = {"metrics": True, "interval_s": self.plan.telemetry_interval_s or "cell boundaries"}
        budget = self.sampler.kv_budget(max_model_len) if self.sampler.available else None
        log_budget = getattr(self.server, "kv_budget", None)
        kv: dict[str, Any] = {}
        if budget is not None:
            kv = {**budget.as_dict(), "source": "metrics"}
        if log_budget is not None:
            kv.setdefault("kv_cache_tokens", log_budget.tokens)
            kv["log_kv_cache_tokens"] = log_budget.tokens
            kv["source"] = "metrics+log" if budget is not None else "log"
        b = budget or log_budget
        if kv and b is not None:
            kv["max_concurrency_by_workload"] = {
                w.name: round(b.max_concurrency(w.input_tokens.upper + w.output_tokens.upper), 2)
                for w in self.plan.workloads if not w.dataset
            }
            meta["kv_budget"] = kv
            notes.append(Notice("info", f"KV cache: {int(kv['kv_cache_tokens']):,} tokens ({kv['source']}); max concurrency "
                                        + ", ".join(f"{k} {v:g}x" for k, v in kv["max_concurrency_by_workload"].items())))
        if self.gpu is None:
            self.gpu = GpuSampler(self.plan.telemetry_interval_s or 1.0)
            if self.gpu.available and self.plan.telemetry_interval_s:
                self.gpu.start()
                meta["gpu"] = {"available": True, "count": len(getattr(self.gpu, "indices", []) or [])}
            else:
                meta["gpu"] = {"available": False, "reason": self.gpu.reason}
        self.writer.save_meta()
        return notes

    async def _stop_metrics(self) -> None:
        if self.sampler is not None:
            await self.bg.call(self.sampler.stop())
            self._save_telemetry()
            self.sampler_frames.append(self.sampler.frame())
            self.sampler = None
        if self.sampler_http is not None:
            await self.bg.call(self.sampler_http.aclose())
            self.sampler_http = None

    def _save_telemetry(self) -> None:
        """telemetry.parquet (server /metrics samples) and gpu.parquet, rewritten after each cell."""
        import polars as pl

        from servescope.sessions.store import write_parquet_atomic

        if self.writer is None:
            return
        frames = list(self.sampler_frames)
        if self.sampler is not None and len(self.sampler):
            frames.append(self.sampler.frame())
        frames = [f for f in frames if f.height]
        if frames:
            write_parquet_atomic(self.writer.path / "telemetry.parquet", pl.concat(frames, how="diagonal_relaxed"))
        if self.gpu is not None and self.gpu.available:
            g = self.gpu.frame()
            if g.height:
                write_parquet_atomic(self.writer.path / "gpu.parquet", g)

    async def _close(self) -> None:
        await self._stop_metrics()
        if self.gpu is not None:
            self.gpu.stop()
            self._save_telemetry()
            self.gpu.close()
            self.gpu = None
        if self.http is not None:
            await self.http.aclose()
            self.http = None
        if self.server is not None:
            await asyncio.to_thread(self.server.stop)
            self.server = None
        self.bg.close()

    async def _run_one(self, cell: Cell, specs: list[RequestSpec], model: str, attempt: int) -> AsyncIterator[Event]:
        plan, control, writer, http = self.plan, self.control, self.writer, self.http
        assert writer is not None and http is not None
        opts = ClientOptions(base_url=self.url, model=model, api_key=plan.api_key, timeout_s=plan.timeout_s,
                             ignore_eos=plan.ignore_eos, transport=plan.transport)
        cc = CellControl()
        control.cell = cc
        pending: list[RequestRecord] = []
        counts = [0, 0]
        wake = asyncio.Event()
        server_before: dict[str, float] | None = None
        lost = [False]

        def on_record(r: RequestRecord) -> None:
            pending.append(r)
            counts[0 if r.status == "ok" else 1] += 1

        window = [0, 0]

        async def before_measured() -> None:
            nonlocal server_before
            window[0] = time.perf_counter_ns()  # before the boundary samples, so they fall inside the window
            if self.sampler is not None and self.sampler.available:
                await self.bg.call(self.sampler.sample_now())
            if self.gpu is not None and self.gpu.available:
                self.gpu.sample_once()
            server_before = await scrape(http)

        async def watchdog() -> None:
            misses = 0
            while not cc.stop.is_set():
                await asyncio.sleep(plan.health_interval_s)
                if await self._healthy(timeout_s=max(2.0, plan.health_interval_s)):
                    misses = 0
                    continue
                misses += 1
                if misses >= 2 and not cc.stop.is_set():
                    lost[0] = True
                    cc.request_stop(f"server lost: {self.label} stopped answering its health check")
                    return

        seen = [len(self.sampler) if self.sampler is not None else 0, 0]
        t0 = time.monotonic()
        task = asyncio.create_task(run_cell(opts, specs, cell.load, Limits(cell.requests, cell.duration_s, cell.warmup),
                                            on_record, cc, seed=cell.index, before_measured=before_measured))
        task.add_done_callback(lambda _t: wake.set())
        dog = asyncio.create_task(watchdog())
        try:
            while not task.done():
                try:
                    await asyncio.wait_for(wake.wait(), timeout=0.25)
                except TimeoutError:
                    pass
                if pending:
                    batch = pending[:]
                    pending.clear()
                    yield RequestsDone(cell, batch, counts[0], counts[1], time.monotonic() - t0)
                sample = self._latest_sample(seen)
                if sample is not None:
                    yield sample
        except BaseException:
            cc.request_stop("interrupted")
            dog.cancel()
            await asyncio.gather(task, dog, return_exceptions=True)
            _save(cell, task, writer, plan, None, None, interrupted=True)
            raise
        dog.cancel()
        await asyncio.gather(dog, return_exceptions=True)
        run = task.result()
        if pending:
            yield RequestsDone(cell, pending[:], counts[0], counts[1], time.monotonic() - t0)
            pending.clear()
        server_after = await scrape(http) if not lost[0] else None
        if self.sampler is not None and self.sampler.available and not lost[0]:
            await self.bg.call(self.sampler.sample_now())
        if self.gpu is not None and self.gpu.available:
            self.gpu.sample_once()
        window[1] = time.perf_counter_ns()
        # a server killed near a cell's end fails its last requests fast, before the watchdog's second miss:
        # any failure (not only an early stop) gets a health check before the cell counts as done
        if ((run.stopped or counts[1]) and not lost[0] and not control.stopping
                and not await self._healthy()):
            lost[0] = True
        status_override = "server_lost" if lost[0] else None
        extra: dict[str, Any] = {}
        if window[0]:
            if self.sampler is not None and self.sampler.available:
                extra["telemetry"] = await self.bg.sync(self.sampler.window_summary, window[0], window[1])
            if self.gpu is not None:
                out_tok = sum(r.output_tokens for r in run.records if r.status == "ok")
                extra["gpu"] = self.gpu.window_summary(window[0], window[1], out_tok, plan.electricity_price)
        summary = _save(cell, task, writer, plan, server_before, server_after, status=status_override,
                        suffix=f"-lost{attempt}" if lost[0] else "", extra=extra)
        self._save_telemetry()
        control.cell = None
        st = status_override or ("stopped" if run.stopped else "done")
        yield CellFinished(cell, summary, st, run.stopped)
        mm = summary.get("input_tokens_mismatch")
        if mm and mm["max_abs"] > 0:
            yield Notice("warning", f"cell {cell.index + 1} ({cell.label}): input tokens differ from the request by "
                                    f"up to {mm['max_abs']} (mean {mm['mean']:+.1f})")


def _save(cell: Cell, task: asyncio.Task[Any], writer: SessionWriter, plan: SweepPlan,
          before: dict[str, float] | None, after: dict[str, float] | None, interrupted: bool = False,
          status: str | None = None, suffix: str = "", extra: dict[str, Any] | None = None) -> dict[str, Any]:
    if task.cancelled() or task.exception() is not None:
        writer.set_cell_status(cell.index, "failed", "interrupted" if interrupted else str(task.exception()))
        return {}
    run = task.result()
    df = records_frame(run.records)
    wall = max(0.0, (run.end_ns - run.start_ns) / 1e9)
    summary = summarize(df, wall, plan.slos)
    server = cell_delta(before, after)
    if server:
        summary["server"] = server
    summary.update(extra or {})
    status = status or ("stopped" if (run.stopped or interrupted) else "done")
    writer.write_cell({**cell.row(), "status": status, "reason": clean_text(run.stopped)}, df, summary, suffix=suffix)
    return summary
