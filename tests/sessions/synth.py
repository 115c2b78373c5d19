"""Sessions whose truth is known: requests drawn from seeded distributions (lognormal TTFT and TPOT), run
through a closed loop of users exactly as the runner schedules them (the next request goes to the first
free user), written with the real SessionWriter and summarize. The session's metadata and its cell rows are
the engine's own (engine.sessionmeta.session_meta over a SweepSpec, engine.plan.Cell.row), as a sweep
writes them: `sweep_session` below, which tests/sessions/conftest.py's fixed sessions use too."""

from __future__ import annotations

import random
from array import array
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from servescope.core.load import Load
from servescope.core.metrics import records_frame, summarize
from servescope.core.records import RequestRecord
from servescope.core.results import CellWindow
from servescope.core.target import ModelInfo, TargetInfo
from servescope.engine.plan import Cell
from servescope.engine.sessionmeta import ran_with, session_meta
from servescope.engine.spec import SweepSpec
from servescope.sessions.store import SessionWriter
from servescope.workloads.spec import Workload
from tests.support.meta import set_meta

WORKLOAD = Workload.from_dict({"name": "chat", "api": "chat", "input_tokens": 300, "output_tokens": 32,
                               "source": "preset"})
URL = "http://127.0.0.1:8000"


def plan(points: Sequence[tuple[Workload, int, int | None]]) -> list[Cell]:
    """The sweep's cells for these (workload, concurrency, requests) points, in this order: a point given k times
    is k repeats of it (as `--repeat k` plans them)."""
    total = Counter((w.name, c) for w, c, _ in points)
    nth: Counter[tuple[str, int]] = Counter()
    cells = []
    for i, (w, c, n) in enumerate(points):
        nth[w.name, c] += 1
        cells.append(Cell(i, w, Load(concurrency=c), n, None, 0, repeat=nth[w.name, c], repeats=total[w.name, c]))
    return cells


def sweep_session(path: Path, name: str, cells: Sequence[Cell], *, model: str, max_model_len: int, tokenizer: str,
                  slos: dict[str, float] | None = None, tags: dict[str, str] | None = None, url: str = URL,
                  version: str = "0.32.0") -> tuple[SessionWriter, dict[str, Any]]:
    """A new sweep session of these cells against a vLLM at `url`, its session.toml written as the runner writes
    it (engine.sessionmeta.session_meta over the SweepSpec that plans such cells); with the columns each
    measured cell's row adds to `Cell.row()` (the runner's `ran_with`)."""
    sizes = {c.requests for c in cells}
    spec = SweepSpec(name=name, url=url, workloads=tuple({c.workload.name: c.workload for c in cells}.values()),
                     concurrency=tuple(sorted({c.load.concurrency or 1 for c in cells})),
                     requests=sizes.pop() if len(sizes) == 1 else None, repeat=max(c.repeats for c in cells),
                     slos=dict(slos or {}), tags=dict(tags or {})).check()
    served = ModelInfo(model, max_model_len)
    target = TargetInfo(url, [served], version=version, metrics_available=True, tokenize_available=True,
                        raw_models={"object": "list", "data": [{"id": model, "object": "model",
                                                                "max_model_len": max_model_len}]},
                        engine="vllm")
    meta = session_meta(spec, cells, name=name, label=url, target=target, model=served, tokenizer=tokenizer)
    return SessionWriter.create(path, meta), ran_with(spec, tokenizer)


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


def write_session(base: Path, name: str, cells: list[dict[str, Any]], meta: dict[str, Any] | None = None,
                  warmup: int = 0, window: str | None = None) -> Path:
    """A session of workload `chat` with one cell per entry of `cells` (cell_frame's keyword arguments, plus
    `c`), each planned with `warmup` warm-up requests; `meta` overrides session.toml keys (host, tokenizer...);
    `window` ("steady" or "whole") the window each cell's figures say they are over (None: written before windows)."""
    planned = plan([(WORKLOAD, cl.get("c", 4), cl.get("n", 100)) for cl in cells])
    for cell in planned:
        cell.warmup = warmup
    w, ran = sweep_session(base / name, name, planned, model="m", max_model_len=4096, tokenizer="server")
    for cell, cl in zip(planned, cells, strict=True):
        df, wall = cell_frame(**cl)
        summ = summarize(df, wall)
        if window is not None:
            summ = msgspec.structs.replace(summ, window=CellWindow(kind=window, start_s=0.0, end_s=wall,
                                                                  requests=summ.requests_ok + summ.requests_failed,
                                                                  requests_ok=summ.requests_ok))
        w.write_cell({**cell.row(), **ran, "status": "done", "reason": ""}, df, summ)
    w.finish("completed")
    set_meta(w, host="gpu-box", servescope_version="0.1.0", **(meta or {}))
    return base / name
