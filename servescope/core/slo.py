"""The one SLO rule: whether a request meets a set of SLOs and by how far (its margin), and whether a cell's
share of requests within them is enough. Everything that judges against SLOs calls it: `summarize` (a cell's
goodput and SLO share), the views (a report or a comparison judging by other SLOs than the session's), the
bootstrap behind compare's and gate's intervals, tune's measured and predicted cells, and the twin.

The rule, for one request (docs/metrics.md, "SLOs and goodput"):
- a request that did not succeed (failed, cut, rate-limited, cancelled) meets no SLO;
- `ttft_ms`, `ttfo_ms`, `tpot_ms` and `e2e_ms` are upper bounds, `per_user_tok_s` a lower bound (the direction
  each metric's declaration in core/results.py gives as better); `itl_ms` bounds no request (its gaps are pooled
  over the cell's requests, so no request owns one);
- a request that lacks a figure an SLO bounds fails that SLO, except TTFO: a request that streamed no reasoning
  has its first content at its first token, so a missing content stamp is its TTFT (a record from a tool that
  stamps only the first token); a request that streamed reasoning and never any content showed its user no
  answer, so it fails a TTFO SLO;
- its margin is, over the SLOs, the smallest ln(limit / value) (ln(value / limit) for a lower bound): >= 0
  exactly when it meets every SLO, and it meets them still with latencies exp(margin) times longer; +inf without
  SLOs (or for a zero latency), -inf for a request that fails outright.

A cell meets the SLOs when at least SLO_ATTAINMENT (90%) of its requests do (`attains`).

polars is imported by the functions that build expressions: the app's first frame reads the SLOs' wording here
without it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from servescope.core.results import METRICS

if TYPE_CHECKING:
    import polars as pl

__all__ = ["SLO_ATTAINMENT", "SLO_KEYS", "attains", "lower_bound", "requests_needed", "slo_margin", "slo_margins",
           "slo_met", "slo_terms"]

SLO_KEYS = frozenset({"ttft_ms", "ttfo_ms", "tpot_ms", "e2e_ms", "itl_ms", "per_user_tok_s"})
SLO_ATTAINMENT = 0.9
_MISSED = -1e-12  # the margin of a request just past its limit: below 0 even when ln rounds to 0


def lower_bound(key: str) -> bool:
    """Whether the SLO on `key` is a floor (a speed: per_user_tok_s), not a ceiling (a latency)."""
    return key in METRICS and METRICS[key].better == "higher"


def slo_terms(slos: Mapping[str, float], sep: str = " ") -> list[str]:
    """Each SLO as people read it: `ttft_ms <= 3000`, `per_user_tok_s >= 20` (`sep` around the sign)."""
    return [f"{k}{sep}{'>=' if lower_bound(k) else '<='}{sep}{v:g}" for k, v in slos.items()]


def _judged(key: str) -> pl.Expr:
    """The request's figure an SLO on `key` bounds (a per_request frame's column), the TTFO rule applied."""
    import polars as pl

    v = pl.col(key).cast(pl.Float64)
    if key == "ttfo_ms":
        no_reasoning = pl.col("reasoning_tokens").fill_null(0) <= 0
        v = pl.coalesce(v, pl.when(no_reasoning).then(pl.col("ttft_ms").cast(pl.Float64)))
    return v


def slo_margin(slos: Mapping[str, float]) -> pl.Expr:
    """Each request's margin over `slos` (a per_request frame: `status`, the figures, `reasoning_tokens`)."""
    import polars as pl

    parts: list[pl.Expr] = []
    for key, limit in slos.items():
        if key == "itl_ms":
            continue
        v = _judged(key)
        if lower_bound(key):
            met, ln = v >= limit, (v.clip(lower_bound=0.0) / limit).log()
        else:
            met, ln = v <= limit, (limit / v.clip(lower_bound=0.0)).log()
        parts.append(pl.when(v.is_null() | v.is_nan()).then(-math.inf)
                     .when(met).then(ln.clip(lower_bound=0.0)).otherwise(ln.clip(upper_bound=_MISSED)))
    within = pl.min_horizontal(parts) if parts else pl.lit(math.inf)
    return pl.when(pl.col("status") == "ok").then(within).otherwise(-math.inf).cast(pl.Float64)


def slo_met(slos: Mapping[str, float]) -> pl.Expr:
    """Whether each request meets every SLO (its margin is >= 0)."""
    return slo_margin(slos) >= 0.0


def slo_margins(frame: pl.DataFrame, slos: Mapping[str, float]) -> list[float]:
    """The margins of a per_request frame's requests, in its order."""
    if frame.height == 0:
        return []
    return [float(x) for x in frame.select(slo_margin(slos).alias("m"))["m"].to_list()]


def attains(fraction: float | None) -> bool:
    """Whether a cell whose share `fraction` of requests met the SLOs meets them (None: nothing was judged)."""
    return fraction is not None and fraction >= SLO_ATTAINMENT - 1e-12


def requests_needed(n: int) -> int:
    """Of `n` judged requests, how many must meet the SLOs for their cell to meet them."""
    return math.ceil(SLO_ATTAINMENT * n - 1e-9)
