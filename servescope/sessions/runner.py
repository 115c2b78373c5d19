"""The sweep runner: plans cells (workload x load), builds their prompts, runs them, saves each finished
cell to the session before the next starts, and yields a stream of events. The headless CLI, the TUI and
the tests are three consumers of the same `run_sweep()` async generator."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from servescope.core.client import ClientOptions, RequestSpec
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


@dataclass
class Cell:
    index: int
    workload: Workload
    load: Load
    requests: int | None
    duration_s: float | None
    warmup: int

    def row(self) -> dict[str, Any]:
        return {
            "index": self.index,
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
        return f"{self.workload.name} {self.load.label}"


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
class Notice:
    level: str  # "info" | "warning" | "error"
    text: str


@dataclass
class SweepFinished:
    session_dir: Path
    status: str  # "completed" | "interrupted" | "failed"
    message: str = ""


Event = SweepStarted | CellStarted | RequestsDone | CellFinished | CellSkipped | Notice | SweepFinished


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


def plan_cells(plan: SweepPlan) -> list[Cell]:
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
            cells.append(Cell(len(cells), w, ld, req, plan.duration_s, plan.warmup))
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


async def _health(url: str, api_key: str | None) -> bool:
    try:
        async with httpx.AsyncClient(base_url=url, timeout=5.0, trust_env=False) as c:
            r = await c.get("/v1/models", headers={"Authorization": f"Bearer {api_key}"} if api_key else None)
            return r.status_code < 500
    except Exception:
        return False


async def run_sweep(plan: SweepPlan, control: SweepControl | None = None) -> AsyncIterator[Event]:
    """Run the sweep and yield events. Setup problems raise ServescopeError before any cell runs."""
    control = control or SweepControl()
    control.loop = asyncio.get_running_loop()
    target = await probe(plan.url, plan.api_key)
    minfo = target.model(plan.model)
    model = minfo.id
    cells = plan_cells(plan)
    if not cells:
        raise ServescopeError("the sweep has no cells: give at least one workload and one load level")

    base_http = httpx.AsyncClient(
        base_url=target.url if "@" not in plan.url else plan.url,
        headers={"Authorization": f"Bearer {plan.api_key}"} if plan.api_key else None,
        timeout=httpx.Timeout(120.0, connect=10.0),
        limits=httpx.Limits(max_connections=16),
        trust_env=False,
    )
    tok: Tokenizer
    if plan.tokenizer:
        tok = LocalTokenizer(plan.tokenizer)
    elif await has_tokenize(base_http, model):
        tok = ServerTokenizer(base_http, model)
    else:
        tok = EstimateTokenizer()

    label = plan.target_label or target.url
    name = plan.name or f"{model.rstrip('/').split('/')[-1]}-{'-'.join(sorted({w.name.split('/')[0] for w in plan.workloads}))}"
    path = plan.save_dir or new_session_dir(plan.sessions_dir, name)
    meta = {
        "name": name,
        "target": {"url": label, "version": target.version, "metrics": target.metrics_available,
                   "tokenizer": tok.name},
        "model": model,
        "max_model_len": minfo.max_model_len,
        "models_json": __import__("json").dumps(target.raw_models, default=str),
        "workloads": [w.to_dict() for w in plan.workloads],
        "load": {
            "concurrency": plan.concurrency, "rates": plan.rates, "arrival": plan.arrival,
            "max_concurrency": plan.max_concurrency, "requests": plan.requests, "duration_s": plan.duration_s,
            "warmup": plan.warmup, "timeout_s": plan.timeout_s, "ignore_eos": plan.ignore_eos,
        },
        "slos": plan.slos,
        "tags": plan.tags,
        "cells": [{**c.row(), "status": "planned"} for c in cells],
    }
    writer = SessionWriter.create(path, meta)
    yield SweepStarted(path, cells, target, model, tok.name)
    if not tok.exact:
        yield Notice("warning", f"{label} has no /tokenize: input lengths are estimated (1 token per word); "
                                "pass --tokenizer PATH for exact lengths. Each cell shows requested vs measured.")

    opts = ClientOptions(base_url=plan.url if "@" not in plan.url else plan.url, model=model, api_key=plan.api_key,
                         timeout_s=plan.timeout_s, ignore_eos=plan.ignore_eos)
    status, message = "completed", ""
    try:
        for cell in cells:
            if control.stopping:
                if status == "completed":
                    status = "interrupted"
                break
            reason = _fits(cell.workload, minfo.max_model_len)
            if reason:
                writer.write_cell({**cell.row(), "status": "skipped", "reason": reason}, None, None)
                yield CellSkipped(cell, reason)
                continue
            try:
                prompts = await build_prompts(cell.workload, _pool_size(cell) + cell.warmup, f"cell{cell.index}", tok)
            except ServescopeError:
                raise
            except httpx.HTTPError as e:
                raise ServescopeError(f"lost {label} while building prompts: {clean_text(str(e)) or type(e).__name__}") from None
            specs = [RequestSpec(cell.workload.api, p.text, p.input_tokens, p.output_tokens, cell.workload.thinking)
                     for p in prompts]
            yield CellStarted(cell, len(cells))
            async for ev in _run_one(cell, specs, opts, plan, control, base_http, writer):
                yield ev
                if (isinstance(ev, CellFinished) and ev.status == "stopped" and not control.stopping
                        and not await _health(plan.url, plan.api_key)):
                    status = "failed"
                    message = (f"{label} stopped answering during cell {cell.index + 1} ({cell.label}); "
                               f"finished cells are saved in {path}")
                    yield Notice("error", message)
                    control.stopping = True
            if control.stopping and status == "completed":
                status = "interrupted"
    except (asyncio.CancelledError, KeyboardInterrupt):
        status = "interrupted"
        writer.finish(status, "interrupted")
        raise
    except ServescopeError as e:
        status, message = "failed", e.message
        writer.finish(status, message)
        await base_http.aclose()
        raise
    writer.finish(status, message)
    await base_http.aclose()
    yield SweepFinished(path, status, message)


async def _run_one(cell: Cell, specs: list[RequestSpec], opts: ClientOptions, plan: SweepPlan,
                   control: SweepControl, http: httpx.AsyncClient, writer: SessionWriter) -> AsyncIterator[Event]:
    cc = CellControl()
    control.cell = cc
    pending: list[RequestRecord] = []
    counts = [0, 0]
    wake = asyncio.Event()
    server_before: dict[str, float] | None = None

    def on_record(r: RequestRecord) -> None:
        pending.append(r)
        counts[0 if r.status == "ok" else 1] += 1

    async def before_measured() -> None:
        nonlocal server_before
        server_before = await scrape(http)

    t0 = time.monotonic()
    task = asyncio.create_task(run_cell(opts, specs, cell.load, Limits(cell.requests, cell.duration_s, cell.warmup),
                                        on_record, cc, seed=cell.index, before_measured=before_measured))
    task.add_done_callback(lambda _t: wake.set())
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
    except BaseException:
        cc.request_stop("interrupted")
        await asyncio.gather(task, return_exceptions=True)
        _save(cell, task, writer, plan, None, None, interrupted=True)
        raise
    run = task.result()
    if pending:
        yield RequestsDone(cell, pending[:], counts[0], counts[1], time.monotonic() - t0)
        pending.clear()
    server_after = await scrape(http)
    summary = _save(cell, task, writer, plan, server_before, server_after)
    control.cell = None
    st = "stopped" if run.stopped else "done"
    yield CellFinished(cell, summary, st, run.stopped)
    mm = summary.get("input_tokens_mismatch")
    if mm and mm["max_abs"] > 0:
        yield Notice("warning", f"cell {cell.index + 1} ({cell.label}): input tokens differ from the request by up to "
                                f"{mm['max_abs']} (mean {mm['mean']:+.1f})")


def _save(cell: Cell, task: asyncio.Task[Any], writer: SessionWriter, plan: SweepPlan,
          before: dict[str, float] | None, after: dict[str, float] | None, interrupted: bool = False) -> dict[str, Any]:
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
    status = "stopped" if (run.stopped or interrupted) else "done"
    writer.write_cell({**cell.row(), "status": status, "reason": clean_text(run.stopped)}, df, summary)
    return summary
