"""A latency histogram drawn with unicode block characters: cheap enough to redraw several times a second,
readable without colour (p50 and p99 are marked with characters, not only with colour).

Where the markers go: the `▲` of p50 and of p99 always sits in a column of the bin that holds that
percentile (`Bins.column_of`), whatever else is on the axis line. When a label (the minimum, the maximum,
its unit) would touch a marker, the label gives way, never the marker (see `axis_tokens`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.reactive import reactive

from servescope.tui.widgets.zoom import Zoomable

BLOCKS = " ▁▂▃▄▅▆▇█"


def percentile(sorted_values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile of sorted values (the same interpolation polars uses)."""
    n = len(sorted_values)
    if n == 0:
        return math.nan
    if n == 1:
        return float(sorted_values[0])
    pos = (n - 1) * p / 100
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    return float(sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo))


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "-"
    if v >= 10_000:
        return f"{v / 1000:.1f}k"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


@dataclass(frozen=True)
class Bins:
    """The histogram's geometry: `nbins` equal bins over [lo, hi] drawn across `width` columns (nbins <= width).

    Bin i holds the values v with lo + i*step <= v < lo + (i+1)*step (step = (hi - lo) / nbins); values below
    lo land in the first bin, values at or beyond hi in the last. Column c draws bin c*nbins // width, so a
    bin is one column wide or several adjacent ones."""

    lo: float
    hi: float
    nbins: int
    width: int

    @classmethod
    def for_values(cls, sorted_values: Sequence[float], width: int) -> Bins:
        """The bins the widget draws for these (sorted, non-empty) values: from the minimum to p99.5 (to the
        maximum for 20 values or fewer), so one outlier does not squash the picture; few values get fewer,
        wider bins, many get one bin per column."""
        lo = float(sorted_values[0])
        hi = percentile(sorted_values, 99.5) if len(sorted_values) > 20 else float(sorted_values[-1])
        if hi <= lo:
            hi = lo + max(abs(lo) * 0.01, 1e-6)
        nbins = max(1, min(width, max(8, int(math.sqrt(len(sorted_values)) * 4))))
        return cls(lo, hi, nbins, width)

    def bin_of(self, v: float) -> int:
        """The bin that holds the value v."""
        span = self.hi - self.lo if self.hi > self.lo else 1.0
        x = (v - self.lo) / span * self.nbins
        return 0 if not x > 0 else min(self.nbins - 1, int(x))  # `not x > 0` also catches NaN

    def bin_at(self, column: int) -> int:
        """The bin that column draws."""
        return column * self.nbins // self.width

    def columns(self, i: int) -> range:
        """The columns that draw bin i (at least one, as nbins <= width)."""
        return range(-(-i * self.width // self.nbins), -(-(i + 1) * self.width // self.nbins))

    def column_of(self, v: float) -> int:
        """The column of v's marker: a column of the bin that holds v, the one nearest v's place on the
        axis when the bin is several columns wide."""
        cols = self.columns(self.bin_of(v))
        span = self.hi - self.lo if self.hi > self.lo else 1.0
        x = (v - self.lo) / span * self.width
        want = int(x) if math.isfinite(x) else 0
        return max(cols[0], min(cols[-1], want))

    def counts(self, values: Sequence[float]) -> list[int]:
        """How many of the values each bin holds."""
        out = [0] * self.nbins
        for v in values:
            out[self.bin_of(v)] += 1
        return out


Piece = tuple[int, str, bool]  # (start column, text, is a marker)


def _marker_layouts(width: int, marks: list[tuple[int, str]]) -> list[tuple[int, list[Piece]]]:
    """The ways to draw the markers, each with its cost (lower reads better). Every `▲` is at its column in
    all of them. Its number follows it (`▲50`), or comes before it (`99▲`, `50▲▲99`) where there is no room
    after it. Two markers too close to carry a number each share one label after the last `▲`, numbers in
    column order (`▲50,99` for one column, `▲ ▲50,99` for two), or before the first (`50,99▲`); last come
    the bare `▲`s. Only layouts inside the width, with a blank between separate markers, are listed."""
    marks = sorted(marks)
    out: list[tuple[int, list[Piece]]] = []
    if len(marks) == 2 and marks[0][0] != marks[1][0]:
        (c1, n1), (c2, n2) = marks
        after1, before1 = (c1, "▲" + n1, True), (c1 - len(n1), n1 + "▲", True)
        after2, before2 = (c2, "▲" + n2, True), (c2 - len(n2), n2 + "▲", True)
        out += [(0, [after1, after2]), (2, [after1, before2]), (3, [before1, before2]), (4, [before1, after2])]
    cols = sorted({c for c, _ in marks})
    names = ",".join(n for _, n in marks)
    shape = "".join("▲" if c in cols else " " for c in range(cols[0], cols[-1] + 1))
    out += [(1, [(cols[0], shape + names, True)]), (3, [(cols[0] - len(names), names + shape, True)])]
    out.append((20, [(cols[0], shape, True)]))  # narrower than 10 columns: the ▲s without their numbers

    def ok(pieces: list[Piece]) -> bool:
        if any(s < 0 or s + len(t) > width for s, t, _ in pieces):
            return False
        # a blank between separate markers, except two bare ▲s side by side (`50▲▲99`)
        return all(a[0] + len(a[1]) < b[0] + (a[1][-1] == b[1][0] == "▲")
                   for a, b in zip(pieces, pieces[1:], strict=False))

    return [(cost, pieces) for cost, pieces in out if ok(pieces)]


@dataclass(frozen=True)
class Axis:
    """The axis line as (text, is_marker) pieces, `width` characters in all, and the bars' place above it: the
    bars take the columns [left, width - right), a label outside them having the columns beside."""

    tokens: list[tuple[str, bool]]
    left: int = 0
    right: int = 0
    low_shown: bool = True  # the minimum is on the line (else the title may name it)
    high_shown: bool = True

    def geometry(self, lo: float, hi: float, nbins: int, width: int) -> Bins:
        """The bins the bars above this axis draw (`nbins` of them over the whole width, fewer if the bars are
        narrower)."""
        bars = width - self.left - self.right
        return Bins(lo, hi, max(1, min(bars, nbins)), bars)


GUTTER_COST = 0.25  # per column the bars give up to a label beside them (a label left out costs 10)


def _labels(width: int, taken: list[Piece], low: str, high: str, unit: str, left: int, right: int
            ) -> tuple[float, list[Piece]]:
    """Place the minimum and the maximum in axis order around the markers `taken` (inside the bars' columns
    [left, width - right)): the cheapest way and its cost. The minimum is at the left edge, before every
    marker, the maximum at the right edge, after every marker, a blank between; a label that cannot be there
    is left out (10), never moved past a marker. The unit is on the axis once, with the maximum, else with the
    minimum; not on the axis costs 5, on the minimum 1."""
    u = f" {unit}" if unit else ""
    first = min(s for s, _, _ in taken) if taken else width
    last = max(s + len(t) for s, t, _ in taken) if taken else 0
    lows = [(0, low), (1, low + u), (10, "")] if u else [(0, low), (10, "")]
    highs = [(0, high + u), (1, high), (10, "")] if u else [(0, high), (10, "")]
    best: tuple[float, list[Piece]] = (float("inf"), list(taken))
    for lcost, ltext in lows:
        # in a gutter of its own (as wide as the label and a blank), or at the edge, before the first marker
        if ltext and not (len(ltext) + 1 <= (left or first)):
            continue
        for hcost, htext in highs:
            start = width - len(htext)
            if htext and not (start - 1 >= (width - right if right else last)):
                continue
            if ltext and htext and len(ltext) + 1 > start:
                continue
            low_u, high_u = bool(u) and lcost == 1, bool(u) and hcost == 0 and bool(htext)
            if low_u and high_u:
                continue  # the unit once
            cost = lcost + hcost + (0 if low_u or high_u or not u else 5)
            if cost < best[0]:
                best = (cost, [*taken, *([(0, ltext, False)] if ltext else []),
                               *([(start, htext, False)] if htext else [])])
    return best


def axis_layout(width: int, lo: float, hi: float, p50: float, p99: float, maxv: float, unit: str = "", *,
                nbins: int | None = None) -> Axis:
    """The histogram's axis line and where the bars go: `▲50` and `▲99` in the columns of the bins that hold p50
    and p99 (`nbins` bins over [lo, hi] across the bars' columns), however close they are to each other or to
    the edges (see `_marker_layouts` for how their numbers are written when there is little room: `▲50,99`,
    `▲ ▲50,99`, `99▲`). Labels read in axis order: the minimum at the left edge before every marker, the
    maximum with its unit at the right edge after every marker. Where a marker takes an edge (p99 in the last
    bin, p50 in the first), the bars give up the columns that label needs (a gutter beside them) rather than
    the label move past the marker; where the bars cannot spare them (under 10 columns left), the label is
    left out (the title names it). Of the ways to draw the line, the cheapest is drawn (markers' layout, a label
    left out 10, the unit not on the axis 5, a gutter GUTTER_COST a column). A blank separates every two
    pieces."""
    low, high = _fmt(lo), _fmt(maxv)
    u = f" {unit}" if unit else ""
    gutters = {(0, 0)}
    for lt in (low, low + u):
        for ht in (high, high + u):
            gutters |= {(len(lt) + 1, 0), (0, len(ht) + 1), (len(lt) + 1, len(ht) + 1)}
    best: tuple[tuple[float, int], Axis] | None = None
    for left, right in sorted(gutters):
        bars = width - left - right
        if (left or right) and bars < 10:
            continue
        geo = Bins(lo, hi, max(1, min(bars, nbins or width)), bars)
        marks = [(geo.column_of(p50), "50"), (geo.column_of(p99), "99")]
        for mcost, pieces in _marker_layouts(bars, marks):
            taken = [(s + left, t, m) for s, t, m in pieces]
            lcost, placed = _labels(width, taken, low, high, unit, left, right)
            key = (mcost + lcost + GUTTER_COST * (left + right), mcost)
            if best is None or key < best[0]:
                labels = [(st, t) for st, t, m in placed if not m]
                best = (key, Axis(_tokens(width, placed), left, right, any(st == 0 for st, _ in labels),
                                  any(st + len(t) == width for st, t in labels)))
    assert best is not None  # the bare ▲s fit any width of 10 and more
    return best[1]


def _tokens(width: int, pieces: list[Piece]) -> list[tuple[str, bool]]:
    out: list[tuple[str, bool]] = []
    pos = 0
    for start, text, mark in sorted(pieces):
        if start > pos:
            out.append((" " * (start - pos), False))
        out.append((text, mark))
        pos = start + len(text)
    if pos < width:
        out.append((" " * (width - pos), False))
    return out


def axis_tokens(width: int, lo: float, hi: float, p50: float, p99: float, maxv: float,
                unit: str = "", *, nbins: int | None = None) -> list[tuple[str, bool]]:
    """The axis line of `axis_layout` as (text, is_marker) pieces, exactly `width` characters in all."""
    return axis_layout(width, lo, hi, p50, p99, maxv, unit, nbins=nbins).tokens


class LatencyHistogram(Zoomable):
    """Distribution of one latency metric of the current cell, with p50 and p99 marked.

    Set `values` (a tuple of numbers); the widget redraws itself. Bars span [min, p99.5] so one outlier
    does not squash the picture; values beyond it land in the last bin (`Bins.for_values`). The axis line
    under the bars has `▲50` / `▲99` in the columns of the bins that hold p50 and p99 (those bars are drawn
    in the marker colour too), the minimum at the left and the maximum with the unit at the right, the
    labels giving way to the markers (see `axis_tokens`)."""

    DEFAULT_CSS = """
    LatencyHistogram { height: 1fr; padding: 0 1; }
    LatencyHistogram .hist--bar { color: $accent; }
    LatencyHistogram .hist--mark { color: $warning; text-style: bold; }
    """
    COMPONENT_CLASSES = {"hist--bar", "hist--mark"}
    can_focus = True  # so it can be zoomed (z)

    values: reactive[tuple[float, ...]] = reactive(tuple, layout=False)
    empty: reactive[str] = reactive("waiting for requests…")  # what it says without a value
    # the requests finished ok that the values come from (the Run screen's `requests N done`): the title says
    # `n=3 of 4` when fewer of them hold this figure (a TPOT needs two tokens); None: not said
    requests: reactive[int | None] = reactive(None, layout=False)

    def __init__(self, title: str, unit: str = "ms", *, name: str | None = None, id: str | None = None,
                 classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self.title = title
        self.unit = unit

    def render(self) -> Text:
        width = max(10, self.content_size.width)
        height = max(3, self.content_size.height)
        vals = sorted(v for v in self.values if v is not None and not math.isnan(v))
        head = Text(f"{self.title} {self.unit}", style="bold")
        if not vals:
            head.append(f"  {self.empty}", style="dim")
            head.truncate(width, overflow="ellipsis")
            return head
        p50, p99 = percentile(vals, 50), percentile(vals, 99)
        full = Bins.for_values(vals, width)
        axis_line = axis_layout(width, full.lo, full.hi, p50, p99, vals[-1], self.unit, nbins=full.nbins)
        axis = axis_line.tokens
        geo = axis_line.geometry(full.lo, full.hi, full.nbins, width)  # the bars: the axis may keep a gutter
        # the labels the axis has no room for go to the title, where there is room for them
        left_out = ([] if axis_line.high_shown else [f"max {_fmt(vals[-1])}"]) + (
            [] if axis_line.low_shown else [f"min {_fmt(vals[0])}"])
        of = f" of {self.requests}" if self.requests is not None and self.requests != len(vals) else ""
        stats = f"  p50 {_fmt(p50)}  p99 {_fmt(p99)}  n={len(vals)}{of}"
        while left_out and head.cell_len + len(stats) + sum(2 + len(x) for x in left_out) > width:
            left_out.pop()
        head.append(stats + "".join(f"  {x}" for x in left_out))
        if head.cell_len > width:  # narrow: the count can go, and the unit if the axis shows it
            unit_shown = any(not mark and text.endswith(f" {self.unit}") for text, mark in axis)
            head = Text(f"{self.title}" if unit_shown or not self.unit else f"{self.title} {self.unit}", style="bold")
            head.append(f" p50 {_fmt(p50)} p99 {_fmt(p99)}")
        head.truncate(width, overflow="ellipsis")
        bar_rows = height - 2
        counts = geo.counts(vals)
        bins = [counts[geo.bin_at(c)] for c in range(geo.width)]
        top = max(bins)
        marked = {geo.column_of(p50), geo.column_of(p99)}  # the same columns as the axis's ▲s
        bar_style = self.get_component_rich_style("hist--bar")
        mark_style = self.get_component_rich_style("hist--mark")
        out = Text()
        out.append_text(head)
        for row in range(bar_rows - 1, -1, -1):
            out.append("\n" + " " * axis_line.left)
            for i, b in enumerate(bins):
                level = b / top * bar_rows - row  # how much of this row the bar fills, in rows
                ch = BLOCKS[8] if level >= 1 else (BLOCKS[max(0, int(level * 8))] if level > 0 else " ")
                if b and ch == " " and row == 0:
                    ch = BLOCKS[1]  # show that a bin is not empty
                out.append(ch, style=mark_style if i in marked else bar_style)
        # the axis: ▲50/▲99 under their bins; min at the left, max (with the unit) at the right, out of their way
        out.append("\n")
        for text, is_mark in axis:
            out.append(text, style=mark_style if is_mark else "dim")
        return out
