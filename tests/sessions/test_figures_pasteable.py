"""Figures a person pastes as they are: no text over another text or over a data point (asked of matplotlib:
the extents of what the Agg renderer draws, tests/support/figure_extents.py), ticks a person would write
(whole numbers on counts, rounded to what differs, plain numbers on logarithmic axes), legends whose numbers
differ where the lines do, each compared difference's interval drawn, PNGs at least 1600 pixels wide; and a
finished session's figures drawn once and kept, never stale."""

from __future__ import annotations

import re
import struct
import xml.etree.ElementTree as ET
from dataclasses import replace
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from servescope.reports import figcache, figures_svg
from servescope.reports.figures import FigureSpec, Panel, Point, Series, distinct_labels, session_figures
from servescope.reports.figures_svg import SVG_NS, draw, render
from servescope.reports.htmlreport import compare_html, compare_parts
from servescope.reports.report import build
from servescope.sessions.live import RunnerLock
from servescope.sessions.store import load_session
from tests.support.figure_extents import overlaps

from .conftest import CellSpec, SessionSpec, build_session
from .test_figures import two_workloads

pytest.importorskip("matplotlib")

Q = f"{{{SVG_NS}}}"
PLAIN = re.compile(r"^-?[\d,]+(\.\d+)?$")


def _telemetry(s: Any) -> None:
    """telemetry.parquet as the engine writes it, over the session's cells."""
    t0 = min(int(s.requests(v.index)["sent_ns"].min()) for v in build(s).views)
    ts = [t0 + i * 250_000_000 for i in range(40)]
    pl.DataFrame({"t_ns": ts, "kv_cache_usage_perc": [0.01 * (i % 20) for i in range(40)],
                  "num_requests_running": [float(i % 17) for i in range(40)],
                  "num_requests_waiting": [float(i % 3) for i in range(40)]}).write_parquet(s.path / "telemetry.parquet")


def _compare(tmp_path: Path, loads: tuple[int, ...] = (1, 2, 4, 8, 16)) -> tuple[list[FigureSpec], Any]:
    """A comparison's figures (FP8's TPOT 25% above GPTQ's), and the first session."""
    from servescope.reports.figures import comparison_figures

    a = two_workloads(tmp_path, "GPTQ", workloads=("sharegpt",), loads=loads)
    b = two_workloads(tmp_path, "FP8", tpot_ms=7.5, workloads=("sharegpt",), loads=loads)
    comp, reps = compare_parts([a, b], label_key="quant")
    return comparison_figures(comp, reps), a


@pytest.mark.slow  # ~4.7 s of the --fast lane on 2 busy cores (2026-12-08)
def test_no_text_covers_another_text_or_a_data_point(tmp_path: Path) -> None:
    """Every figure of a two-workload, five-load session (with its telemetry) and of a comparison of two
    sessions, drawn: no text's extent meets another text's, and none (nor a legend) meets a data marker."""
    s = two_workloads(tmp_path / "one")
    _telemetry(s)
    specs = session_figures(build(load_session(s.path))) + _compare(tmp_path / "two")[0]
    assert {f.kind for f in specs} >= {"throughput", "tradeoff", "latency", "histograms", "context", "telemetry",
                                       "compare"}
    found = {f.name: overlaps(draw(f)) for f in specs}
    assert not any(found.values()), {k: v[:5] for k, v in found.items() if v}


def test_the_overlap_check_sees_a_label_on_a_point_and_on_a_text(tmp_path: Path) -> None:
    """The check can fail: a label written on a data point, and one written over a tick label, are found."""
    s = two_workloads(tmp_path, loads=(1, 4), workloads=("sharegpt",))
    spec = next(f for f in session_figures(build(s)) if f.kind == "tradeoff")
    fig = draw(spec)
    ax = fig.axes[0]
    p = spec.panels[0].series[0].points[0]
    ax.annotate("right here", (p.x, p.y), ha="center", va="center")
    fig.canvas.draw()
    tick = next(t for t in ax.texts if (t.get_gid() or "").startswith("tick-y-") and t.get_text())
    bb = tick.get_window_extent()
    ax.annotate("over a tick", ((bb.x0 + bb.x1) / 2, (bb.y0 + bb.y1) / 2), xycoords="figure pixels", ha="center",
                va="center", annotation_clip=False)
    found = overlaps(fig)
    assert any("'right here' over a marker" in f for f in found), found
    assert any("'over a tick'" in f and "over text" in f for f in found), found


def _ticks(fig: Any) -> list[tuple[Any, list[str], list[str]]]:
    """Each axes' x and y tick labels as drawn (matplotlib's own tick labels, and the texts figures_svg draws as
    ticks: their gid says which axis)."""
    fig.canvas.draw()

    def labels(ax: Any, which: str) -> list[str]:
        own = ax.get_xticklabels() if which == "x" else ax.get_yticklabels()
        drawn = [t for t in ax.texts if (t.get_gid() or "").startswith(f"tick-{which}-")]
        if which == "y":
            drawn += [t for t in ax.texts if (t.get_gid() or "").startswith("tick-y2-")]
        return [t.get_text() for t in [*own, *drawn] if t.get_text()]

    return [(ax, labels(ax, "x"), labels(ax, "y")) for ax in fig.axes]


def test_counts_tick_whole_numbers_and_barely_varying_values_get_a_sane_axis(tmp_path: Path) -> None:
    """A histogram's requests and the telemetry's running requests tick in whole numbers; a TPOT that barely
    varies (the synthetic cells' are constant) gets an axis 1% of its size wide, with ticks of few decimals."""
    s = two_workloads(tmp_path, loads=(1, 2, 4, 8, 16), workloads=("sharegpt",))
    _telemetry(s)
    specs = {f.kind: f for f in session_figures(build(load_session(s.path)))}
    for ax, xs, ys in _ticks(draw(specs["histograms"])):
        assert ys and all(re.fullmatch(r"\d+", y) for y in ys), ys
        lo, hi = ax.get_xlim()
        assert (hi - lo) >= 0.009 * abs(hi + lo) / 2, (lo, hi)
        assert all(PLAIN.match(x) and len(x.split(".")[-1]) <= 3 for x in xs if "." in x), xs
    tele = {ax.get_ylabel(): ys for ax, _, ys in _ticks(draw(specs["telemetry"]))}
    assert all(re.fullmatch(r"\d+", y) for y in tele["requests"]), tele
    # values 22.9195 ... 22.9220 ms: ticks say 22.8 ... 23.0, not the fourth decimal
    spec = FigureSpec("t", "t", "", [Panel("TPOT", "TPOT ms", "requests", hist=[22.9195 + i * 0.0005 for i in range(6)],
                                           y_integer=True)])
    ((ax, xs, ys),) = _ticks(draw(spec))
    assert len(xs) >= 3 and all(len(x.split(".")[-1]) <= 2 for x in xs), xs
    assert ys == [str(i) for i in range(len(ys))]


def test_log_axes_read_plain_numbers(tmp_path: Path) -> None:
    """Logarithmic axes (TTFT spanning 3 to 2,000 ms, input lengths 300 to 8,000 tokens) tick in plain numbers."""
    pts = [Point(300.0 * 1.7 ** k, 3.0 ** k, "") for k in range(1, 8)]
    spec = FigureSpec("lat", "lat", "", [Panel("p", "input tokens", "TTFT ms", [Series("a", pts)], log_x=True,
                                               log_y=True)])
    ((ax, xs, ys),) = _ticks(draw(spec))
    assert ax.get_xscale() == ax.get_yscale() == "log"
    assert len(xs) >= 3 and len(ys) >= 3
    for label in xs + ys:
        assert PLAIN.match(label), label  # never 3x10^2
    assert not [t for t in ax.xaxis.get_minorticklabels() + ax.yaxis.get_minorticklabels() if t.get_text()]
    assert len(set(xs)) == len(xs) and len(set(ys)) == len(ys)


def test_legend_numbers_differ_where_the_lines_do() -> None:
    assert distinct_labels([19.71, 19.74, 25.0]) == ["19.71", "19.74", "25.00"]  # fmt_num reads both as 19.7
    assert distinct_labels([183.7, 190.2]) == ["183.7", "190.2"]
    assert distinct_labels([19.7, 19.7]) == ["19.7", "19.7"]


def test_equal_percentiles_are_one_legend_entry(tmp_path: Path) -> None:
    """The synthetic cells' TPOT is the same for every request: p50, p90 and p99 are one line named once."""
    s = two_workloads(tmp_path, loads=(1,), workloads=("sharegpt",))
    hist = next(f for f in session_figures(build(s)) if f.kind == "histograms")
    tpot = next(p for p in hist.panels if "TPOT" in p.title)
    assert [m.label for m in tpot.marks] == ["p50, p90, p99 6.00 ms"]
    texts = [t.get_text() for t in draw(hist).texts]
    assert texts.count("p50, p90, p99 6.00 ms") == 1 and not {"p50 6.00 ms", "p90 6.00 ms", "p99 6.00 ms"} & set(texts)
    ttft = next(p for p in hist.panels if "TTFT" in p.title)
    labels = [m.label.split()[-2] for m in ttft.marks]
    assert len(set(labels)) == len(labels)  # distinct values read distinct


@pytest.mark.slow
def test_compare_figures_draw_each_differences_interval(tmp_path: Path) -> None:
    (spec,), _ = _compare(tmp_path)
    root = ET.fromstring(render(spec).svg)
    titles = [t.text or "" for t in root.iter(f"{Q}title")]
    for pan in spec.panels:
        first, second = pan.series[0], pan.series[1]
        assert not first.intervals and len(second.intervals) == len(second.points) == 5, pan.title
        for iv, p, base in zip(second.intervals, second.points, first.points, strict=True):
            assert iv.lo * (1 - 1e-9) <= p.y <= iv.hi * (1 + 1e-9)  # about the delta the point shows
            assert iv.tip in titles
            if "no spread: deterministic server" in iv.tip:  # a zero-width interval reads as that, not [+x, +x]
                assert iv.hi - iv.lo <= 1e-3 * abs(iv.hi) and "drawn as" not in iv.tip, iv.tip
                continue
            ci = re.search(r"\[([+-][\d.]+), ([+-][\d.]+)\]", iv.tip)
            assert ci is not None, iv.tip
            zero_inside = float(ci[1]) <= 0 <= float(ci[2])
            assert (iv.lo <= base.y <= iv.hi) == zero_inside or abs(float(ci[1])) < 0.1 or abs(float(ci[2])) < 0.1
            assert iv.tip in titles
    assert "Hover" not in spec.caption and "hover" not in spec.caption


def test_compare_html_says_hover_once_per_figure(tmp_path: Path) -> None:
    a = two_workloads(tmp_path, "GPTQ", loads=(1, 4), workloads=("sharegpt",))
    b = two_workloads(tmp_path, "FP8", tpot_ms=7.5, loads=(1, 4), workloads=("sharegpt",))
    comp, reps = compare_parts([a, b], label_key="quant")
    doc = compare_html(comp, reps)
    captions = re.findall(r"<figcaption>(.*?)</figcaption>", doc, re.S)
    assert captions and all(c.lower().count("hover") == 1 for c in captions), captions


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    w, h = struct.unpack(">II", data[16:24])
    return int(w), int(h)


def test_pngs_are_at_least_1600_pixels_wide(tmp_path: Path) -> None:
    s = two_workloads(tmp_path, loads=(1, 4), workloads=("sharegpt",))
    for f in session_figures(build(s)):
        png = render(replace(f, cache_dir=None), png=True).png
        assert png is not None and _png_size(png)[0] >= 1600, f.name


# ---- drawn once, kept, never stale --------------------------------------------------------------------------
def test_a_finished_sessions_figures_are_kept_and_a_changed_figure_drawn_again(tmp_path: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    s = two_workloads(tmp_path, loads=(1, 4), workloads=("sharegpt",))
    spec = next(f for f in session_figures(build(s)) if f.kind == "throughput")
    assert spec.cache_dir == s.path / "figures"
    first = render(spec, png=True)
    kept = sorted(p.name for p in (s.path / "figures").iterdir())
    assert kept == [f"sharegpt-throughput-{figcache.key_of(spec)}.png", f"sharegpt-throughput-{figcache.key_of(spec)}.svg"]

    def no_drawing(spec: FigureSpec) -> Any:
        raise AssertionError(f"{spec.name} drawn again")

    monkeypatch.setattr(figures_svg, "_draw", no_drawing)
    again = render(spec, png=True)
    assert (again.svg, again.png) == (first.svg, first.png)
    # the same session read again (a second report): the same figure, kept
    spec2 = next(f for f in session_figures(build(load_session(s.path))) if f.kind == "throughput")
    assert render(spec2).svg == first.svg
    # a figure that shows something else is another drawing: never the kept one
    changed = replace(spec, panels=[replace(spec.panels[0], series=[replace(spec.panels[0].series[0], points=[
        replace(p, y=p.y * 2) for p in spec.panels[0].series[0].points])] + spec.panels[0].series[1:])])
    assert figcache.key_of(changed) != figcache.key_of(spec)
    with pytest.raises(AssertionError, match="drawn again"):
        render(changed)
    monkeypatch.undo()
    redrawn = render(changed)
    assert redrawn.svg != first.svg and f'data-y="{changed.panels[0].series[0].points[0].y!r}"' in redrawn.svg


def test_old_drawings_are_dropped_beyond_keep(tmp_path: Path) -> None:
    s = two_workloads(tmp_path, loads=(1, 4), workloads=("sharegpt",))
    spec = next(f for f in session_figures(build(s)) if f.kind == "tradeoff")
    for k in range(figcache.KEEP + 2):
        render(replace(spec, caption=f"caption {k}"))
    assert len(list((s.path / "figures").glob("sharegpt-tradeoff-*.svg"))) == figcache.KEEP


def test_a_comparisons_figures_are_kept_in_the_first_sessions_folder(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    (spec,), first = _compare(tmp_path / "s", loads=(1, 4))
    assert spec.cache_dir == first.path / "figures"
    render(spec)
    assert [p.name for p in (first.path / "figures").iterdir()] == [f"{spec.name}-{figcache.key_of(spec)}.svg"]
    assert not list((tmp_path / "elsewhere").iterdir())


def test_a_running_sessions_figures_are_not_kept(tmp_path: Path) -> None:
    path = build_session(tmp_path, SessionSpec("live", [CellSpec("sharegpt", 1)], status="running"))
    lock = RunnerLock.acquire(path)
    try:
        specs = session_figures(build(load_session(path)))
        assert specs and all(f.cache_dir is None for f in specs)
        render(specs[0])
        assert not (path / "figures").exists()
    finally:
        lock.release()
    assert all(f.cache_dir == path / "figures" for f in session_figures(build(load_session(path))))


def test_a_folder_that_cannot_be_written_only_means_drawing_again(tmp_path: Path) -> None:
    s = two_workloads(tmp_path, loads=(1,), workloads=("sharegpt",))
    spec = next(f for f in session_figures(build(s)) if f.kind == "throughput")
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    r = render(replace(spec, cache_dir=blocked / "figures"))
    assert "<title>" in r.svg and blocked.read_text() == "not a folder"


def test_a_second_report_of_a_finished_session_never_loads_matplotlib(tmp_path: Path) -> None:
    """The second `report --format html` reads the kept drawings: the same page, and matplotlib never imported."""
    import subprocess
    import sys

    s = two_workloads(tmp_path, loads=(1, 4), workloads=("sharegpt",))
    runs = []
    for name in ("first.html", "second.html"):
        code = ("import sys; from servescope.__main__ import main; "
                f"rc = main(['report', {str(s.path)!r}, '--format', 'html', '-o', {str(tmp_path / name)!r}]); "
                "print(rc, 'matplotlib' in sys.modules)")
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
        assert r.returncode == 0, r.stderr[-2000:]
        runs.append(r.stdout.split())
    assert runs == [["0", "True"], ["0", "False"]]
    assert (tmp_path / "first.html").read_text() == (tmp_path / "second.html").read_text()
