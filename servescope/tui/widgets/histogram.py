"""A latency histogram drawn with unicode block characters: cheap enough to redraw several times a second,
readable without colour (p50 and p99 are marked with characters, not only with colour)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

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


class LatencyHistogram(Widget):
    """Distribution of one latency metric of the current cell, with p50 and p99 marked.

    Set `values` (a tuple of numbers); the widget redraws itself. Bars span [min, p99.5] so one outlier
    does not squash the picture; values beyond it land in the last bin, which is then marked `+`."""

    DEFAULT_CSS = """
    LatencyHistogram { height: 1fr; padding: 0 1; }
    LatencyHistogram .hist--bar { color: $accent; }
    LatencyHistogram .hist--mark { color: $warning; text-style: bold; }
    """
    COMPONENT_CLASSES = {"hist--bar", "hist--mark"}

    values: reactive[tuple[float, ...]] = reactive(tuple, layout=False)

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
            head.append("  waiting for requests…", style="dim")
            head.truncate(width, overflow="ellipsis")
            return head
        p50, p99 = percentile(vals, 50), percentile(vals, 99)
        head.append(f"  n={len(vals)}  p50 {_fmt(p50)}  p99 {_fmt(p99)}  max {_fmt(vals[-1])}")
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
        overflow = False
        for v in vals:
            i = int((v - lo) / span * nbins)
            if i >= nbins:
                overflow = overflow or v > hi
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
        # axis with the markers
        axis = [" "] * width
        left, right = _fmt(lo), _fmt(hi) + ("+" if overflow else "")
        for i, ch in enumerate(left):
            if i < width:
                axis[i] = ch
        for i, ch in enumerate(right):
            j = width - len(right) + i
            if 0 <= j < width:
                axis[j] = ch
        if c99 + 3 > width - len(right):  # the p99 marker wins over the range label
            for j in range(width - len(right), width):
                axis[j] = " "
        for c, label in ((c50, "▲50"), (c99, "▲99")):
            start = min(c, width - len(label))
            for i, ch in enumerate(label):
                axis[start + i] = ch
        out.append("\n")
        line = "".join(axis)
        for i, ch in enumerate(line):
            out.append(ch, style=mark_style if ch in "▲" or (ch.isdigit() and i in range(c50, c50 + 3))
                       or (ch.isdigit() and i in range(c99, c99 + 3)) else "dim")
        return out
