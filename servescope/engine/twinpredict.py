"""The capacity twin's predictions: a fitted twin (`servescope.engine.twin`) runs the asked cells on the
simulator's virtual clock, and the same `summarize` as a real run turns its requests into the same figures; each
figure gets a band: the twin's error for that figure (the fit's residual, or the fitted cell's own error at a
measured load when larger), widened by how far the question lies outside the measured range (in doublings) and by
a changed server setting, and combined with the sampling spread of the prediction and of a run (the same cell run
on the virtual clock with other draws of its requests); the band is BAND_Z times that combination.

At a load the session measured (same workload, as-measured server), the prediction runs as many requests as the
measured cell did: a closed loop of 64 users over 32 requests is another cell than one over 256."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from servescope.core.errors import ServescopeError
from servescope.core.jsontypes import JsonObject
from servescope.core.load import Load as LoadShape
from servescope.core.results import CellResult
from servescope.core.steady import ramp_from_probe
from servescope.engine.twin import (
    FIGURES,
    MIN_BAND,
    Twin,
    VirtualCell,
    quick_figures,
    run_virtual,
    steady_part,
    steady_regime,
    virtual_summary,
)
from servescope.engine.twinshape import AS_MEASURED, Knobs, apply_knobs
from servescope.sessions.store import Session
from servescope.sim.profile import CostModel
from servescope.workloads.spec import Workload, from_saved


@dataclass(frozen=True)
class Load:
    concurrency: int | None = None
    rate: float | None = None

    @property
    def label(self) -> str:
        return f"c={self.concurrency}" if self.concurrency else f"rate={self.rate:g}/s"


def sample_lengths(w: Workload, n: int, seed: int = 0) -> tuple[list[int], list[int]]:
    if w.kind != "single" or w.dataset:
        raise ServescopeError(f"workload {w.name!r}: the twin predicts single-request workloads with token-length "
                              "distributions (no dataset, conversation, agent or trace workloads)")
    rng = random.Random(f"{seed}:{w.name}")
    prompts = [w.prefix_tokens + w.input_tokens.sample(rng) for _ in range(n)]
    outputs = [w.output_tokens.sample(rng) for _ in range(n)]
    return prompts, outputs


def session_workloads(session: Session) -> list[Workload]:
    """The session's single-request workloads (the ones the twin predicts), as it recorded them."""
    out = []
    for d in session.info.workloads:
        try:
            w = from_saved(dict(d))
        except ServescopeError:
            continue
        if w.kind == "single" and not w.dataset:
            out.append(w)
    return out


def poisson_sends(rate: float, n: int, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def requests_for(load: Load, requests: int | None) -> int:
    if requests:
        return requests
    c = load.concurrency or max(1, int(round(load.rate or 1)))
    return max(64, 4 * c)


@dataclass
class Prediction:
    workload: str
    load: Load
    summary: CellResult
    band: dict[str, list[float]]
    extrapolated: bool
    why: list[str]
    requests: int = 0  # the requests the prediction ran (a measured load: as many as the measured cell)


# a band is BAND_Z x the combined spread (the twin's error and the sampling spreads of the prediction and of a
# run), in ln units: about 95% of runs of the cell land inside it where the errors are roughly normal
BAND_Z = 2.0
# what a band is, in words for the CLI and the app
BAND_NOTE = ("2x the twin's error for each figure (the fit's residual, or the measured cell's own where larger), "
             "widened by each doubling outside the measured range, with the sampling spread of the prediction and "
             "of a run")
SPREAD_RUNS = 8  # extra virtual runs with other requests (other seeds) that measure the prediction's spread


def fitted_cell(twin: Twin, workload: str, load: Load) -> JsonObject | None:
    """The fit's row for the measured cell of `workload` at `load` (twins fitted before the rows named their
    workload and load have none)."""
    rows = twin.fit_info.get("cells")
    for row in rows if isinstance(rows, list) else []:
        if not isinstance(row, dict) or row.get("workload") != workload:
            continue
        if load.concurrency and row.get("concurrency") == load.concurrency:
            return row
        if not load.concurrency and load.rate and row.get("rate") == load.rate:
            return row
    return None


def _cell_error(row: Mapping[str, object] | None, key: str) -> float:
    """|ln(twin / measured)| of the fitted cell's figure (0 when unknown)."""
    pair = row.get(key) if row is not None else None
    if isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, (int, float)) and x > 0 for x in pair):
        return abs(math.log(float(pair[1]) / float(pair[0])))
    return 0.0


def _ln_spread(values: Sequence[float]) -> float:
    logs = [math.log(v) for v in values if v > 0 and math.isfinite(v)]
    if len(logs) < 2:
        return 0.0
    m = sum(logs) / len(logs)
    return math.sqrt(sum((x - m) ** 2 for x in logs) / (len(logs) - 1))


RANGE_SLACK = 1.1  # a sample of the same distribution reaches a little past the measured sample's extremes


def _outside(v: float, rng: Sequence[float] | None, slack: float = 1.0001) -> float:
    """How far v lies outside [lo / slack, hi x slack], in doublings past the measured range (0 inside)."""
    if not rng or v <= 0:
        return 0.0
    lo, hi = rng[0], rng[1]
    if v > hi * slack:
        return math.log2(v / hi)
    if v < lo / slack:
        return math.log2(lo / v)
    return 0.0


def predict(twin: Twin, workload: Workload, loads: Sequence[Load], knobs: Knobs = AS_MEASURED, requests: int | None = None,
            slos: Mapping[str, float] | None = None, seed: int = 0, bands: bool = True) -> list[Prediction]:
    """The twin's cells at `loads`, each with its band (`bands=False`: without the spread's extra runs, for
    callers that read the figures only)."""
    prof = apply_knobs(twin.profile, knobs, twin.memory_known)
    cost = CostModel(prof)
    out = []
    for load in loads:
        row = None if knobs.any else fitted_cell(twin, workload.name, load)
        measured_n = row.get("requests") if row is not None else None
        n = requests or (measured_n if isinstance(measured_n, int) and measured_n > 0 else requests_for(load, None))
        prompts, outputs = sample_lengths(workload, n, seed)
        longest = max(p + o for p, o in zip(prompts, outputs, strict=True))
        if longest > prof.model.max_model_len:
            raise ServescopeError(f"workload {workload.name!r}: requests of up to {longest:,} tokens do not fit the "
                                  f"server's max_model_len {prof.model.max_model_len:,}")
        if cost.blocks_for(longest) > cost.num_blocks:
            raise ServescopeError(f"workload {workload.name!r}: a request of {longest:,} tokens is larger than the "
                                  f"whole KV cache ({cost.kv_cache_tokens:,} tokens)")
        sends = None if load.concurrency else poisson_sends(float(load.rate or 1.0), n, seed)
        steady = steady_regime(twin)
        ramp = _ramp(cost, prompts, outputs, load) if steady else 0.0
        v = run_virtual(cost, prompts, outputs, load.concurrency, sends, tokens=True, ramp_s=ramp)
        summary = virtual_summary(v, slos, LoadShape(concurrency=load.concurrency, rate=load.rate,
                                                     ramp_s=ramp or None) if steady else None)
        why = []
        dist = 0.0
        for key, vals in (("prompt_tokens", prompts), ("output_tokens", outputs)):
            rng = twin.data_range.get(key)
            d = max(_outside(min(vals), rng, RANGE_SLACK), _outside(max(vals), rng, RANGE_SLACK))
            if d > 0:
                why.append(f"{key.replace('_', ' ')} {min(vals)}-{max(vals)} outside the measured "
                           f"{int(twin.data_range[key][0])}-{int(twin.data_range[key][1])}")
            dist += d
        if load.concurrency:
            rng = twin.data_range.get("concurrency")
            d = _outside(load.concurrency, rng) if rng else 1.0
            if d > 0:
                why.append(f"c={load.concurrency} outside the measured c={int(rng[0])}..{int(rng[1])}" if rng
                           else "the session measured no closed-loop cell")
        else:
            rng = twin.data_range.get("rate")
            d = _outside(float(load.rate or 0), rng) if rng else 1.0
            if d > 0:
                why.append(f"rate {load.rate:g}/s outside the measured {rng[0]:g}..{rng[1]:g}/s" if rng
                           else "the session measured no open-loop cell")
        dist += d
        if knobs.any:
            why.append(f"server settings changed ({knobs.label()})")
            dist += 1.0
        spread = _spreads(cost, workload, load, n, seed, summary, steady) if bands else {}
        band = {}
        for key in FIGURES:
            name = key.partition(".")[0]
            val = summary.value(key)
            if val is None:
                continue
            model = max(twin.residuals.get(key, 0.1), _cell_error(row, key), MIN_BAND) * (1.0 + dist)
            # the prediction and a run of the cell each draw their own requests: each has the spread once
            rel = BAND_Z * math.sqrt(model * model + 2.0 * spread.get(key, 0.0) ** 2)
            band[name] = [val * math.exp(-rel), val * math.exp(rel)]
        out.append(Prediction(workload.name, load, summary, band, bool(why), why, n))
    return out


def _ramp(cost: CostModel, prompts: list[int], outputs: list[int], load: Load) -> float:
    """A predicted cell's ramp as `run` starts it (--ramp auto): a closed loop of several users over the E2E of one
    request alone; none for one user or an open loop."""
    if not load.concurrency or load.concurrency <= 1:
        return 0.0
    alone = run_virtual(cost, prompts[:1], outputs[:1], 1)
    return ramp_from_probe(alone.done[0] - alone.sent[0])


def _regime(cost: CostModel, prompts: list[int], outputs: list[int], load: Load, sends: list[float] | None,
            steady: bool) -> VirtualCell:
    """A predicted cell as `run` measures it: in the steady regime (`steady`), a closed loop's users start one by one
    over the E2E of one request alone (--ramp auto) and the figures are over its steady window; else all at once,
    over the whole cell."""
    if not steady:
        return run_virtual(cost, prompts, outputs, load.concurrency, sends)
    ramp = _ramp(cost, prompts, outputs, load)
    return steady_part(run_virtual(cost, prompts, outputs, load.concurrency, sends, ramp_s=ramp), load.concurrency,
                       ramp)


def _spreads(cost: CostModel, workload: Workload, load: Load, n: int, seed: int, first: CellResult,
             steady: bool = False) -> dict[str, float]:
    """The prediction's own sampling spread per figure: the standard deviation of ln(figure) over the predicted
    cell and SPREAD_RUNS more runs of it with other draws of its requests (lengths, and an open loop's sends)."""
    runs: dict[str, list[float]] = {}
    for k in FIGURES:
        v = first.value(k)
        runs[k] = [float(v)] if isinstance(v, (int, float)) else []
    for i in range(1, SPREAD_RUNS + 1):
        other = seed + 7919 * i
        prompts, outputs = sample_lengths(workload, n, other)
        sends = None if load.concurrency else poisson_sends(float(load.rate or 1.0), n, other)
        figs = quick_figures(_regime(cost, prompts, outputs, load, sends, steady), cost.profile.efficiency.frontend_ms)
        for k in FIGURES:
            if k in figs:
                runs[k].append(figs[k])
    return {k: _ln_spread(v) for k, v in runs.items()}
