"""The engine's events as plain data: each `servescope.engine.events` event becomes `(kind, fields)` items
(kinds named as the app's messages are), reduced to what viewers draw (a batch of requests becomes its
TTFT/TPOT/E2E lists). The runner writes these items to the session's event log (servescope.sessions.live),
so the app, `servescope watch` and any number of viewers rebuild a sweep from it, live or later.
`encode_item`/`decode_item` turn them into JSON and back (CellInfo and paths)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from servescope.core.textsafe import clean_text
from servescope.sessions import series_name

Item = tuple[str, dict[str, Any]]

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


@dataclass
class CellInfo:
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
    def from_cell(cls, cell: Any) -> CellInfo:
        return cls(cell.index, cell.workload.name, cell.load.label, cell.load.concurrency, cell.load.rate,
                   cell.requests, cell.duration_s, cell.workload.shape(), clean_text(getattr(cell, "variant_args", "")))


def reduce_batch(records: list[Any]) -> tuple[list[float], list[float], list[float], list[float], int,
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


def live_server(sample: dict[str, Any] | None) -> dict[str, float] | None:
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


def telemetry_meta(session_dir: Path) -> Item | None:
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
    return ("TelemetryMeta", {"kv_budget": dict(kv) if kv else None, "gpu": dict(gpu) if gpu else None})


class Translator:
    """Runner events -> app items; remembers the session folder to re-read the KV budget and GPU
    availability when the engine announces a KV budget (at the start, and after a relaunch)."""

    def __init__(self, target_label: str | None) -> None:
        self.target_label = target_label
        self.session_dir: Path | None = None

    def __call__(self, ev: Any) -> list[Item]:
        from servescope.engine import events as r

        if isinstance(ev, r.SweepStarted):
            self.session_dir = ev.session_dir
        items = translate(ev, self.target_label)
        if isinstance(ev, r.KvBudgetKnown) and self.session_dir is not None:
            meta = telemetry_meta(self.session_dir)
            items += [meta] if meta else [("TelemetryMeta", {"kv_budget": dict(ev.budget), "gpu": None})]
        return items


def translate(ev: Any, target_label: str | None) -> list[Item]:
    """One runner event -> the items the app needs (usually one)."""
    from servescope.engine import events as r

    if isinstance(ev, r.RequestsDone):
        ttft, tpot, e2e, per_user, out_tok, errors, turns, cached = reduce_batch(ev.records)
        return [("RequestsMeasured", {"cell": CellInfo.from_cell(ev.cell), "ttft_ms": ttft, "tpot_ms": tpot,
                                      "e2e_ms": e2e, "per_user_tok_s": per_user, "output_tokens": out_tok,
                                      "done": ev.done, "failed": ev.failed, "elapsed_s": ev.elapsed_s,
                                      "errors": errors, "turns": turns, "cached": cached})]
    if isinstance(ev, r.TelemetrySample):
        gpus = [dict(g) for g in ev.gpus] if ev.gpus else None
        return [("TelemetryUpdated", {"server": live_server(ev.server), "gpus": gpus})]
    if isinstance(ev, r.CellStarted):
        return [("CellStarted", {"cell": CellInfo.from_cell(ev.cell), "total": ev.total})]
    if isinstance(ev, r.CellFinished):
        return [("CellFinished", {"cell": CellInfo.from_cell(ev.cell), "summary": ev.summary.to_dict(),
                                  "status": ev.status, "reason": clean_text(ev.reason)})]
    if isinstance(ev, r.CellSkipped):
        return [("CellSkipped", {"cell": CellInfo.from_cell(ev.cell), "reason": clean_text(ev.reason)})]
    if isinstance(ev, (r.Notice, r.KvBudgetKnown)):
        return [("EngineNotice", {"level": ev.level, "text": clean_text(ev.text)})]
    if isinstance(ev, r.SweepStarted):
        out: list[Item] = [("SweepStarted", {"session_dir": ev.session_dir, "cells": [CellInfo.from_cell(c) for c in ev.cells],
                                 "target": target_label or ev.target.url, "model": ev.model,
                                 "version": ev.target.version, "engine": ev.target.engine_text, "tokenizer": ev.tokenizer,
                                 "metrics": ev.target.metrics_available, "engine_pid": os.getpid()})]
        meta = telemetry_meta(ev.session_dir)
        return out + ([meta] if meta else [])
    if isinstance(ev, r.SweepFinished):
        return [("SweepFinished", {"session_dir": ev.session_dir, "status": ev.status,
                                   "message": clean_text(ev.message)})]
    return []


def encode_item(kind: str, fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` as plain JSON values (CellInfo -> dict, Path -> str)."""
    out: dict[str, Any] = {}
    for k, v in fields.items():
        if isinstance(v, CellInfo):
            v = asdict(v)
        elif k == "cells" and isinstance(v, list):
            v = [asdict(c) if isinstance(c, CellInfo) else c for c in v]
        elif isinstance(v, Path):
            v = str(v)
        out[k] = v
    return out


def decode_item(kind: str, fields: dict[str, Any]) -> Item:
    """An item read back from the event log, with CellInfo and Path values as the app's messages take them."""
    out = dict(fields)
    if isinstance(out.get("cell"), dict):
        out["cell"] = CellInfo(**out["cell"])
    if kind == "SweepStarted" and isinstance(out.get("cells"), list):
        out["cells"] = [CellInfo(**c) if isinstance(c, dict) else c for c in out["cells"]]
    if "session_dir" in out and isinstance(out["session_dir"], str):
        out["session_dir"] = Path(out["session_dir"])
    if kind == "RequestsMeasured" and isinstance(out.get("errors"), list):
        out["errors"] = [tuple(e) for e in out["errors"]]
    return kind, out
