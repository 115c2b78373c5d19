"""Sessions whose truth is known: requests drawn from seeded distributions (lognormal TTFT and TPOT), run
through a closed loop of users exactly as the runner schedules them (the next request goes to the first
free user), written with the real SessionWriter and summarize."""

from __future__ import annotations

import random
from array import array
from pathlib import Path
from typing import Any

import polars as pl

from servescope.core.metrics import records_frame, summarize
from servescope.core.records import RequestRecord
from servescope.sessions.store import SessionWriter

WORKLOAD = {"name": "chat", "api": "chat", "input_tokens": {"dist": "fixed", "value": 300},
            "output_tokens": {"dist": "fixed", "value": 32}, "prefix_tokens": 0, "dataset": "", "seed": 0,
            "source": "preset"}


def cell_frame(seed: int, n: int = 100, c: int = 4, ttft_ms: float = 100.0, tpot_ms: float = 6.0, out: int = 32,
               inp: int = 300, sigma: float = 0.25, tpot_sigma: float = 0.1,
               slow_first: int = 0, slow_factor: float = 1.0, drift: float = 0.0) -> tuple[pl.DataFrame, float]:
    """A closed-loop cell: `slow_first` requests `slow_factor` slower to first token (a warm-up effect);
    `drift` the relative TTFT growth from the first request to the last."""
    rng = random.Random(seed)
    t_user = [1_000_000] * c
    recs = []
    for i in range(n):
        u = min(range(c), key=lambda k: t_user[k])
        sent = t_user[u]
        r = RequestRecord(index=i, user=u, warmup=False, input_tokens_requested=inp, output_tokens_requested=out,
                          scheduled_ns=sent, sent_ns=sent)
        slow = slow_factor if i < slow_first else 1.0
        tt = ttft_ms * rng.lognormvariate(0, sigma) * slow * (1 + drift * i / max(n - 1, 1))
        tp = tpot_ms * rng.lognormvariate(0, tpot_sigma)
        first = sent + int(tt * 1e6)
        stamps = sorted(first + int(k * tp * 1e6 * rng.uniform(0.8, 1.2)) for k in range(out))
        r.first_token_ns = first
        r.first_content_ns = first
        r.chunk_ns = array("q", stamps)
        r.chunk_tokens = array("i", [1] * out)
        r.end_ns = stamps[-1] + 100_000
        r.prompt_tokens = inp
        r.output_tokens = out
        r.usage_reported = True
        recs.append(r)
        t_user[u] = r.end_ns
    return records_frame(recs), (max(t_user) - 1_000_000) / 1e9


def write_session(base: Path, name: str, cells: list[dict[str, Any]], meta: dict[str, Any] | None = None) -> Path:
    """A session of workload `chat` with one cell per entry of `cells` (cell_frame's keyword arguments, plus
    `c`); `meta` overrides session.toml keys (host, warmup, tokenizer...)."""
    path = base / name
    plan = [{"index": i, "workload": "chat", "api": "chat", "concurrency": cl.get("c", 4), "rate": None,
             "load_label": f"c={cl.get('c', 4)}", "warmup": 0} for i, cl in enumerate(cells)]
    full = {"name": name, "target": {"url": "http://127.0.0.1:8000", "version": "0.32.0", "tokenizer": "server"},
            "model": "m", "max_model_len": 4096, "workloads": [WORKLOAD],
            "load": {"concurrency": sorted({p["concurrency"] for p in plan}), "requests": 100, "warmup": 0},
            "cells": [{**p, "status": "planned"} for p in plan]}
    w = SessionWriter.create(path, full)
    for row, cl in zip(plan, cells, strict=True):
        df, wall = cell_frame(**cl)
        w.write_cell({**row, "status": "done", "reason": ""}, df, summarize(df, wall))
    w.finish("completed")
    w.meta.update(host="gpu-box", servescope_version="0.1.0", **(meta or {}))
    w.save_meta()
    return path
