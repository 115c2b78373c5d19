"""The histogram's p50/p99 markers sit in the bins that hold p50 and p99 (issue: markers pushed left by the
labels, `3218   ▲50 ▲99 5029 ms` with p50 = 4953 in the last column): whatever the labels, each `▲` is in
its bin's column, and the axis line is never wider than the widget. The labels read in axis order (issue:
`101  max 225 ms ▲50  99▲` put the maximum before the p50 marker): the minimum at the left edge before every
marker, the maximum at the right edge after every marker, the bars giving up the columns beside them where a
marker takes an edge. Checked on the axis line alone over generated samples and widths (Hypothesis), on the
drawn widget (the ▲ under the bar drawn in the marker colour), and on the run and session screens."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from textual.app import App, ComposeResult

from servescope.tui.app import make_app
from servescope.tui.screens.run import RunScreen
from servescope.tui.screens.sessions import SessionScreen
from servescope.tui.widgets.histogram import LatencyHistogram, _fmt, axis_layout, percentile

from .fixtures import live_sweep_messages, write_session
from .helpers import wait_until

MARKER = re.compile(r"^(?:(\d\d(?:,\d\d)?)(▲[▲ ]*▲|▲)|(▲[▲ ]*▲|▲)(\d\d(?:,\d\d)?))$")


def widget_range(vals: list[float]) -> tuple[float, float]:
    """[lo, hi] of the bars as the widget documents it: the minimum to p99.5 (the maximum for 20 values or
    fewer), widened a little when all values are equal."""
    lo = vals[0]
    hi = percentile(vals, 99.5) if len(vals) > 20 else vals[-1]
    return lo, (hi if hi > lo else lo + max(abs(lo) * 0.01, 1e-6))


def holds(lo: float, hi: float, nbins: int, i: int, v: float) -> bool:
    """Whether bin i of `nbins` equal bins over [lo, hi] holds v (below lo: the first; at or past hi: the
    last), allowing for rounding at the bin edges."""
    step = (hi - lo) / nbins
    tol = 1e-9 * (abs(hi) + abs(lo) + step)
    low_edge = -float("inf") if i == 0 else lo + i * step
    high_edge = float("inf") if i == nbins - 1 else lo + (i + 1) * step
    return low_edge - tol <= v <= high_edge + tol


def read_axis(tokens: list[tuple[str, bool]], width: int
              ) -> tuple[str, dict[str, int], list[tuple[int, str]], tuple[int, int]]:
    """The axis line, each marker's column by its name ("50", "99"), the labels with their columns and the
    columns the markers with their numbers span, read back from the (text, is_marker) pieces; fails on a piece
    that is not a marker or label as drawn."""
    line = "".join(t for t, _ in tokens)
    assert len(line) == width, (width, line)
    marks: dict[str, int] = {}
    labels: list[tuple[int, str]] = []
    span = (width, 0)
    pos = 0
    for text, is_mark in tokens:
        if is_mark:
            span = (min(span[0], pos), max(span[1], pos + len(text)))
            m = MARKER.match(text)
            assert m, f"not a marker: {text!r} in {line!r}"
            names = (m.group(1) or m.group(4)).split(",")
            cols = [pos + k for k, ch in enumerate(text) if ch == "▲"]
            assert len(cols) in (1, len(names)), line  # one ▲ per number, or one ▲ for both
            for k, name in enumerate(names):
                assert name not in marks, line
                marks[name] = cols[min(k, len(cols) - 1)]
        elif text.strip():
            assert text == text.strip() and "▲" not in text, line
            labels.append((pos, text))
        pos += len(text)
    assert sorted(marks) == ["50", "99"], line
    return line, marks, labels, span


def check_axis(width: int, lo: float, hi: float, nbins: int, vals: list[float], unit: str = "ms") -> str:
    p50, p99 = percentile(vals, 50), percentile(vals, 99)
    axis = axis_layout(width, lo, hi, p50, p99, vals[-1], unit, nbins=nbins) if nbins != width else \
        axis_layout(width, lo, hi, p50, p99, vals[-1], unit)
    line, marks, labels, (first, last) = read_axis(axis.tokens, width)
    # the bars: the whole width, or all but a gutter beside them for a label, at least 10 columns
    geo = axis.geometry(lo, hi, nbins, width)
    assert axis.left + geo.width + axis.right == width and (geo.width >= 10 or not (axis.left or axis.right))
    # each ▲ in a column of the bin holding its percentile, under the bars
    for name, p in (("50", p50), ("99", p99)):
        c = marks[name]
        assert axis.left <= c < width - axis.right and line[c] == "▲", (name, c, line)
        assert holds(lo, hi, geo.nbins, (c - axis.left) * geo.nbins // geo.width, p), (name, p, c, line)
    assert axis.left <= first and last <= width - axis.right, line
    # no ▲ but the markers'; a blank between a label and anything else; labels are the min and the max, in axis
    # order: the minimum at the left edge before every marker, the maximum at the right edge after them all
    assert line.count("▲") == len(set(marks.values())), line
    u = f" {unit}" if unit else ""
    low, high = _fmt(lo), _fmt(vals[-1])
    for start, text in labels:
        end = start + len(text)
        assert (start == 0 or line[start - 1] == " ") and (end == width or line[end] == " "), (text, line)
        assert (text in (low, low + u) and start == 0 and end < first) \
            or (text in (high, high + u) and end == width and start > last), (text, line)
    assert axis.low_shown == any(s == 0 for s, _ in labels), line
    assert axis.high_shown == any(s + len(t) == width for s, t in labels), line
    if u:  # the unit on the axis once (narrow, it may be left to the title)
        shown = sum(t.endswith(u) for _, t in labels)
        assert shown == 1 if width >= 40 else shown <= 1, line
    if width >= 60:  # room for both labels wherever the markers are
        assert len(labels) == 2, line
    return line


@st.composite
def samples(draw: st.DrawFn) -> list[float]:
    """Latency-like samples: all equal, uniform, lognormal, Pareto (heavy tail), two modes, a pile at the
    maximum, one big outlier, or raw floats; from 1 to 400 values, scaled from sub-millisecond to minutes."""
    kind = draw(st.sampled_from(["equal", "uniform", "lognormal", "pareto", "bimodal", "near-max", "outlier", "raw"]))
    if kind == "raw":
        return sorted(draw(st.lists(st.floats(0, 1e6, allow_nan=False), min_size=1, max_size=200)))
    n = draw(st.integers(1, 400))
    scale = draw(st.sampled_from([0.04, 1.0, 37.0, 950.0, 4800.0, 61_000.0]))
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    gens: dict[str, Callable[[], float]] = {
        "equal": lambda: scale,
        "uniform": lambda: rng.uniform(0.5, 1.5) * scale,
        "lognormal": lambda: rng.lognormvariate(0, 1.2) * scale,
        "pareto": lambda: rng.paretovariate(1.1) * scale,
        "bimodal": lambda: (1.0 if rng.random() < 0.6 else 6.0) * scale * rng.uniform(0.95, 1.05),
        "near-max": lambda: scale if rng.random() < 0.7 else rng.uniform(0.2, 1.0) * scale,
        "outlier": lambda: rng.uniform(0.9, 1.1) * scale,
    }
    vals = [gens[kind]() for _ in range(n)]
    if kind == "outlier":
        vals.append(scale * 200)
    return sorted(vals)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(vals=samples(), width=st.integers(10, 220))
def test_each_marker_is_in_its_bins_column_one_bin_per_column(vals: list[float], width: int) -> None:
    lo, hi = widget_range(vals)
    check_axis(width, lo, hi, width, vals)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(vals=samples(), width=st.integers(10, 220))
def test_each_marker_is_in_its_bins_column_with_the_widgets_bins(vals: list[float], width: int) -> None:
    from servescope.tui.widgets.histogram import Bins

    geo = Bins.for_values(vals, width)
    assert (geo.lo, geo.hi) == widget_range(vals) and 1 <= geo.nbins <= width
    check_axis(width, geo.lo, geo.hi, geo.nbins, vals)
    for c in range(width):  # every column draws one bin, and every bin is drawn
        assert c in geo.columns(geo.bin_at(c))
    assert {geo.bin_at(c) for c in range(width)} == set(range(geo.nbins))


# ---- the issue's cases, as drawn ------------------------------------------------------------------------
# E2E, 16 requests from 3218 to 5029 ms with p50 = 4953; the session view's 92.2 .. 149 ms with p50 near 137
E2E = [3218.0, 3480.0, 3905.0, 4300.0, 4620.0, 4810.0, 4902.0, 4940.0, 4966.0, 4975.0, 4984.0, 4992.0, 5001.0,
       5010.0, 5020.0, 5029.0]
SESSION = [92.2, 101.0, 108.0, 114.0, 119.0, 124.0, 128.0, 131.0, 134.0, 136.0, 137.0, 137.5, 138.0, 139.0,
           140.0, 141.0, 142.0, 143.0, 144.0, 145.0, 146.0, 147.0, 148.0, 149.0]


def proportional(v: float, lo: float, hi: float, width: int) -> int:
    return min(width - 1, int((v - lo) / (hi - lo) * width))


def test_the_issues_e2e_line_marks_p50_in_its_bin_by_the_max_label() -> None:
    assert round(percentile(E2E, 50)) == 4953
    lo, hi = widget_range(E2E)
    line = check_axis(38, lo, hi, 38, E2E)
    marks = [k for k, ch in enumerate(line) if ch == "▲"]
    # p99 (5028 ms) in the last column of the bars, which leave the maximum its place after it
    axis = axis_layout(38, lo, hi, percentile(E2E, 50), percentile(E2E, 99), E2E[-1], "ms")
    bars = 38 - axis.left - axis.right
    assert marks == [axis.left + proportional(percentile(E2E, 50), lo, hi, bars), axis.left + bars - 1], line
    # in axis order (the issue: `101  max 225 ms ▲50  99▲`): the minimum, the markers, the maximum
    assert re.fullmatch(r"3218 +50,99▲▲ 5029 ms", line), line


def test_the_issues_session_line_marks_p50_in_its_bin() -> None:
    assert round(percentile(SESSION, 50)) == 138
    lo, hi = widget_range(SESSION)
    for width in (28, 38, 76):
        line = check_axis(width, lo, hi, width, SESSION)
        axis = axis_layout(width, lo, hi, percentile(SESSION, 50), percentile(SESSION, 99), SESSION[-1], "ms")
        bars = width - axis.left - axis.right
        assert line.index("▲") == axis.left + proportional(percentile(SESSION, 50), lo, hi, bars), line


class HistApp(App[None]):
    def __init__(self, vals: list[float]) -> None:
        super().__init__()
        self.vals = vals

    def compose(self) -> ComposeResult:
        yield LatencyHistogram("E2E", id="h")

    def on_mount(self) -> None:
        self.query_one(LatencyHistogram).values = tuple(self.vals)


def drawn_markers(h: LatencyHistogram) -> tuple[list[int], list[int], str, str]:
    """The ▲ columns on the axis line, the columns of the bottom bar row drawn in the marker style (bold),
    the axis line and the title line (render_line draws the content, inside the padding)."""
    rows = [list(h.render_line(y)) for y in range(h.size.height)]
    axis = "".join(s.text for s in rows[-1])
    bar_row = rows[-2]
    bold: list[int] = []
    x = 0
    for seg in bar_row:
        if seg.style is not None and seg.style.bold:  # an empty bin's blank too
            bold += [x + k for k in range(len(seg.text))]
        x += len(seg.text)
    title = "".join(s.text for s in rows[0])
    return [k for k, ch in enumerate(axis) if ch == "▲"], bold, axis, title


def check_drawn(h: LatencyHistogram) -> None:
    vals = sorted(h.values)
    width = h.content_size.width
    lo, hi = widget_range(vals)
    nbins = max(1, min(width, max(8, int(math.sqrt(len(vals)) * 4))))  # few values: fewer, wider bins
    marks, bold, axis, title = drawn_markers(h)
    p50, p99 = percentile(vals, 50), percentile(vals, 99)
    assert f"p50 {_fmt(p50)}" in title and f"p99 {_fmt(p99)}" in title, title
    assert f" {h.unit}" in axis or title.startswith(f"{h.title} {h.unit}"), (title, axis)  # the unit, once at least
    assert marks == sorted(set(bold)), (marks, bold, axis)  # the ▲s under the bars in the marker colour
    layout = axis_layout(width, lo, hi, p50, p99, vals[-1], h.unit, nbins=nbins)
    assert "".join(t for t, _ in layout.tokens) == axis
    geo = layout.geometry(lo, hi, nbins, width)  # the bars beside a label's gutter
    bins = {(c - layout.left) * geo.nbins // geo.width for c in marks}
    for p in (p50, p99):
        assert any(holds(lo, hi, geo.nbins, i, p) for i in bins), (p, marks, axis)
    assert len(axis.rstrip()) <= width
    # a label the axis leaves out is named in the title where it has room; the title is never cut
    for shown, name, v in ((layout.low_shown, "min", vals[0]), (layout.high_shown, "max", vals[-1])):
        assert shown or f"{name} {_fmt(v)}" in title or len(title) + len(f"  {name} {_fmt(v)}") > width, title
    assert not title.endswith("…"), title


@pytest.mark.parametrize("width", [30, 40, 80, 160])
@pytest.mark.parametrize("vals", [E2E, SESSION, [42.0] * 30, [1.0, 100.0]], ids=["e2e", "session", "equal", "gap"])
async def test_the_drawn_widget_marks_the_bars_it_points_at(vals: list[float], width: int) -> None:
    app = HistApp(vals)
    async with app.run_test(size=(width, 8)) as pilot:
        await pilot.pause()
        check_drawn(app.query_one(LatencyHistogram))


# ---- both screens draw with it ---------------------------------------------------------------------------
@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_run_screen_histograms_mark_their_bins(home: Path, size: tuple[int, int]) -> None:
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"), workloads_dir=home / "workloads")
    async with app.run_test(size=size) as pilot:
        await app.switch_mode("run")
        run = app.get_screen("run", RunScreen)
        run.reset("sim://tiny: 1 workload")
        for msg in live_sweep_messages(home / "sessions" / "20261202-100000-demo"):
            run.post_message(msg)
        await pilot.pause()
        run.flush_charts()
        await pilot.pause()
        hists = [h for h in run.query(LatencyHistogram) if h.display and h.values]
        assert len(hists) == 3
        for h in hists:
            check_drawn(h)


@pytest.mark.slow  # ~3 s of the --fast lane on 2 busy cores (2026-12-08)
@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_session_screen_histograms_mark_their_bins(home: Path, size: tuple[int, int]) -> None:
    write_session(home / "sessions", "qwen-fp8", "2026-12-01T10:00:00+0000", {"quant": "FP8"})
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"), workloads_dir=home / "workloads")
    async with app.run_test(size=size) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, SessionScreen), 30, "the session screen")
        scr: Any = app.screen
        await wait_until(pilot, lambda: all(h.values for h in scr.query(LatencyHistogram)), 30, "histograms")
        await pilot.pause()
        for h in scr.query(LatencyHistogram):
            check_drawn(h)
