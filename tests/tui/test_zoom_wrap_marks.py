"""Display fixes: `t` on a zoomed panel hands the zoom to the panel shown in its place, and is not offered while
another pane is zoomed (it would swap the panels behind it); the event log wraps
again when zoomed or resized; under NO_COLOR every chart mark is told apart by its glyph; Compare's client-bound
points are hollow and not joined to the line; a simulator's quality figures are said to be synthetic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.app import App, ComposeResult

from servescope.core.quality import QualityResult, TaskScore, wilson
from servescope.sessions.store import SessionWriter
from servescope.tui.app import make_app
from servescope.tui.screens.run import RunScreen
from servescope.tui.screens.sessions import SessionScreen
from servescope.tui.widgets.curve import CLIENT_BOUND, CurvePoint, OverlayCurve, ThroughputCurve
from servescope.tui.widgets.histogram import LatencyHistogram
from servescope.tui.widgets.panels import CellTable, EventLog, ServerPanel, TelemetryPanel
from servescope.tui.widgets.quality import QualityPanel
from tests.support.meta import meta_of, quality_settings

from .fixtures import live_sweep_messages, write_session
from .helpers import drawn, wait_until

# the --fast lane leaves this module out: 13 tests, ~31 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

QUALITY_SETTINGS = {"tasks": ["arithmetic"], "contexts": [1024], "n": 20, "top_k": 5, "seed": 0, "reference": None,
                    "user_sets": []}


def sim_result() -> QualityResult:
    """A probe's result as the simulator gives it: a perplexity no model has."""
    lo, hi = wilson(12, 20)
    return QualityResult(perplexity=50804.8, perplexity_tokens=4096,
                         tasks={"arithmetic": TaskScore(accuracy=0.6, n=20, correct=12, lo=lo, hi=hi)})


def screen_text(app: Any) -> str:
    return "\n".join(s.text.rstrip() for s in app.screen._compositor.render_strips())


async def open_session(pilot: Any) -> SessionScreen:
    await pilot.press("f4")
    await pilot.pause()
    await pilot.press("enter")
    await pilot.pause()
    scr = pilot.app.screen
    assert isinstance(scr, SessionScreen), scr
    return scr


# ---- 5. `t` on a zoomed panel ------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_t_on_a_zoomed_session_panel_zooms_the_panel_shown_instead(home: Path, size: tuple[int, int]) -> None:
    write_session(home / "sessions", "qwen-fp8", "2026-12-01T10:00:00+0000", {"quant": "FP8"}, telemetry=True)
    app = make_app(sessions_dir=str(home / "sessions"))
    async with app.run_test(size=size) as pilot:
        scr = await open_session(pilot)
        live, server = scr.query_one(TelemetryPanel), scr.query_one(ServerPanel)
        live.focus()
        await pilot.press("z")
        await pilot.pause()
        assert scr.maximized is live
        await pilot.press("t")
        await wait_until(pilot, lambda: scr.maximized is server, what="the zoom handed to the /metrics panel")
        await pilot.pause()
        assert server.display and not live.display and app.focused is server
        shown = screen_text(app)
        assert "╱" not in shown, shown  # not the hatched screen of a maximized pane that is not displayed
        assert "server /metrics per cell" in shown, shown
        await pilot.press("t")  # and back
        await wait_until(pilot, lambda: scr.maximized is live, what="the zoom handed back")
        assert app.focused is live
        await pilot.press("t", "escape")
        await wait_until(pilot, lambda: scr.maximized is None, what="esc unzooms")
        assert app.focused is server, app.focused  # the panel that was on screen, not the chart
        assert isinstance(app.screen, SessionScreen)


async def test_t_on_the_zoomed_run_panel_zooms_the_panel_shown_instead(home: Path) -> None:
    app = make_app(sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        await app.switch_mode("run")
        run = app.get_screen("run", RunScreen)
        run.reset("sim://tiny: 1 workload")
        for msg in live_sweep_messages(home / "sessions" / "20261202-100000-demo"):
            run.post_message(msg)
        await pilot.pause()
        live, server = run.query_one(TelemetryPanel), run.query_one(ServerPanel)
        shown_first = live if live.display else server
        other = server if shown_first is live else live
        shown_first.focus()
        await pilot.press("z")
        await pilot.pause()
        await pilot.press("t")
        await wait_until(pilot, lambda: run.maximized is other, what="the zoom handed to the other panel")
        assert app.focused is other and "╱" not in screen_text(app)


def footer_keys(app: Any) -> set[str]:
    """The keys the footer offers now (the bindings shown, as Textual's Footer lists them)."""
    return {key for key, b in app.screen.active_bindings.items() if b.binding.show and b.enabled}


@pytest.mark.parametrize("where", ["run", "session"])
async def test_t_is_not_offered_while_another_pane_is_zoomed(home: Path, where: str) -> None:
    """`z` on a histogram, then `t`: the swap would happen behind the zoomed pane, nothing visible (the footer
    offered `t Panel`): it is neither offered nor run; unzoomed, it is again."""
    write_session(home / "sessions", "qwen-fp8", "2026-12-01T10:00:00+0000", {"quant": "FP8"}, telemetry=True)
    app = make_app(sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        if where == "run":
            await app.switch_mode("run")
            scr: Any = app.get_screen("run", RunScreen)
            scr.reset("sim://tiny: 1 workload")
            for msg in live_sweep_messages(home / "sessions" / "20261202-100000-demo"):
                scr.post_message(msg)
            await pilot.pause()
        else:
            scr = await open_session(pilot)
        live, server = scr.query_one(TelemetryPanel), scr.query_one(ServerPanel)
        before = (live.display, server.display)
        assert "t" in footer_keys(app)
        hist = scr.query(LatencyHistogram).first()
        hist.focus()
        await pilot.press("z")
        await wait_until(pilot, lambda: scr.maximized is hist, what="the histogram zoomed")
        assert "t" not in footer_keys(app) and "z" in footer_keys(app)
        await pilot.press("t")
        await pilot.pause()
        assert (live.display, server.display) == before and scr.maximized is hist
        await pilot.press("z")
        await wait_until(pilot, lambda: scr.maximized is None, what="unzoomed")
        assert "t" in footer_keys(app)


async def test_q_on_the_zoomed_cells_table_zooms_the_quality_shown_instead(home: Path) -> None:
    p = write_session(home / "sessions", "qwen-fp8", "2026-12-01T10:00:00+0000", {"quant": "FP8"})
    SessionWriter.open(p).write_quality(sim_result(), quality_settings(QUALITY_SETTINGS))
    app = make_app(sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        scr = await open_session(pilot)
        cells, panel = scr.query_one(CellTable), scr.query_one(QualityPanel)
        assert app.focused is cells
        await pilot.press("z")
        await pilot.pause()
        await pilot.press("q")
        await wait_until(pilot, lambda: scr.maximized is panel, what="the quality zoomed in the cells' place")
        assert "cells (" not in screen_text(app)  # not the table, whose column is hidden
        await pilot.press("q")
        await wait_until(pilot, lambda: scr.maximized is cells, what="the cells zoomed again")
        assert app.focused is cells


# ---- 8. the event log wraps again ----------------------------------------------------------------------------
async def test_the_event_log_wraps_again_when_zoomed_and_resized(home: Path) -> None:
    app = make_app(sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        await app.switch_mode("run")
        log = app.get_screen("run", RunScreen).query_one(EventLog)
        text = "cell 2 (sharegpt c=4): input tokens differ from the request by up to 3 (mean +1.2), " * 2
        for i in range(3):
            log.event("warning", f"{i}: {text}")
        await pilot.pause()

        def widest() -> int:
            return max(len(ln.text.rstrip()) for ln in log.lines)

        narrow = log.scrollable_content_region.width
        assert widest() <= narrow
        rows_narrow = len(log.lines)
        log.focus()
        await pilot.press("z")
        await wait_until(pilot, lambda: log.scrollable_content_region.width > narrow, what="the zoomed log")
        await pilot.pause()
        wide = log.scrollable_content_region.width
        assert widest() > narrow and widest() <= wide, (widest(), narrow, wide)  # the whole width is used
        assert len(log.lines) < rows_narrow
        assert log.scroll_y == log.max_scroll_y  # still at the newest line
        await pilot.press("z")
        await pilot.pause()
        assert widest() <= narrow and len(log.lines) == rows_narrow
        await pilot.resize_terminal(160, 48)
        await wait_until(pilot, lambda: log.scrollable_content_region.width > narrow, what="the resized log")
        await pilot.pause()
        assert narrow < widest() <= log.scrollable_content_region.width
        log.reset()  # a new sweep: nothing comes back on the next resize
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert not log.lines


# ---- 7. marks told apart without colour --------------------------------------------------------------------------
def knee_and_capacity() -> tuple[CurvePoint, ...]:
    # aggregate gains less than per-user loses past c=4 (the knee); c=8 is the last to meet the SLOs
    return (CurvePoint(1, "c=1", 100, 100, True), CurvePoint(2, "c=2", 190, 95, True),
            CurvePoint(4, "c=4", 360, 90, True), CurvePoint(8, "c=8", 380, 47.5, True),
            CurvePoint(16, "c=16", 390, 24, False), CurvePoint(32, "c=32", 300, 20, None, live=True))


async def curve_lines(monkeypatch: pytest.MonkeyPatch, home: Path, no_color: bool) -> tuple[list[str], Any]:
    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    else:
        monkeypatch.delenv("NO_COLOR", raising=False)
    app = make_app(sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(100, 30)) as pilot:
        await app.switch_mode("run")
        curve = app.get_screen("run", RunScreen).query_one(ThroughputCurve)
        curve.points = knee_and_capacity()
        curve.focus()
        await pilot.press("z")
        await pilot.pause()
        return drawn(curve), curve.render()


async def test_without_colour_the_chart_tells_its_marks_apart_by_glyph(home: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    lines, text = await curve_lines(monkeypatch, home, no_color=True)
    legend, plot = lines[1], lines[2:-1]
    # each series' key is its marker and its line's glyph; knee ┊ and SLO capacity ┃ differ
    assert "■· tok/s (left)" in legend and "◆- mean tok/s/user (right)" in legend, legend
    assert "┊ knee c=4" in legend and "┃ SLO capacity c=8" in legend, legend
    assert "□◇ running" in legend
    body = "".join(plot)
    for glyph in "■◆·-┊┃□◇":
        assert glyph in body, (glyph, lines)
    # no colour anywhere in the chart: the Monochrome filter would turn a magenta line into a near-background grey
    assert not [sp for sp in text.spans if any(w in str(sp.style).split() for w in ("cyan", "magenta", "yellow",
                                                                                    "green", "red"))]


async def test_in_colour_the_chart_is_unchanged(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines, text = await curve_lines(monkeypatch, home, no_color=False)
    legend = lines[1]
    assert "■ tok/s (left)" in legend and "◆ mean tok/s/user (right)" in legend and "┊ SLO capacity c=8" in legend
    assert "-" not in "".join(lines[2:-1]) and "┃" not in "".join(lines)
    assert any("magenta" in str(sp.style) for sp in text.spans)


# ---- 9. client-bound points on Compare; the simulator's quality -----------------------------------------------
class OneChart(App[None]):
    def compose(self) -> ComposeResult:
        yield OverlayCurve(id="chart")


@pytest.mark.parametrize("no_color", [False, True])
async def test_compare_draws_a_client_bound_point_hollow_and_apart_from_the_line(
        no_color: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if no_color:
        monkeypatch.setenv("NO_COLOR", "1")
    app = OneChart()
    async with app.run_test(size=(80, 20)) as pilot:
        chart = app.query_one(OverlayCurve)
        chart.title = "output tok/s vs load: sharegpt"
        chart.series = (("fp8", ((1.0, 100.0), (2.0, 200.0), (4.0, 400.0), (8.0, 410.0, True))),
                        ("int4", ((1.0, 80.0), (2.0, 150.0), (4.0, 300.0), (8.0, 320.0, False))))
        await pilot.pause()
        lines = drawn(chart)
        legend = " ".join(lines[1:3])
        assert f"□ {CLIENT_BOUND}" in legend, lines  # only fp8's c=8 was client bound
        plot = lines[3:-1] if "client-bound" in lines[2] else lines[2:-1]
        body = "\n".join(plot)
        assert body.count("□") == 1 and body.count("■") == 3 and body.count("◆") == 4, body
        rb = next(r for r, ln in enumerate(plot) if "□" in ln)
        r4 = max((r for r, ln in enumerate(plot) if "■" in ln), key=lambda r: plot[r].index("■"))  # fp8's c=4
        c4, cb = plot[r4].index("■"), plot[rb].index("□")
        # nothing joins c=4's point to the client-bound one: the rows between them are empty there
        between = [ln[c4 + 1:cb] for ln in plot[min(r4, rb):max(r4, rb) + 1]]
        assert not "".join(between).strip(), body


def sim_quality_session(base: Path) -> Path:
    w = SessionWriter.create(base / "20261201-100000-quality-sim", meta_of(**{
        "kind": "quality", "name": "quality sim", "model": "tiny", "target": {"url": "sim://tiny", "engine": "vllm"}}))
    w.write_quality(sim_result(), quality_settings(QUALITY_SETTINGS))
    w.finish("completed")
    return base


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_a_simulators_quality_figures_are_said_to_be_synthetic(home: Path, size: tuple[int, int]) -> None:
    sim_quality_session(home / "sessions")
    app = make_app(sessions_dir=str(home / "sessions"))
    async with app.run_test(size=size) as pilot:
        scr = await open_session(pilot)
        assert scr.query_one(QualityPanel).display
        shown = " ".join(screen_text(app).split())
        assert "50,804.8" in shown or "50804.8" in shown, shown
        assert "! synthetic: the simulator (sim://) makes these quality figures up; they measure no model" in shown, shown
