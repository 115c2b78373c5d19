"""Aggregate output tok/s and per-user tok/s against load (concurrency or rate), over finished cells,
with the running cell drawn as it fills in, the knee and the SLO capacity marked."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from textual.reactive import reactive
from textual_plotext import PlotextPlot


@dataclass(frozen=True)
class CurvePoint:
    x: float  # concurrency or rate
    label: str  # "c=4", "2/s"
    aggregate_tok_s: float
    per_user_tok_s: float
    meets_slo: bool | None = None  # None: no SLOs set
    live: bool = False  # the running cell, still filling in


def find_knee(points: Sequence[CurvePoint]) -> CurvePoint | None:
    """The last load level before extra aggregate throughput starts costing more per-user speed (relative
    change) than it gains: the first step where per-user loss > aggregate gain; its left end is the knee."""
    pts = sorted((p for p in points if not p.live), key=lambda p: p.x)
    for a, b in zip(pts, pts[1:], strict=False):
        if a.aggregate_tok_s <= 0 or a.per_user_tok_s <= 0:
            continue
        gain = (b.aggregate_tok_s - a.aggregate_tok_s) / a.aggregate_tok_s
        loss = (a.per_user_tok_s - b.per_user_tok_s) / a.per_user_tok_s
        if loss > gain:
            return a
    return None


def slo_capacity(points: Sequence[CurvePoint]) -> CurvePoint | None:
    """The highest load whose cell still meets the SLOs (None without SLOs or when none meets them)."""
    ok = [p for p in points if not p.live and p.meets_slo]
    return max(ok, key=lambda p: p.x) if ok else None


class ThroughputCurve(PlotextPlot):
    """Set `points` (finished cells plus, optionally, one live point); the plot redraws itself."""

    DEFAULT_CSS = """
    ThroughputCurve { height: 1fr; }
    """

    points: reactive[tuple[CurvePoint, ...]] = reactive(tuple)
    title: reactive[str] = reactive("throughput vs load")

    def watch_points(self) -> None:
        self._replot()

    def watch_title(self) -> None:
        self._replot()

    def on_mount(self) -> None:
        super().on_mount()
        self._replot()

    def _replot(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        pts = sorted(self.points, key=lambda p: (p.x, p.live))
        xs_unique = sorted({p.x for p in pts})
        pos = {x: i + 1 for i, x in enumerate(xs_unique)}
        knee, cap = find_knee(pts), slo_capacity(pts)
        note = []
        if knee:
            note.append(f"knee {knee.label}")
        if cap:
            note.append(f"SLO capacity {cap.label}")
        elif any(p.meets_slo is not None for p in pts):
            note.append("no cell meets the SLOs")
        plt.title(self.title + (f"  ({', '.join(note)})" if note else ""))
        if not pts:
            plt.xticks([])
            plt.yticks([])
            return
        done = [p for p in pts if not p.live]
        live = [p for p in pts if p.live]
        if done:
            plt.plot([pos[p.x] for p in done], [p.aggregate_tok_s for p in done], label="aggregate tok/s",
                     marker="hd", color="cyan")
            plt.plot([pos[p.x] for p in done], [p.per_user_tok_s for p in done], label="per-user tok/s",
                     marker="hd", color="magenta", yside="right")
        if live:
            plt.scatter([pos[p.x] for p in live], [p.aggregate_tok_s for p in live], marker="o", color="cyan")
            plt.scatter([pos[p.x] for p in live], [p.per_user_tok_s for p in live], marker="o", color="magenta",
                        yside="right")
        if knee:
            plt.vline(pos[knee.x], "yellow")
        if cap and (not knee or cap.x != knee.x):
            plt.vline(pos[cap.x], "green")
        labels = {p.x: p.label for p in pts}
        plt.xticks([pos[x] for x in xs_unique], [labels[x] for x in xs_unique])
        plt.xlim(0.5, len(xs_unique) + 0.5)
        self.refresh()


SERIES_COLORS = ("cyan", "magenta", "yellow", "green", "red", "blue")
SERIES_MARKERS = ("hd", "dot", "+", "x", "*", "o")  # distinct without colour (NO_COLOR)


class OverlayCurve(PlotextPlot):
    """One metric against load for several sessions, overlaid: set `series` (label -> [(x, y)]); the x
    axis is categorical (the load levels in order), as in ThroughputCurve."""

    DEFAULT_CSS = """
    OverlayCurve { height: 1fr; }
    """

    series: reactive[tuple[tuple[str, tuple[tuple[float, float], ...]], ...]] = reactive(tuple)
    title: reactive[str] = reactive("")

    def watch_series(self) -> None:
        self._replot()

    def watch_title(self) -> None:
        self._replot()

    def on_mount(self) -> None:
        super().on_mount()
        self._replot()

    def _replot(self) -> None:
        plt = self.plt
        plt.clear_data()
        plt.clear_figure()
        plt.title(self.title)
        xs = sorted({x for _, pts in self.series for x, _ in pts})
        if not xs:
            plt.xticks([])
            plt.yticks([])
            self.refresh()
            return
        pos = {x: i + 1 for i, x in enumerate(xs)}
        for i, (label, pts) in enumerate(self.series):
            pts_s = sorted(pts)
            plt.plot([pos[x] for x, _ in pts_s], [y for _, y in pts_s], label=label,
                     marker=SERIES_MARKERS[i % len(SERIES_MARKERS)], color=SERIES_COLORS[i % len(SERIES_COLORS)])
        plt.xticks([pos[x] for x in xs], [f"{x:g}" for x in xs])
        plt.xlim(0.5, len(xs) + 0.5)
        self.refresh()
