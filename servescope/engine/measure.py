"""How one cell is measured beyond its load: the window its figures are over (core/steady.py), the intervals of its
figures and the precision stop rule (core/precision.py), the saturation mark (engine/saturation.py) and the
interference probes (engine/interference.py). The runner makes a `CellMeasure` per cell (`cell_measure`); the cell
(engine/cell.py) feeds its finished requests to a `Stopper` while it runs and ends with `cell_figures`, which turns
the whole cell's summary into the one it saves:

- `window = "steady"` (the default): the top-level figures are the steady window's; `whole` holds the whole cell's
  beside them; the request counts and errors stay the whole cell's (every request measured);
- `window = "whole"`: the figures are the whole cell's, as before windows;
- `intervals`: each figure's 95% interval (batch means over spans of time), for the `--precision` figures, else the
  default ones (output tok/s and a median per SLO metric);
- `precision`: with `--precision`, whether the cell stopped at its target or its ceiling came first (`imprecise`).

The requests' rows gain an `in_window` column (sent inside the window), so a reader of the requests (compare's
intervals, tune's margins) takes the same requests as the figures."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import msgspec
import polars as pl

from servescope.core.client import RequestSpec
from servescope.core.load import CellRun, Load
from servescope.core.metrics import summarize
from servescope.core.precision import (
    BATCH_E2E,
    Interval,
    PrecisionRule,
    default_figures,
    intervals,
    point_of,
    window_rates,
)
from servescope.core.records import RequestRecord
from servescope.core.results import (
    CellPrecision,
    CellResult,
    CellWindow,
    FigureInterval,
    TelemetryWindow,
)
from servescope.core.steady import WindowSpan, sent_at, steady_offset
from servescope.engine.plan import Cell
from servescope.engine.saturation import judge_saturation, ttft_trend

__all__ = ["CellMeasure", "Stopper", "cell_figures", "ceiling_text", "imprecise_reason", "method_text"]
WHOLE_COUNTS = ("requests_ok", "requests_failed", "requests_bad_usage", "requests_rate_limited", "rate_limit_retries",
                "retry_wait_s", "retry_after_s_max", "errors", "turns", "conversations", "output_check")


@dataclass
class CellMeasure:
    """How a cell is measured beyond its load (the runner's, per cell)."""

    window: str = "steady"
    targets: tuple[tuple[str, float], ...] = ()  # --precision: (figure, share); () without
    slos: Mapping[str, float] = field(default_factory=dict)
    ceiling: str = ""  # the ceiling as people read it: "2,000 requests", "60 s"
    probe_rate: float | None = None
    probe_specs: Sequence[RequestSpec] = ()
    lower: tuple[float, CellResult] | None = None  # the next lower load of the cell's series, and its summary
    auto_ramp_s: float | None = None  # --ramp auto: the ramp its users start over (not part of its planned load)

    def load(self, cell: Cell) -> Load:
        """The load the cell runs: its planned one, with the auto ramp when it has one. The planned load (its row,
        its label, what comparisons join cells on) stays as planned: an auto ramp differs a little from run to run."""
        if self.auto_ramp_s and not cell.load.ramp_s:
            return dataclasses.replace(cell.load, ramp_s=self.auto_ramp_s)
        return cell.load

    @property
    def figures(self) -> tuple[str, ...]:
        """The figures whose intervals the cell keeps: the --precision ones, else the default ones."""
        return tuple(f for f, _ in self.targets) or default_figures(self.slos)


def ceiling_text(requests: int | None, duration_s: float | None) -> str:
    parts = []
    if requests is not None:
        parts.append(f"{requests:,} requests")
    if duration_s is not None:
        parts.append(f"{duration_s:g} s")
    return " or ".join(parts) or "none"


class Stopper:
    """The stop rule of one running cell: `add` each finished request, `look()` after each batch; True once the named
    figures are precise enough (the cell then sends no more: CellControl.request_finish). `end_ns` is the window's
    end that look judged."""

    def __init__(self, m: CellMeasure, cell: Cell) -> None:
        self.rule = PrecisionRule(m.targets, m.slos, users=cell.load.concurrency or 1)
        self.offset, _ = steady_offset(m.load(cell), cell.requests)
        self.first: int | None = None
        self.end_ns: int | None = None
        self.fired = False

    def add(self, rec: RequestRecord) -> None:
        if rec.warmup:
            return
        if self.first is None or rec.scheduled_ns < self.first:
            self.first = rec.scheduled_ns
            self.rule.begin(self.first + self.offset)
        self.rule.add(rec)

    def look(self) -> bool:
        if self.fired:
            return False
        if self.rule.check() is None:
            return False
        self.fired = True
        self.end_ns = self.rule.complete_until()
        return True


def method_text(batches: int, span_s: float | None) -> str:
    size = f" of {span_s:.3g} s" if span_s else ""
    return (f"batch means over {batches} spans of time{size} (each at least {BATCH_E2E:g} median E2Es; requests by "
            "the span they were sent in), t with K-1 degrees of freedom; percentiles by Woodruff's method")


def _intervals(ivs: Sequence[Interval], targets: Mapping[str, float]) -> list[FigureInterval]:
    return [FigureInterval(figure=iv.figure, estimate=iv.value, low=iv.low, high=iv.high,
                           reached=iv.reached if math.isfinite(iv.reached) else None,
                           target=targets.get(iv.figure), batches=iv.batches) for iv in ivs]


def cell_figures(whole: CellResult, df: pl.DataFrame, run: CellRun, cell: Cell, m: CellMeasure,
                 slos: Mapping[str, float], server_hit_rate: float | None, stopper: Stopper | None,
                 steady_tele: TelemetryWindow | None, span: WindowSpan | None) -> tuple[CellResult, pl.DataFrame]:
    """The summary the cell saves (see the module's text), and its request rows with `in_window`."""
    measured = [r for r in run.records if not r.warmup]
    points = [point_of(r) for r in measured]
    ramp = m.load(cell).ramp_s
    first = min((r.scheduled_ns for r in measured), default=run.start_ns)
    sent = pl.when(pl.col("sent_ns") > 0).then(pl.col("sent_ns")).otherwise(pl.col("scheduled_ns"))
    targets = dict(m.targets)
    ok_in = (sum(1 for r in measured if span.start_ns <= sent_at(r) <= span.end_ns and r.status == "ok")
             if span is not None else 0)
    if m.window == "whole" or span is None or not ok_in:
        end = max(run.end_ns, first + 1)
        ivs = intervals(points, first, end, m.figures, slos)
        why = ("every measured request, over the cell's wall time" if m.window == "whole" else
               "every measured request: a trace replays its own times" if cell.load.arrival == "trace" else
               "every measured request: its steady window (from the ramp's end to the last send) held fewer than "
               "two requests or lasted less than their median E2E" if span is None else
               "every measured request: no request sent in its steady window finished")
        window = CellWindow(kind="whole", start_s=0.0, end_s=(end - first) / 1e9, requests=len(measured),
                            requests_ok=whole.requests_ok, ramp_s=ramp, basis=why)
        out = msgspec.structs.replace(whole, window=window, intervals=_intervals(ivs, targets))
        df = df.with_columns(in_window=~pl.col("warmup"))
        a, b = first, end
    else:
        a, b = span.start_ns, span.end_ns
        inside = (sent >= a) & (sent <= b) & ~pl.col("warmup")
        steady = summarize(df.filter(inside), (b - a) / 1e9, slos, server_prefix_hit_rate=server_hit_rate)
        rates = window_rates(points, a, b, slos)  # what happened in the window: tokens arrived, requests ended
        out_tok = rates.get("output_tok_s", 0.0) * (b - a) / 1e9
        steady = msgspec.structs.replace(
            steady, **{k: getattr(whole, k) for k in WHOLE_COUNTS}, **rates,
            output_tokens_total=round(out_tok),
            input_tokens_total=round(rates.get("total_tok_s", 0.0) * (b - a) / 1e9 - out_tok))
        n_in = sum(1 for r in measured if a <= sent_at(r) <= b)
        n_before = sum(1 for r in measured if sent_at(r) < a)
        window = CellWindow(kind="steady", start_s=(a - first) / 1e9, end_s=(b - first) / 1e9, requests=n_in,
                            requests_ok=ok_in, ramp_requests=n_before, drain_requests=len(measured) - n_in - n_before,
                            ramp_s=ramp, basis=span.basis)
        ivs = intervals(points, a, b, m.figures, slos)
        out = msgspec.structs.replace(steady, window=window, whole=whole, intervals=_intervals(ivs, targets))
        df = df.with_columns(in_window=inside.fill_null(False))
    if m.targets:
        out = msgspec.structs.replace(out, precision=_precision(ivs, m, len(measured), stopper, (b - a) / 1e9))
    window_s = max((b - a) / 1e9, 1e-9)
    trend = ttft_trend([((p.sent_ns - a) / 1e9, v) for p in points
                        if p.ok and a <= p.sent_ns <= b and (v := p.values.get("ttft_ms")) is not None])
    load = float(cell.load.concurrency or cell.load.rate or 0)
    if cell.load.arrival != "trace" and load > 0:
        sat = judge_saturation(out, steady_tele, load, cell.load.rate is not None, window_s, trend, m.lower)
        out = msgspec.structs.replace(out, saturation=sat)
    return out, df


def _precision(ivs: Sequence[Interval], m: CellMeasure, requests: int, stopper: Stopper | None,
               window_s: float) -> CellPrecision:
    shares = dict(m.targets)
    worst = max(ivs, key=lambda iv: iv.reached / shares[iv.figure]) if ivs else None
    batches = worst.batches if worst is not None else 0
    precise = stopper is not None and stopper.fired
    reached = worst.reached if worst is not None and math.isfinite(worst.reached) else None
    return CellPrecision(target=shares[worst.figure] if worst is not None else None, reached=reached,
                         requests=requests, figure=worst.figure if worst is not None else "", imprecise=not precise,
                         ceiling=m.ceiling, method=method_text(batches, window_s / batches if batches else None))


def imprecise_reason(s: CellResult | None) -> str:
    """`imprecise: +-3.1% (target 2%) on output_tok_s over 2,000 requests: the ceiling (2,000 requests) came first`,
    for a cell whose --precision target was not reached; "" otherwise."""
    p = s.precision if s is not None else None
    if p is None or not p.imprecise:
        return ""
    got = f"+-{p.reached * 100:.1f}%" if p.reached is not None else "no interval"
    target = f"{(p.target or 0) * 100:g}%"
    return (f"imprecise: {got} (target {target}) on {p.figure} over {p.requests:,} requests: the ceiling "
            f"({p.ceiling}) came first")
