"""Is a difference real? Bootstrap confidence intervals for the figures compare, gate and report judge.

Pure functions over per-request frames (a cell's `requests/cell-NNNN.parquet`, or `records_frame()`), with
polars only. The method (also in docs/compare.md, "Is it a real difference?"):

- A figure's interval comes from a seeded percentile bootstrap (`RESAMPLES` = 1000 replicates, 95%): each
  replicate resamples a cell's measured (non-warmup) requests with replacement and recomputes the figure.
  With several repeats of a cell (cells sharing a workload and load, e.g. a `repeat` column), a replicate
  first resamples the repeats, then the requests within each chosen repeat, and takes their median (a
  hierarchical bootstrap; the point's figure is the median of its repeats); with one repeat the interval is request-level only and says so
  (`interval_label`). K repeats only estimate the spread between runs, so their replicates are spread out
  around the figure (as ratios to it, on the log scale) by t(0.975, K-1)/1.96 x sqrt(K/(K-1))
  (`small_k_widening`: 2.69 at K=3, 1.22 at K=10).
- Distribution figures (`ttft_ms.p99`, `tpot_ms.p50`, `per_user_tok_s.mean`, ...) are recomputed exactly as
  `core.metrics.summarize` computes them: over the successful requests, percentiles by linear
  interpolation. Pooled ITL (`itl_ms`, `itl_token_ms`) resamples whole requests with all their gaps (a
  cluster bootstrap); a cell with very many gaps keeps every s-th of each request's sorted gaps (one stride
  for all its requests, so each request keeps its weight) so a replicate stays cheap.
- Rates (`output_tok_s`, `total_tok_s`, `request_s`, `goodput_req_s`) are a cell's count over its wall
  time, and a resample has no wall time of its own. By Little's law a cell's rate is its mean number of
  requests in flight times what each request delivers per second of its life (sum of output tokens / sum of
  request E2E), so a replicate scales the observed rate by the resample's tokens per request-second over the
  whole cell's: a resample with slower or shorter requests, or more failed ones (0 tokens), gets a lower
  rate. In a closed-loop cell (`users` = its concurrency) the in-flight level moves too: each resample is
  replayed through that many users, each request going to the first user free as the runner sends them,
  and its in-flight level (sum of lives / makespan, below the concurrency by the cell's ragged end) scales
  the replicate, relative to the same replay of the cell's own requests in send order. An open-loop cell
  (request rate) keeps its in-flight level fixed.
- The relative delta of a candidate against a baseline is (candidate - baseline) / |baseline| in percent;
  its interval is the 2.5th..97.5th percentile of the replicates' deltas, the two sessions resampled
  independently (seeds derived from `seed`, the session's position and the cell, so output repeats).
- Verdict: `within noise` when the interval includes 0 or |delta| is below the minimum effect
  (`MIN_EFFECT_PCT`, 2%), else `better` or `worse` by the figure's direction (core.results.METRICS).
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import polars as pl

from servescope.core.metrics import per_request
from servescope.core.results import METRICS
from servescope.core.slo import slo_met

__all__ = [
    "CONFIDENCE", "MIN_EFFECT_PCT", "RESAMPLES", "Boot", "Drift", "Judgement", "Verdict", "WarmUp", "bootstrap",
    "drift", "figure_problem", "interval_label", "judge", "measured", "metric_direction", "seed_for",
    "small_k_widening",
    "verdict_of", "warm_up",
]

RESAMPLES = 1000
CONFIDENCE = 0.95
MIN_EFFECT_PCT = 2.0
ROW_BUDGET = 500_000  # rows of pooled gaps one bootstrap may expand (ITL)
SIM_BUDGET = 400_000  # requests a bootstrap may replay through a closed loop (rates); beyond, Little's law alone

Verdict = Literal["better", "worse", "within noise"]

REQUEST_DISTS = ("ttft_ms", "ttfo_ms", "tpot_ms", "e2e_ms", "per_user_tok_s", "prefill_tok_s", "client_queue_ms")
POOLED_DISTS = ("itl_ms", "itl_token_ms")
RATES = ("output_tok_s", "total_tok_s", "request_s", "goodput_req_s")
MEANS = ("input_tokens_mean", "output_tokens_mean")
STATS = ("mean", "p50", "p90", "p95", "p99")


def figure_problem(key: str) -> str | None:
    """None when `key` ("ttft_ms.p99", "output_tok_s") is a figure the bootstrap can recompute, else why not."""
    head, _, stat = key.partition(".")
    if head in RATES or head in MEANS:
        return None if not stat else f"{head} has no statistic (write it without .{stat})"
    if head in REQUEST_DISTS or head in POOLED_DISTS:
        if stat in STATS:
            return None
        return f"{head} needs one of .{', .'.join(STATS)}" + (f" (not .{stat})" if stat else "")
    return f"unknown figure {head!r}"


def seed_for(seed: int, *parts: object) -> int:
    """A stable seed for one session's cell (not Python's salted hash): output repeats run to run."""
    return zlib.crc32(":".join(map(str, (seed, *parts))).encode()) & 0x7FFFFFFF


def interval_label(repeats: int) -> str:
    return ("request-level interval (1 repeat)" if repeats <= 1 else
            f"hierarchical interval ({repeats} repeats, requests within each)")


def measured(frame: pl.DataFrame, slos: Mapping[str, float] | None = None) -> pl.DataFrame | None:
    """A cell's measured requests with their per-request metrics, a `good` column (within every SLO) and the
    columns a bootstrap reads; None when the frame holds no per-request stamps (an aggregate-only import)."""
    if frame.height == 0 or "sent_ns" not in frame.columns or "status" not in frame.columns:
        return None
    df = frame.filter(~pl.col("warmup")) if "warmup" in frame.columns else frame
    if "in_window" in df.columns:  # the requests the cell's figures are over: its steady window's (engine/measure.py)
        df = df.filter(pl.col("in_window"))
    if df.height == 0:
        return None
    for c in ("prompt_tokens", "output_tokens", "scheduled_ns", "first_content_ns"):
        if c not in df.columns:
            df = df.with_columns(pl.lit(None, dtype=pl.Int64).alias(c))
    pr = per_request(df)
    ok = pl.col("status") == "ok"
    return pr.with_columns(
        ok=ok,
        good=slo_met(slos or {}),
        out_tok=pl.when(ok).then(pl.col("output_tokens").fill_null(0)).otherwise(0).cast(pl.Float64),
        in_tok=pl.when(ok & (pl.col("prompt_tokens") >= 0)).then(pl.col("prompt_tokens")).otherwise(0)
        .cast(pl.Float64),
        life_s=(pl.col("e2e_ms").fill_null(0.0) / 1000.0),
        pos=pl.int_range(0, pl.len()),
    )


def _gaps(pr: pl.DataFrame, column: str, stride: int) -> pl.DataFrame:
    """pos -> the request's sorted gaps (every `stride`-th), for the successful requests with chunks."""
    if "chunk_ns" not in pr.columns:
        return pl.DataFrame(schema={"pos": pl.Int64, column: pl.List(pl.Float64)})
    ex = (pr.filter(pl.col("ok")).select("pos", "chunk_ns", *(["chunk_tokens"] if "chunk_tokens" in pr.columns
                                                            else []))
          .explode([c for c in ("chunk_ns", "chunk_tokens") if c in pr.columns]).drop_nulls("chunk_ns"))
    ex = ex.with_columns(gap=(pl.col("chunk_ns") - pl.col("chunk_ns").shift(1).over("pos")) * 1e-6).drop_nulls("gap")
    val = pl.col("gap") if column == "itl_ms" else pl.col("gap") / pl.col("chunk_tokens").clip(lower_bound=1)
    out = ex.select("pos", val.cast(pl.Float64).alias(column)).group_by("pos").agg(pl.col(column).sort())
    if stride > 1:
        out = out.with_columns(pl.col(column).list.gather_every(stride, offset=stride // 2))
    return out


def _expr(key: str) -> pl.Expr:
    """The figure over one (resampled) set of requests; rates as tokens (or requests) per request-second."""
    head, _, stat = key.partition(".")
    ok = pl.col("ok")
    life = pl.col("life_s").sum()
    if head == "output_tok_s":
        return pl.col("out_tok").sum() / life
    if head == "total_tok_s":
        return (pl.col("out_tok").sum() + pl.col("in_tok").sum()) / life
    if head == "request_s":
        return ok.cast(pl.Float64).sum() / life
    if head == "goodput_req_s":
        return pl.col("good").cast(pl.Float64).sum() / life
    if head == "input_tokens_mean":
        return pl.col("prompt_tokens").filter(ok & (pl.col("prompt_tokens") >= 0)).cast(pl.Float64).mean()
    if head == "output_tokens_mean":
        return pl.col("output_tokens").filter(ok).cast(pl.Float64).mean()
    col = pl.col(head) if head in POOLED_DISTS or head == "client_queue_ms" else pl.col(head).filter(ok)
    col = col.cast(pl.Float64)
    if stat == "mean":
        return col.mean()
    return col.quantile(int(stat[1:]) / 100, interpolation="linear")


@dataclass
class Boot:
    """One session's cell, bootstrapped: each figure's observed value and its replicates as ratios to it
    (a replicate / observed), so a caller may put the summary's own value in `observed`."""

    observed: dict[str, float | None]
    ratios: dict[str, list[float]]
    repeats: int = 1
    requests: int = 0


def _figures_frame(rows: pl.DataFrame, keys: Sequence[str], by: list[str]) -> pl.DataFrame:
    plain = [k for k in keys if k.partition(".")[0] not in POOLED_DISTS]
    return rows.group_by(by).agg([_expr(k).alias(k) for k in plain]) if plain else rows.select(by).unique()


def _pooled(rows: pl.DataFrame, gaps: dict[str, pl.DataFrame], keys: Sequence[str], by: list[str]) -> pl.DataFrame:
    out = None
    for k in keys:
        head = k.partition(".")[0]
        if head not in POOLED_DISTS:
            continue
        g = rows.select(*by, "pos").join(gaps[head], on="pos", how="left").explode(head)
        part = g.group_by(by).agg(_expr(k).alias(k))
        out = part if out is None else out.join(part, on=by, how="full", coalesce=True)
    return out if out is not None else rows.select(by).unique()


def bootstrap(frames: Sequence[pl.DataFrame], keys: Sequence[str], resamples: int = RESAMPLES,
              seed: int = 0, users: int | None = None) -> Boot | None:
    """Replicates of `keys` for one cell measured in `frames` (one `measured()` frame per repeat); `users`:
    the cell's concurrency when it ran closed-loop (its rates then replay each resample through that many
    users, see `_closed_loop`).

    None when no repeat has per-request data. Figures the frames cannot give (no successful request, a
    zero observed value) get no replicates."""
    reps = [f for f in frames if f is not None and f.height]
    if not reps:
        return None
    keys = [k for k in dict.fromkeys(keys) if figure_problem(k) is None]
    pooled_heads = {k.partition(".")[0] for k in keys} & set(POOLED_DISTS)
    rate_keys = [k for k in keys if k in RATES]
    gaps: list[dict[str, pl.DataFrame]] = []
    full: list[dict[str, float | None]] = []  # pooled figures over every gap (the replicates may thin them)
    for f in reps:
        g: dict[str, pl.DataFrame] = {}
        exact: dict[str, float | None] = {}
        for head in pooled_heads:
            total = int(f.filter(pl.col("ok"))["chunk_ns"].list.len().sum() or 0) if "chunk_ns" in f.columns else 0
            stride = max(1, math.ceil(total * resamples / ROW_BUDGET))
            g[head] = _gaps(f, head, stride)
            every = g[head] if stride == 1 else _gaps(f, head, 1)
            pooled = every.explode(head)
            for key in keys:
                if key.partition(".")[0] == head:
                    exact[key] = _finite(pooled.select(_expr(key)).item()) if pooled.height else None
        gaps.append(g)
        full.append(exact)
    # observed, per repeat (the whole frame)
    obs_k: list[dict[str, float | None]] = []
    for f, g in zip(reps, gaps, strict=True):
        one = f.with_columns(b=pl.lit(0), j=pl.lit(0))
        row = _figures_frame(one, keys, ["b", "j"]).join(_pooled(one, g, keys, ["b", "j"]), on=["b", "j"])
        d = row.to_dicts()[0]
        obs_k.append({key: _finite(d.get(key)) for key in keys})
    K = len(reps)
    rng = random.Random(seed)
    picks = [rng.randrange(K) for _ in range(resamples * K)] if K > 1 else [0] * resamples
    slots: list[list[tuple[int, int]]] = [[] for _ in range(K)]
    for s, pick in enumerate(picks):
        slots[pick].append(divmod(s, K) if K > 1 else (s, 0))
    plain_parts, pooled_parts = [], []
    for r, (f, g) in enumerate(zip(reps, gaps, strict=True)):
        if not slots[r]:
            continue
        n = f.height
        c = len(slots[r])
        idx = pl.Series("i", range(n), dtype=pl.Int64).sample(c * n, with_replacement=True, seed=seed_for(seed, r))
        which = pl.int_range(0, c * n, eager=True) // n
        bs = pl.Series([b for b, _ in slots[r]], dtype=pl.Int64).gather(which)
        js = pl.Series([j for _, j in slots[r]], dtype=pl.Int64).gather(which)
        rows = f.select("pos", "ok", "good", "out_tok", "in_tok", "life_s", "prompt_tokens", "output_tokens",
                        *[h for h in (*REQUEST_DISTS,) if h in f.columns]).gather(idx)
        rows = rows.with_columns(b=bs, j=js)
        part = _figures_frame(rows, keys, ["b", "j"]).with_columns(k=pl.lit(r))
        if users and users > 1 and rate_keys and c * n <= SIM_BUDGET:  # one user: always one in flight
            lives = rows["life_s"].to_list()
            sim = [_closed_loop(lives[i * n:(i + 1) * n], users) for i in range(c)]
            base = _closed_loop(f.sort("sent_ns")["life_s"].to_list(), users)
            part = part.join(pl.DataFrame({"b": [b for b, _ in slots[r]], "j": [j for _, j in slots[r]],
                                           "sim": [x / base if x is not None and base else None for x in sim]},
                                          schema={"b": pl.Int64, "j": pl.Int64, "sim": pl.Float64}),
                             on=["b", "j"], how="left")
        plain_parts.append(part)
        if pooled_heads:
            pooled_parts.append(_pooled(rows, g, keys, ["b", "j"]))
    table = pl.concat(plain_parts, how="diagonal_relaxed")
    if pooled_parts:
        table = table.join(pl.concat(pooled_parts, how="diagonal_relaxed"), on=["b", "j"], how="left")
    inflight = [_inflight(f) for f in reps]  # Little's law: a repeat's rate = in-flight level x per request-second
    observed: dict[str, float | None] = {}
    ratios: dict[str, list[float]] = {}
    for key in keys:
        head = key.partition(".")[0]
        scale = inflight if head in RATES else [1.0] * K
        vals: list[float | None] = []
        for o, sc in zip(obs_k, scale, strict=True):
            x = o[key]
            vals.append(None if x is None or sc is None else x * sc)
        if any(v is None for v in vals):
            observed[key] = None
            continue
        t = table.select("b", pl.col("k").cast(pl.Int64), pl.col(key).cast(pl.Float64))
        if head in RATES:
            t = t.with_columns(pl.col(key) * pl.col("k").replace_strict(dict(enumerate(scale)), default=None,
                                                                         return_dtype=pl.Float64))
            if "sim" in table.columns:  # the resample's own in-flight level, relative to the cell's
                t = t.with_columns(pl.col(key) * table["sim"].fill_null(1.0))
        by_b = t.group_by("b").agg(pl.col(key).median()).sort("b")[key].to_list()  # a point: the median repeat
        mean_obs = statistics.median(float(v) for v in vals if v is not None)
        whole = [fx.get(key) for fx in full]
        observed[key] = (statistics.median(float(x) for x in whole if x is not None) if head in POOLED_DISTS
                         and all(x is not None for x in whole) else mean_obs)
        if mean_obs == 0:
            continue
        good = [v / mean_obs for v in by_b if v is not None and math.isfinite(v)]
        if K > 1:  # the spread between repeats is known from K values only: widen as a t interval would
            w = small_k_widening(K)  # on the log scale where it can be, so a positive figure stays positive
            good = ([math.exp(math.log(g) * w) for g in good] if all(g > 0 for g in good) else
                    [1.0 + (g - 1.0) * w for g in good])
        if len(good) >= resamples // 2:
            ratios[key] = good
    return Boot(observed, ratios, K, sum(f.height for f in reps))


# Student's t, 97.5th percentile, by degrees of freedom (1..30); beyond, the normal's 1.96
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def small_k_widening(k: int) -> float:
    """How much a K-repeat bootstrap's replicates are spread out around the observed figure: a bootstrap over
    K repeats sees (K-1)/K of their variance and treats it as known, where K values only estimate it (K-1
    degrees of freedom); t(0.975, K-1) / 1.96 x sqrt(K / (K-1)) makes up for both (2.69 at K=3, 1.58 at K=5,
    1.22 at K=10)."""
    if k <= 1:
        return 1.0
    t = _T975[k - 2] if k - 2 < len(_T975) else 1.96
    return t / 1.96 * math.sqrt(k / (k - 1))


def _closed_loop(lives: Sequence[float], users: int) -> float | None:
    """Mean requests in flight when `lives` (seconds, in order) run through `users` closed-loop users, each
    request going to the first user free (as the runner sends them): their sum over the makespan. It is below
    `users` by the cell's ragged end (users idle while the last requests finish)."""
    h = [0.0] * max(1, min(users, len(lives)))
    for x in lives:
        heapq.heapreplace(h, h[0] + x)
    mk = max(h)
    return sum(lives) / mk if mk > 0 else None


def _inflight(f: pl.DataFrame) -> float | None:
    """Mean requests in flight over the cell's wall time (first scheduled send to last end): the sum of the
    requests' lives over the wall time."""
    start_col = pl.when(pl.col("scheduled_ns") > 0).then(pl.col("scheduled_ns")).otherwise(pl.col("sent_ns"))
    row = f.select(start=start_col.filter(pl.col("sent_ns") > 0).min(), end=pl.col("end_ns").max(),
                   life=pl.col("life_s").sum()).row(0)
    start, end, life = row
    if start is None or end is None or end <= start:
        return None
    return float(life) / ((float(end) - float(start)) / 1e9)


def _finite(v: object) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def _percentile(sorted_vals: Sequence[float], q: float) -> float:
    pos = q * (len(sorted_vals) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def verdict_of(delta: float | None, ci: tuple[float, float] | None, better: str | None,
               min_effect: float = MIN_EFFECT_PCT) -> Verdict | None:
    """`within noise` when the interval includes 0 or |delta| < min_effect (percent), else better/worse by
    the figure's direction; None for a figure that is not judged or without an interval."""
    if delta is None or ci is None or better not in ("higher", "lower"):
        return None
    if ci[0] <= 0 <= ci[1] or abs(delta) < min_effect:
        return "within noise"
    up = delta > 0
    return "better" if up == (better == "higher") else "worse"


@dataclass(frozen=True)
class Judgement:
    """A candidate's figure against a baseline's: the signed delta, its interval (both in percent) and the
    verdict (None where the figure is not judged, e.g. token counts, or has no interval)."""

    delta_pct: float | None
    ci: tuple[float, float] | None
    verdict: Verdict | None

    def significant(self, direction: str) -> bool:
        """The interval lies wholly on the `direction` ("up"/"down") side of 0."""
        if self.ci is None:
            return False
        return self.ci[0] > 0 if direction == "up" else self.ci[1] < 0


def judge(base: Boot | None, cand: Boot | None, key: str, better: str | None,
          min_effect: float = MIN_EFFECT_PCT, confidence: float = CONFIDENCE,
          observed: tuple[float | None, float | None] | None = None) -> Judgement:
    """The candidate's delta against the baseline for `key`, its percentile interval and verdict.
    `observed` (base, candidate) overrides the bootstraps' own observed values (e.g. the summaries')."""
    b_obs, c_obs = observed if observed is not None else (
        base.observed.get(key) if base else None, cand.observed.get(key) if cand else None)
    if b_obs is None or c_obs is None or b_obs == 0:
        return Judgement(None, None, None)
    delta = (c_obs - b_obs) / abs(b_obs) * 100.0
    rb = base.ratios.get(key) if base else None
    rc = cand.ratios.get(key) if cand else None
    if not rb or not rc:
        return Judgement(delta, None, None)
    n = min(len(rb), len(rc))
    ds = sorted((c_obs * rc[i] - b_obs * rb[i]) / abs(b_obs * rb[i]) * 100.0 for i in range(n) if rb[i] != 0)
    if len(ds) < n // 2 or not ds:
        return Judgement(delta, None, None)
    a = (1 - confidence) / 2
    ci = (_percentile(ds, a), _percentile(ds, 1 - a))
    return Judgement(delta, ci, verdict_of(delta, ci, better, min_effect))


def metric_direction(key: str) -> str | None:
    m = METRICS.get(key.partition(".")[0])
    return m.better if m is not None else None


# ---- stability within a cell -------------------------------------------------------------------------
DRIFT_MIN_PCT = 10.0  # a drift smaller than this is not reported
DRIFT_MIN_REQUESTS = 30  # successful requests a cell needs for thirds worth comparing
WARMUP_SHARE = 0.05  # the first 5% of a cell's requests ...
WARMUP_RATIO = 1.5  # ... whose TTFT p50 is this many times the rest's: a warm-up effect
WARMUP_MIN_REQUESTS = 20
DRIFT_FIGURES = ("ttft_ms.p50", "per_user_tok_s.p50")


@dataclass(frozen=True)
class Drift:
    """A figure that changed from the first third of a cell's requests (by send time) to the last, beyond
    noise (its bootstrap interval excludes 0) and by more than DRIFT_MIN_PCT."""

    figure: str
    first: float
    last: float
    judgement: Judgement
    requests: int  # in each third


def drift(pr: pl.DataFrame, resamples: int = RESAMPLES, seed: int = 0) -> list[Drift]:
    """The drifts of a `measured()` cell: TTFT p50 and per-request tok/s p50, first third vs last third of
    its successful requests by send time; [] for a cell with fewer than DRIFT_MIN_REQUESTS."""
    ok = pr.filter(pl.col("ok") & (pl.col("sent_ns") > 0)).sort("sent_ns")
    n = ok.height
    if n < DRIFT_MIN_REQUESTS:
        return []
    third = n // 3
    first, last = ok.head(third), ok.tail(third)
    bf = bootstrap([first], DRIFT_FIGURES, resamples, seed_for(seed, "first"))
    bl = bootstrap([last], DRIFT_FIGURES, resamples, seed_for(seed, "last"))
    out = []
    for key in DRIFT_FIGURES:
        j = judge(bf, bl, key, metric_direction(key), min_effect=DRIFT_MIN_PCT)
        if j.verdict in ("better", "worse") and bf is not None and bl is not None:
            f, la = bf.observed.get(key), bl.observed.get(key)
            if f is not None and la is not None:
                out.append(Drift(key, f, la, j, third))
    return out


@dataclass(frozen=True)
class WarmUp:
    """The first requests of a cell much slower to their first token than the rest."""

    requests: int
    first_ttft_ms: float
    rest_ttft_ms: float

    @property
    def ratio(self) -> float:
        return self.first_ttft_ms / self.rest_ttft_ms


def warm_up(pr: pl.DataFrame) -> WarmUp | None:
    """A warm-up effect in a `measured()` cell: the first WARMUP_SHARE (5%, at least one) of its successful
    requests by send time have a TTFT p50 over WARMUP_RATIO (1.5x) the rest's; None otherwise."""
    ok = pr.filter(pl.col("ok") & pl.col("ttft_ms").is_not_null() & (pl.col("sent_ns") > 0)).sort("sent_ns")
    n = ok.height
    if n < WARMUP_MIN_REQUESTS:
        return None
    k = max(1, math.ceil(WARMUP_SHARE * n))
    a = _finite(ok.head(k)["ttft_ms"].quantile(0.5, interpolation="linear"))
    b = _finite(ok.tail(n - k)["ttft_ms"].quantile(0.5, interpolation="linear"))
    if a is None or b is None or b <= 0 or a <= WARMUP_RATIO * b:
        return None
    return WarmUp(k, a, b)
