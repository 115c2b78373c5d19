"""A latency histogram drawn with unicode block characters: cheap enough to redraw several times a second,
readable without colour (p50 and p99 are marked with characters, not only with colour)."""

from __future__ import annotations

import math
from collections.abc import Sequence

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


def axis_tokens(width: int, lo: float, hi: float, p50: float, p99: float, maxv: float,
                unit: str = "") -> list[tuple[str, bool]]:
    """The histogram's axis line as (text, is_marker) pieces, `width` characters in all: the minimum at
    the left edge, the maximum and the unit at the right edge, `▲50` and `▲99` as close to their bins'
    columns as the other labels allow. No two labels touch (a digit never sits next to a `▲`), and none
    is dropped at any width >= 30 (narrower, the unit goes first, then the maximum, then the minimum)."""
    span = hi - lo if hi > lo else 1.0

    def col(v: float) -> int:
        return max(0, min(width - 1, int((v - lo) / span * width)))

    right = f"{_fmt(maxv)} {unit}".strip()
    labels: list[tuple[str, int, bool]] = [(_fmt(lo), 0, False), ("▲50", col(p50), True), ("▲99", col(p99), True),
                                           (right, width - len(right), False)]

    def fits(ls: list[tuple[str, int, bool]]) -> bool:
        return sum(len(t) for t, _, _ in ls) + len(ls) - 1 <= width

    if not fits(labels):
        labels[3] = (_fmt(maxv), width - len(_fmt(maxv)), False)
    while not fits(labels) and len(labels) > 2:
        labels.pop(-1 if len(labels) == 4 else 0)
    # left to right: each label starts at its column or just after the previous one (one space between)
    starts: list[int] = []
    for i, (_text, want, _) in enumerate(labels):
        starts.append(max(want, starts[-1] + len(labels[i - 1][0]) + 1) if starts else max(0, want))
    # right to left: nothing past the right edge
    limit = width
    for i in range(len(labels) - 1, -1, -1):
        starts[i] = min(starts[i], limit - len(labels[i][0]))
        limit = starts[i] - 1
    out: list[tuple[str, bool]] = []
    pos = 0
    for (text, _, mark), st in zip(labels, starts, strict=True):
        st = max(st, pos)
        if st > pos:
            out.append((" " * (st - pos), False))
        out.append((text, mark))
        pos = st + len(text)
    if pos < width:
        out.append((" " * (width - pos), False))
    return out


class LatencyHistogram(Zoomable):
    """Distribution of one latency metric of the current cell, with p50 and p99 marked.

    Set `values` (a tuple of numbers); the widget redraws itself. Bars span [min, p99.5] so one outlier
    does not squash the picture; values beyond it land in the last bin. The axis line under the bars
    labels the minimum (left), the maximum with the unit (right) and `▲50` / `▲99` under the p50 and p99
    bins, each label kept apart from the others by at least one space (see `axis_tokens`)."""

    DEFAULT_CSS = """
    LatencyHistogram { height: 1fr; padding: 0 1; }
    LatencyHistogram .hist--bar { color: $accent; }
    LatencyHistogram .hist--mark { color: $warning; text-style: bold; }
    """
    COMPONENT_CLASSES = {"hist--bar", "hist--mark"}
    can_focus = True  # so it can be zoomed (z)

    values: reactive[tuple[float, ...]] = reactive(tuple, layout=False)
    empty: reactive[str] = reactive("waiting for requests…")  # what it says without a value

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
        head.append(f"  p50 {_fmt(p50)}  p99 {_fmt(p99)}  n={len(vals)}")
        if head.cell_len > width:  # narrow: the unit is on the axis, the count can go
            head = Text(f"{self.title}", style="bold")
            head.append(f" p50 {_fmt(p50)} p99 {_fmt(p99)}")
        head.truncate(width, overflow="ellipsis")
        bar_rows = height - 2
        lo = vals[0]
        hi = percentile(vals, 99.5) if len(vals) > 20 else vals[-1]
        if hi <= lo:
            hi = lo + max(abs(lo) * 0.01, 1e-6)
        # few values: fewer, wider bins (each `per` columns wide); many: one bin per column
        nbins = max(1, min(width, max(8, int(math.sqrt(len(vals)) * 4))))
        per = width / nbins
        span = hi - lo
        counts = [0] * nbins
        for v in vals:
            i = int((v - lo) / span * nbins)
            if i >= nbins:  # values beyond p99.5 land in the last bin
                i = nbins - 1
            counts[i] += 1
        bins = [counts[min(nbins - 1, int(c / per))] for c in range(width)]
        top = max(bins)

        def col(v: float) -> int:
            return max(0, min(width - 1, int((v - lo) / span * width)))

        c50, c99 = col(p50), col(p99)
        bar_style = self.get_component_rich_style("hist--bar")
        mark_style = self.get_component_rich_style("hist--mark")
        out = Text()
        out.append_text(head)
        for row in range(bar_rows - 1, -1, -1):
            out.append("\n")
            for i, b in enumerate(bins):
                level = b / top * bar_rows - row  # how much of this row the bar fills, in rows
                ch = BLOCKS[8] if level >= 1 else (BLOCKS[max(0, int(level * 8))] if level > 0 else " ")
                if b and ch == " " and row == 0:
                    ch = BLOCKS[1]  # show that a bin is not empty
                out.append(ch, style=mark_style if i in (c50, c99) else bar_style)
        # the axis: min at the left, max (with the unit) at the right, ▲50/▲99 under their bins, never touching
        out.append("\n")
        for text, is_mark in axis_tokens(width, lo, hi, p50, p99, vals[-1], self.unit):
            out.append(text, style=mark_style if is_mark else "dim")
        return out
