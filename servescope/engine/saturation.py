"""Is a cell past its server's saturation? Judged over the cell's steady window:

1. **the queue**: with the server's /metrics, its `waiting` gauge. A closed loop's queue cannot grow past its users,
   so there the sign is a queue that *stands*: a request waiting in every sample of the window (`waiting_min >= 1`).
   An open loop's queue *grows*: the waiting count's slope over the window is significant (t >= `SLOPE_T`) and adds
   at least `MIN_RISE` requests over it. Without /metrics, the client's TTFT stands in for the queue: its slope over
   the window's sends, as significant and rising by at least `TTFT_RISE` of its median over the window;
2. **the throughput no longer rises with the load**: against the next lower load of the same series (workload,
   server variant, repeat), the output tok/s rose by less than `ELASTICITY` of the load's rise on a log scale
   (ln(T2/T1) / ln(L2/L1) < 0.5: doubling the users gained less than 41%). With no lower load measured, the queue
   alone decides.

A saturated cell carries `saturation.saturated = True` and one line saying why; `--stop-after-saturation` then runs
the next load and skips the ones above it (engine/runner.py)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from servescope.core.results import CellResult, Saturation, TelemetryWindow

__all__ = ["ELASTICITY", "judge_saturation", "ttft_trend"]

ELASTICITY = 0.5  # throughput rising less than half as fast as the load (log scale): no longer rising with it
SLOPE_T = 3.0  # a trend's slope this many standard errors from 0 is significant
MIN_RISE = 2.0  # an open loop's queue grows by at least this many requests over the window
TTFT_RISE = 0.5  # without /metrics: TTFT rises by at least half its median over the window
MIN_SAMPLES = 3  # /metrics samples in the window at least, to judge the queue by


def ttft_trend(points: Sequence[tuple[float, float]]) -> tuple[float | None, float | None]:
    """(slope in ms per s, its t statistic) of TTFT (ms) over send time (s); (None, None) with fewer than 3."""
    n = len(points)
    if n < 3:
        return None, None
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx <= 0:
        return None, None
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    resid = sum((y - my - b * (x - mx)) ** 2 for x, y in points)
    se = math.sqrt(resid / (n - 2) / sxx)
    return b, (b / se if se > 0 else (1e9 if b > 0 else -1e9 if b < 0 else 0.0))


def judge_saturation(s: CellResult, steady: TelemetryWindow | None, load: float, open_loop: bool,
                     window_s: float, ttft: tuple[float | None, float | None],
                     lower: tuple[float, CellResult] | None) -> Saturation:
    """The saturation mark of a finished cell: `steady` is the server's /metrics over its steady window (None
    without), `load` its users or rate, `ttft` the TTFT trend over the window (ttft_trend), `lower` the next lower
    load of its series and that cell's summary."""
    elasticity = None
    if lower is not None and lower[0] > 0 and load > lower[0]:
        t1, t2 = lower[1].output_tok_s, s.output_tok_s
        if t1 and t2 and t1 > 0 and t2 > 0:
            elasticity = math.log(t2 / t1) / math.log(load / lower[0])
    flat = elasticity is None or elasticity < ELASTICITY
    slope_ms, slope_t = ttft
    queue, basis, said = False, "", ""
    if steady is not None and steady.available and steady.samples >= MIN_SAMPLES and steady.waiting_min is not None:
        basis = "server waiting"
        if open_loop:
            rise = (steady.waiting_slope_per_s or 0.0) * window_s
            queue = (steady.waiting_slope_t or 0.0) >= SLOPE_T and rise >= MIN_RISE
            said = (f"the server's queue grew by {rise:.0f} requests over the steady window"
                    f" ({steady.waiting_slope_per_s or 0:.2f}/s)")
        else:
            queue = steady.waiting_min >= 1
            said = (f"the server's queue never emptied in the steady window (waiting {steady.waiting_min:.0f} to "
                    f"{steady.waiting_max or 0:.0f}, mean {steady.waiting_mean or 0:.1f}, over {steady.samples} "
                    "samples)")
    elif slope_ms is not None and slope_t is not None:
        basis = "TTFT trend"
        p50 = s.ttft_ms.p50 or 0.0
        rise = slope_ms * window_s
        queue = slope_t >= SLOPE_T and p50 > 0 and rise >= TTFT_RISE * p50
        said = f"TTFT rose by {rise:,.0f} ms over the steady window (no /metrics: the client's TTFT stood for the queue)"
    if not queue:
        return Saturation(False, "", basis, *_figures(steady), slope_ms, elasticity)
    if not flat:
        return Saturation(False, f"{said}, but the throughput still rose with the load (elasticity "
                                 f"{elasticity:.2f})", basis, *_figures(steady), slope_ms, elasticity)
    gain = (f"; output tok/s rose {elasticity:.2f} times as fast as the load from {lower[0]:g}"
            if elasticity is not None and lower is not None else "")
    return Saturation(True, f"saturated: {said}{gain}", basis, *_figures(steady), slope_ms, elasticity)


def _figures(t: TelemetryWindow | None) -> tuple[float | None, float | None, float | None]:
    if t is None:
        return None, None, None
    return t.waiting_mean, t.waiting_min, t.waiting_slope_per_s
