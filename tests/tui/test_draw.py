"""What the screens draw (issue 10, the drawing half): histogram labels intact at every width, a readable
throughput chart at 80x24, selections as characters, F6/F7/F8 focus, nothing cut without an ellipsis,
zoom, per-screen searchable help, the sessions list's filter/sort/delete/rename, the compare baseline,
the simulator descriptions, ctrl+s adding `.toml`."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from textual.app import App, ComposeResult
from textual.widgets import DataTable, Input, Static, Tabs

from servescope.engine import wire as w
from servescope.reports.compare_doc import headline
from servescope.tui import messages as m
from servescope.tui.app import make_app
from servescope.tui.screens.compare import CompareScreen
from servescope.tui.screens.compose import ComposeScreen
from servescope.tui.screens.help import HelpScreen
from servescope.tui.screens.run import RunScreen
from servescope.tui.screens.sessions import SessionScreen, SessionsScreen
from servescope.tui.widgets import CellTable, LatencyHistogram, OverlayCurve, ThroughputCurve

from .fixtures import live_sweep_messages, write_session
from .helpers import drawn, set_input, text_of

# the --fast lane leaves this module out: 34 tests, ~43 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

# a word of the axis line with a ▲ is a marker and its own numbers, nothing else: `▲50`, `99▲`, `▲50,99`, `50,99▲`,
# `50▲▲99` (two markers side by side at an edge), or a bare `▲` whose number is in its neighbour's `▲50,99`
MARKER_WORD = re.compile(r"(?:50|99|50,99)?▲+(?:50|99|50,99)?")
NUM = re.compile(r"-?\d[\d,]*(\.\d+)?k?")


def two_sessions(home: Path) -> Path:
    base = home / "sessions"
    write_session(base, "qwen-fp8", "2026-12-01T10:00:00+0000", {"quant": "FP8", "gpu": "H100-SXM-80GB"},
                  telemetry=True)
    int4 = write_session(base, "qwen-int4", "2026-12-02T09:30:00+0000",
                         {"quant": "GPTQ-Int4", "gpu": "H100-SXM-80GB", "note": "a long tag value that will not fit"},
                         status="interrupted", loads=(1, 4), slow=1.5)
    from servescope.sessions.store import SessionWriter

    w = SessionWriter.open(int4)  # a long target and model, as a simulator profile has
    w.update(target=msgspec.structs.replace(w.meta.target, url="sim://rtx-pro-6000/qwen3.5-35b-a3b-gptq-int4"),
             model="Qwen/Qwen3.5-35B-A3B-GPTQ-Int4")
    return base


# ---- 2. histogram labels ------------------------------------------------------------------------------
# value sets that overwrote labels before: min 77.4 / p50 504 (▲504), p50 next to the max (1▲50), p50 and
# p99 in one bin (▲▲99), all equal, a long tail
DATASETS = {
    "field": [77.4] + [503.0 + i * 0.02 for i in range(60)] + [505.0, 1475.0],
    "near-max": [10.0 + i for i in range(40)] + [150.0] * 60,
    "one-bin": [1000.0] * 50 + [1000.5] * 50,
    "equal": [42.0] * 30,
    "tail": [20.0 + (i % 7) for i in range(200)] + [9000.0, 12000.0],
}


def _check_words(line: str, lo: str, hi: str, unit: str = "ms") -> None:
    """The axis line read word by word, as a user reads it: each word with a `▲` is a marker with only its own
    numbers (no label glued to it: not `1▲50`, `▲504`), p50 and p99 named once each, p50 first; the other words
    are the minimum then the maximum (`min 77.4`, `max 1475` where moved), the unit once, after one of them."""
    words = line.split()
    names: list[str] = []
    for word in words:
        if "▲" in word:
            assert MARKER_WORD.fullmatch(word), (word, line)
            names += re.findall(r"\d+", word)
    assert names == ["50", "99"], line
    labels = " ".join(word for word in words if "▲" not in word)
    u = re.escape(unit)
    assert re.fullmatch(rf"(?:min )?{re.escape(lo)}(?: {u})? (?:max )?{re.escape(hi)}(?: {u})?", labels), (labels, line)
    assert words.count(unit) == 1, line


@pytest.mark.parametrize("line", [
    "77.4        ▲50       ▲99      1475 ms",
    "77.4 ms     ▲50       ▲99      1475",  # the unit with the minimum, the maximum's place near ▲99
    "77.4           ▲ ▲50,99    1475 ms",  # close together: one label for both
    "77.4        50,99▲ ▲       1475 ms",
    "▲50,99 min 77.4        1475 ms",  # one column; a label moved for a marker says what it is
    "77.4        max 1475 ms 50,99▲",
    "50▲▲99 min 77.4         1475 ms",  # at the edge
    "77.4 ms        50▲ max 1475 99▲",  # the maximum moved from under ▲99
])
def test_the_axis_word_check_reads_each_marker_form(line: str) -> None:
    _check_words(line, "77.4", "1475")


@pytest.mark.parametrize("line", [
    "77.4   ▲504 ▲99   1475 ms",  # a marker glued to a number
    "77.4   ▲99      14▲50 ms",  # the maximum overwritten by a marker
    "77.4 ▲50▲99          1475 ms",  # two markers glued
    "77.4 ▲50 ▲50 ▲99     1475 ms",  # p50 twice
    "77.4   ▲99 ▲50       1475 ms",  # p99 before p50
    "77.4   ▲50 ▲99         1475",  # no unit
    "77.4 ms  ▲50 ▲99    1475 ms",  # the unit twice
    "▲50 ▲99              1475 ms",  # no minimum
    "1475 ▲50 ▲99         77.4 ms",  # the maximum first
])
def test_the_axis_word_check_rejects_overwritten_labels(line: str) -> None:
    with pytest.raises(AssertionError):
        _check_words(line, "77.4", "1475")


@pytest.mark.parametrize("name", sorted(DATASETS))
def test_histogram_axis_keeps_min_p50_p99_max_apart_at_every_width(name: str) -> None:
    from servescope.tui.widgets.histogram import _fmt, percentile

    from .test_histogram_markers import check_axis

    vals = sorted(DATASETS[name])
    hi = percentile(vals, 99.5) if len(vals) > 20 else vals[-1]
    for width in range(30, 161):
        # each ▲ in its percentile's bin, the labels the minimum and the maximum, a blank between any two
        line = check_axis(width, vals[0], max(hi, vals[0] + 1e-6), width, vals, "ms")
        _check_words(line, _fmt(vals[0]), _fmt(vals[-1]))  # both labels and the unit there, nothing glued


class HistApp(App[None]):
    def __init__(self, vals: list[float]) -> None:
        super().__init__()
        self.vals = vals

    def compose(self) -> ComposeResult:
        yield LatencyHistogram("TTFT", id="h")

    def on_mount(self) -> None:
        self.query_one(LatencyHistogram).values = tuple(self.vals)


@pytest.mark.parametrize("width", [30, 40, 57, 80, 120, 160])
async def test_histogram_drawn_at_several_widths_has_intact_labels(width: int) -> None:
    from servescope.tui.widgets.histogram import _fmt

    from .test_histogram_markers import check_drawn

    vals = DATASETS["field"]
    app = HistApp(vals)
    async with app.run_test(size=(width, 8)) as pilot:
        await pilot.pause()
        h = app.query_one(LatencyHistogram)
        check_drawn(h)  # each ▲ under a bar of its percentile's bin
        lines = [ln.rstrip() for ln in str(h.render()).split("\n")]
        _check_words(lines[-1], _fmt(min(vals)), _fmt(max(vals)))
        assert "p50 504" in lines[0] and "p99" in lines[0]  # the values themselves are in the title line


# ---- 4. the throughput chart at 80x24 ------------------------------------------------------------------
def _ticks(lines: list[str], sep: str) -> list[float]:
    out = []
    for ln in lines:
        if sep in ln:
            left = ln.split(sep)[0] if sep == "┤" else ln.rsplit(sep, 1)[1]
            mt = NUM.search(left.strip("▊ "))
            if mt:
                t = mt.group(0).replace(",", "")
                out.append(float(t[:-1]) * 1000 if t.endswith("k") else float(t))
    return out


def _check_chart(lines: list[str], title: str) -> None:
    body = [ln.lstrip("▊ ") for ln in lines]
    assert body[0].startswith(title[:20]), body  # the title first
    assert "■" in body[1] and "◆" in body[1] and "(l" in body[1], body  # the legend, above the plot
    plot = [ln for ln in body[2:] if "┤" in ln or "│" in ln]
    assert len(plot) >= 4, body  # at least four rows of data
    assert not any("tok/s" in ln for ln in plot), body  # the legend is never drawn over the data
    left, right = _ticks(plot, "┤"), _ticks(plot, "├")
    for ticks in (left, right):
        assert len(ticks) >= 2 and ticks == sorted(ticks, reverse=True) and min(ticks) == 0, body
        steps = {round(a - b, 6) for a, b in zip(ticks, ticks[1:], strict=False)}
        assert len(steps) == 1, body  # even steps (not 681.7 then 421.3)
    assert left != right or left[0] != left[-1]  # not the same numbers on both axes
    axis = next(ln for ln in body if "└" in ln)
    assert "c=1" in axis and "c=4" in axis  # the load's unit on the x axis


async def _feed(app: Any, home: Path) -> RunScreen:
    await app.switch_mode("run")
    run = app.get_screen("run", RunScreen)
    run.reset("sim://tiny: 1 workload")
    for msg in live_sweep_messages(home / "sessions" / "20261202-100000-demo"):
        run.post_message(msg)
    return run


async def test_throughput_chart_is_readable_at_80x24(home: Path) -> None:
    app = make_app(sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        run = await _feed(app, home)
        await pilot.pause()
        run.flush_charts()
        await pilot.pause()
        curve = run.query_one(ThroughputCurve)
        assert curve.size.height >= 7
        _check_chart(drawn(curve), "sharegpt: output tok/s")
        # zoom: the chart fills the screen, z again (or esc) puts it back
        curve.focus()
        await pilot.press("z")
        await pilot.pause()
        assert run.maximized is curve and curve.size.height >= 20
        _check_chart(drawn(curve), "sharegpt: output tok/s")
        await pilot.press("escape")
        await pilot.pause()
        assert run.maximized is None and isinstance(app.screen, RunScreen)  # esc unzoomed, did not go back


async def test_one_point_chart_has_distinct_round_ticks(home: Path) -> None:
    from servescope.tui.widgets.curve import CurvePoint

    app = make_app(sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        await app.switch_mode("run")
        run = app.get_screen("run", RunScreen)
        curve = run.query_one(ThroughputCurve)
        curve.title = "sharegpt: output tok/s vs load"
        curve.points = (CurvePoint(1, "c=1", 173.4, 173.4),)
        await pilot.pause()
        lines = drawn(curve)
        plot = [ln for ln in lines[2:] if "┤" in ln]
        assert _ticks(plot, "┤")[0] > 173.4 and _ticks(plot, "┤")[-1] == 0
        body = "\n".join(lines)
        assert "■" in body.split("\n", 2)[2] and "◆" in body.split("\n", 2)[2]  # both points drawn, side by side
        assert not re.search(r"-\d", body)  # no negative tick


async def test_compare_charts_are_titled_with_units(home: Path) -> None:
    base = two_sessions(home)
    app = make_app(sessions_dir=str(base))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f4", "space", "down", "space", "c")
        await pilot.pause()
        scr = app.screen
        assert isinstance(scr, CompareScreen)
        for wid, unit in (("#cmp-aggregate", "output tok/s"), ("#cmp-per-user", "mean tok/s/user")):
            lines = [ln.lstrip("▊ ") for ln in drawn(scr.query_one(wid, OverlayCurve))]
            assert lines[0].startswith(unit), lines  # the title names the metric and its unit
            assert "■" in lines[1] and "◆" in lines[1]  # the legend: one marker per session
            assert any("c=1" in ln and "└" in ln for ln in lines)


# ---- 5. selection marks are characters -----------------------------------------------------------------
async def test_workload_selection_is_marked_with_characters(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    app = make_app(sessions_dir=str(home / "sessions"), workloads_dir=home / "workloads")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f7")
        await pilot.pause()
        sl = app.screen.query_one("#workloads")
        lines = [ln.strip() for ln in drawn(sl)]
        assert any(ln.startswith("[x] sharegpt") for ln in lines), lines
        assert any(ln.startswith("[ ] balanced1k1k") for ln in lines), lines
        assert not any("▐" in ln for ln in lines)
        sl.highlighted = 1  # type: ignore[attr-defined]
        await pilot.press("space")
        await pilot.pause()
        assert any(ln.strip().startswith("[x] balanced1k1k") for ln in drawn(sl))


# ---- 6. focus ------------------------------------------------------------------------------------------
async def test_f6_f7_f8_focus_the_panes_first_field(home: Path) -> None:
    app = make_app(sessions_dir=str(home / "sessions"), workloads_dir=home / "workloads")
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f8")
        await pilot.pause()
        assert app.focused is not None and app.focused.id == "concurrency"
        await pilot.press("ctrl+a", "ctrl+k", "8")  # typing right after F8 goes into the field
        await pilot.pause()
        assert app.screen.query_one("#concurrency", Input).value == "8"
        await pilot.press("f7")
        await pilot.pause()
        sl = app.screen.query_one("#workloads")
        assert app.focused is sl and sl.highlighted == 0  # type: ignore[attr-defined]
        await pilot.press("f8")
        await pilot.pause()
        # the list keeps no highlight of its own once it lost focus: row 0 looks like row 2
        assert list(sl.render_line(0))[1].style.bgcolor == list(sl.render_line(2))[1].style.bgcolor
        await pilot.press("f6")
        await pilot.pause()
        assert app.focused is not None and app.focused.id == "url"
        # from the tab strip one Tab reaches the first field (no invisible stop)
        app.screen.query_one(Tabs).focus()
        await pilot.press("tab")
        await pilot.pause()
        assert app.focused is not None and app.focused.id == "url"


# ---- 7. nothing cut without an ellipsis at 80x24 -------------------------------------------------------
def _cells_cut_with_ellipsis(table: Any) -> None:
    shown = [c.key for c in table.shown]
    for i in range(table.row_count):
        full = table.full_row(i)
        for j, cell in enumerate(table.get_row_at(i)):
            text = cell.plain.rstrip()
            whole = full[[c.key for c in table.cols].index(shown[j])]
            assert text == whole or (text.endswith("…") and whole.startswith(text[:-1])), (text, whole)


async def test_run_screen_at_80x24_shows_every_finished_cell_and_the_session(home: Path) -> None:
    app = make_app(sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        run = await _feed(app, home)
        long_dir = home / "sessions" / ("20261202-100000-" + "a-long-session-name-" * 3)
        run.post_message(m.SweepFinished(w.SweepFinished(long_dir, "interrupted")))
        await pilot.pause()
        cells = run.query_one(CellTable)
        text = "\n".join(drawn(cells))
        for load in ("c=1", "c=4", "c=16"):
            assert load in text, text  # all three finished cells are on screen
        assert cells.virtual_size.width <= cells.size.width  # no horizontal scrollbar eating a row
        header = drawn(cells)[0]
        for c in cells.shown:
            assert c.label in header, header  # whole column labels (not `ok/`)
        _cells_cut_with_ellipsis(cells)
        line = drawn(run.query_one("#run-session", Static))[0].rstrip()
        assert line.startswith("session (interrupted): sessions/") and line.endswith("…"), line


async def test_sessions_list_at_80x24_shows_model_and_cuts_with_ellipsis(home: Path) -> None:
    two_sessions(home)
    app = make_app(sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        t = app.screen.query_one("#sessions", DataTable)
        header = drawn(t)[0]
        for col in ("name", "status", "target", "model"):
            assert f" {col} " in f" {header} ", header  # model no longer pushed off the right edge
        keys = [c.key for c in t.shown]
        assert {"name", "status", "target", "model"} <= set(keys), keys
        _cells_cut_with_ellipsis(t)
        detail = text_of(app.screen.query_one("#session-detail", Static))  # the highlighted one in full
        assert "model Qwen3.5-35B-A3B-GPTQ-Int4" in detail and "note=a long tag value that will not fit" in detail
        assert "workloads sharegpt" in detail


async def test_sessions_list_at_160_columns_cuts_tags_with_an_ellipsis(home: Path) -> None:
    base = two_sessions(home)
    write_session(base, "many-tags", "2026-12-03T09:30:00+0000",
                  {f"key{i}": f"value-number-{i}" for i in range(8)})
    app = make_app(sessions_dir=str(base))
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        t = app.screen.query_one("#sessions", DataTable)
        assert "tags" in [c.key for c in t.shown]
        _cells_cut_with_ellipsis(t)
        assert any(str(c.plain).endswith("…") for i in range(t.row_count) for c in t.get_row_at(i))


async def test_compare_headline_is_whole_at_80x24(home: Path) -> None:
    base = two_sessions(home)
    app = make_app(sessions_dir=str(base))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f4", "space", "down", "space", "c")
        await pilot.pause()
        scr = app.screen
        assert isinstance(scr, CompareScreen)
        head = " ".join(ln.strip() for ln in drawn(scr.query_one("#compare-head", Static)))
        first = headline(scr.comparison)[0]
        assert " ".join(first.split()) in " ".join(head.split()), (first, head)


# ---- discoverability -----------------------------------------------------------------------------------
async def test_help_is_per_screen_and_searchable(home: Path) -> None:
    app = make_app(sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        await pilot.press("f1")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        body = app.screen.query_one("#help Static", Static)
        first = text_of(body).strip().split("\n")[0]
        assert first.startswith("Sessions (F4)") and "this screen" in first
        await pilot.press(*"zoom")
        await pilot.pause()
        out = text_of(body)
        assert "Zoom" in out and "Skip cell" not in out
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, SessionsScreen)


async def test_sessions_filter_sort_delete_rename(home: Path) -> None:
    base = two_sessions(home)
    app = make_app(sessions_dir=str(base))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        scr = app.screen
        t = scr.query_one("#sessions", DataTable)
        assert t.row_count == 2
        # `/` filters
        await pilot.press("slash", *"int4")
        await pilot.pause()
        assert t.row_count == 1 and "qwen-int4" in t.full_row(0)
        await pilot.press("escape")
        await pilot.pause()
        assert t.row_count == 2 and t.has_focus
        # sort by a column (o), reverse (O)
        t.sort_on("name")
        assert [t.full_row(i)[2] for i in range(2)] == ["qwen-fp8", "qwen-int4"]
        await pilot.press("O")
        await pilot.pause()
        assert [t.full_row(i)[2] for i in range(2)] == ["qwen-int4", "qwen-fp8"]
        await pilot.press("o")
        assert t.sort_key != "name"
        t.sort_on(None)
        # rename (n), with the current name to edit
        await pilot.press("home", "n")
        await pilot.pause()
        assert app.screen.query_one("#ask-input", Input).value == "qwen-int4"
        await set_input(pilot, "#ask-input", "int4 run")
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, SessionsScreen)
        assert 'name = "int4 run"' in (base / "20261202-100000-qwen-int4" / "session.toml").read_text()
        assert t.full_row(0)[2] == "int4 run"
        # delete (d) asks first; n keeps it, y moves it to the trash
        await pilot.press("d")
        await pilot.pause()
        await pilot.press("n")
        await pilot.pause()
        assert t.row_count == 2
        await pilot.press("d")
        await pilot.pause()
        await pilot.press("y")
        await pilot.pause()
        assert t.row_count == 1
        assert (base / ".trash" / "20261202-100000-qwen-int4" / "session.toml").is_file()


async def test_compare_baseline_can_be_chosen(home: Path) -> None:
    base = two_sessions(home)
    app = make_app(sessions_dir=str(base))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("f4", "space", "down", "space", "c")
        await pilot.pause()
        scr = app.screen
        assert isinstance(scr, CompareScreen) and scr.comparison.labels[0] == "FP8"
        await pilot.press("B")
        await pilot.pause()
        assert scr.comparison.labels[0] == "GPTQ-Int4"
        assert "baseline GPTQ-Int4" in text_of(scr.query_one("#compare-head", Static))


async def test_session_detail_zooms_the_cell_table(home: Path) -> None:
    base = two_sessions(home)
    app = make_app(sessions_dir=str(base))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f4", "down", "enter")
        await pilot.pause()
        scr = app.screen
        assert isinstance(scr, SessionScreen)
        table = scr.query_one(CellTable)
        table.focus()
        hidden = len(table.cols) - len(table.shown)
        assert hidden > 0 and "z zooms" in str(table.border_subtitle)
        await pilot.press("z")
        await pilot.pause()
        assert scr.maximized is table and len(table.cols) - len(table.shown) < hidden
        await pilot.press("z")
        await pilot.pause()
        assert scr.maximized is None
        await pilot.press("escape")  # not zoomed: esc goes back
        await pilot.pause()
        assert isinstance(app.screen, SessionsScreen)


# ---- 10. simulator descriptions, ctrl+s adds .toml ------------------------------------------------------
async def test_simulator_profiles_are_described(home: Path) -> None:
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert "Tiny test model" in text_of(app.screen.query_one("#sim-desc", Static))
        from textual.widgets import Select

        sel = app.screen.query_one("#sim-profile", Select)
        prompts = [str(p) for p, _ in sel._options]
        assert any(p.startswith("tiny: Tiny test model") for p in prompts), prompts


async def test_ctrl_s_adds_toml_to_a_bare_name(home: Path) -> None:
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f8")
        await set_input(pilot, "#sweep-file", "gptq")
        await pilot.press("ctrl+s", "enter")  # ctrl+s asks where, offering the field's file: enter saves there
        await pilot.pause()
        assert isinstance(app.screen, ComposeScreen)
        assert (home / "gptq.toml").is_file() and not (home / "gptq").exists()
        assert app.screen.query_one("#sweep-file", Input).value == str(home / "gptq.toml")


async def test_event_log_zooms_and_scrolls(home: Path) -> None:
    from servescope.tui.widgets import EventLog

    app = make_app(sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        run = await _feed(app, home)
        await pilot.pause()
        log = run.query_one(EventLog)
        for i in range(40):
            log.event("info", f"line {i}")
        log.focus()
        await pilot.press("z")
        await pilot.pause()
        assert run.maximized is log and log.size.height >= 20
        await pilot.press("home")
        await pilot.pause()
        assert log.scroll_y == 0
        await pilot.press("pagedown")
        await pilot.pause()
        assert log.scroll_y > 0
        await pilot.press("z")
        await pilot.pause()
        assert run.maximized is None


async def test_session_head_is_cut_with_an_ellipsis_at_80(home: Path) -> None:
    base = two_sessions(home)
    app = make_app(sessions_dir=str(base))
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f4", "home", "enter")
        await pilot.pause()
        scr = app.screen
        assert isinstance(scr, SessionScreen)
        head = [ln.rstrip() for ln in drawn(scr.query_one("#session-head", Static))]
        assert len(head) == 2 and head[1].endswith("…") and "sim://rtx-pro-6000" in head[1], head


async def test_the_cell_time_runs_on_between_the_engines_batches(home: Path) -> None:
    """The engine reports a cell's elapsed time with each batch of finished requests (twice a second at most, and
    not at all before the first request ends); the header's cell time runs on from it every second meanwhile."""
    now = [1000.0]
    app = make_app(sessions_dir=str(home / "sessions"), clock=lambda: now[0])
    async with app.run_test(size=(80, 24)) as pilot:
        run = await _feed(app, home)  # the running cell's latest batch said 6.5 s
        await pilot.pause()
        assert run.progress.cell_elapsed == 6.5
        now[0] += 3.0
        run._tick()
        assert run.progress.cell_elapsed == pytest.approx(9.5)
        await pilot.pause()
        assert "cell 9.5 s" in text_of(run.progress)
        cell = live_sweep_messages(home / "sessions" / "20261202-100000-demo")[-1].cell
        run.post_message(m.RequestsMeasured(w.RequestsMeasured(cell, [], [], [], [], 0, 40, 2, 9.0)))  # the engine's own figure wins
        await pilot.pause()
        assert run.progress.cell_elapsed == 9.0
        now[0] += 1.0
        run._tick()
        assert run.progress.cell_elapsed == pytest.approx(10.0)
        run.post_message(m.CellStarted(w.CellStarted(cell, 4)))  # a new cell starts at 0 and runs on from there
        await pilot.pause()
        now[0] += 2.0
        run._tick()
        assert run.progress.cell_elapsed == pytest.approx(2.0)
