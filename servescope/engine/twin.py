"""The capacity twin: the simulator's scheduler and roofline, fitted to one measured session, answering "what if".

The fit (`fit_session`): the model's shape, the KV budget and the scheduler limits come from
`servescope.engine.twinshape`; the rates are fitted. Each measured cell is replayed on the simulator's virtual
clock (`servescope.sim.engine.VirtualRunner`) with the cell's own load (its concurrency, or its requests' send
times for an open loop) and its requests' own prompt and output lengths, and the efficiencies of the roofline
(`EfficiencySpec`: bandwidth_eff, gemm_eff, gemm_half_rows, attention_eff, step_overhead_ms, host_overhead_ms,
per_seq_overhead_us, frontend_ms) are chosen to minimise the log error of each cell's output tok/s, TTFT p50,
TPOT p50 and the server's own mean TTFT, and at half weight the means and the TTFT p90 (soft-L1: squared while
under ~15%, linear beyond, so one erratic cell cannot drag the fit; Nelder-Mead in log space, from three starts
and a fourth from the lowest load's prefill, with a weak pull towards neutral priors so that a rate the data
cannot see stays plausible: attention_eff is tied to gemm_eff unless the measured prompts span 3x or more).
Where the shape does not say whether host and device time overlap (async scheduling), both are fitted.

The starts' searches are independent: each runs in its own process where there are CPUs for it (spawned, as
the app fits from a thread), with the same numbers as one after another. `fit_time_estimate` says beforehand what
a fit will take, from the session's cells (each virtual run replays them all; `fit_seconds`).

The prediction (`servescope.engine.twinpredict`): the fitted profile runs the asked cells on the virtual clock
and the same `summarize` as a real run turns its requests into the same figures; each figure gets a band from
the twin's error for that figure (the fit's residual, or the fitted cell's own error at a measured load), widened
by how far the question lies outside the measured range, combined with the prediction's own sampling spread.
"""

from __future__ import annotations

import functools
import math
import os
import random
import statistics
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import polars as pl

from servescope.core.errors import ServescopeError
from servescope.core.jsontypes import JsonObject
from servescope.core.load import CellRun, Load
from servescope.core.metrics import records_frame, summarize
from servescope.core.records import RequestRecord
from servescope.core.results import CellResult
from servescope.core.steady import steady_span
from servescope.engine.measure import CellMeasure, cell_figures
from servescope.engine.plan import Cell
from servescope.engine.twinshape import (
    NOMINAL_GPU,
    Shape,
    profile_to_dict,
    session_shape,
)
from servescope.sessions.store import Session, atomic_write, toml_clean
from servescope.sessions.twin import PROFILE_FILE, TWIN_DIR
from servescope.sim.engine import VirtualRunner
from servescope.sim.profile import CostModel, Profile, ProfileError, profile_from_dict
from servescope.sim.request import SimRequest
from servescope.workloads.spec import Workload

FIGURES = ("output_tok_s", "ttft_ms.p50", "tpot_ms.p50")  # what the fit and the bands are about
# server.ttft_ms_mean: the server's own mean TTFT (its /metrics, over the cell), which starts when the engine got
# the request: the client's TTFT less the API server's part (frontend_ms). Without it one prompt length cannot
# tell the API server's fixed cost from the prefill's cost per prompt token.
FIT_FIGURES = (("output_tok_s", 1.0), ("ttft_ms.p50", 1.0), ("tpot_ms.p50", 1.0), ("ttft_ms.mean", 0.5),
               ("tpot_ms.mean", 0.5), ("ttft_ms.p90", 0.5), ("server.ttft_ms_mean", 1.0))
# a closed-loop user's next request reaches the server this long after its last token (the stream's end reaching
# the client, the next request reaching the server): with it, users that finished in the same step are not
# admitted in lockstep forever, as on a real server (an idle engine starts a step on the first arrival)
CLIENT_GAP_S = (0.0002, 0.0008)
MIN_BAND = 0.03  # a band is never narrower than +-3%: run-to-run noise on a quiet server
# the fit's search budget, in virtual runs of every measured cell: each start's, then the best one's polish (a
# shorter search per start, then only the best start searched on, ended 3x worse on tok/s on a 2-cell session:
# there the best start after 200 runs was the worst after 60)
START_EVALS = 200
POLISH_EVALS = 120
MIN_FIT_CPUS = 4  # the starts run side by side on machines with this many CPUs or more (fit_workers)


@dataclass(frozen=True)
class Param:
    name: str  # an EfficiencySpec field
    prior: float
    lo: float
    hi: float


PARAMS = (
    Param("bandwidth_eff", 0.7, 1e-4, 50.0),
    Param("gemm_eff", 0.5, 1e-4, 50.0),
    Param("gemm_half_rows", 32.0, 0.5, 4096.0),
    Param("step_overhead_ms", 1.0, 1e-3, 2000.0),
    Param("host_overhead_ms", 1.0, 1e-3, 2000.0),
    Param("per_seq_overhead_us", 10.0, 1e-2, 1e5),
    Param("frontend_ms", 10.0, 1e-2, 1e4),
    Param("attention_eff", 0.3, 1e-4, 50.0),
)
ATTENTION_TIE = 0.6  # attention_eff / gemm_eff when the prompts do not span enough to fit it (profiles: 0.5-0.64)
PRIOR_WEIGHT = 0.002  # per parameter, per (ln factor)^2 away from its prior
ROBUST_SCALE = 0.15  # ln errors above ~15% count linearly, not squared: one erratic cell cannot drag the fit


def _ln_error(twin: float, measured: float) -> float:
    """ln(twin / measured); a twin figure at or below 0 (a server TTFT the frontend has eaten up) counts as 1000x
    too small, not as nothing."""
    return math.log(max(twin, measured * 1e-3) / measured)


def robust(r: float) -> float:
    """Soft-L1 loss of a log error r: r^2 while small, 2 x ROBUST_SCALE x |r| when large."""
    d = ROBUST_SCALE
    return 2.0 * d * d * (math.sqrt(1.0 + (r / d) ** 2) - 1.0)


# --- what was measured ----------------------------------------------------------------------------------------
@dataclass
class MeasuredCell:
    index: int
    workload: str
    concurrency: int | None
    rate: float | None
    prompts: list[int]
    outputs: list[int]
    send_s: list[float]  # open loop: each request's scheduled send, from the cell's first
    figures: dict[str, float]
    client_bound: bool = False  # the client, not the server, limited the cell (core.health)
    ramp_s: float = 0.0  # a closed loop's users started one by one over this long (`--ramp`)
    steady: bool = False  # its figures are over its steady window (core/steady.py): the replay's are too

    @property
    def label(self) -> str:
        return f"{self.workload} c={self.concurrency}" if self.concurrency else f"{self.workload} rate={self.rate:g}/s"


def _figure(s: CellResult, key: str) -> float | None:
    v = s.value(key)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) and v > 0 else None


def measured_cells(session: Session) -> list[MeasuredCell]:
    """The session's completed single-turn cells, with their requests' lengths and their figures."""
    out: list[MeasuredCell] = []
    rows = session.cells.to_dicts()
    for row, s in zip(rows, session.summaries(), strict=False):
        if s is None or row.get("status") != "done" or not s.requests_ok:
            continue
        df = session.requests(int(row["index"]))
        if df.is_empty():
            continue
        df = df.filter(~pl.col("warmup") & (pl.col("status") == "ok"))
        if "turn" in df.columns and (df["turn"] > 0).any():
            continue  # conversations: the twin models single requests only
        df = df.sort("scheduled_ns")
        prompts = [int(p) if p is not None and p > 0 else int(r) for p, r in
                   zip(df["prompt_tokens"].to_list(), df["input_tokens_requested"].to_list(), strict=True)]
        outputs = [max(1, int(o)) for o in df["output_tokens"].to_list()]
        t0 = int(df["scheduled_ns"].min() or 0)  # type: ignore[arg-type]
        sends = [(int(t) - t0) / 1e9 for t in df["scheduled_ns"].to_list()]
        figs = {k: v for k, _ in FIT_FIGURES if (v := _figure(s, k)) is not None}
        conc = row.get("concurrency")
        rate = row.get("rate")
        ramp = row.get("ramp_s") or (s.window.ramp_s if s.window is not None else None)  # planned, else --ramp auto
        out.append(MeasuredCell(int(row["index"]), str(row.get("workload")), int(conc) if conc else None,
                                float(rate) if rate else None, prompts, outputs, sends, figs, s.client_bound,
                                float(ramp) if isinstance(ramp, (int, float)) and ramp > 0 else 0.0,
                                s.window is not None and s.window.kind == "steady"))
    if not out:
        raise ServescopeError(f"{session.path}: no completed cell with measured requests to fit the twin to; run a "
                              "sweep first (e.g. -c 1,4,16)")
    return out


# --- the virtual run ------------------------------------------------------------------------------------------
@dataclass
class VirtualCell:
    prompts: list[int]
    outputs: list[int]
    first: list[float]
    done: list[float]
    sent: list[float]
    token_t: list[list[float]]
    wall: float
    window_tokens: float | None = None  # a steady window's (steady_part): the output tokens that arrived inside it


def _filler(n: int) -> list[int]:
    return [64] * n


def run_virtual(cost: CostModel, prompts: Sequence[int], outputs: Sequence[int], concurrency: int | None,
                send_s: Sequence[float] | None = None, tokens: bool = False, ramp_s: float = 0.0) -> VirtualCell:
    """One cell on the virtual clock: `concurrency` closed-loop users (user u of N starting at u/N x `ramp_s`, as
    the load's ramp starts them), or sends at `send_s` (open loop)."""
    runner = VirtualRunner(cost)
    rng = random.Random(0)  # a real client's users never send at the very same instant: see CLIENT_GAP_S
    n = len(prompts)
    first = [0.0] * n
    done = [0.0] * n
    sent = [0.0] * n
    token_t: list[list[float]] = [[] for _ in range(n)] if tokens else []
    reqs: list[SimRequest] = []
    nxt = 0

    def on_tok(req: SimRequest, _n: int, _fin: bool, t: float) -> None:
        token_t[req.rid].append(t)

    def make(i: int, at: float) -> None:
        req = SimRequest(i, prompts[i], outputs[i], prompt_ids=[i, *range(64, 63 + prompts[i])], out_ids=_filler,
                         on_tokens=on_tok if tokens else None)
        reqs.append(req)
        sent[i] = at
        runner.submit(req, at)

    def on_done(req: SimRequest, t: float) -> None:
        nonlocal nxt
        first[req.rid] = req.first_token_t
        done[req.rid] = t
        if concurrency and nxt < n:
            make(nxt, t + rng.uniform(*CLIENT_GAP_S))
            nxt += 1

    runner.on_done = on_done
    if concurrency:
        users = min(concurrency, n)
        for u in range(users):
            make(nxt, u * CLIENT_GAP_S[0] + ramp_s * u / users)
            nxt += 1
    else:
        for i, t in enumerate(send_s or [0.0] * n):
            make(i, t)
    try:
        runner.run()
    except RuntimeError as e:
        raise ServescopeError(f"the twin cannot run this cell: {e}") from None
    return VirtualCell(list(prompts), list(outputs), first, done, sent, token_t, runner.now)


def steady_part(v: VirtualCell, concurrency: int | None, ramp_s: float = 0.0) -> VirtualCell:
    """The virtual cell's steady window, as core/steady.py cuts a measured one: the requests sent from the moment the
    last user started (a closed loop: user u of N at u/N x ramp; an open loop: after its ramp) to the last send, their
    times shifted so the window starts at 0, `wall` its length and `window_tokens` the output tokens that arrived in
    it (a token's time from `token_t`, else spread evenly from the first token to the end). The whole cell when the
    window is no steady state (fewer than two requests, or shorter than their median E2E: core.steady.long_enough)."""
    if not v.sent:
        return v
    first = min(v.sent)
    if concurrency:
        users = min(concurrency, len(v.sent))
        start = first + (ramp_s * (users - 1) / users if users > 1 else 0.0)
    else:
        start = first + ramp_s
    end = max(v.sent)
    keep = [i for i, t in enumerate(v.sent) if start <= t <= end]
    e2e = sorted(v.done[i] - v.sent[i] for i in keep)
    if end <= start or len(keep) < 2 or end - start < e2e[len(e2e) // 2]:
        return v
    arrived = 0.0
    for i, o in enumerate(v.outputs):
        stamps = v.token_t[i] if v.token_t else [v.first[i] + (v.done[i] - v.first[i]) * k / max(o - 1, 1)
                                                 for k in range(o)]
        arrived += sum(1 for t in stamps if start <= t < end)
    return VirtualCell([v.prompts[i] for i in keep], [v.outputs[i] for i in keep],
                       [v.first[i] - start for i in keep], [v.done[i] - start for i in keep],
                       [v.sent[i] - start for i in keep],
                       [[t - start for t in v.token_t[i]] for i in keep] if v.token_t else [], end - start, arrived)


def steady_regime(twin: Twin) -> bool:
    """Whether the twin's session measured its cells over steady windows (a `run` of the default regime: a closed
    loop's users started over one request's E2E, figures over the steady window): its predictions are then of that
    regime too. Twins fitted before windows, and sessions measured with `--window whole`: the whole cell."""
    rows = twin.fit_info.get("cells")
    return any(isinstance(r, dict) and r.get("window") == "steady" for r in rows) if isinstance(rows, list) else False


def _quantile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return math.nan
    pos = (len(s) - 1) * q
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def quick_figures(v: VirtualCell, frontend_ms: float = 0.0) -> dict[str, float]:
    """The fitted figures of a virtual cell, computed as `summarize` computes them (linear quantiles); the
    server's own mean TTFT leaves out the API server's `frontend_ms`."""
    ttft = [(f - s) * 1e3 for f, s in zip(v.first, v.sent, strict=True)]
    tpot = [(d - f) * 1e3 / (o - 1) for d, f, o in zip(v.done, v.first, v.outputs, strict=True) if o > 1]
    mean = statistics.fmean(ttft)
    tokens = v.window_tokens if v.window_tokens is not None else sum(v.outputs)
    out = {"output_tok_s": tokens / max(v.wall, 1e-9), "ttft_ms.p50": _quantile(ttft, 0.5),
           "ttft_ms.mean": mean, "ttft_ms.p90": _quantile(ttft, 0.9), "server.ttft_ms_mean": mean - frontend_ms}
    if tpot:
        out["tpot_ms.p50"] = _quantile(tpot, 0.5)
        out["tpot_ms.mean"] = statistics.fmean(tpot)
    return out


def virtual_summary(v: VirtualCell, slos: Mapping[str, float] | None = None, steady: Load | None = None
                    ) -> CellResult:
    """The cell's summary exactly as `servescope run` computes it, from request records built from the run: over
    the whole cell, or with `steady` (the load it ran: users and ramp) over its steady window, the whole cell's
    figures and counts beside, by the very function `run` saves a cell with (engine.measure.cell_figures)."""
    recs = []
    for i, (p, o) in enumerate(zip(v.prompts, v.outputs, strict=True)):
        ns = [int(t * 1e9) for t in v.token_t[i]] if v.token_t else [int(v.first[i] * 1e9), int(v.done[i] * 1e9)]
        recs.append(RequestRecord(
            index=i, user=-1, warmup=False, input_tokens_requested=p, output_tokens_requested=o,
            scheduled_ns=int(v.sent[i] * 1e9), sent_ns=int(v.sent[i] * 1e9), first_token_ns=int(v.first[i] * 1e9),
            first_content_ns=int(v.first[i] * 1e9), end_ns=int(v.done[i] * 1e9), prompt_tokens=p, output_tokens=o,
            usage_reported=True, chunk_ns=array("q", ns),
            chunk_tokens=array("i", [1] * len(ns))))
    start = min(v.sent) if v.sent else 0.0
    df = records_frame(recs)
    whole = summarize(df, v.wall - start, slos)
    if steady is None or not recs:
        return whole
    cell = Cell(0, Workload("twin", source="inline"), steady, len(recs), None, 0)
    run = CellRun(recs, int(start * 1e9), int(v.wall * 1e9))
    measure = CellMeasure(window="steady", slos=dict(slos or {}))
    span = steady_span(recs, steady, len(recs))
    return cell_figures(whole, df, run, cell, measure, dict(slos or {}), None, None, None, span)[0]


# --- the fit --------------------------------------------------------------------------------------------------
@dataclass
class FitResult:
    profile: Profile
    shape: Shape
    free: list[str]
    residuals: dict[str, float]  # per figure: root mean square of ln(twin / measured) over the fitted cells
    cells: list[dict[str, int | float | str | list[float]]]  # per fitted cell: index, label, workload, load, requests
    # and each figure's [measured, twin]
    data_range: dict[str, list[float]]
    evaluations: int
    warnings: list[str] = field(default_factory=list)

    def to_toml_dict(self) -> JsonObject:
        d = profile_to_dict(self.profile)
        d["fit"] = {
            "shape_from": self.shape.source, "kv_from": self.shape.kv_source, "limits_from": self.shape.limits_source,
            "fitted": self.free, "evaluations": self.evaluations, "warnings": self.warnings,
            "residual_rms_ln": self.residuals,
            "range": self.data_range,
            "cells": self.cells,
        }
        return d


def _with(p: Profile, values: Mapping[str, float]) -> Profile:
    """`p` with `values` for its efficiency's float fields, by name (PARAMS): the name picks the field, so a type
    checker cannot match each value to its field; dataclasses.replace rejects an unknown name."""
    return replace(p, efficiency=functools.partial(replace, p.efficiency)(**values))


def _span(xs: Sequence[float]) -> float:
    return max(xs) / max(min(xs), 1e-9) if xs else 1.0


def data_range(cells: Sequence[MeasuredCell]) -> dict[str, list[float]]:
    prompts = [p for c in cells for p in c.prompts]
    outputs = [o for c in cells for o in c.outputs]
    out: dict[str, list[float]] = {"prompt_tokens": [min(prompts), max(prompts)],
                                   "output_tokens": [min(outputs), max(outputs)]}
    concs = [c.concurrency for c in cells if c.concurrency]
    rates = [c.rate for c in cells if c.rate]
    if concs:
        out["concurrency"] = [min(concs), max(concs)]
    if rates:
        out["rate"] = [min(rates), max(rates)]
    return out


def nelder_mead(f: Callable[[list[float]], float], x0: list[float], step: float = 0.7, max_evals: int = 250,
                tol: float = 1e-6) -> tuple[list[float], float, int]:
    """Minimise f from x0 (plain Nelder-Mead; returns the best point, its value and the evaluations used)."""
    n = len(x0)
    pts = [list(x0)] + [[x + (step if i == j else 0.0) for j, x in enumerate(x0)] for i in range(n)]
    vals = [f(p) for p in pts]
    evals = n + 1
    while evals < max_evals:
        order = sorted(range(n + 1), key=vals.__getitem__)
        pts = [pts[i] for i in order]
        vals = [vals[i] for i in order]
        if vals[-1] - vals[0] < tol:
            break
        c = [sum(p[j] for p in pts[:-1]) / n for j in range(n)]
        worst = pts[-1]
        r = [c[j] + (c[j] - worst[j]) for j in range(n)]
        fr = f(r)
        evals += 1
        if fr < vals[0]:
            e = [c[j] + 2.0 * (c[j] - worst[j]) for j in range(n)]
            fe = f(e)
            evals += 1
            pts[-1], vals[-1] = (e, fe) if fe < fr else (r, fr)
        elif fr < vals[-2]:
            pts[-1], vals[-1] = r, fr
        else:
            k = [c[j] + 0.5 * (worst[j] - c[j]) for j in range(n)]
            fk = f(k)
            evals += 1
            if fk < vals[-1]:
                pts[-1], vals[-1] = k, fk
            else:
                best = pts[0]
                pts = [best] + [[best[j] + 0.5 * (p[j] - best[j]) for j in range(n)] for p in pts[1:]]
                vals = [vals[0]] + [f(p) for p in pts[1:]]
                evals += n
    i = min(range(n + 1), key=vals.__getitem__)
    return pts[i], vals[i], evals


def _prefill_start(shape: Shape, c1: MeasuredCell, tpot_ms: float, cost: CostModel,
                   mem_ms: float) -> dict[str, float] | None:
    """A compute-bound start from the lowest load's cell, where its server's own TTFT is known: its first step
    (the prefill) minus a decode step is the prompt's compute, and the client's TTFT over the server's is the
    API server's part. (Small models on slow devices: overheads per step, prefill per prompt token.)"""
    server = c1.figures.get("server.ttft_ms_mean")
    client = c1.figures.get("ttft_ms.mean")
    prompt = statistics.median(c1.prompts) if c1.prompts else 0
    if not server or not client or prompt < 2 or cost.dense_flops_tok <= 0:
        return None
    per_token_s = max(server - tpot_ms, 0.05 * tpot_ms) / 1e3 / (prompt - 1)
    peak = shape.profile.gpu.peak_tflops * 1e12
    gemm = cost.dense_flops_tok / (peak * per_token_s)
    return {"gemm_eff": gemm, "attention_eff": gemm * ATTENTION_TIE, "gemm_half_rows": 1.0,
            "bandwidth_eff": max(mem_ms / (0.1 * tpot_ms), 1e-4), "step_overhead_ms": 0.8 * tpot_ms,
            "host_overhead_ms": 0.1 * tpot_ms, "per_seq_overhead_us": 10.0,
            "frontend_ms": max(client - server, 0.02)}


def fit(shape: Shape, cells: Sequence[MeasuredCell], max_requests: int = 200,
        progress: Callable[[str], None] | None = None, workers: int | None = None) -> FitResult:
    """Fit the shape's efficiencies to the measured cells. Where the shape does not know whether the server
    schedules asynchronously (its host work hidden behind the device's step) or not (host and device time add
    up: a CPU build, or a GPU server without async scheduling), both are fitted and the closer one kept."""
    if shape.async_known:
        return _fit_efficiencies(shape, cells, max_requests, progress, workers)[0]
    best: tuple[FitResult, float] | None = None
    for mode in (True, False):
        if progress is not None:
            progress(f"async scheduling {'on' if mode else 'off'}")
        eff = replace(shape.profile.efficiency, async_scheduling=mode)
        got = _fit_efficiencies(replace(shape, profile=replace(shape.profile, efficiency=eff)), cells, max_requests,
                                progress, workers)
        if best is None or got[1] < best[1]:
            best = got
    assert best is not None
    return best[0]


@dataclass
class FitLoss:
    """The fit's objective over x (ln of the free efficiencies): a plain object, so that a worker process can run
    a start's search with it."""

    profile: Profile
    cells: list[MeasuredCell]
    trimmed: list[MeasuredCell]  # the cells as replayed (their first requests)
    free: list[Param]
    fit_attention: bool

    def values(self, x: Sequence[float]) -> dict[str, float]:
        v = {p.name: min(max(math.exp(x[i]), p.lo), p.hi) for i, p in enumerate(self.free)}
        if not self.fit_attention:
            v["attention_eff"] = v["gemm_eff"] * ATTENTION_TIE
        return v

    def figures(self, prof: Profile) -> list[dict[str, float]]:
        """Each cell replayed (with the ramp it ran with), its figures over the window its own are over."""
        cost = CostModel(prof)
        out = []
        for c in self.trimmed:
            v = run_virtual(cost, c.prompts, c.outputs, c.concurrency, None if c.concurrency else c.send_s,
                            ramp_s=c.ramp_s)
            out.append(quick_figures(steady_part(v, c.concurrency, c.ramp_s) if c.steady else v,
                                     prof.efficiency.frontend_ms))
        return out

    def __call__(self, x: list[float]) -> float:
        try:
            sims = self.figures(_with(self.profile, self.values(x)))
        except ServescopeError:
            return 1e9
        total = 0.0
        for c, sim in zip(self.cells, sims, strict=True):
            for key, w in FIT_FIGURES:
                m, s = c.figures.get(key), sim.get(key)
                if m and s is not None and math.isfinite(s):
                    total += w * robust(_ln_error(s, m))
        total += PRIOR_WEIGHT * sum((x[i] - math.log(p.prior)) ** 2 for i, p in enumerate(self.free))
        return total


def _search(job: tuple[FitLoss, list[float]]) -> tuple[list[float], float, int]:
    loss, x0 = job
    return nelder_mead(loss, x0, max_evals=START_EVALS)


def _search_at(job: tuple[int, FitLoss, list[float]]) -> tuple[int, tuple[list[float], float, int]]:
    i, loss, x0 = job
    return i, _search((loss, x0))


def fit_workers(starts: int = 4) -> int:
    """Processes for the fit's starts: one per start, at most one per CPU this process may use; none below
    MIN_FIT_CPUS (on 2 busy cores, 2 workers took 41 s where one after another took 24 s: each spawned worker
    imports servescope anew, some 3 s of CPU, and the cores were not free anyway)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(starts, cpus)) if cpus >= MIN_FIT_CPUS else 1


def _searches(loss: FitLoss, starts: list[list[float]], workers: int | None,
              progress: Callable[[str], None] | None) -> list[tuple[list[float], float, int]]:
    """Each start's search, in its order: the starts are independent, so each runs in a worker process where
    there are CPUs for them (the same numbers as one after the other: a search is deterministic)."""
    n = fit_workers(len(starts)) if workers is None else max(1, min(workers, len(starts)))
    out: list[tuple[list[float], float, int] | None] = [None] * len(starts)

    def done(i: int, r: tuple[list[float], float, int]) -> None:
        out[i] = r
        if progress is not None:
            progress(f"start {i + 1}/{len(starts)}: loss {r[1]:.4f} after {r[2]} runs")

    if n <= 1:
        for i, x0 in enumerate(starts):
            done(i, _search((loss, x0)))
    else:
        import multiprocessing

        # spawn, not fork: the app fits from a thread, and a forked child of a threaded process can deadlock. The
        # pool's exit terminates its workers: a progress callback that raises (the app quits) leaves none behind
        with multiprocessing.get_context("spawn").Pool(n) as pool:
            for i, r in pool.imap_unordered(_search_at, [(i, loss, x0) for i, x0 in enumerate(starts)]):
                done(i, r)
    return [r for r in out if r is not None]


def _fit_efficiencies(shape: Shape, cells: Sequence[MeasuredCell], max_requests: int,
                      progress: Callable[[str], None] | None, workers: int | None = None) -> tuple[FitResult, float]:
    prompts_all = [p for c in cells for p in c.prompts]
    fit_attention = _span(prompts_all) >= 3.0
    free = [p for p in PARAMS if p.name != "attention_eff" or fit_attention]
    index = {p.name: i for i, p in enumerate(free)}
    # long cells are replayed on their first requests only (a closed loop's steady state is the same after a few
    # rounds of its users; an open loop keeps its first max_requests sends)
    def keep(c: MeasuredCell) -> int:
        return _keep(c.concurrency, max_requests)

    trimmed = [replace(c, prompts=c.prompts[:keep(c)], outputs=c.outputs[:keep(c)], send_s=c.send_s[:keep(c)])
               for c in cells]

    loss = FitLoss(shape.profile, list(cells), trimmed, free, fit_attention)
    values, twin_figures = loss.values, loss.figures

    starts = [[math.log(p.prior) for p in free]]
    c1 = min(cells, key=lambda c: c.concurrency or 10**9)
    tpot = c1.figures.get("tpot_ms.p50")
    if tpot:  # a memory-bound start and an overhead-bound start, scaled to the measured step time
        cost = CostModel(shape.profile)
        mem_ms = cost.weight_bytes / (shape.profile.gpu.bandwidth_gbs * 1e9) * 1e3
        a = list(starts[0])
        a[index["bandwidth_eff"]] = math.log(max(mem_ms / (0.8 * tpot), 1e-4))
        a[index["step_overhead_ms"]] = math.log(0.2 * tpot)
        b = list(starts[0])
        b[index["bandwidth_eff"]] = math.log(max(mem_ms / (0.1 * tpot), 1e-4))
        b[index["step_overhead_ms"]] = math.log(0.9 * tpot)
        b[index["host_overhead_ms"]] = math.log(0.5 * tpot)
        starts += [a, b]
        prefill = _prefill_start(shape, c1, tpot, cost, mem_ms)
        if prefill is not None:
            starts.append([math.log(prefill.get(p.name, p.prior)) for p in free])
    best: tuple[list[float], float] | None = None
    evals = 0
    for x, v, n in _searches(loss, starts, workers, progress):
        evals += n
        if best is None or v < best[1]:
            best = (x, v)
    assert best is not None
    x, final_loss, n = nelder_mead(loss, best[0], step=0.15, max_evals=POLISH_EVALS)  # polish the best
    evals += n
    fitted = _with(shape.profile, {k: round(v, 6) for k, v in values(x).items()})
    sims = twin_figures(fitted)
    per: dict[str, list[float]] = {}
    rows = []
    for c, sim in zip(cells, sims, strict=True):
        row: dict[str, int | float | str | list[float]] = {"cell": c.index, "label": c.label, "workload": c.workload,
                                                             "requests": len(c.prompts)}
        if c.concurrency:
            row["concurrency"] = c.concurrency
        if c.rate:
            row["rate"] = c.rate
        row["window"] = "steady" if c.steady else "whole"
        if c.ramp_s:
            row["ramp_s"] = c.ramp_s
        for key, _ in FIT_FIGURES:
            m, s = c.figures.get(key), sim.get(key)
            if m and s is not None and math.isfinite(s):
                per.setdefault(key, []).append(_ln_error(s, m))
                row[key] = [round(m, 4), round(s, 4)]
        rows.append(row)
    residuals = {k: round(math.sqrt(statistics.fmean(e * e for e in v)), 5) for k, v in per.items()}
    warnings = []
    bound = [c.label for c in cells if c.client_bound]
    if bound:
        warnings.append(f"{len(bound)} of {len(cells)} fitted cells were client-bound ({', '.join(bound)}): the client, "
                        "not the server, limited them, and the twin learns those limits too; re-measure them with "
                        "more client CPU (--workers) for a twin of the server alone")
    return (FitResult(fitted, shape, [p.name for p in free], residuals, rows, data_range(cells), evals, warnings),
            final_loss)


# --- storage --------------------------------------------------------------------------------------------------
def twin_dir(session: Session) -> Path:
    return session.path / TWIN_DIR


def save_fit(session: Session, result: FitResult) -> Path:
    import tomli_w

    d = twin_dir(session)
    d.mkdir(exist_ok=True)
    path = d / PROFILE_FILE
    atomic_write(path, tomli_w.dumps(toml_clean(result.to_toml_dict())).encode())
    return path


@dataclass
class Twin:
    """A fitted profile and what the fit knows about its own accuracy."""

    profile: Profile
    residuals: dict[str, float]
    data_range: dict[str, list[float]]
    memory_known: bool
    fit_info: JsonObject = field(default_factory=dict)  # profile.toml's [fit] table as read


def load_twin(session: Session) -> Twin | None:
    import tomllib

    path = twin_dir(session) / PROFILE_FILE
    if not path.is_file():
        return None
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        prof = profile_from_dict(data, path.stem, str(path))
    except (ProfileError, OSError, ValueError) as e:
        raise ServescopeError(f"{path}: cannot read the twin's profile ({e}); delete it and run `servescope twin fit "
                              f"{session.path}` again") from None
    info = data.get("fit", {})
    res = {k: float(v) for k, v in (info.get("residual_rms_ln") or {}).items()}
    rng = {k: [float(x) for x in v] for k, v in (info.get("range") or {}).items()}
    memory_known = prof.gpu.name != NOMINAL_GPU.name  # a sim profile's GPU, or the memory NVML reported
    return Twin(prof, res, rng, memory_known, info)


# the fit's CPU time, per virtual step and per request in a step's batch (benchmarks/twin_fit_time.py on the 2-core
# dev machine: 2.7 us and 1.9 us); a busy machine's wall time runs up to twice the CPU time
STEP_CPU_S = 2.7e-6
TOKEN_CPU_S = 1.9e-6


def _run_cpu_s(requests: int, output_mean: float, users: float) -> float:
    """A virtual run's CPU seconds for one cell of `requests` requests (trimmed as the fit replays them)."""
    tokens = requests * max(output_mean, 1.0)
    return (tokens / max(1.0, min(users, requests)) + requests) * STEP_CPU_S + tokens * TOKEN_CPU_S


def _keep(concurrency: int | None, max_requests: int = 200) -> int:
    """How many of a cell's first requests the fit replays: a closed loop's steady state is the same after a few
    rounds of its users; an open loop keeps its first max_requests sends."""
    return min(max_requests, max(16, 4 * concurrency)) if concurrency else max_requests


def _fit_cpu_s(per_run: float, async_known: bool, workers: int = 1) -> float:
    """The fit's seconds from one virtual run of all cells: each start's search (side by side on `workers`), then
    the polish; twice over where the fit tries async scheduling on and off."""
    rounds = -(-4 // max(1, workers))
    return per_run * (rounds * START_EVALS + POLISH_EVALS) * (1 if async_known else 2)


def fit_seconds(cells: Sequence[MeasuredCell], async_known: bool = True, workers: int = 1) -> float:
    """The fit's expected seconds on an idle machine (calibrated by benchmarks/twin_fit_time.py)."""
    per_run = 0.0
    for c in cells:
        outs = c.outputs[:_keep(c.concurrency)]
        if not outs:
            continue
        if c.concurrency:
            users = float(c.concurrency)
        else:  # an open loop: the requests in flight (Little's law, from its TPOT)
            tpot_s = (c.figures.get("tpot_ms.p50") or 10.0) / 1e3
            users = (c.rate or 1.0) * statistics.fmean(outs) * tpot_s
        per_run += _run_cpu_s(len(outs), statistics.fmean(outs), users)
    return _fit_cpu_s(per_run, async_known, workers)


def fit_time_estimate(session: Session) -> str:
    """What fitting this session's twin will take, for the line shown while it fits: `22-54 s`, `5-12 min`. From
    the session's cells table alone (no request is read): each cell's requests, mean output and load. The range
    runs from an idle machine (the starts side by side where there are CPUs for them) to twice the time of one
    after another (a busy machine)."""
    per_run = 0.0
    for row in session.cells.to_dicts() if session.cells.height else []:
        n, out = row.get("requests_ok"), row.get("output_tokens_mean")
        if row.get("status") != "done" or not isinstance(n, int) or n < 1 or not isinstance(out, (int, float)):
            continue
        conc, rate = row.get("concurrency"), row.get("rate")
        if isinstance(conc, int) and conc > 0:
            users = float(conc)
            kept = min(n, _keep(conc))
        else:
            tpot = row.get("tpot_ms.p50")  # its column in cells.parquet: the figure's key
            users = float(rate or 1.0) * out * (float(tpot) if isinstance(tpot, (int, float)) else 10.0) / 1e3
            kept = min(n, _keep(None))
        per_run += _run_cpu_s(kept, float(out), users)
    if per_run <= 0:
        return "a while"
    try:
        async_known = session_shape(session).async_known
    except ServescopeError:
        async_known = False
    # the same fit took 23-31 s of CPU (a 2-cell session) and 90-122 s (7 cells) from run to run on the 2-core
    # dev machine: the range starts below the calibrated time and ends at twice it (a busy machine's wall time)
    lo = 0.8 * _fit_cpu_s(per_run, async_known, fit_workers())
    hi = 2 * _fit_cpu_s(per_run, async_known)
    if hi < 300:
        return f"{max(1, round(lo))}-{max(2, round(hi))} s"
    return f"{max(1, round(lo / 60))}-{max(2, round(hi / 60))} min"


def fit_session(session: Session, model_config: Path | None = None, max_num_seqs: int | None = None,
                max_num_batched_tokens: int | None = None, progress: Callable[[str], None] | None = None) -> FitResult:
    shape = session_shape(session, model_config, max_num_seqs, max_num_batched_tokens)
    result = fit(shape, measured_cells(session), progress=progress)
    save_fit(session, result)
    return result
