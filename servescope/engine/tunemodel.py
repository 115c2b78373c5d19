"""`servescope tune`'s model: the capacity twin (servescope.engine.twin) with the server setting as an input, and a
correction learnt from each measured cell.

- The twin's shape comes from the first measured cell's session (a simulator profile, a config.json, the KV budget
  the server reported); each setting is applied to it the way the server would apply the flag (`apply_setting`:
  the scheduler limits --max-num-seqs and --max-num-batched-tokens, the KV cache's --kv-cache-tokens,
  --num-gpu-blocks-override, --gpu-memory-utilization, --kv-cache-dtype, and --max-model-len). A flag the twin
  does not model leaves the prediction as it is, with twice the uncertainty.
- One set of efficiencies is fitted to every measured cell at once, each replayed with its own setting's limits
  (the twin's loss summed over the settings). The fit is budgeted (`FIT_EVALS` virtual runs of the cells from the
  shape's priors, `REFIT_EVALS` from the last fit when the measured cells have doubled): the twin's own fit
  (`fit_session`: four starts of 200 runs and a polish of 120) took 27 s for 4 short cells on the 2-core dev
  machine, and a search refits several times (docs/tune.md has the measurement).
- Each measured cell's residual (`tune.residual`: how far its latencies are from the twin's, in ln units) corrects
  the cells near it: mu is a kernel-weighted mean of the residuals (distance over the flags' positions and the
  load, length `LENGTH`), shrunk towards 0 with weight `PRIOR_W`; sigma combines the run-to-run noise, the twin's
  error scale (the residuals' RMS or half the largest, at least `MIN_MODEL_ERR`) shrinking as measured cells come
  near, the kernel-weighted spread of the near residuals around mu (where they disagree, the twin's error changes
  there), and mu itself (a correction is as uncertain as it is large).
  A goodput residual is the eps at which the predicted cell's goodput is the measured one
  (`tune.value_residual`), else the shift of the margins' quantiles (`tune.residual`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import polars as pl

from servescope.core.errors import ServescopeError
from servescope.core.metrics import per_request
from servescope.core.steady import ramp_from_probe
from servescope.engine.specsearch import SPEC_TOKENS_FLAG
from servescope.engine.tune import (
    CellPred,
    Measured,
    Objective,
    Setting,
    Space,
    margins_of,
    residual,
    value_residual,
)
from servescope.engine.twin import (
    PARAMS,
    FitLoss,
    MeasuredCell,
    _with,
    measured_cells,
    nelder_mead,
    run_virtual,
    steady_part,
)
from servescope.engine.twinpredict import sample_lengths
from servescope.engine.twinshape import NOMINAL_GPU, Knobs, apply_knobs, session_shape
from servescope.sessions.store import load_session
from servescope.sim.profile import CostModel, Profile
from servescope.workloads.spec import Workload

FIT_EVALS = 160  # virtual runs of the measured cells in the first fit
REFIT_EVALS = 60  # in a refit, from the last fit
FIT_REQUESTS = 64  # a cell is replayed on its first requests (at least 4 rounds of its users: twin._keep)
NOISE = 0.04  # ln units: run-to-run spread of a short cell's latencies on the simulator
MIN_MODEL_ERR = 0.08  # the twin's error scale before any residual says otherwise
LENGTH = 0.35  # kernel length over the space's 0..1 coordinates
PRIOR_W = 2.0  # weight of "the twin is right" (mu = 0) against the measured residuals
MODELLED = {"--max-num-seqs", "--max-num-batched-tokens", "--kv-cache-tokens", "--num-gpu-blocks-override",
            "--gpu-memory-utilization", "--kv-cache-dtype", "--max-model-len"}


def apply_setting(p: Profile, setting: Setting, memory_known: bool = True) -> tuple[Profile, list[str]]:
    """The profile the server runs with this setting, and the flags the twin does not model."""
    engine, model = p.engine, p.model
    unknown = []
    knobs = Knobs()
    for flag, value in setting.args:
        try:
            if flag == "--max-num-seqs":
                engine = replace(engine, max_num_seqs=int(float(value)))
            elif flag == "--max-num-batched-tokens":
                engine = replace(engine, max_num_batched_tokens=int(float(value)))
            elif flag == "--kv-cache-tokens":
                engine = replace(engine, kv_cache_tokens=int(float(value)))
            elif flag == "--num-gpu-blocks-override":
                engine = replace(engine, kv_cache_tokens=int(float(value)) * engine.block_size)
            elif flag == "--max-model-len":
                model = replace(model, max_model_len=int(float(value)))
            elif flag == "--gpu-memory-utilization":
                knobs = replace(knobs, gpu_memory_utilization=float(value))
            elif flag == "--kv-cache-dtype":
                knobs = replace(knobs, kv_cache_dtype=value)
            elif flag == SPEC_TOKENS_FLAG and engine.speculative_method:  # engine/specsearch.py
                engine = replace(engine, num_speculative_tokens=int(float(value)))
            else:
                unknown.append(flag)
        except ValueError:
            raise ServescopeError(f"--search {flag}: {value!r} is not a number") from None
    out = replace(p, engine=engine, model=model)
    if knobs.any:
        out = apply_knobs(out, knobs, memory_known)
    return out, unknown


def request_rows(session_path: str, cell: int | None = None) -> tuple[pl.DataFrame, float]:
    """A measured cell's requests (every repeat's, or cell `cell`'s; warmup left out, and the requests a stop
    cancelled: they are not judged, as in summarize) with their per-request figures (core.metrics.per_request), and
    the mean wall time of those cells."""
    s = load_session(session_path)
    frames: list[pl.DataFrame] = []
    walls = []
    for row, summ in zip(s.cells.to_dicts(), s.summaries(), strict=False):
        if summ is None or (cell is not None and int(row["index"]) != cell):
            continue
        walls.append(float(summ.wall_s or 0.0))
        df = s.requests(int(row["index"]))
        if df.is_empty():
            continue
        df = df.filter(~df["warmup"])
        if "in_window" in df.columns:  # the requests its figures are over (engine/measure.py): the steady window's
            df = df.filter(df["in_window"])
        pr = per_request(df)
        frames.append(pr.filter(pr["status"] != "cancelled").select(*FIGURES))  # a cancelled request is not judged
    rows = pl.concat(frames, how="vertical_relaxed") if frames else pl.DataFrame(schema=FIGURE_SCHEMA)
    return rows, (sum(walls) / len(walls) if walls else 0.0)


# what the SLO rule reads of a request (servescope.core.slo): its status, figures and reasoning tokens
FIGURE_SCHEMA: dict[str, type[pl.DataType]] = {
    "status": pl.Utf8, "ttft_ms": pl.Float64, "ttfo_ms": pl.Float64, "tpot_ms": pl.Float64, "e2e_ms": pl.Float64,
    "per_user_tok_s": pl.Float64, "reasoning_tokens": pl.Int64}
FIGURES = tuple(FIGURE_SCHEMA)


@dataclass
class FitInfo:
    cells: int
    evals: int
    seconds: float
    loss: float


class TwinModel:
    """The twin fitted to the measured cells, with the setting as an input (see the module's text)."""

    def __init__(self, space: Space, workload: Workload, slos: Mapping[str, float], requests: Callable[[int], int],
                 seed: int = 0, progress: Callable[[str], None] | None = None, objective: Objective = "goodput",
                 ramp_s: float | None = None, steady: bool = True) -> None:
        if workload.kind != "single" or workload.dataset:
            raise ServescopeError(f"workload {workload.name!r}: tune's model predicts single-request workloads with "
                                  "token-length distributions (no dataset, conversation, agent or trace workloads)")
        self.space = space
        self.objective = objective
        self.workload = workload
        self.slos = dict(slos)
        self.requests = requests
        self.seed = seed
        self.progress = progress
        self.base: Profile | None = None
        self.memory_known = True
        self.x: list[float] | None = None
        self.fitted_n = 0
        self.fits: list[FitInfo] = []
        self.preds: dict[tuple[int, int], CellPred] = {}
        self.residuals: dict[tuple[int, int], float] = {}
        self.unknown: dict[int, list[str]] = {}
        self.ramp_s = ramp_s  # the search's own --ramp, for every cell
        self.steady = steady  # the cells' figures are over their steady windows (--window steady): predicted so too
        self.ramps: dict[int, float] = {}  # setting -> the ramp its measured cells ran with (from its probe)
        self.ramp_read: set[str] = set()

    # -- fitting
    def update(self, observed: dict[tuple[int, int], Measured]) -> None:
        for (s, ld), m in observed.items():
            if s not in self.ramps and self.space.loads[ld] > 1 and m.session and m.session not in self.ramp_read:
                self.ramp_read.add(m.session)  # each cell's session read once (a failed probe left it unramped)
                ramp = _cell_ramp(m.session)
                if ramp:  # the setting's cells are predicted with the ramp its cells ran with
                    self.ramps[s] = ramp
                    self.preds = {k: v for k, v in self.preds.items() if k[0] != s}
        if self.base is None or len(observed) >= 2 * max(self.fitted_n, 1):
            self._fit(observed)
        self.residuals = {}
        for cell, m in observed.items():
            pred = self._pred(*cell)
            r = value_residual(pred, m.value, self.objective) if self.objective == "goodput" else None
            if r is None:
                r = residual(pred.margins, m.margins)
            if r is not None:
                self.residuals[cell] = max(-2.0, min(2.0, r))

    def _fit(self, observed: Mapping[tuple[int, int], Measured]) -> None:
        t0 = time.monotonic()
        groups: dict[int, list[MeasuredCell]] = {}
        sessions = {cell: m.session for cell, m in observed.items() if m.session}
        if not sessions:
            raise ServescopeError("tune: no measured cell to fit the model to")
        first = load_session(next(iter(sessions.values())))
        shape = session_shape(first)
        base = shape.profile
        self.memory_known = base.gpu.name != NOMINAL_GPU.name
        for cell, path in sessions.items():
            try:
                cells = measured_cells(load_session(path))
            except ServescopeError:
                continue  # a cell that measured nothing (every request failed) teaches the fit nothing
            groups.setdefault(cell[0], []).extend(cells)
        if not groups:
            raise ServescopeError("tune: no measured cell finished a request; check the server and the SLOs")
        prompts = [p for cs in groups.values() for c in cs for p in c.prompts]
        fit_attention = bool(prompts) and max(prompts) >= 3 * max(min(prompts), 1)
        free = [p for p in PARAMS if p.name != "attention_eff" or fit_attention]
        losses = []
        for s, cells in groups.items():
            prof, _ = apply_setting(base, self.space.settings[s], self.memory_known)
            trimmed = [replace(c, prompts=c.prompts[:self._keep(c)], outputs=c.outputs[:self._keep(c)],
                               send_s=c.send_s[:self._keep(c)]) for c in cells]
            losses.append(FitLoss(prof, cells, trimmed, free, fit_attention))

        def loss(x: list[float]) -> float:
            return sum(f(x) for f in losses)

        if self.x is None or len(self.x) != len(free):
            x0 = [math.log(p.prior) for p in free]
            evals = FIT_EVALS
        else:
            x0, evals = self.x, REFIT_EVALS
        x, val, n = nelder_mead(loss, x0, step=0.7 if evals == FIT_EVALS else 0.2, max_evals=evals)
        self.x = x
        self.base = _with(base, {k: round(v, 6) for k, v in losses[0].values(x).items()})
        self.fitted_n = len(observed)
        self.preds = {}
        info = FitInfo(sum(len(c) for c in groups.values()), n, time.monotonic() - t0, val)
        self.fits.append(info)
        if self.progress is not None:
            self.progress(f"fitted the twin to {info.cells} cells in {info.seconds:.1f} s ({n} virtual runs)")

    @staticmethod
    def _keep(c: MeasuredCell) -> int:
        return min(len(c.prompts), max(FIT_REQUESTS, 4 * (c.concurrency or 16)))

    # -- predicting
    def _pred(self, s: int, ld: int) -> CellPred:
        cell = (s, ld)
        if cell in self.preds:
            return self.preds[cell]
        assert self.base is not None
        prof, unknown = apply_setting(self.base, self.space.settings[s], self.memory_known)
        self.unknown[s] = unknown
        c = self.space.loads[ld]
        n = self.requests(c)
        prompts, outputs = sample_lengths(self.workload, n, self.seed)
        cost = CostModel(prof)
        longest = max(p + o for p, o in zip(prompts, outputs, strict=True))
        if longest > prof.model.max_model_len or cost.blocks_for(longest) > cost.num_blocks:
            pred = CellPred(s, ld, c, [-math.inf] * n, 1.0, notes=("the requests do not fit the server",))
        else:
            ramp = self._ramp(s, cost, prompts[0], outputs[0]) if c > 1 else 0.0
            v = run_virtual(cost, prompts, outputs, c, ramp_s=ramp)
            if self.steady:
                v = steady_part(v, c, ramp)
            rows: list[tuple[str, float, float, float | None, float, float | None, int]] = []
            for i, o in enumerate(v.outputs):  # the virtual requests stream no reasoning: TTFO is their TTFT
                ttft = (v.first[i] - v.sent[i]) * 1e3
                e2e = (v.done[i] - v.sent[i]) * 1e3
                rows.append(("ok", ttft, ttft, (e2e - ttft) / (o - 1) if o > 1 else None, e2e,
                             o / (e2e / 1e3) if e2e > 0 else None, 0))
            margins = margins_of(pl.DataFrame(rows, schema=FIGURE_SCHEMA, orient="row"), self.slos)
            pred = CellPred(s, ld, c, margins, max(v.wall - min(v.sent), 1e-9))
        self.preds[cell] = pred
        return pred

    def _ramp(self, s: int, cost: CostModel, prompt: int, output: int) -> float:
        """A cell's ramp as the measurer sets it: the search's --ramp, else the setting's probe (its measured
        cells'), else the twin's E2E of the probe's one request alone."""
        if self.ramp_s:
            return self.ramp_s
        if s not in self.ramps:
            v = run_virtual(cost, [prompt], [output], 1)
            return ramp_from_probe(v.done[0] - v.sent[0])
        return self.ramps[s]

    def predict(self, setting: int, load: int) -> CellPred:
        p = self._pred(setting, load)
        here = (setting, load)
        rs = list(self.residuals.values())
        err = max(math.sqrt(sum(r * r for r in rs) / len(rs)), 0.5 * max(abs(r) for r in rs)) if rs else 0.0
        scale = max(MIN_MODEL_ERR, err)
        if self.unknown.get(setting):
            scale *= 2.0
        weights = [(math.exp(-0.5 * (self.space.distance(here, cell) / LENGTH) ** 2), r)
                   for cell, r in self.residuals.items()]
        wsum = sum(w for w, _ in weights)
        mu = sum(w * r for w, r in weights) / (wsum + PRIOR_W)
        # the neighbours' disagreement: residuals that differ near the cell say the twin's error changes there
        spread = sum(w * (r - mu) ** 2 for w, r in weights) / wsum if wsum > 0 else 0.0
        sigma = math.sqrt(NOISE ** 2 + scale ** 2 * PRIOR_W / (wsum + PRIOR_W) + spread + mu ** 2)
        notes = p.notes + ((f"the twin does not model {', '.join(self.unknown[setting])}",)
                           if self.unknown.get(setting) else ())
        return replace(p, mu=mu, sigma=sigma, notes=notes)


def _cell_ramp(session_path: str) -> float | None:
    """The ramp (s) a measured cell's users started over, as its session recorded it (its planned ramp, else the
    one --ramp auto gave it: its summary's window)."""
    try:
        s = load_session(session_path)
        rows = s.cells.to_dicts()
        summaries = s.summaries()
    except (ServescopeError, OSError):
        return None
    ramp = rows[0].get("ramp_s") if rows else None
    if not ramp and summaries and summaries[0] is not None and summaries[0].window is not None:
        ramp = summaries[0].window.ramp_s
    return float(ramp) if isinstance(ramp, (int, float)) and ramp > 0 else None


def fit_summary(fits: Sequence[FitInfo]) -> str:
    if not fits:
        return "no fit"
    return "; ".join(f"{f.cells} cells, {f.evals} runs, {f.seconds:.1f} s" for f in fits)

