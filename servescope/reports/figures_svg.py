"""servescope.reports.figures' specs drawn as SVG (and PNG) with matplotlib's Agg backend: no display, no
browser and no network. matplotlib is the optional `plots` extra (`pip install 'servescope[plots]'`), imported
only inside the functions that draw, so nothing here costs the app or `servescope run` a thing at start-up.

Every point a figure draws carries its value in an SVG `<title>` (a browser shows it on hover) and its exact
coordinates in `data-x` / `data-y`: matplotlib draws a series' markers as `<use>` elements in point order, and
they are matched to the spec's points one for one (a figure whose markers do not match its points is an error,
never a silently wrong tooltip). Reference lines, bands, histogram bars and cell spans carry a `<title>` too.
Every id in a figure is prefixed with its name, so several figures can share one HTML page."""

from __future__ import annotations

import io
import math
import re
import statistics
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text
from servescope.reports.figures import FigureSpec, Panel, Point, Series
from servescope.sessions.views import fmt_num

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["PLOTS_HINT", "Rendered", "plots_available", "render", "require_plots"]

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


def plots_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


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


def render(spec: FigureSpec, png: bool = False) -> Rendered:
    """The figure as SVG (its points' values in <title>s), and PNG when asked."""
    require_plots()
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    with matplotlib.rc_context():  # these settings last for this figure only
        matplotlib.rc("svg", fonttype="none", hashsalt="servescope")  # text as text; ids that repeat run to run
        matplotlib.rc("font", size=9, family="sans-serif", **{"sans-serif": ["DejaVu Sans"]})
        matplotlib.rc("axes", titlesize=9, labelsize=8.5)
        matplotlib.rc("axes.spines", top=False, right=False)
        matplotlib.rc("xtick", labelsize=8)
        matplotlib.rc("ytick", labelsize=8)
        matplotlib.rc("legend", fontsize=7.5)
        cols = max(1, spec.columns)
        rows = math.ceil(len(spec.panels) / cols)
        hist = all(p.hist is not None for p in spec.panels)
        width = 10.5 if cols > 1 else 7.5
        height = (2.1 if hist else 3.6) * rows + 0.6
        fig = Figure(figsize=(width, height), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(rows, cols, squeeze=False)
        tips = _Tips()
        for i, ax in enumerate(axes.flat):
            if i >= len(spec.panels):
                ax.set_visible(False)
                continue
            _panel(ax, spec.panels[i], tips, legend=(i == 0 or spec.kind != "compare"),
                   also=_verdict_keys(spec) if i == 0 and spec.kind == "compare" else ())
        fig.suptitle(_t(spec.title), fontsize=10.5, fontweight="bold")
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None})
        svg = _annotate(buf.getvalue(), tips, spec.name, spec.title)
        png_bytes = None
        if png:
            b = io.BytesIO()
            fig.savefig(b, format="png", dpi=110)
            png_bytes = b.getvalue()
    return Rendered(spec, svg, png_bytes)


def render_all(specs: Sequence[FigureSpec], png: bool = False) -> list[Rendered]:
    return [render(s, png) for s in specs]


# ---- drawing ----------------------------------------------------------------------------------------
def _verdict_keys(spec: FigureSpec) -> list[tuple[str, str]]:
    """(verdict, series label) of every ring the figure draws: the one legend (the first panel's) names them all."""
    out: dict[tuple[str, str], None] = {}
    for pan in spec.panels:
        for s in pan.series:
            for p in s.points:
                if p.verdict and not p.bound:
                    out[(p.verdict, s.label)] = None
    return list(out)


def _panel(ax: Axes, panel: Panel, tips: _Tips, legend: bool, also: Sequence[tuple[str, str]] = ()) -> None:
    from matplotlib.lines import Line2D

    ax.set_title(_t(panel.title), loc="left")
    ax.set_xlabel(_t(panel.x_label))
    ax.set_ylabel(_t(panel.y_label))
    ax.grid(True, alpha=0.25, linewidth=0.6)
    ax2 = None
    if panel.y2_label or any(s.axis == "right" for s in panel.series):
        ax2 = ax.twinx()
        ax2.set_ylabel(_t(panel.y2_label))
        ax2.spines["right"].set_visible(True)
    if panel.hist is not None:
        _histogram(ax, panel, tips)
    for i, sp in enumerate(panel.spans):
        r = ax.axvspan(sp.x0, sp.x1, color="#000000", alpha=0.09 if i % 2 else 0.04, linewidth=0)
        g = tips.gid("span")
        r.set_gid(g)
        tips.ones[g] = sp.tip
        if len(panel.spans) <= 24 and (sp.x1 - sp.x0) >= 0.035 * (panel.spans[-1].x1 - panel.spans[0].x0):
            ax.annotate(_t(sp.label), xy=((sp.x0 + sp.x1) / 2, 1.0), xycoords=("data", "axes fraction"),
                        ha="center", va="top", fontsize=6.5, color="#444444")
    bound_labelled = False
    for s in panel.series:
        target = ax2 if (s.axis == "right" and ax2 is not None) else ax
        bound_labelled = _series(target, s, tips, bound_labelled)
    for m in panel.marks:
        target = ax2 if (m.axis == "right" and ax2 is not None) else ax
        side_ys = [p.y for s in panel.series for p in s.points if (s.axis == m.axis or ax2 is None)]
        if m.orient == "h" and side_ys and m.at > OFF_SCALE * max(side_ys):  # far above the data: said, not drawn
            txt = target.annotate(_t(f"{m.label} (above the axis)"), xy=(0.5, 0.99), xycoords="axes fraction",
                                  ha="center", va="top", fontsize=7, color=MARK_STYLES["slo"][0])
            g = tips.gid("mark")
            txt.set_gid(g)
            tips.ones[g] = m.tip
            continue
        colour: str
        style: str | tuple[int, tuple[int, ...]]
        if m.kind == "percentile":
            colour, style = PERCENTILE_STYLES.get(m.label.split()[0], ("#000000", "-"))
        else:
            colour, style = MARK_STYLES.get(m.kind, ("#000000", "--"))
        line = (target.axhline(m.at, color=colour, linestyle=style, linewidth=1.1) if m.orient == "h" else
                target.axvline(m.at, color=colour, linestyle=style, linewidth=1.1))
        g = tips.gid("mark")
        line.set_gid(g)
        tips.ones[g] = m.tip
        if m.kind == "percentile":  # several close together: named in the legend, not beside the line
            line.set_label(_t(m.label))
        elif m.orient == "h":
            target.annotate(_t(m.label), xy=(0.99, m.at), xycoords=("axes fraction", "data"), ha="right",
                            va="bottom", fontsize=7, color=colour)
        else:  # the knee's label left of its line, the capacity's right of it: they may share a level
            target.annotate(_t(m.label), xy=(m.at, 0.98), xycoords=("data", "axes fraction"),
                            ha="left" if m.kind == "capacity" else "right", va="top", fontsize=7, color=colour,
                            rotation=90)
    xs = [p.x for s in panel.series for p in s.points]
    if panel.log_x and xs and min(xs) > 0:
        ax.set_xscale("log")
    if panel.x_label.startswith(("concurrency", "request rate")) and xs:
        levels = sorted(set(xs))
        if len(levels) <= 12:
            ax.set_xticks(levels)
            ax.set_xticklabels([f"{x:g}" for x in levels])
            ax.minorticks_off()
    for a, side in ((ax, "left"), (ax2, "right")):
        if a is None:
            continue
        ys = [p.y for s in panel.series if (s.axis == side or (side == "left" and ax2 is None)) for p in s.points]
        ys += [m.at for m in panel.marks if m.orient == "h" and m.axis == side
               and not (ys and m.at > OFF_SCALE * max(ys))]
        ys += [y for s in panel.series if s.band is not None and (s.axis == side or (side == "left" and ax2 is None))
               for y in (*s.band.lo, *s.band.hi)]
        if panel.log_y and ys and min(ys) > 0 and side == "left":
            a.set_yscale("log")
        elif ys and min(ys) >= 0 and panel.hist is None:
            a.set_ylim(bottom=0, top=max(ys) * 1.12 if max(ys) > 0 else 1.0)
    if not panel.series and panel.hist is None or panel.note and not xs and not panel.hist:
        ax.text(0.5, 0.5, _t(panel.note or "no data"), transform=ax.transAxes, ha="center", va="center",
                color="#666666")
    if legend:
        handles, labels = ax.get_legend_handles_labels()
        if ax2 is not None:
            h2, l2 = ax2.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
        for verdict, series in also:  # rings drawn only in other panels
            lb = f"{verdict} ({_t(series)})"
            if lb not in labels:
                labels.append(lb)
                handles.append(Line2D([], [], linestyle="none", marker="o", markersize=11, markerfacecolor="none",
                                      markeredgecolor=VERDICT_COLOURS[verdict], markeredgewidth=1.4))
        if handles:
            ax.legend(handles, labels, loc="best", framealpha=0.85)


def _series(ax: Axes, s: Series, tips: _Tips, bound_labelled: bool) -> bool:
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
        ax.plot(list(by_x), [statistics.median(v) for v in by_x.values()], color=colour, linestyle=style,
                linewidth=1.4 if s.marker else 1.1, label=_t(s.label) if not s.marker else None)
    if data:
        ms = 5.0 if s.marker else 1.6
        (art,) = ax.plot([p.x for p in data], [p.y for p in data], linestyle="none", marker=s.marker or "o",
                         markersize=ms, color=colour, markerfacecolor="white" if s.dashed else colour,
                         label=_t(s.label) if s.marker else None)
        g = tips.gid("pts")
        art.set_gid(g)
        tips.points[g] = data
    if bound:
        (art,) = ax.plot([p.x for p in bound], [p.y for p in bound], linestyle="none", marker=s.marker or "o",
                         markersize=6, markerfacecolor="none", markeredgecolor=BOUND_GREY,
                         label=None if bound_labelled else "client bound (not the server's figure)")
        g = tips.gid("pts")
        art.set_gid(g)
        tips.points[g] = bound
        bound_labelled = True
    for verdict, colour_v in VERDICT_COLOURS.items():
        vp = [p for p in s.points if p.verdict == verdict and not p.bound]
        if not vp:
            continue
        (ring,) = ax.plot([p.x for p in vp], [p.y for p in vp], linestyle="none", marker="o", markersize=11,
                          markerfacecolor="none", markeredgecolor=colour_v, markeredgewidth=1.4,
                          label=f"{verdict} ({_t(s.label)})")
        g = tips.gid("ring")
        ring.set_gid(g)
        tips.ones[g] = f"{s.label}: {verdict} at " + ", ".join(p.tip.split(":")[0].split(", ")[-1] for p in vp)
    for p in s.points:
        if p.label:
            ax.annotate(_t(p.label), (p.x, p.y), textcoords="offset points", xytext=(5, 4), fontsize=7,
                        color="#333333")
    return bound_labelled


def _histogram(ax: Axes, panel: Panel, tips: _Tips) -> None:
    vals = panel.hist or []
    if not vals:
        return
    from matplotlib.container import BarContainer

    lo, hi = min(vals), max(vals)
    pad = max(abs(hi) * 0.01, 0.01)
    # values all (nearly) equal: one bar around them (numpy cannot split a range of a few ulps into bins)
    bins, rng = ((max(1, min(24, len(set(vals)))), (lo, hi)) if hi - lo > max(abs(hi), 1.0) * 1e-6 else
                 (1, (lo - pad, hi + pad)))
    counts, edges, patches = ax.hist(vals, bins=bins, range=rng, color=PALETTE[0], alpha=0.7, edgecolor="white",
                                     linewidth=0.4)
    g = tips.gid("bars")
    tips.bars[g] = []
    for i, patch in enumerate(patches if isinstance(patches, BarContainer) else []):
        patch.set_gid(f"{g}-{i}")
        tips.bars[g].append(f"{panel.hist_tip} {fmt_num(float(edges[i]))}-{fmt_num(float(edges[i + 1]))} ms: "
                            f"{int(counts[i])} requests")


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
