"""The figures of a report, as data: what each figure draws (its panels, series, points, bands and reference
lines), taken from the session's saved data only (the cells' summaries, their requests/cell-NNNN.parquet,
telemetry.parquet, gpu.parquet and the twin's stored fit). No plotting library is imported here:
servescope.reports.figures_svg draws these specs (matplotlib, the optional `plots` extra) and writes every
point's value into the SVG's `<title>` tooltips, so a figure carries the same numbers as the report's tables.

Session figures, per workload (x = concurrency, or the request rate of open-loop cells):
- throughput: aggregate output tok/s (left axis) and mean per-user tok/s (right axis) against load, the knee
  and the per-user SLO marked;
- tradeoff: mean per-user tok/s against aggregate output tok/s, one point per load;
- latency: TTFT and TPOT p50 and p99 against load, with the SLO lines and the capacity and knee marked;
- histograms: each cell's TTFT and TPOT over its successful requests, with p50, p90 and p99 marked.
And once per session: TTFT p50 against the measured input length (where the workloads differ in length) and
the server's KV-cache use, running and waiting requests over time (telemetry.parquet; GPU power from
gpu.parquet where it was recorded), the cells as spans.

Comparison figures, per workload: each session's curves overlaid (the median of its repeats; a band from the
lowest to the highest repeat), each point of a later session marked with its verdict against the first
(better, worse, within noise); a twin's fitted values dashed, with their bands.

Client-bound cells (the load generator, not the server, limited them) are marked as hollow grey points and
left out of the lines: they are not the server's figures."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import polars as pl

from servescope.core.metrics import per_request
from servescope.core.results import finite
from servescope.core.textsafe import clean_text, slug
from servescope.reports.report_sections import SessionReport
from servescope.reports.tunereport import TUNE_FIGURE_KEY
from servescope.reports.tunereport import fmt_value as f3
from servescope.sessions.answers import WorkloadAnswers, completed
from servescope.sessions.compare import CellView, ComparedCell, Comparison, fmt_num, interval_pct
from servescope.sessions.store import Session

__all__ = ["Band", "FigureSpec", "Interval", "Mark", "Panel", "Point", "Series", "comparison_figures",
           "distinct_labels", "session_figures"]

MAX_HIST_CELLS = 8  # cells drawn as histograms per workload (evenly spread over the sweep when it has more)
MAX_TIMELINE_POINTS = 400  # samples drawn per telemetry series (evenly thinned beyond)
HIST_BINS = 24
TWIN_BAND_Z = 2.0  # the twin's band: 2x its error for the figure (as servescope.engine.twinpredict's BAND_Z)
TWIN_FIGURES = ("output_tok_s", "ttft_ms.p50", "tpot_ms.p50")  # the figures the twin's fit stores per cell
LOG_SPAN = 30.0  # a y axis whose values span more than this factor is drawn logarithmic

Verdict = Literal["better", "worse", "within noise", "not comparable", ""]


@dataclass
class Point:
    x: float
    y: float
    tip: str  # the tooltip: what the point is and its value, as the tables print it
    bound: bool = False  # client bound: marked (hollow, grey), not drawn as data
    verdict: Verdict = ""  # a compared session's point: its verdict against the first session
    label: str = ""  # a short label drawn beside the point ("c=4"), "" for none


@dataclass
class Band:
    """A shaded interval around a series: (x, low, high) per point."""

    xs: list[float]
    lo: list[float]
    hi: list[float]
    tip: str


@dataclass
class Interval:
    """A vertical bar from lo to hi at x: a compared point's 95% interval of its difference from the first
    session, drawn about the first session's value (that value x (1 + the interval in percent / 100))."""

    x: float
    lo: float
    hi: float
    tip: str


@dataclass
class Series:
    label: str
    points: list[Point]
    color: int = 0  # index into the palette
    axis: Literal["left", "right"] = "left"
    dashed: bool = False  # a prediction (the twin), not a measurement
    marker: str = "o"
    band: Band | None = None
    connect: bool = True  # draw a line through the (non-bound) points
    intervals: list[Interval] = field(default_factory=list)


@dataclass
class Mark:
    """A reference line: an SLO (horizontal) or the capacity / knee (vertical)."""

    orient: Literal["h", "v"]
    at: float
    label: str
    tip: str
    axis: Literal["left", "right"] = "left"
    kind: Literal["slo", "capacity", "knee", "percentile"] = "slo"


@dataclass
class Span:
    """A stretch of the x axis (a cell on the telemetry timeline)."""

    x0: float
    x1: float
    label: str
    tip: str


@dataclass
class Panel:
    title: str
    x_label: str
    y_label: str
    series: list[Series] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    y2_label: str = ""  # the right axis (series with axis="right")
    log_x: bool = False
    log_y: bool = False
    hist: list[float] | None = None  # a histogram of these values instead of series
    hist_tip: str = ""  # what one bar counts ("TTFT ms"), for the bars' tooltips
    spans: list[Span] = field(default_factory=list)
    note: str = ""  # drawn in the panel when it has nothing to show
    x_integer: bool = False  # the axis counts things (requests, steps): whole-number ticks only
    y_integer: bool = False


@dataclass
class FigureSpec:
    name: str  # the file stem: "chat-throughput"
    title: str
    caption: str  # what the figure shows, in a sentence or two (under it in the report)
    panels: list[Panel]
    columns: int = 1  # panels per row
    workload: str | None = None  # the workload whose section it belongs in (None: the session's)
    kind: str = ""  # throughput, tradeoff, latency, histograms, context, telemetry, compare
    # where its drawing is kept (servescope.reports.figcache): a finished session's folder; None: drawn each time.
    # Not part of what the figure shows: the drawing is keyed by everything else.
    cache_dir: Path | None = None

    def points(self) -> list[Point]:
        """Every drawn point of every series, in drawing order (the order of the SVG's point tooltips)."""
        return [p for pan in self.panels for s in pan.series for p in s.points]


# ---- helpers ----------------------------------------------------------------------------------------
def _x_of(views: Sequence[CellView]) -> tuple[list[CellView], str, str]:
    """The cells a load axis draws (closed-loop ones by concurrency, else open-loop ones by rate), the axis
    label and the kind (concurrency | rate)."""
    closed = [v for v in views if v.concurrency is not None]
    if closed:
        return closed, "concurrency (users)", "concurrency"
    return [v for v in views if v.rate is not None], "request rate (req/s)", "rate"


def distinct_labels(values: Sequence[float]) -> list[str]:
    """Each value as the tables write it (fmt_num), with more decimals where two different values would read the
    same (19.7 and 19.7 become 19.71 and 19.74); values that are equal read the same."""
    base = [fmt_num(v) for v in values]

    def clash(labels: Sequence[str]) -> bool:
        seen: dict[str, float] = {}
        for lb, v in zip(labels, values, strict=True):
            if lb in seen and not math.isclose(seen[lb], v, rel_tol=1e-12, abs_tol=1e-12):
                return True
            seen.setdefault(lb, v)
        return False

    if not clash(base):
        return base
    start = max(len(b.split(".")[1]) if "." in b else 0 for b in base)
    for d in range(start + 1, 7):
        out = [f"{v:,.{d}f}" for v in values]
        if not clash(out):
            return out
    return [repr(v) for v in values]


def _cache_dir(session: Session) -> Path | None:
    """Where a session's figures are kept once drawn: its folder's figures/ (none while it runs)."""
    return None if session.status == "running" else session.path / "figures"


def _val(v: CellView, key: str) -> float | None:
    return v.summary.value(key)


def _tip(series: str, load: str, what: str, value: float, unit: str = "") -> str:
    return f"{series}, {load}: {what} = {fmt_num(value)}{' ' + unit if unit else ''}"


def _log_y(values: Sequence[float]) -> bool:
    pos = [v for v in values if v > 0]
    return bool(pos) and max(pos) / min(pos) > LOG_SPAN


def _log_x(xs: Sequence[float]) -> bool:
    pos = sorted({x for x in xs if x > 0})
    return len(pos) >= 3 and pos[-1] / pos[0] >= 16


def _series(label: str, views: Sequence[CellView], key: str, what: str, unit: str, color: int,
            axis: Literal["left", "right"] = "left", marker: str = "o", who: str = "") -> Series:
    """`who` names the points in their tooltips (the workload; the series' label by default)."""
    pts = []
    for v in views:
        y = _val(v, key)
        if y is None or v.x is None:
            continue
        bound = v.summary.client_bound
        tip = _tip(who or label, v.load, what, y, unit) + (" (client bound: the load generator, not the server, limited "
                                                     "this cell; not the server's figure)" if bound else "")
        pts.append(Point(v.x, y, tip, bound=bound))
    return Series(f"{label}", pts, color, axis, marker=marker)


def _slo_marks(slos: dict[str, float], key: str, axis: Literal["left", "right"] = "left",
               unit: str = "ms") -> list[Mark]:
    v = slos.get(key)
    if v is None:
        return []
    op = ">=" if key == "per_user_tok_s" else "<="
    return [Mark("h", float(v), f"SLO {op} {v:g} {unit}", f"SLO: {key} {op} {fmt_num(float(v))} {unit}", axis)]


def _answer_marks(ans: WorkloadAnswers | None, kind: str) -> list[Mark]:
    """The capacity (when a level meets the SLOs) and the knee, as vertical lines."""
    out: list[Mark] = []
    if ans is None:
        return out
    cap = ans.capacity
    if cap.level is not None and not cap.unknown and (kind == "concurrency") == (cap.unit == "concurrency"):
        lv = f"c={int(cap.level)}" if cap.unit == "concurrency" else f"{cap.level:g} req/s"
        out.append(Mark("v", float(cap.level), f"capacity {lv}", f"capacity at the SLOs: {cap.text()}",
                        kind="capacity"))
    k = ans.knee
    if k.concurrency is not None and kind == "concurrency":
        out.append(Mark("v", float(k.concurrency), f"knee c={k.concurrency}", f"knee: {k.text()}", kind="knee"))
    return out


def _twin_rows(rep: SessionReport, workload: str) -> list[dict[str, object]]:
    if rep.twin is None:
        return []
    rows = rep.twin.fit.get("cells")
    return [r for r in rows if isinstance(r, dict) and r.get("workload") == workload] if isinstance(rows, list) else []


def twin_series(rep: SessionReport, workload: str, key: str, what: str, unit: str, color: int,
                axis: Literal["left", "right"] = "left") -> Series | None:
    """The twin's fitted value of `key` at each measured load of the workload (dashed), with its band: 2x the
    fit's error for that figure (its residual over all fitted cells, or this cell's own error where larger)."""
    if rep.twin is None or key not in TWIN_FIGURES:
        return None
    res_t = rep.twin.fit.get("residual_rms_ln")
    res = res_t.get(key) if isinstance(res_t, dict) else None
    resid = float(res) if isinstance(res, (int, float)) and math.isfinite(res) else 0.0
    per_x: dict[float, list[tuple[float, float, str]]] = {}  # x -> (twin, |ln error|, load) per fitted cell
    for r in _twin_rows(rep, workload):
        pair = r.get(key)
        x = r.get("concurrency") or r.get("rate")
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(x, (int, float))):
            continue
        m, t = pair
        if not (isinstance(m, (int, float)) and isinstance(t, (int, float)) and m > 0 and t > 0):
            continue
        load = clean_text(str(r.get("label") or (f"c={x}" if r.get("concurrency") else f"{x} req/s")))
        per_x.setdefault(float(x), []).append((float(t), abs(math.log(t / m)), load))
    pts, xs, lo, hi = [], [], [], []
    for x in sorted(per_x):  # a load fitted several times (its repeats): the median, the largest error
        rows = per_x[x]
        t = statistics.median(r[0] for r in rows)
        rel = TWIN_BAND_Z * max(resid, *(r[1] for r in rows))
        pts.append(Point(x, t, f"twin, {rows[0][2]}: {what} = {fmt_num(t)} {unit} (band "
                               f"{fmt_num(t * math.exp(-rel))}-{fmt_num(t * math.exp(rel))})"))
        xs.append(x)
        lo.append(t * math.exp(-rel))
        hi.append(t * math.exp(rel))
    if not pts:
        return None
    band = Band(xs, lo, hi, f"twin band ({what}): 2x the fit's error for this figure")
    return Series(f"twin ({what})", pts, color, axis, dashed=True, marker="D", band=band)


# ---- the session's figures --------------------------------------------------------------------------
def session_figures(rep: SessionReport) -> list[FigureSpec]:
    """Every figure the session's data allows, per workload and then the session's own."""
    out: list[FigureSpec] = []
    for w in dict.fromkeys(v.workload for v in rep.views):
        views = completed([v for v in rep.views if v.workload == w])
        pts, x_label, kind = _x_of(views)
        ans = next((a for a in rep.answers if a.workload == w), None)
        if pts:
            out.append(_throughput(rep, w, pts, x_label, kind, ans))
            out.append(_tradeoff(rep, w, pts, ans))
            out.append(_latency(rep, w, pts, x_label, kind, ans))
        hist = _histograms(rep.session, w, views)
        if hist is not None:
            out.append(hist)
    ctx = _context(rep)
    if ctx is not None:
        out.append(ctx)
    tele = _telemetry(rep)
    if tele is not None:
        out.append(tele)
    tune = _tune(rep)
    if tune is not None:
        out.append(tune)
    keep = _cache_dir(rep.session)
    for f in out:
        f.cache_dir = keep
    return out


def _tune(rep: SessionReport) -> FigureSpec | None:
    """A tune session's search: the objective each measured cell gave, in the order measured, the best cell's
    measurements marked (a cell measured again appears at each of its steps)."""
    table = rep.session.meta.get("tune") if rep.session.info.kind == "tune" else None
    if not isinstance(table, dict):
        return None
    path = table.get("path")
    steps = [st for st in (path if isinstance(path, list) else []) if isinstance(st, dict)
             and isinstance(st.get("objective"), (int, float)) and isinstance(st.get("step"), int)
             and not st.get("skipped")]  # a cell the user skipped has no value to draw
    if not steps:
        return None
    unit, objective = str(table.get("unit", "")), str(table.get("objective", ""))
    best = table.get("best")
    best_key = ((str(best.get("server_args", "")), best.get("concurrency")) if isinstance(best, dict) else None)
    measured: list[Point] = []
    top: list[Point] = []
    for st in steps:
        args = str(st.get("server_args") or "")
        band = st.get("band")
        pred = (f"; predicted before {f3(band[0])}-{f3(band[1])} {unit}"
                if isinstance(band, list) and len(band) == 2 else "")
        tip = clean_text(f"step {st['step']}: {args or 'as launched'} at c={st.get('concurrency')}: {objective} "
                         f"{f3(st['objective'])} {unit}{pred} ({st.get('why', '')})")
        pt = Point(float(st["step"]), float(st["objective"]), tip)
        (top if (args, st.get("concurrency")) == best_key else measured).append(pt)
    series = [Series("measured cell", measured, color=0, connect=False),
              Series("the best cell (each measurement)", top, color=1, marker="*", connect=False)]
    what = ("goodput (requests/s meeting every SLO)" if objective == "goodput" else
            "capacity (the most users whose cell meets the SLOs)")
    panel = Panel(f"tune: {objective} of each measured cell, in search order", "search step",
                  f"{objective} {unit}", [s for s in series if s.points], x_integer=True)
    return FigureSpec("tune-search", "tune: the search", (
        f"The {what} each measured cell gave, in the order the search measured them (the first steps are its "
        "design); the stars are the best cell's measurements. Each point's tooltip names the setting, the load, "
        "the band the model predicted before it was measured and why it was chosen."),
        [panel], workload=TUNE_FIGURE_KEY, kind="tune")


def _throughput(rep: SessionReport, w: str, pts: list[CellView], x_label: str, kind: str,
                ans: WorkloadAnswers | None) -> FigureSpec:
    agg = _series("aggregate output tok/s", pts, "output_tok_s", "aggregate output tok/s", "tok/s", 0, who=w)
    user = _series("per-user tok/s (mean)", pts, "per_user_tok_s.mean", "per-user tok/s (mean)", "tok/s", 1,
                   axis="right", marker="s", who=w)
    series = [agg, user]
    tw = twin_series(rep, w, "output_tok_s", "aggregate output tok/s", "tok/s", 0)
    if tw is not None:
        series.append(tw)
    marks = [m for m in _answer_marks(ans, kind) if m.kind == "knee"]
    marks += _slo_marks(rep.slos, "per_user_tok_s", axis="right", unit="tok/s")
    xs = [p.x for p in agg.points]
    panel = Panel(f"{w}: aggregate and per-user output tok/s vs {kind}", x_label, "aggregate output tok/s",
                  series, marks, y2_label="per-user tok/s (mean)", log_x=_log_x(xs))
    return FigureSpec(f"{slug(w)}-throughput", f"{w}: aggregate vs per-user throughput", (
        "Aggregate output tokens per second (all users together, left axis) and each user's mean output tokens "
        "per second (right axis) as the load grows: past the knee, extra aggregate throughput costs more "
        "per-user speed than it gains." + (" Dashed: the twin's fitted values, with its band." if tw else "")),
        [panel], workload=w, kind="throughput")


def _tradeoff(rep: SessionReport, w: str, pts: list[CellView], ans: WorkloadAnswers | None) -> FigureSpec:
    points = []
    for v in pts:
        a, u = _val(v, "output_tok_s"), _val(v, "per_user_tok_s.mean")
        if a is None or u is None:
            continue
        bound = v.summary.client_bound
        points.append(Point(a, u, f"{w}, {v.load}: aggregate output tok/s = {fmt_num(a)} tok/s, per-user tok/s "
                                  f"(mean) = {fmt_num(u)} tok/s" + (" (client bound: not the server's figure)"
                                                                     if bound else ""),
                            bound=bound, label=v.load))
    marks = _slo_marks(rep.slos, "per_user_tok_s", unit="tok/s")
    k = ans.knee if ans is not None else None
    if k is not None and k.concurrency is not None and k.aggregate_tok_s is not None:
        marks.append(Mark("v", k.aggregate_tok_s, f"knee c={k.concurrency}", f"knee: {k.text()}", kind="knee"))
    panel = Panel(f"{w}: per-user vs aggregate output tok/s", "aggregate output tok/s", "per-user tok/s (mean)",
                  [Series("cells", points, 2)], marks)
    return FigureSpec(f"{slug(w)}-tradeoff", f"{w}: per-user vs aggregate throughput", (
        "Each load level as one point: what a user gets (mean per-user output tok/s) against what the server "
        "delivers in total (aggregate output tok/s); the upper right is better."), [panel], workload=w,
        kind="tradeoff")


def _latency(rep: SessionReport, w: str, pts: list[CellView], x_label: str, kind: str,
             ans: WorkloadAnswers | None) -> FigureSpec:
    panels = []
    for metric, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT")):
        series = [_series(f"{name} p50", pts, f"{metric}.p50", f"{name} p50", "ms", 0, who=w),
                  _series(f"{name} p99", pts, f"{metric}.p99", f"{name} p99", "ms", 3, marker="^", who=w)]
        tw = twin_series(rep, w, f"{metric}.p50", f"{name} p50", "ms", 0)
        if tw is not None:
            series.append(tw)
        marks = _slo_marks(rep.slos, metric) + _answer_marks(ans, kind)
        ys = [p.y for s in series for p in s.points]
        panels.append(Panel(f"{w}: {name} vs {kind}", x_label, f"{name} ms", series, marks, log_y=_log_y(ys),
                            log_x=_log_x([p.x for p in series[0].points])))
    return FigureSpec(f"{slug(w)}-latency", f"{w}: TTFT and TPOT against load", (
        "Time to first token and time per output token, p50 and p99 over each cell's successful requests, with "
        "the SLO lines, the capacity (the highest load meeting the SLOs) and the knee marked."), panels,
        columns=2, workload=w, kind="latency")


def _pick(views: Sequence[CellView], n: int) -> list[CellView]:
    if len(views) <= n:
        return list(views)
    step = (len(views) - 1) / (n - 1)
    return [views[round(i * step)] for i in range(n)]


def _histograms(session: Session, w: str, views: Sequence[CellView]) -> FigureSpec | None:
    panels = []
    chosen = _pick(views, MAX_HIST_CELLS)
    for v in chosen:
        df = session.requests(v.index)
        if df.height == 0 or "sent_ns" not in df.columns:
            continue
        if "warmup" in df.columns:
            df = df.filter(~pl.col("warmup"))
        pr = per_request(df).filter(pl.col("status") == "ok")
        for metric, name in (("ttft_ms", "TTFT"), ("tpot_ms", "TPOT")):
            vals = [float(x) for x in pr[metric].drop_nulls().to_list() if math.isfinite(x)] \
                if metric in pr.columns else []
            got = [(stat, s) for stat in ("p50", "p90", "p99") if (s := v.summary.value(metric, stat)) is not None]
            groups: dict[str, list[tuple[str, float]]] = {}  # the label's number -> the percentiles that read it
            for (stat, s), text in zip(got, distinct_labels([s for _, s in got]), strict=True):
                groups.setdefault(text, []).append((stat, s))
            marks = [Mark("v", same[0][1], f"{', '.join(st for st, _ in same)} {text} ms",
                          "; ".join(f"{w}, {v.load}: {name} {st} = {fmt_num(s)} ms" for st, s in same),
                          kind="percentile") for text, same in groups.items()]
            panels.append(Panel(f"{v.load}: {name} ({len(vals)} requests)", f"{name} ms", "requests", marks=marks,
                                hist=vals, hist_tip=f"{w}, {v.load}: {name}",
                                note="" if vals else "no successful request", y_integer=True))
    if not panels:
        return None
    more = f" ({len(chosen)} of its {len(views)} cells, evenly spread)" if len(chosen) < len(views) else ""
    return FigureSpec(f"{slug(w)}-histograms", f"{w}: latency histograms per cell", (
        f"Each cell's TTFT and TPOT over its successful requests{more}, with p50, p90 and p99 marked (the "
        "percentiles the tables give)."), panels, columns=2, workload=w, kind="histograms")


def _context(rep: SessionReport) -> FigureSpec | None:
    """TTFT p50 against the measured mean input tokens, one line per load level, where the workloads differ in
    prompt length."""
    done = [v for v in completed(rep.views) if v.x is not None]
    lengths = {v.workload: _val(v, "input_tokens_mean") for v in done}
    got = sorted(x for x in lengths.values() if x is not None)
    if len(got) < 2 or got[-1] < 1.2 * got[0]:
        return None
    by_load: dict[str, list[CellView]] = {}
    for v in done:
        by_load.setdefault(v.load, []).append(v)
    series = []
    for i, (load, vs) in enumerate(by_load.items()):
        pts = []
        for v in sorted(vs, key=lambda v: _val(v, "input_tokens_mean") or 0.0):
            x, y = _val(v, "input_tokens_mean"), _val(v, "ttft_ms.p50")
            if x is None or y is None:
                continue
            bound = v.summary.client_bound
            pts.append(Point(x, y, f"{v.workload}, {load}: input tokens (mean) = {fmt_num(x)}, TTFT p50 = "
                                   f"{fmt_num(y)} ms" + (" (client bound)" if bound else ""), bound=bound))
        if len({p.x for p in pts}) >= 2:
            series.append(Series(load, pts, i))
    if not series:
        return None
    ys = [p.y for s in series for p in s.points]
    xs = [p.x for s in series for p in s.points]
    marks = _slo_marks(rep.slos, "ttft_ms")
    panel = Panel("TTFT p50 vs input length, per load", "input tokens (mean, measured)", "TTFT p50 ms", series,
                  marks, log_x=max(xs) / max(min(xs), 1.0) >= 16, log_y=_log_y(ys))
    return FigureSpec("ttft-vs-context", "TTFT against context length", (
        "Time to first token (p50) against each workload's measured mean prompt length, one line per load "
        "level: the prefill cost of longer contexts."), [panel], kind="context")


def _cell_windows(session: Session, views: Sequence[CellView]) -> list[tuple[CellView, int, int]]:
    """Each cell's time on the runner's clock: its first request sent to its last answer."""
    out = []
    for v in sorted(views, key=lambda v: v.index):
        df = session.requests(v.index)
        if df.height == 0 or "sent_ns" not in df.columns or "end_ns" not in df.columns:
            continue
        t0, t1 = df["sent_ns"].min(), df["end_ns"].max()
        if isinstance(t0, int) and isinstance(t1, int) and t1 > t0:
            out.append((v, t0, t1))
    return out


def _thin(n: int, cap: int) -> list[int]:
    if n <= cap:
        return list(range(n))
    step = (n - 1) / (cap - 1)
    return sorted({round(i * step) for i in range(cap)})


def _timeline(frame: pl.DataFrame, col: str, t0: int, name: str, unit: str, scale: float, color: int) -> Series | None:
    if col not in frame.columns:
        return None
    df = frame.select("t_ns", col).drop_nulls().sort("t_ns")
    if df.height == 0:
        return None
    ts, vs = df["t_ns"].to_list(), df[col].to_list()
    pts = []
    for i in _thin(len(ts), MAX_TIMELINE_POINTS):
        x, y = (ts[i] - t0) / 1e9, float(vs[i]) * scale
        if math.isfinite(y):
            pts.append(Point(x, y, f"t = {x:.1f} s: {name} = {fmt_num(y)}{' ' + unit if unit else ''}"))
    return Series(name, pts, color, marker="") if pts else None


def _read(p: Path) -> pl.DataFrame | None:
    if not p.is_file():
        return None
    try:
        return pl.read_parquet(p)
    except Exception:  # noqa: BLE001 - a damaged telemetry file: no timeline (the report's tables stand)
        return None


def _telemetry(rep: SessionReport) -> FigureSpec | None:
    s = rep.session
    tele = _read(s.path / "telemetry.parquet")
    gpu = _read(s.path / "gpu.parquet")
    if (tele is None or "t_ns" not in tele.columns) and (gpu is None or "t_ns" not in gpu.columns):
        return None
    starts = [t for f in (tele, gpu) if f is not None and "t_ns" in f.columns and f.height
              and isinstance(t := f["t_ns"].min(), int)]
    if not starts:
        return None
    t0 = min(starts)
    spans = []
    several = len({v.workload for v in rep.views}) > 1
    for v, a, b in _cell_windows(s, rep.views):
        e = finite(v.summary.gpu.energy_wh) if v.summary.gpu is not None else None
        spans.append(Span((a - t0) / 1e9, (b - t0) / 1e9, f"{v.workload[:8]} {v.load}" if several else v.load,
                          f"cell {v.index + 1}: {v.workload} {v.load}, {(a - t0) / 1e9:.1f}-{(b - t0) / 1e9:.1f} s"
                          + (f", GPU energy {fmt_num(e)} Wh" if e is not None else "")))
    panels = []
    if tele is not None and "t_ns" in tele.columns:
        kv = _timeline(tele, "kv_cache_usage_perc", t0, "KV cache used", "%", 100.0, 0)
        if kv is not None:
            panels.append(Panel("server KV cache in use (/metrics)", "time (s)", "KV cache used %", [kv],
                                spans=spans))
        rw = [x for x in (_timeline(tele, "num_requests_running", t0, "running", "requests", 1.0, 1),
                          _timeline(tele, "num_requests_waiting", t0, "waiting", "requests", 1.0, 3)) if x]
        if rw:
            panels.append(Panel("server requests running and waiting (/metrics)", "time (s)", "requests", rw,
                                spans=spans, y_integer=True))
    if gpu is not None and "t_ns" in gpu.columns and "power_w" in gpu.columns:
        series = []
        for i, g in enumerate(sorted(set(gpu["gpu"].to_list())) if "gpu" in gpu.columns else [None]):
            part = gpu.filter(pl.col("gpu") == g) if g is not None else gpu
            sr = _timeline(part, "power_w", t0, f"GPU {g} power" if g is not None else "GPU power", "W", 1.0, i)
            if sr is not None:
                series.append(sr)
        if series:
            panels.append(Panel("GPU power (NVML)", "time (s)", "power W", series, spans=spans))
    if not panels:
        return None
    return FigureSpec("server-telemetry", "Server telemetry over the sweep", (
        "The server's KV-cache use and its running and waiting requests as sampled from /metrics during the "
        "sweep" + (", and each GPU's power draw" if any(p.title.startswith("GPU") for p in panels) else "")
        + "; the shaded spans are the cells (first request sent to last answer)."), panels, kind="telemetry")


# ---- a comparison's figures -------------------------------------------------------------------------
COMPARE_PANELS = (("output_tok_s", "aggregate output tok/s", "tok/s"),
                  ("per_user_tok_s.mean", "per-user tok/s (mean)", "tok/s"),
                  ("ttft_ms.p50", "TTFT p50", "ms"), ("ttft_ms.p99", "TTFT p99", "ms"),
                  ("tpot_ms.p50", "TPOT p50", "ms"), ("e2e_ms.p50", "E2E p50", "ms"))
MARKERS = ("o", "s", "^", "v", "D", "P")


def _compare_cache(reps: Sequence[SessionReport]) -> Path | None:
    """A comparison's figures are kept in the first session's figures/ when no session of it is running (the
    sessions are known by their reports; without them, the figures are drawn each time)."""
    if not reps or any(r.session.status == "running" for r in reps):
        return None
    return reps[0].session.path / "figures"


def _verdict(c: ComparedCell, key: str, i: int) -> Verdict:
    v = c.verdict(key, i)
    if v is None:
        return ""
    if v.startswith("not comparable"):
        return "not comparable"
    return "better" if v == "better" else "worse" if v == "worse" else "within noise" if v == "within noise" else ""


def comparison_figures(comp: Comparison, reps: Sequence[SessionReport] = ()) -> list[FigureSpec]:
    """Per workload of the cells the sessions share: each session's curves overlaid (bands: the range of its
    repeats), later sessions' points marked with their verdict; the twins' fitted values where a session has
    one (`reps`: the sessions' reports, in the comparison's order, for their twins)."""
    out: list[FigureSpec] = []
    labels = comp.labels
    cache = _compare_cache(reps)
    for w in dict.fromkeys(c.workload for c in comp.cells):
        cells = [c for c in comp.cells if c.workload == w]
        closed = [c for c in cells if c.concurrency is not None]
        cells = closed or [c for c in cells if c.rate is not None]
        kind = "concurrency" if closed else "rate"
        x_label = "concurrency (users)" if closed else "request rate (req/s)"
        if not cells:
            continue
        cells.sort(key=lambda c: float(c.concurrency) if c.concurrency is not None else (c.rate or 0.0))
        panels = []
        for key, what, unit in COMPARE_PANELS:
            if key not in {m.key for m in comp.metrics}:
                continue
            series = []
            for i, lb in enumerate(labels):
                pts, xs, lo, hi, ivs = [], [], [], [], []
                for c in cells:
                    y = c.values[key][i]
                    x = float(c.concurrency) if c.concurrency is not None else c.rate
                    if y is None or x is None:
                        continue
                    reps_v = [r.summary.value(key) for r in c.cells[i]]
                    got = [r for r in reps_v if r is not None]
                    bound = i in c.bound_in
                    verdict = _verdict(c, key, i) if i > 0 else ""
                    d = c.deltas[key][i]
                    j = (c.judgements.get(key) or [None] * (i + 1))[i]
                    vs = ""
                    if i > 0 and d is not None:
                        ci = f" {interval_pct(j.ci)}" if j is not None and j.ci is not None else ""
                        vs = f"; vs {labels[0]}: {d:+.1f}%{ci} {c.verdict(key, i) or '(no interval)'}"
                    rng = (f"; repeats {fmt_num(min(got))}-{fmt_num(max(got))} ({len(got)})" if len(got) > 1 else "")
                    pts.append(Point(x, y, f"{lb}, {c.load}: {what} = {fmt_num(y)} {unit}{rng}{vs}"
                                     + (" (client bound: not the server's figure)" if bound else ""),
                                     bound=bound, verdict=verdict))
                    if len(got) > 1:
                        xs.append(x)
                        lo.append(min(got))
                        hi.append(max(got))
                    iv = _interval(c, key, i, x, labels, what, unit)
                    if iv is not None and not bound:
                        ivs.append(iv)
                band = Band(xs, lo, hi, f"{lb}: the range of its repeats ({what})") if len(xs) >= 1 else None
                series.append(Series(lb, pts, i, marker=MARKERS[i % len(MARKERS)], band=band, intervals=ivs))
            for i, r in enumerate(reps):
                tw = twin_series(r, w, key, what, unit, i) if i < len(labels) else None
                if tw is not None:
                    tw.label = f"{labels[i]} twin"
                    series.append(tw)
            ys = [p.y for s in series for p in s.points]
            panels.append(Panel(f"{what} vs {kind}", x_label, what if unit in what else f"{what} {unit}", series,
                                log_y=unit == "ms" and _log_y(ys),
                                log_x=_log_x([p.x for s in series for p in s.points])))
        if not panels:
            continue
        first = labels[0]
        out.append(FigureSpec(f"{slug(w)}-compare", f"{w}: {' vs '.join(labels)}", (
            f"Each session's figures against load (the median of its repeats; shaded: the range of its repeats). "
            f"A ring around a point of {', '.join(labels[1:])} is its verdict against {first}: green better, "
            "red worse, grey within noise (the 95% interval of the delta includes 0, or the change is under the "
            f"minimum effect). The bar through such a point is that 95% interval, drawn about {first}'s value "
            f"({first}'s value x (1 + the interval)): a bar that reaches {first}'s point is a difference that may "
            "be 0."
            + (" Hollow grey points: client bound, not drawn as data." if any(c.bound_in for c in cells) else "")),
            panels, columns=2, workload=w, kind="compare", cache_dir=cache))
    return out


def _interval(c: ComparedCell, key: str, i: int, x: float, labels: Sequence[str], what: str,
              unit: str) -> Interval | None:
    """Session i's 95% interval of its difference from the first session at this cell, on the figure's axis."""
    j = (c.judgements.get(key) or [None] * (i + 1))[i] if i > 0 else None
    base = c.values[key][0]
    if j is None or j.ci is None or j.delta_pct is None or base is None or base <= 0:
        return None
    lo, hi = base * (1 + j.ci[0] / 100), base * (1 + j.ci[1] / 100)
    head = f"{labels[i]}, {c.load}: {what} vs {labels[0]}: {j.delta_pct:+.1f}% {interval_pct(j.ci)}"
    if f"{j.ci[0]:+.1f}" == f"{j.ci[1]:+.1f}":  # no spread (a deterministic server): nothing to draw but the point
        return Interval(x, lo, hi, head)
    return Interval(x, lo, hi, f"{head} (the 95% interval of the difference), drawn as {fmt_num(lo)}-{fmt_num(hi)} "
                               f"{unit}: {labels[0]}'s {fmt_num(base)} {unit} x (1 + the interval)")
