"""servescope.reports.figures' specs drawn as SVG (and PNG) with matplotlib's Agg backend: no display, no
browser and no network. matplotlib is the optional `plots` extra (`pip install 'servescope[plots]'`), imported
only inside the functions that draw, so nothing here costs the app or `servescope run` a thing at start-up.

A figure is laid out once, by arithmetic rather than by matplotlib's layout engines: every panel's axes has a
fixed size; the margins around it are what its tick labels, axis labels, title and legend measure. Above each
panel, in this order, are its title, its legend (never over the data) and the names of the telemetry's cell
spans; a comparison's legend is shared, under the figure's title. Labels drawn inside a panel (an SLO line's,
the knee's and the capacity's, a point's `c=4`) go where their extents hit no other text, no data marker and,
where possible, no line (servescope.reports.figlayout); a label with no such place moves into the legend.
Ticks are numbers a person writes (figlayout: whole numbers on counts, plain numbers on logarithmic axes, as
many decimals as the step needs).

Every point a figure draws carries its value in an SVG `<title>` (a browser shows it on hover) and its exact
coordinates in `data-x` / `data-y`: matplotlib draws a series' markers as `<use>` elements in point order, and
they are matched to the spec's points one for one (a figure whose markers do not match its points is an error,
never a silently wrong tooltip). Reference lines, bands, intervals, histogram bars, cell spans and legend
entries for lines not drawn carry a `<title>` too. Every id in a figure is prefixed with its name, so several
figures can share one HTML page.

A figure whose spec names a `cache_dir` (a finished session's) is drawn once and kept there
(servescope.reports.figcache), keyed by what it shows and by this code's version."""

from __future__ import annotations

import importlib.util
import io
import math
import re
import statistics
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text
from servescope.reports import figcache
from servescope.reports.figlayout import (
    Box,
    Scene,
    fmt_tick,
    hline_spots,
    linear_ticks,
    log_ticks,
    point_spots,
    spread,
    thin,
    vline_spots,
)
from servescope.reports.figures import FigureSpec, Mark, Panel, Point, Series
from servescope.sessions.views import fmt_num

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.backend_bases import RendererBase
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.text import Text
    from matplotlib.transforms import ScaledTranslation

__all__ = ["PLOTS_HINT", "Rendered", "draw", "plots_available", "render", "render_all", "require_plots"]

PLOTS_HINT = ("figures need matplotlib, the `plots` extra: pip install 'servescope[plots]' "
              "(or pip install 'matplotlib>=3.8')")
SVG_NS = "http://www.w3.org/2000/svg"
XLINK_NS = "http://www.w3.org/1999/xlink"
# Okabe and Ito's colour-blind-safe palette
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#000000", "#F0E442")
BOUND_GREY = "#8c8c8c"
VERDICT_COLOURS = {"better": "#009E73", "worse": "#D55E00", "within noise": "#8c8c8c", "not comparable": "#CC79A7"}
MARK_STYLES = {  # kind -> (colour, line style)
    "slo": ("#D55E00", (0, (5, 3))), "capacity": ("#009E73", (0, (1, 2))), "knee": ("#CC79A7", (0, (6, 2, 1, 2))),
}
OFF_SCALE = 4.0  # an SLO line more than this many times the panel's highest value is named, not drawn
PERCENTILE_STYLES = {"p50": ("#000000", "-"), "p90": ("#555555", "--"), "p99": ("#D55E00", "--")}

# the layout, in points (1/72 inch) unless named otherwise
DPI = 100  # the layout's pixels; the SVG is written at 72 per inch, the PNG at png_dpi()
PNG_MIN_PX = 1600  # a PNG is at least this wide
WIDTH_IN = (7.5, 10.5)  # one column, several
AXES_H_IN = 2.45  # a panel's plotting area
HIST_AXES_H_IN = 1.3
EDGE = 8.0  # around the figure
GAP = 4.0  # between a panel's title, legend, span names and axes
ROW_GAP = 12.0
TICK_LEN, TICK_PAD, LABEL_PAD = 3.5, 3.5, 4.0
SIZES = {"tick": 8.0, "label": 8.5, "title": 9.0, "legend": 7.5, "mark": 7.0, "span": 6.5, "suptitle": 10.5}
PX = DPI / 72.0  # pixels per point
INTERVAL_ENTRY = ": 95% interval of the difference"  # a compared series' intervals in the legend
LEGEND_HANDLE, LEGEND_PAD, LEGEND_COL_GAP, LEGEND_ROW_GAP = (k * SIZES["legend"] for k in (1.8, 0.5, 1.4, 0.3))
TICK_MARKS: dict[str, Literal[0, 1, 3]] = {"x": 3, "y": 0, "y2": 1}  # matplotlib's TICKDOWN, TICKLEFT, TICKRIGHT


def plots_available() -> bool:
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        return False


def require_plots() -> None:
    """A one-line ServescopeError saying how to install the plots extra when matplotlib is missing."""
    if not plots_available():
        raise ServescopeError(PLOTS_HINT)


@dataclass
class Rendered:
    spec: FigureSpec
    svg: str  # the <svg> element alone (for inlining); `svg_file` is the standalone document
    png: bytes | None = None

    @property
    def svg_file(self) -> str:
        return '<?xml version="1.0" encoding="utf-8" standalone="no"?>\n' + self.svg + "\n"


@dataclass
class _Tips:
    """What the drawing gave ids to, and the tooltips to write into them."""

    points: dict[str, list[Point]] = field(default_factory=dict)  # gid -> the points its markers draw, in order
    ones: dict[str, str] = field(default_factory=dict)  # gid -> the tooltip of one element
    bars: dict[str, list[str]] = field(default_factory=dict)  # gid -> one tooltip per bar
    n: int = 0

    def gid(self, kind: str) -> str:
        self.n += 1
        return f"{kind}{self.n}"


def _t(s: str) -> str:
    """Text for matplotlib: no control characters, and `$` never starts mathtext."""
    return clean_text(s).replace("$", r"\$")


@contextmanager
def _style() -> Iterator[None]:
    import matplotlib

    with matplotlib.rc_context():  # these settings last for this figure only
        matplotlib.rc("svg", fonttype="none", hashsalt="servescope")  # text as text; ids that repeat run to run
        matplotlib.rc("font", size=9, family="sans-serif", **{"sans-serif": ["DejaVu Sans"]})
        matplotlib.rc("axes", titlesize=SIZES["title"], labelsize=SIZES["label"])
        matplotlib.rc("axes.spines", top=False, right=False)
        matplotlib.rc("xtick", labelsize=SIZES["tick"])
        matplotlib.rc("ytick", labelsize=SIZES["tick"])
        matplotlib.rc("xtick.major", size=TICK_LEN, pad=TICK_PAD)
        matplotlib.rc("ytick.major", size=TICK_LEN, pad=TICK_PAD)
        matplotlib.rc("legend", fontsize=SIZES["legend"])
        yield


def png_dpi(width_in: float) -> int:
    return math.ceil(PNG_MIN_PX / width_in)


def render(spec: FigureSpec, png: bool = False) -> Rendered:
    """The figure as SVG (its points' values in <title>s), and PNG when asked; a kept drawing when the spec's
    folder has one for exactly this figure (and drawing code), else drawn now and kept there."""
    require_plots()
    key = figcache.key_of(spec) if spec.cache_dir is not None else None
    kept = figcache.load(spec, png, key)
    if kept is not None:
        return Rendered(spec, kept[0], kept[1])
    with _style():
        fig, tips = _draw(spec)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
        svg = _annotate(buf.getvalue(), tips, spec.name, spec.title)
        png_bytes = None
        if png:
            b = io.BytesIO()
            fig.savefig(b, format="png", dpi=png_dpi(fig.get_figwidth()))
            png_bytes = b.getvalue()
    figcache.store(spec, svg, png_bytes, key)
    return Rendered(spec, svg, png_bytes)


def render_all(specs: Sequence[FigureSpec], png: bool = False) -> list[Rendered]:
    return [render(s, png) for s in specs]


def draw(spec: FigureSpec) -> Figure:
    """The figure as matplotlib holds it, laid out and ready to save (an Agg canvas attached): what `render`
    writes, for a check that asks matplotlib for its texts' and markers' extents."""
    require_plots()
    with _style():
        return _draw(spec)[0]


# ---- drawing ----------------------------------------------------------------------------------------
@dataclass
class _Legend:
    """A legend laid out in rows as wide as the space it has: each entry a handle (a copy of the artist's line and
    marker) and its label, drawn as plain figure artists (matplotlib's Legend costs a layout of boxes per draw)."""

    entries: list[tuple[Artist, str, str]]  # handle, label, tooltip
    rows: list[list[tuple[int, float]]]  # per row: (entry, its x in points from the legend's left)
    row_h: float
    width: float

    @property
    def height(self) -> float:
        return len(self.rows) * self.row_h + (len(self.rows) - 1) * LEGEND_ROW_GAP


@dataclass
class _Drawn:
    """One panel as it is drawn: its axes, and what the layout and the label placement need to know of it."""

    panel: Panel
    ax: Axes
    ax2: Axes | None = None
    entries: list[tuple[Artist, str, str]] = field(default_factory=list)  # legend: handle, label, tooltip
    labels: list[tuple[Mark, str, Artist]] = field(default_factory=list)  # mark labels to place: colour, line
    point_labels: list[tuple[Axes, Point]] = field(default_factory=list)
    markers: list[tuple[Axes, float, float, float, float]] = field(default_factory=list)  # x, y, half w/h (pt)
    lines: list[tuple[Axes, list[float], list[float]]] = field(default_factory=list)
    hlines: list[tuple[Axes, float]] = field(default_factory=list)
    vlines: list[tuple[Axes, float]] = field(default_factory=list)
    notes: list[Text] = field(default_factory=list)
    span_names: list[tuple[float, str]] = field(default_factory=list)  # (centre x, name) above the axes
    hist_range: tuple[float, float] | None = None
    hist_top: float = 0.0
    axes_h: float = AXES_H_IN * 72
    ticks: dict[str, list[tuple[float, str]]] = field(default_factory=dict)  # x, y, y2 -> (value, label)
    ytick_w: float = 0.0  # widest tick label, points
    y2tick_w: float = 0.0
    top: float = 0.0  # title, legend and span names above the axes, points
    legend: _Legend | None = None
    span_h: float = 0.0
    title_h: float = 0.0
    title: Text | None = None

    @property
    def front(self) -> Axes:
        """The axes drawn last (texts go there, over both axes' lines)."""
        return self.ax2 if self.ax2 is not None else self.ax


_SIZES: dict[tuple[str, float, str], tuple[float, float]] = {}


def _measure(fig: Figure, r: RendererBase, s: str, size: float, weight: str = "normal") -> tuple[float, float]:
    """A text's width and height in points (at the layout's DPI; the same text measures the same every time)."""
    key = (s, size, weight)
    got = _SIZES.get(key)
    if got is None:
        from matplotlib.text import Text

        t = Text(0, 0, s, fontsize=size, fontweight=weight, ha="left", va="bottom")
        t.set_figure(fig)
        bb = t.get_window_extent(r)
        if len(_SIZES) > 20_000:  # a long-lived process (the app) drawing report after report
            _SIZES.clear()
        got = _SIZES[key] = (bb.width / PX, bb.height / PX)
    return got


def _wrap(fig: Figure, r: RendererBase, s: str, size: float, width: float, weight: str = "normal") -> str:
    """`s` broken at spaces into lines at most `width` points wide (a word longer than that stands alone)."""
    if _measure(fig, r, s, size, weight)[0] <= width:
        return s
    lines: list[str] = []
    cur = ""
    for word in s.split(" "):
        cand = f"{cur} {word}" if cur else word
        if cur and _measure(fig, r, cand, size, weight)[0] > width:
            lines.append(cur)
            cur = word
        else:
            cur = cand
    lines.append(cur)
    return "\n".join(lines)


def _draw(spec: FigureSpec) -> tuple[Figure, _Tips]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = max(1, len(spec.panels))
    cols = max(1, min(spec.columns, n))
    rows = math.ceil(n / cols)
    width = WIDTH_IN[1] if cols > 1 else WIDTH_IN[0]
    fig = Figure(figsize=(width, 8.0), dpi=DPI)
    renderer: Callable[[], RendererBase] = FigureCanvasAgg(fig).get_renderer
    r = renderer()
    tips = _Tips()
    drawn: list[_Drawn] = []
    for panel in spec.panels:
        d = _Drawn(panel, fig.add_axes((0.1, 0.1, 0.5, 0.5)))
        d.axes_h = (HIST_AXES_H_IN if panel.hist is not None else AXES_H_IN) * 72
        _panel(d, tips)
        drawn.append(d)
    _layout(fig, r, spec, drawn, cols, rows, width, tips)
    return fig, tips


def _panel(d: _Drawn, tips: _Tips) -> None:
    panel, ax = d.panel, d.ax
    ax.set_xlabel(_t(panel.x_label))
    ax.set_ylabel(_t(panel.y_label))
    if panel.y2_label or any(s.axis == "right" for s in panel.series):
        d.ax2 = ax.twinx()
        d.ax2.set_ylabel(_t(panel.y2_label))
        d.ax2.spines["right"].set_visible(True)
    if panel.hist is not None:
        _histogram(d, tips)
    for i, sp in enumerate(panel.spans):
        rect = ax.axvspan(sp.x0, sp.x1, color="#000000", alpha=0.09 if i % 2 else 0.04, linewidth=0)
        g = tips.gid("span")
        rect.set_gid(g)
        tips.ones[g] = sp.tip
        if len(panel.spans) <= 24:
            d.span_names.append(((sp.x0 + sp.x1) / 2, sp.label))
    bound_labelled = False
    for s in panel.series:
        target = d.ax2 if (s.axis == "right" and d.ax2 is not None) else ax
        bound_labelled = _series(d, target, s, tips, bound_labelled)
    for m in panel.marks:
        _mark(d, m, tips)
    _limits(d)
    xs = [p.x for s in panel.series for p in s.points]
    if not panel.series and panel.hist is None or panel.note and not xs and not panel.hist:
        d.notes.append(ax.text(0.5, 0.5, _t(panel.note or "no data"), transform=ax.transAxes, ha="center",
                               va="center", color="#666666"))


def _series(d: _Drawn, ax: Axes, s: Series, tips: _Tips, bound_labelled: bool) -> bool:
    from matplotlib.lines import Line2D

    colour = PALETTE[s.color % len(PALETTE)]
    data = [p for p in s.points if not p.bound]
    bound = [p for p in s.points if p.bound]
    band = s.band
    if band is not None and band.xs:
        order = sorted(range(len(band.xs)), key=lambda i: band.xs[i])
        bx = [band.xs[i] for i in order]
        g = tips.gid("band")
        if len(bx) == 1:  # one point: a short bar of its range
            ax.vlines(bx, [band.lo[order[0]]], [band.hi[order[0]]], colors=colour, alpha=0.35, linewidth=6).set_gid(g)
        else:
            ax.fill_between(bx, [band.lo[i] for i in order], [band.hi[i] for i in order], color=colour, alpha=0.16,
                            linewidth=0).set_gid(g)
        tips.ones[g] = band.tip + ": " + "; ".join(
            f"{band.xs[i]:g}: {fmt_num(band.lo[i])}-{fmt_num(band.hi[i])}" for i in order)
    style = (0, (4, 2)) if s.dashed else "-"
    by_x: dict[float, list[float]] = {}
    for p in data:  # a load measured several times (--repeat): the line runs through the median of its repeats
        by_x.setdefault(p.x, []).append(p.y)
    if s.connect and len(by_x) >= 2:
        lx, ly = list(by_x), [statistics.median(v) for v in by_x.values()]
        (line,) = ax.plot(lx, ly, color=colour, linestyle=style, linewidth=1.4 if s.marker else 1.1)
        d.lines.append((ax, lx, ly))
        if not s.marker:
            d.entries.append((line, _t(s.label), ""))
    if data:
        ms = 5.0 if s.marker else 1.6
        (art,) = ax.plot([p.x for p in data], [p.y for p in data], linestyle="none", marker=s.marker or "o",
                         markersize=ms, color=colour, markerfacecolor="white" if s.dashed else colour)
        g = tips.gid("pts")
        art.set_gid(g)
        tips.points[g] = data
        d.markers += [(ax, p.x, p.y, ms / 2 + 0.5, ms / 2 + 0.5) for p in data]
        if s.marker:
            d.entries.append((art, _t(s.label), ""))
    if bound:
        (art,) = ax.plot([p.x for p in bound], [p.y for p in bound], linestyle="none", marker=s.marker or "o",
                         markersize=6, markerfacecolor="none", markeredgecolor=BOUND_GREY)
        g = tips.gid("pts")
        art.set_gid(g)
        tips.points[g] = bound
        d.markers += [(ax, p.x, p.y, 3.5, 3.5) for p in bound]
        if not bound_labelled:
            d.entries.append((art, "client bound (not the server's figure)", ""))
        bound_labelled = True
    for verdict, colour_v in VERDICT_COLOURS.items():
        vp = [p for p in s.points if p.verdict == verdict and not p.bound]
        if not vp:
            continue
        (ring,) = ax.plot([p.x for p in vp], [p.y for p in vp], linestyle="none", marker="o", markersize=11,
                          markerfacecolor="none", markeredgecolor=colour_v, markeredgewidth=1.4)
        g = tips.gid("ring")
        ring.set_gid(g)
        tips.ones[g] = f"{s.label}: {verdict} at " + ", ".join(p.tip.split(":")[0].split(", ")[-1] for p in vp)
        d.markers += [(ax, p.x, p.y, 6.2, 6.2) for p in vp]
        d.entries.append((ring, f"{verdict} ({_t(s.label)})", ""))
    floor = min((p.y for p in s.points if p.y > 0), default=1.0) / 2
    for iv in s.intervals:
        lo = iv.lo if iv.lo > 0 or not d.panel.log_y else floor  # a log axis: from below the lowest point
        (bar,) = ax.plot([iv.x, iv.x], [lo, iv.hi], color=colour, linewidth=1.1, marker="_", markersize=7,
                         markeredgewidth=1.1)
        g = tips.gid("interval")
        bar.set_gid(g)
        tips.ones[g] = iv.tip
        d.lines.append((ax, [iv.x, iv.x], [lo, iv.hi]))
        d.markers += [(ax, iv.x, y, 3.5, 0.8) for y in (lo, iv.hi)]
    if s.intervals:
        d.entries.append((Line2D([], [], color=colour, linestyle="none", marker="|", markersize=9,
                                 markeredgewidth=1.1), f"{_t(s.label)}{INTERVAL_ENTRY}", ""))
    d.point_labels += [(ax, p) for p in s.points if p.label]
    return bound_labelled


def _mark(d: _Drawn, m: Mark, tips: _Tips) -> None:
    from matplotlib.lines import Line2D

    target = d.ax2 if (m.axis == "right" and d.ax2 is not None) else d.ax
    side_ys = [p.y for s in d.panel.series for p in s.points if (s.axis == m.axis or d.ax2 is None)]
    if m.orient == "h" and side_ys and m.at > OFF_SCALE * max(side_ys):  # far above the data: named, not drawn
        slo_colour, slo_dash = MARK_STYLES["slo"]
        d.entries.append((Line2D([], [], color=slo_colour, linestyle=slo_dash, linewidth=1.1),
                          _t(f"{m.label} (above the axis)"), m.tip))
        return
    dash: str | tuple[int, tuple[int, ...]]
    if m.kind == "percentile":
        colour, dash = PERCENTILE_STYLES.get(m.label.split()[0].rstrip(","), ("#000000", "-"))
    else:
        colour, dash = MARK_STYLES.get(m.kind, ("#000000", "--"))
    line: Line2D = (target.axhline(m.at, color=colour, linestyle=dash, linewidth=1.1) if m.orient == "h" else
                    target.axvline(m.at, color=colour, linestyle=dash, linewidth=1.1))
    g = tips.gid("mark")
    line.set_gid(g)
    tips.ones[g] = m.tip
    (d.hlines if m.orient == "h" else d.vlines).append((target, m.at))
    if m.kind == "percentile":  # several close together: named in the legend, not beside the line
        d.entries.append((line, _t(m.label), ""))
    else:
        d.labels.append((m, colour, line))


def _histogram(d: _Drawn, tips: _Tips) -> None:
    vals = d.panel.hist or []
    if not vals:
        return
    import numpy as np
    from matplotlib.patches import Rectangle

    lo, hi = min(vals), max(vals)
    wide = spread(lo, hi)
    # values that barely vary: bins over an axis 1% of their size wide (they fill one or two of them)
    bins, rng = ((max(1, min(24, len(set(vals)))), (lo, hi)) if wide == (lo, hi) else (24, wide))
    counts, edges = np.histogram(vals, bins=bins, range=rng)
    d.hist_range = rng
    d.hist_top = float(max(counts))
    g = tips.gid("bars")
    tips.bars[g] = []
    for i, n in enumerate(counts):  # each bar its own element (its tooltip); the axes' limits are set apart
        bar = Rectangle((float(edges[i]), 0.0), float(edges[i + 1] - edges[i]), float(n), facecolor=PALETTE[0],
                        alpha=0.7, edgecolor="white", linewidth=0.4)
        bar.set_gid(f"{g}-{i}")
        d.ax.add_artist(bar)
        tips.bars[g].append(f"{d.panel.hist_tip} {fmt_num(float(edges[i]))}-{fmt_num(float(edges[i + 1]))} ms: "
                            f"{int(n)} requests")


# ---- limits and ticks -----------------------------------------------------------------------------------
def _limits(d: _Drawn) -> None:
    """Each axis' range and its y ticks (the x ticks wait for the panel's width: `_x_ticks`)."""
    panel, ax = d.panel, d.ax
    xs = [p.x for s in panel.series for p in s.points]
    xs += [x for s in panel.series if s.band is not None for x in s.band.xs]
    xs += [sp for s in panel.spans for sp in (s.x0, s.x1)]
    xs += [m.at for m in panel.marks if m.orient == "v" and m.kind != "percentile"]
    if d.hist_range is not None:
        xs += [*d.hist_range, *(m.at for m in panel.marks if m.orient == "v")]
    xs = [x for x in xs if math.isfinite(x)]
    log_x = panel.log_x and bool(xs) and min(xs) > 0
    if log_x:
        ax.set_xscale("log")
    if xs:
        lo, hi = min(xs), max(xs)
        if log_x:
            f = (hi / lo) ** 0.04 if hi > lo else 1.25
            ax.set_xlim(lo / f, hi * f)
        else:
            lo, hi = spread(lo, hi) if d.hist_range is None and not panel.spans else (lo, hi)
            pad = (hi - lo) * (0.02 if d.hist_range is not None else 0.04) if hi > lo else max(abs(lo) * 0.1, 0.5)
            ax.set_xlim(lo - pad, hi + pad)
    else:
        ax.set_xlim(0, 1)
    for a, side in ((ax, "left"), (d.ax2, "right")):
        if a is None:
            continue
        mine = [s for s in panel.series if s.axis == side or (side == "left" and d.ax2 is None)]
        ys = [p.y for s in mine for p in s.points]
        drawn_ys = list(ys)
        ys += [m.at for m in panel.marks if m.orient == "h" and m.axis == side
               and not (drawn_ys and m.at > OFF_SCALE * max(drawn_ys))]
        ys += [y for s in mine if s.band is not None for y in (*s.band.lo, *s.band.hi)]
        ys += [y for s in mine for iv in s.intervals for y in (iv.lo, iv.hi)]
        if d.hist_range is not None:
            ys = [0.0, d.hist_top]
        ys = [y for y in ys if math.isfinite(y)]
        log = panel.log_y and side == "left" and bool(ys) and min(ys) > 0
        target = max(4, round(d.axes_h / 36))
        if log:
            a.set_yscale("log")
            lo, hi = min(ys), max(ys)
            f = (hi / lo) ** 0.06 if hi > lo else 1.25
            a.set_ylim(lo / f, hi * f)
            ticks, dec = log_ticks(lo / f, hi * f)
        else:
            if not ys:
                lo, hi = 0.0, 1.0
            elif min(ys) >= 0:
                lo, hi = 0.0, (max(ys) * 1.12 if max(ys) > 0 else 1.0)
            else:
                lo, hi = spread(min(ys), max(ys))
                pad = (hi - lo) * 0.08
                lo, hi = lo - pad, hi + pad
            a.set_ylim(lo, hi)
            ticks, dec = linear_ticks(lo, hi, target, integer=panel.y_integer or d.hist_range is not None)
        d.ticks["y" if side == "left" else "y2"] = [(t, fmt_tick(t, dec)) for t in ticks]


def _x_ticks(fig: Figure, r: RendererBase, d: _Drawn, bounds: tuple[float, float]) -> None:
    """The x ticks for the panel's width: the load levels themselves (up to 12), else round steps; labels that
    would overlap another or leave the panel's column are left unwritten."""
    panel, ax = d.panel, d.ax
    lo, hi = ax.get_xlim()
    levels = sorted({p.x for s in panel.series for p in s.points})
    aw = ax.bbox.width / PX
    if panel.x_label.startswith(("concurrency", "request rate")) and 1 <= len(levels) <= 12:
        ticks, labels = levels, [fmt_tick(x) for x in levels]
    elif ax.get_xscale() == "log":
        ticks, dec = log_ticks(lo, hi)
        labels = [fmt_tick(t, dec) for t in ticks]
    else:
        ticks, dec = linear_ticks(lo, hi, max(3, round(aw / 70)), integer=panel.x_integer)
        labels = [fmt_tick(t, dec) for t in ticks]
    pos = [float(ax.transData.transform((t, 0))[0]) / PX for t in ticks]
    widths = [_measure(fig, r, s, SIZES["tick"])[0] for s in labels]
    keep = thin(pos, widths, 4.0)
    labels = [s if k and bounds[0] <= p - w / 2 and p + w / 2 <= bounds[1] else ""
              for s, k, p, w in zip(labels, keep, pos, widths, strict=True)]
    d.ticks["x"] = list(zip(ticks, labels, strict=True))


# ---- layout -------------------------------------------------------------------------------------------
def _tick_width(fig: Figure, r: RendererBase, ticks: Sequence[tuple[float, str]]) -> float:
    return max((_measure(fig, r, label, SIZES["tick"])[0] for _, label in ticks), default=0.0)


def _draw_ticks(fig: Figure, d: _Drawn, tips: _Tips) -> None:
    """Each axis' ticks drawn as three artists (its tick marks as one line of markers, its grid as one line, its
    labels as texts) instead of matplotlib's five artists per tick: the same picture, a third of the drawing."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullLocator
    from matplotlib.transforms import blended_transform_factory, offset_copy

    for a in (d.ax, d.ax2):
        if a is not None:
            for axis in (a.xaxis, a.yaxis):
                axis.set_major_locator(NullLocator())
                axis.set_minor_locator(NullLocator())
    off = TICK_LEN + TICK_PAD
    for which, ticks in d.ticks.items():
        a = d.ax2 if which == "y2" and d.ax2 is not None else d.ax
        if not ticks:
            continue
        vals = [t for t, _ in ticks]
        if which == "x":
            trans = blended_transform_factory(a.transData, a.transAxes)
            marks, grid = (vals, [0.0] * len(vals)), ([v for t in vals for v in (t, t, math.nan)],
                                                      [v for _ in vals for v in (0.0, 1.0, math.nan)])
            marker, dx, dy, ha, va = TICK_MARKS["x"], 0.0, -off, "center", "top"
        else:
            trans = blended_transform_factory(a.transAxes, a.transData)
            edge = 1.0 if which == "y2" else 0.0
            marks, grid = ([edge] * len(vals), vals), ([v for _ in vals for v in (0.0, 1.0, math.nan)],
                                                       [v for t in vals for v in (t, t, math.nan)])
            marker, dx, dy, ha, va = ((TICK_MARKS["y2"], off, 0.0, "left", "center") if which == "y2" else
                                      (TICK_MARKS["y"], -off, 0.0, "right", "center"))
        if which != "y2":
            a.add_artist(Line2D(*grid, transform=trans, color="#b0b0b0", alpha=0.25, linewidth=0.6, zorder=0.5))
        a.add_artist(Line2D(*marks, transform=trans, marker=marker, markersize=TICK_LEN, markeredgewidth=0.8,
                            linestyle="none", color="#000000", clip_on=False))
        at = offset_copy(trans, fig=fig, x=dx, y=dy, units="points")
        for v, label in ticks:
            if label:
                a.text(v if which == "x" else marks[0][0], 0.0 if which == "x" else v, label, transform=at, ha=ha,
                       va=va, fontsize=SIZES["tick"], clip_on=False, gid=tips.gid(f"tick-{which}-"))


def _layout(fig: Figure, r: RendererBase, spec: FigureSpec, drawn: list[_Drawn], cols: int, rows: int,
            width: float, tips: _Tips) -> None:
    from matplotlib.transforms import BboxTransformTo, ScaledTranslation

    W = width * 72
    tick_h = _measure(fig, r, "0123456789", SIZES["tick"])[1]
    label_h = _measure(fig, r, "Ag", SIZES["label"])[1]
    below = TICK_LEN + TICK_PAD + tick_h + LABEL_PAD + label_h  # under a panel's axes
    # across: each column as wide as the widest tick labels and axis labels of its panels need
    colw = W / cols
    for d in drawn:
        d.ytick_w = _tick_width(fig, r, d.ticks.get("y", []))
        d.y2tick_w = _tick_width(fig, r, d.ticks.get("y2", []))
    left: list[float] = []
    right: list[float] = []
    for c in range(cols):
        mine = drawn[c::cols]
        yl = max((d.ax.yaxis.label.get_window_extent(r).width / PX for d in mine if d.panel.y_label), default=0.0)
        left.append(EDGE + yl + LABEL_PAD + max((d.ytick_w for d in mine), default=0.0) + TICK_PAD + TICK_LEN)
        twins = [d for d in mine if d.ax2 is not None]
        if twins:
            y2 = max((d.ax2.yaxis.label.get_window_extent(r).width / PX for d in twins if d.ax2 is not None),
                     default=0.0)
            right.append(TICK_LEN + TICK_PAD + max(d.y2tick_w for d in twins) + LABEL_PAD + y2 + EDGE)
        else:
            right.append(2 * EDGE)
    # a first, provisional stacking: only sizes matter to where labels go inside a panel
    _stack(fig, drawn, cols, rows, W, colw, left, right, below, sup_h=0.0, legend_h=0.0)
    for i, d in enumerate(drawn):
        c = i % cols
        _x_ticks(fig, r, d, (c * colw + EDGE / 2, (c + 1) * colw - 2.0))
    for d in drawn:
        _place_labels(fig, r, d)
    # above each panel: its title, its legend (or the figure's one legend), the names of its spans
    shared = spec.kind == "compare"
    fig_entries: list[tuple[Artist, str, str]] = []
    if shared:  # the sessions, then the verdicts' rings, then the intervals, then the rest
        seen: set[str] = set()
        for d in drawn:
            for e in d.entries:
                if e[1] not in seen:
                    seen.add(e[1])
                    fig_entries.append(e)
        fig_entries.sort(key=lambda e: 1 if e[1].startswith(tuple(f"{v} (" for v in VERDICT_COLOURS)) else
                         2 if e[1].endswith(INTERVAL_ENTRY) else 3 if e[1].startswith("client bound") else 0)
    for i, d in enumerate(drawn):
        c = i % cols
        avail = (c + 1) * colw - EDGE - (c * colw + left[c])
        t = d.ax.set_title(_wrap(fig, r, _t(d.panel.title), SIZES["title"], avail), loc="left", pad=0, y=1.0,
                           va="bottom", fontsize=SIZES["title"])
        d.title = t
        d.title_h = t.get_window_extent(r).height / PX
        if not shared and d.entries:
            d.legend = _legend(fig, r, d.entries, avail)
        if d.span_names:
            d.span_h = _measure(fig, r, "Ag", SIZES["span"])[1]
        d.top = (d.title_h + GAP + (d.legend.height + GAP if d.legend is not None else 0.0)
                 + (d.span_h + GAP if d.span_h else 0.0))
    sup = fig.suptitle(_wrap(fig, r, _t(spec.title), SIZES["suptitle"], W - 2 * EDGE, "bold"),
                       fontsize=SIZES["suptitle"], fontweight="bold", va="top")
    sup_h = sup.get_window_extent(r).height / PX
    fig_legend = _legend(fig, r, fig_entries, W - 2 * EDGE) if shared and fig_entries else None
    _stack(fig, drawn, cols, rows, W, colw, left, right, below, sup_h=sup_h,
           legend_h=fig_legend.height if fig_legend is not None else 0.0)
    # everything above and beside the axes, in the axes' own fractions (they keep their size from here on)
    H = fig.get_figheight() * 72
    sup.set_y(1 - EDGE / H)
    if fig_legend is not None:
        _draw_legend(fig, fig_legend, ScaledTranslation((W - fig_legend.width) / 2 / W,
                                                        1 - (EDGE + sup_h + 2 * GAP) / H, BboxTransformTo(fig.bbox)),
                     tips)
    for i, d in enumerate(drawn):
        c = i % cols
        aw, ah = d.ax.bbox.width / PX, d.ax.bbox.height / PX
        d.ax.xaxis.set_label_coords(0.5, -(TICK_LEN + TICK_PAD + tick_h + LABEL_PAD) / ah)
        ytw = max(dd.ytick_w for dd in drawn[c::cols])
        d.ax.yaxis.set_label_coords(-(TICK_LEN + TICK_PAD + ytw + LABEL_PAD) / aw, 0.5)
        if d.ax2 is not None:
            y2w = max(dd.y2tick_w for dd in drawn[c::cols])
            d.ax2.yaxis.set_label_coords(1 + (TICK_LEN + TICK_PAD + y2w + LABEL_PAD) / aw, 0.5)
        y = 1 + GAP / ah
        if d.span_names:
            _span_names(fig, r, d, y)
            y += (d.span_h + GAP) / ah
        if d.legend is not None:
            y += d.legend.height / ah
            _draw_legend(fig, d.legend, ScaledTranslation(0.0, y, BboxTransformTo(d.ax.bbox)), tips)
            y += GAP / ah
        if d.title is not None:
            d.title.set_y(y)
        _draw_ticks(fig, d, tips)


def _stack(fig: Figure, drawn: list[_Drawn], cols: int, rows: int, W: float, colw: float, left: list[float],
           right: list[float], below: float, sup_h: float, legend_h: float) -> None:
    """Size the figure to its rows and put each panel's axes in place (points from the top, then fractions)."""
    heights = []
    for row in range(rows):
        mine = drawn[row * cols:(row + 1) * cols]
        heights.append((max((d.top for d in mine), default=0.0), max((d.axes_h for d in mine), default=0.0)))
    head = EDGE + sup_h + GAP + (legend_h + 3 * GAP if legend_h else 0.0)
    H = head + sum(top + ah + below for top, ah in heights) + ROW_GAP * (rows - 1) + EDGE
    fig.set_size_inches(W / 72, H / 72)
    y = head
    for row, (top, ah) in enumerate(heights):
        y += top
        for c, d in enumerate(drawn[row * cols:(row + 1) * cols]):
            x0 = c * colw + left[c]
            aw = colw - left[c] - right[c]
            box = (x0 / W, 1 - (y + d.axes_h) / H, aw / W, d.axes_h / H)
            d.ax.set_position(box)
            if d.ax2 is not None:
                d.ax2.set_position(box)
        y += ah + below + ROW_GAP


def _legend(fig: Figure, r: RendererBase, entries: Sequence[tuple[Artist, str, str]], avail: float) -> _Legend:
    """The entries in rows no wider than `avail` points (the panel's width, or the figure's)."""
    size = SIZES["legend"]
    rows: list[list[tuple[int, float]]] = [[]]
    x = width = 0.0
    for i, (_, label, _) in enumerate(entries):
        w = LEGEND_HANDLE + LEGEND_PAD + _measure(fig, r, label, size)[0]
        if rows[-1] and x + w > avail:
            rows.append([])
            x = 0.0
        rows[-1].append((i, x))
        width = max(width, x + w)
        x += w + LEGEND_COL_GAP
    return _Legend(list(entries), rows, _measure(fig, r, "Ag", size)[1], width)


def _draw_legend(fig: Figure, leg: _Legend, top_left: ScaledTranslation, tips: _Tips) -> None:
    """Draw the legend with its top left corner at `top_left` (positions below are in inches from there)."""
    from matplotlib.lines import Line2D

    at = fig.dpi_scale_trans + top_left
    for k, row in enumerate(leg.rows):
        y = -(k * (leg.row_h + LEGEND_ROW_GAP) + leg.row_h / 2) / 72
        for i, x in row:
            src, label, tip = leg.entries[i]
            x0, x1 = x / 72, (x + LEGEND_HANDLE) / 72
            if isinstance(src, Line2D):
                for xs, line in (([x0, x1], True), ([(x0 + x1) / 2], False)):
                    h = Line2D(xs, [y] * len(xs))
                    h.update_from(src)
                    if line and src.get_linestyle() in ("None", "none", "", " "):
                        continue
                    if line:
                        h.set_marker("None")
                    else:
                        h.set_linestyle("None")
                        if src.get_marker() in (None, "None", "none", "", " "):
                            continue
                    h.set_transform(at)
                    h.set_clip_on(False)
                    h.set_gid(None)
                    h.set_label("")
                    fig.add_artist(h)
            t = fig.text(x1 + LEGEND_PAD / 72, y, label, transform=at, ha="left", va="center",
                         fontsize=SIZES["legend"])
            if tip:
                g = tips.gid("entry")
                t.set_gid(g)
                tips.ones[g] = tip


def _span_names(fig: Figure, r: RendererBase, d: _Drawn, y: float) -> None:
    """The cells' names over their spans, above the axes; a name that would overlap the last one, or leave the
    axes' width, is left out (each span's tooltip names it)."""
    ax = d.ax
    x0, x1 = ax.bbox.x0 / PX, ax.bbox.x1 / PX
    pos = [float(ax.transData.transform((x, 0))[0]) / PX for x, _ in d.span_names]
    widths = [_measure(fig, r, _t(name), SIZES["span"])[0] for _, name in d.span_names]
    keep = thin(pos, widths, 3.0)
    for (x, name), k, p, w in zip(d.span_names, keep, pos, widths, strict=True):
        if k and x0 <= p - w / 2 and p + w / 2 <= x1:
            ax.annotate(_t(name), xy=(x, y), xycoords=("data", "axes fraction"), ha="center", va="bottom",
                        fontsize=SIZES["span"], color="#444444", annotation_clip=False)


# ---- labels inside a panel ----------------------------------------------------------------------------
def _scene(fig: Figure, r: RendererBase, d: _Drawn) -> Scene:
    """What the panel shows, in display pixels: its markers and texts (never covered), its lines."""
    b = d.ax.bbox
    sc = Scene((b.x0 + 2, b.y0 + 2, b.x1 - 2, b.y1 - 2))
    for a, x, y, hw, hh in d.markers:
        X, Y = a.transData.transform((x, y))
        if math.isfinite(X) and math.isfinite(Y):
            sc.hard.append((X - hw * PX, Y - hh * PX, X + hw * PX, Y + hh * PX))
    for t in d.notes:
        sc.hard.append(tuple(t.get_window_extent(r).extents))  # type: ignore[arg-type]
    for a, xs, ys in d.lines:
        sc.add_polyline((float(p[0]), float(p[1])) for p in a.transData.transform(list(zip(xs, ys, strict=True))))
    for a, at in d.hlines:
        Y = float(a.transData.transform((1.0, at))[1])
        sc.lines.append((b.x0, Y, b.x1, Y))
    for a, at in d.vlines:
        X = float(a.transData.transform((at, 1.0))[0])
        sc.lines.append((X, b.y0, X, b.y1))
    return sc


def _place_labels(fig: Figure, r: RendererBase, d: _Drawn) -> None:
    """The reference lines' labels, then the points' labels, each where it hits nothing; a line's label with no
    such place goes into the legend (a point's is left to its tooltip)."""
    if not d.labels and not d.point_labels:
        return
    sc = _scene(fig, r, d)
    gap = 3.0 * PX
    for m, colour, line in d.labels:
        w, h = (v * PX for v in _measure(fig, r, _t(m.label), SIZES["mark"]))
        a = d.ax2 if (m.axis == "right" and d.ax2 is not None) else d.ax
        if m.orient == "h":
            spots = hline_spots(float(a.transData.transform((1.0, m.at))[1]), sc.frame, w, h, gap)
        else:
            spots = vline_spots(float(a.transData.transform((m.at, 1.0))[0]), sc.frame, w, h, gap)
        i = sc.choose(spots)
        if i is None:
            d.entries.append((line, _t(m.label), ""))
            continue
        _put(r, d, sc, spots[i], _t(m.label), colour)
    for a, p in d.point_labels:
        X, Y = (float(v) for v in a.transData.transform((p.x, p.y)))
        w, h = (v * PX for v in _measure(fig, r, _t(p.label), SIZES["mark"]))
        spots = point_spots(X, Y, w, h, 3.0 * PX)
        i = sc.choose(spots)
        if i is not None:
            _put(r, d, sc, spots[i], _t(p.label), "#333333")


def _put(r: RendererBase, d: _Drawn, sc: Scene, box: Box, text: str, colour: str) -> None:
    fx, fy = d.ax.transAxes.inverted().transform((box[0], box[1]))
    t = d.front.annotate(text, xy=(float(fx), float(fy)), xycoords="axes fraction", ha="left", va="bottom",
                         fontsize=SIZES["mark"], color=colour, annotation_clip=False)
    sc.hard.append(tuple(t.get_window_extent(r).extents))  # type: ignore[arg-type]


# ---- tooltips into the SVG --------------------------------------------------------------------------
def _q(tag: str) -> str:
    return f"{{{SVG_NS}}}{tag}"


def _title(text: str) -> ET.Element:
    t = ET.Element(_q("title"))
    t.text = clean_text(text)
    return t


def _annotate(svg: str, tips: _Tips, name: str, title: str) -> str:
    """Write the tooltips into matplotlib's SVG and prefix its ids with the figure's name."""
    ET.register_namespace("", SVG_NS)
    ET.register_namespace("xlink", XLINK_NS)
    root = ET.fromstring(svg)
    for meta in root.findall(_q("metadata")):  # matplotlib's RDF names URLs: nothing a reader needs
        root.remove(meta)
    by_id = {el.get("id"): el for el in root.iter() if el.get("id")}
    for gid, pts in tips.points.items():
        g = by_id.get(gid)
        if g is None:
            raise ServescopeError(f"figure {name}: its points ({gid}) are missing from the SVG")
        uses = list(g.iter(_q("use")))
        if len(uses) != len(pts):
            raise ServescopeError(f"figure {name}: {len(uses)} markers drawn for {len(pts)} points")
        for u, p in zip(uses, pts, strict=True):
            u.append(_title(p.tip))
            u.set("class", "pt" + (" bound" if p.bound else ""))
            u.set("data-x", repr(float(p.x)))
            u.set("data-y", repr(float(p.y)))
    for gid, tip in tips.ones.items():
        el = by_id.get(gid)
        if el is not None:
            el.insert(0, _title(tip))
    for gid, bar_tips in tips.bars.items():
        for i, tip in enumerate(bar_tips):
            el = by_id.get(f"{gid}-{i}")
            if el is not None:
                el.insert(0, _title(tip))
                el.set("class", "bar")
    prefix = re.sub(r"[^A-Za-z0-9_-]", "-", name)
    ren = {old: f"{prefix}-{old}" for old in by_id if old}
    href = f"{{{XLINK_NS}}}href"
    for el in root.iter():
        for k, v in list(el.attrib.items()):
            if k == "id" and v in ren:
                el.set(k, ren[v])
            elif k in (href, "href") and v.startswith("#") and v[1:] in ren:
                el.set(k, "#" + ren[v[1:]])
            elif "url(#" in v:
                el.set(k, re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{ren.get(m[1], m[1])})", v))
    root.set("class", "figure")
    root.set("role", "img")
    root.insert(0, _title(title))
    return ET.tostring(root, encoding="unicode")
