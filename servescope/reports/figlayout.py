"""The geometry of a figure, without a plotting library: the ticks a person would write on an axis, and where a
label goes so that it hits nothing.

Ticks: a linear axis gets 1, 2 or 5 times a power of ten apart, written with as many decimals as the step
needs and no offset or exponent (`22.90 22.92 22.94`, never `22.9195 ... 22.9220` or `+2.29e1`); a count
(requests) gets whole numbers only; a logarithmic axis gets plain numbers (`100 200 500 1,000`, never `3x10^2`).
Values that barely vary get an axis at least `MIN_REL_SPAN` of their size wide, so the ticks say the values
are all about the same instead of magnifying noise in the fourth decimal.

Labels: `Scene` holds what is already drawn in a panel (texts and data markers as boxes, data and reference
lines as segments, all in display pixels) and picks, from a label's candidate boxes, the first that hits no
text or marker and crosses no line; then the first that hits no text or marker; else none (the caller moves the
label into the legend). servescope.reports.figures_svg asks matplotlib for the extents and draws."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

__all__ = ["MIN_REL_SPAN", "Box", "Scene", "fmt_tick", "linear_ticks", "log_ticks", "spread", "thin"]

Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in display pixels (y up)
Segment = tuple[float, float, float, float]  # x0, y0, x1, y1

MIN_REL_SPAN = 0.01  # an axis is at least 1% of its values' size wide
STEPS = (1.0, 2.0, 5.0, 10.0)
INT_STEPS = (1.0, 2.0, 5.0, 10.0)


# ---- ticks --------------------------------------------------------------------------------------------
def spread(lo: float, hi: float, rel: float = MIN_REL_SPAN) -> tuple[float, float]:
    """(lo, hi) widened about its centre to at least `rel` of the centre's size (and to some width at 0)."""
    centre = (lo + hi) / 2
    need = rel * abs(centre) if centre else 1.0
    if hi - lo >= need:
        return lo, hi
    return centre - need / 2, centre + need / 2


def _decimals(step: float) -> int:
    """The fewest decimals that write `step` (and so every multiple of it) exactly."""
    for d in range(0, 13):
        if abs(round(step, d) - step) <= 1e-9 * step:
            return d
    return 12


def linear_ticks(lo: float, hi: float, target: int = 5, integer: bool = False) -> tuple[list[float], int]:
    """Ticks inside [lo, hi], about `target` of them, a round step apart; and the decimals that write them."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo], 0 if integer else 2
    mag = 10.0 ** math.floor(math.log10((hi - lo) / target))
    steps = [m * mag * k for k in (0.1, 1.0, 10.0) for m in (INT_STEPS if integer else STEPS)]
    steps = [st for st in steps if not integer or st >= 1 - 1e-9] or [1.0]

    def count(st: float) -> int:
        return math.floor(hi / st + 1e-9) - math.ceil(lo / st - 1e-9) + 1

    # the step whose tick count is nearest the target (the wider step on a tie)
    step = min(steps, key=lambda st: (abs(count(st) - target), -st))
    if integer:
        step = float(max(1, round(step)))
    first = math.ceil(lo / step - 1e-9)
    ticks = []
    k = first
    while k * step <= hi + 1e-9 * step:
        t = round(k * step, 12)
        ticks.append(0.0 if t == 0 else t)
        k += 1
    return ticks, 0 if integer else _decimals(step)


def log_ticks(lo: float, hi: float) -> tuple[list[float], int | None]:
    """Ticks for a logarithmic axis over [lo, hi] (lo > 0): 1, 2, 5 (or 1 alone, or 1-2-3-5) times a power of ten,
    3 to 8 of them; a range too narrow for that gets linear ticks. Decimals: None (each tick writes its own)."""
    if lo <= 0 or hi <= lo:
        return linear_ticks(lo, hi)[0], None
    k0, k1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    options = []
    for mults in ((1.0,), (1.0, 2.0, 5.0), (1.0, 2.0, 3.0, 5.0), (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0)):
        ticks = [m * 10.0 ** k for k in range(k0, k1 + 1) for m in mults if lo <= m * 10.0 ** k <= hi * (1 + 1e-9)]
        if len(ticks) > 8 and mults == (1.0,):
            return ticks[:: math.ceil(len(ticks) / 8)], None
        if 3 <= len(ticks) <= 8:
            options.append(ticks)
    if options:  # the fewest kinds of multiple that give about 5 ticks
        return min(options, key=lambda t: abs(len(t) - 5)), None
    return linear_ticks(lo, hi)[0], None


def fmt_tick(v: float, decimals: int | None = None, thousands: bool = True) -> str:
    """A tick as a person writes it: no exponent, `decimals` places (None: as few as write `v` exactly), and
    thousands separated as the report's tables do."""
    if decimals is None:
        decimals = 0 if v == 0 else max(0, min(12, _decimals(abs(v)) if abs(v) < 1e12 else 0))
    s = f"{v:,.{decimals}f}" if thousands and abs(v) >= 1000 else f"{v:.{decimals}f}"
    return "0" if s.strip("-0.,") == "" else s


def thin(positions: Sequence[float], sizes: Sequence[float], gap: float) -> list[bool]:
    """Which of the labels centred at `positions` (sizes: their widths along the axis) to keep so that none
    overlaps the last one kept (`gap` apart at least); the first is always kept."""
    keep: list[bool] = []
    edge = -math.inf
    for p, s in sorted(zip(positions, sizes, strict=True), key=lambda t: t[0]):
        ok = p - s / 2 >= edge + gap
        keep.append(ok)
        if ok:
            edge = p + s / 2
    order = sorted(range(len(positions)), key=lambda i: positions[i])
    out = [False] * len(positions)
    for rank, i in enumerate(order):
        out[i] = keep[rank]
    return out


# ---- label placement ------------------------------------------------------------------------------------
def overlap(a: Box, b: Box, tol: float = 0.0) -> bool:
    """The boxes share more than `tol` pixels in both directions."""
    return a[0] < b[2] - tol and b[0] < a[2] - tol and a[1] < b[3] - tol and b[1] < a[3] - tol


def crosses(box: Box, seg: Segment) -> bool:
    """The segment passes through the box (Liang-Barsky clipping)."""
    x0, y0, x1, y1 = seg
    dx, dy = x1 - x0, y1 - y0
    t0, t1 = 0.0, 1.0
    for p, q in ((-dx, x0 - box[0]), (dx, box[2] - x0), (-dy, y0 - box[1]), (dy, box[3] - y0)):
        if p == 0:
            if q < 0:
                return False
            continue
        t = q / p
        if p < 0:
            if t > t1:
                return False
            t0 = max(t0, t)
        else:
            if t < t0:
                return False
            t1 = min(t1, t)
    return t0 <= t1


def inside(box: Box, frame: Box) -> bool:
    return box[0] >= frame[0] and box[1] >= frame[1] and box[2] <= frame[2] and box[3] <= frame[3]


@dataclass
class Scene:
    """What a panel already shows, in display pixels: labels go inside `frame` and hit none of it."""

    frame: Box
    hard: list[Box] = field(default_factory=list)  # texts and data markers: never covered
    lines: list[Segment] = field(default_factory=list)  # data and reference lines: not crossed where avoidable
    pad: float = 1.5  # pixels kept clear around a label

    def add_polyline(self, pts: Iterable[tuple[float, float]]) -> None:
        p = [q for q in pts if all(math.isfinite(c) for c in q)]
        self.lines.extend((a[0], a[1], b[0], b[1]) for a, b in zip(p, p[1:], strict=False))

    def free(self, box: Box, lines: bool = True) -> bool:
        g = (box[0] - self.pad, box[1] - self.pad, box[2] + self.pad, box[3] + self.pad)
        if not inside(box, self.frame) or any(overlap(g, h) for h in self.hard):
            return False
        return not (lines and any(crosses(g, s) for s in self.lines))

    def choose(self, boxes: Sequence[Box]) -> int | None:
        """The first box that hits nothing; else the first that only crosses a line; else None."""
        for strict in (True, False):
            for i, b in enumerate(boxes):
                if self.free(b, lines=strict):
                    return i
        return None


def box_at(x: float, y: float, w: float, h: float, ha: str, va: str) -> Box:
    """The box of a w x h label anchored at (x, y) with matplotlib's alignment names."""
    x0 = x if ha == "left" else x - w if ha == "right" else x - w / 2
    y0 = y if va == "bottom" else y - h if va == "top" else y - h / 2
    return (x0, y0, x0 + w, y0 + h)


def hline_spots(y: float, frame: Box, w: float, h: float, gap: float) -> list[Box]:
    """Where a horizontal line's label may go: above it, then below it, from the right end leftwards."""
    x0, _, x1, _ = frame
    out = []
    for f in (1.0, 0.0, 0.5, 0.75, 0.25, 0.875, 0.625, 0.375, 0.125):
        left = x0 + gap + f * max(0.0, (x1 - x0) - w - 2 * gap)
        for above in (True, False):
            out.append((left, y + gap, left + w, y + gap + h) if above else (left, y - gap - h, left + w, y - gap))
    return out


def vline_spots(x: float, frame: Box, w: float, h: float, gap: float) -> list[Box]:
    """Where a vertical line's label may go: beside it (right, then left), from the top down, then bottom up."""
    _, y0, _, y1 = frame
    rows = max(1, int((y1 - y0 - 2 * gap) // (h + gap)))
    levels = [y1 - gap - h - k * (h + gap) for k in range(rows)]
    out = []
    for top in levels:
        for right in (True, False):
            left = x + gap if right else x - gap - w
            out.append((left, top, left + w, top + h))
    return out


def point_spots(x: float, y: float, w: float, h: float, off: float) -> list[Box]:
    """Around a point: upper right first, then the other corners and sides, then twice as far."""
    out = []
    for k in (1.0, 2.0, 3.0):
        d = off * k
        for dx, dy in ((1, 1), (-1, 1), (1, -1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1)):
            cx = x + dx * (d + w / 2) if dx else x
            cy = y + dy * (d + h / 2) if dy else y
            out.append((cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2))
    return out
