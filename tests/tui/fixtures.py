"""Fixed data for snapshot tests: a saved session written by the real SessionWriter from synthetic
requests with fixed stamps, and the engine messages of a sweep in progress."""

from __future__ import annotations

import random
from array import array
from pathlib import Path
from typing import Any

import polars as pl

from servescope.core.metrics import records_frame, summarize
from servescope.core.records import RequestRecord
from servescope.core.results import CellResult
from servescope.engine import wire as w
from servescope.tui import messages as m
from servescope.tui.wire import live_server
from tests.support.meta import meta_of, set_meta

LOADS = (1, 4, 16, 32)
# a shape like the field reports': aggregate rises, per-user falls, latency grows with load
TTFT_MS = {1: 30.0, 4: 70.0, 16: 210.0, 32: 650.0}
TPOT_MS = {1: 4.0, 4: 4.4, 16: 6.5, 32: 11.0}


def synthetic_records(conc: int, n: int, seed: int, out_tokens: int = 64, slow: float = 1.0) -> list[RequestRecord]:
    rng = random.Random(seed)
    recs = []
    t = 1_000_000_000
    for i in range(n):
        ttft = TTFT_MS[conc] * slow * rng.uniform(0.6, 1.8)
        tpot = TPOT_MS[conc] * slow * rng.uniform(0.9, 1.15)
        sent = t + (i // conc) * int((ttft + tpot * out_tokens) * 1e6)
        first = sent + int(ttft * 1e6)
        chunks = array("q", [first + int(k * tpot * 1e6) for k in range(out_tokens)])
        recs.append(RequestRecord(
            index=i, user=i % conc, warmup=False, input_tokens_requested=256, output_tokens_requested=out_tokens,
            scheduled_ns=sent, sent_ns=sent, first_token_ns=first, first_content_ns=first, end_ns=chunks[-1] + 1000,
            status="ok" if i % 29 else "error", http_status=200 if i % 29 else 500,
            error="" if i % 29 else "HTTP 500: simulated overload", prompt_tokens=256, output_tokens=out_tokens,
            usage_reported=True, chunk_ns=chunks, chunk_tokens=array("i", [1] * out_tokens),
        ))
    return recs


def summary_for(conc: int, n: int = 60, slos: dict[str, float] | None = None,
                slow: float = 1.0) -> tuple[Any, dict[str, Any]]:
    recs = synthetic_records(conc, n, seed=conc, slow=slow)
    df = records_frame(recs)
    wall = (max(r.end_ns for r in recs) - min(r.scheduled_ns for r in recs)) / 1e9
    s = summarize(df, wall, slos or {}).to_dict()  # as stored, with a server part added below
    s["server"] = {"requests_success": float(n), "prompt_tokens": 256.0 * n, "generation_tokens": 64.0 * n,
                   "preemptions": float(max(0, conc - 16)), "ttft_ms_mean": TTFT_MS[conc] * 0.9,
                   "itl_ms_mean": TPOT_MS[conc], "e2e_ms_mean": TTFT_MS[conc] + 63 * TPOT_MS[conc],
                   "queue_ms_mean": conc * 1.5, "kv_cache_tokens": 373296.0, "prefix_cache_hit_rate": 0.0}
    return df, s


def write_session(base: Path, name: str, started: str, tags: dict[str, str], status: str = "completed",
                  loads: tuple[int, ...] = LOADS, slow: float = 1.0,
                  telemetry: bool = False, ramp: int = 0) -> Path:
    """A completed (or `status`) session; `slow` scales TTFT/TPOT (a slower variant for comparisons),
    `telemetry` adds the KV budget, GPU meta and per-cell telemetry/GPU summaries the engine stores; `ramp` > 0:
    each cell's first `ramp` requests are outside its steady window (`in_window` false, as engine/measure.py
    writes it) and its figures are over the rest."""
    from servescope.sessions.store import SessionWriter
    from servescope.workloads.spec import PRESETS

    slos = {"ttft_ms": 500.0, "tpot_ms": 10.0}
    path = base / f"{started[:10].replace('-', '')}-100000-{name}"
    meta = {
        "name": name, "target": {"url": "sim://tiny", "version": "0.32.0-sim", "metrics": True,
                                 "tokenizer": "server /tokenize"},
        "model": "tiny", "max_model_len": 8192, "workloads": [PRESETS["sharegpt"].to_dict()],
        "slos": slos, "tags": tags,
        "cells": [{"index": i, "workload": "sharegpt", "concurrency": c, "load_label": f"c={c}", "status": "planned"}
                  for i, c in enumerate(loads)],
    }
    w = SessionWriter.create(path, meta_of(**meta))
    for i, c in enumerate(loads):
        df, s = summary_for(c, slos=slos, slow=slow)
        if ramp:
            df = df.with_columns(in_window=pl.col("index") >= ramp)
            steady = df.filter(pl.col("in_window"))
            wall = (steady["end_ns"].max() - steady["scheduled_ns"].min()) / 1e9  # type: ignore[operator]
            s = {**s, **summarize(steady, wall, slos).to_dict(),
                 "window": {"kind": "steady", "requests": steady.height, "ramp_requests": ramp}}
        if telemetry:
            s["telemetry"] = telemetry_summary(c)
            s["gpu"] = {"available": False, "reason": "NVML not available: no NVIDIA driver on this machine"}
        row = {"index": i, "workload": "sharegpt", "api": "chat", "concurrency": c, "rate": None, "arrival": None,
               "max_concurrency": None, "requests_planned": 60, "duration_s_planned": None, "warmup": 0,
               "load_label": f"c={c}", "status": "done", "reason": ""}
        w.write_cell(row, df, CellResult.from_dict(s))
    if telemetry:
        w.update(kv_budget={"kv_cache_tokens": 12752, "source": "metrics", "block_size": 16, "num_gpu_blocks": 797,
                            "max_concurrency_by_workload": {"sharegpt": 16.6}},
                 gpu={"available": False, "reason": "NVML not available: no NVIDIA driver on this machine"})
    set_meta(w, started_at=started, host="gpu-box")
    w.finish(status)
    set_meta(w, ended_at=started)
    return path


def telemetry_summary(conc: int) -> dict[str, Any]:
    """A cell's /metrics window summary as the engine stores it (KV fills up and requests queue past c=16)."""
    return {"available": True, "reason": None, "samples": 10, "scrape_failures": 0,
            "kv_cache_usage_peak": min(1.0, conc / 20), "kv_cache_usage_mean": min(1.0, conc / 28),
            "running_mean": min(conc, 16) * 0.9, "running_max": float(min(conc, 16)),
            "waiting_mean": max(0, conc - 16) * 0.7, "waiting_max": float(max(0, conc - 16)),
            "preemptions": float(max(0, conc - 16)), "prefix_cache_hit_rate": 0.0,
            "ttft_ms_mean": TTFT_MS[conc] * 0.9, "itl_ms_mean": TPOT_MS[conc]}


def telemetry_samples(n: int = 30) -> list[m.TelemetryUpdated]:
    """Live /metrics samples of a filling KV cache, and no GPUs (NVML absent)."""
    out = []
    for i in range(n):
        raw = {"vllm:kv_cache_usage_perc": min(1.0, i / 25), "vllm:num_requests_running": float(min(i, 16)),
               "vllm:num_requests_waiting": float(max(0, i - 16)), "vllm:num_preemptions_total": float(max(0, i - 24))}
        out.append(m.TelemetryUpdated(w.TelemetryUpdated(live_server(raw), None)))
    return out


def cell_info(i: int, conc: int) -> m.CellInfo:
    return m.CellInfo(i, "sharegpt", f"c={conc}", conc, None, 60, None, "in 200-512 (uniform) / out 256 (chat)")


def live_sweep_messages(session_dir: Path) -> list[Any]:
    """Three finished cells and a fourth half way, as the worker would post them."""
    cells = [cell_info(i, c) for i, c in enumerate(LOADS)]
    out: list[Any] = [
        m.SweepStarted(w.SweepStarted(session_dir, cells, "sim://tiny", "tiny", "0.32.0-sim", "server /tokenize",
                                      True)),
        m.EngineNotice(w.EngineNotice("warning", "cell 2 (sharegpt c=4): input tokens differ from the request by up "
                                                 "to 3 (mean +1.2)")),
    ]
    for i, c in enumerate(LOADS[:3]):
        df, s = summary_for(c)
        out.append(m.CellStarted(w.CellStarted(cells[i], len(cells))))
        out.append(m.CellFinished(w.CellFinished(cells[i], CellResult.from_dict(s), "done")))
    from servescope.core.metrics import per_request

    recs = synthetic_records(32, 40, seed=99)
    pr = per_request(records_frame(recs)).filter(per_request(records_frame(recs))["status"] == "ok")
    out.append(m.CellStarted(w.CellStarted(cells[3], len(cells))))
    out.append(m.RequestsMeasured(w.RequestsMeasured(cells[3], pr["ttft_ms"].to_list(), pr["tpot_ms"].to_list(), pr["e2e_ms"].to_list(),
                                  pr["per_user_tok_s"].to_list(), int(pr["output_tokens"].sum()), 38, 2, 6.5,
                                  [("error", "HTTP 500: simulated overload")] * 2)))
    return out
