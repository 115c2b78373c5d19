"""The what-if pane (`w` on a saved session): a session measured on the real simulator (c=1,4), the twin fitted
from the pane (in a worker) and its predictions in the table equal to `predict(...)` called directly, the loads
outside the measured range marked, bad input as one line under the form (never a traceback), the layout at
80x24 and 160x48, and the chart's dashed series and band drawn as characters."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input, Select, Static

from servescope.engine.twin import fit_session, fit_time_estimate, load_twin
from servescope.engine.twinpredict import Load, predict
from servescope.engine.twinshape import Knobs
from servescope.sessions.store import load_session
from servescope.tui.app import make_app
from servescope.tui.screens.sessions import SessionScreen
from servescope.tui.screens.whatif import BAND_NOTE, WhatIfScreen
from servescope.tui.widgets.curve import ChartSpec, PredictionCurve, Series, draw_chart
from servescope.tui.widgets.table import FitTable
from servescope.workloads.spec import from_saved

from .helpers import drawn, full_row, set_input, text_of, wait_until

# the --fast lane leaves this module out: 8 tests, ~41 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = ('[workload]\nname = "short"\napi = "completions"\n'
            'input_tokens = { dist = "uniform", min = 100, max = 300 }\noutput_tokens = 24\n')
NUM = re.compile(r"\d[\d,]*(?:\.\d+)?")
LOADS = (1, 4, 8, 16)  # the default: the measured 1,4 and two doublings beyond


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real session: `servescope run` against the simulator's tiny profile, c=1 and c=4, 16 requests each."""
    d = tmp_path_factory.mktemp("whatif")
    (d / "short.toml").write_text(WORKLOAD)
    env = {**os.environ, "SERVESCOPE_HOME": str(d / "home"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    p = subprocess.run([sys.executable, "-m", "servescope", "run", "--url", "sim://tiny", "-w", str(d / "short.toml"),
                        "-c", "1,4", "-n", "16", "--save", str(d / "measured"), "--json"],
                       capture_output=True, text=True, timeout=300, env=env, cwd=d)
    assert p.returncode == 0, p.stderr[-3000:]
    return d / "measured"


@pytest.fixture(scope="module")
def fitted(measured: Path) -> Path:
    """The same session with its twin fitted (as `servescope twin fit` does)."""
    d = measured.parent / "fitted"
    shutil.copytree(measured, d)
    fit_session(load_session(d))
    return d


def install(session: Path, home: Path) -> Path:
    """A copy of the session in the app's sessions folder."""
    dest = home / "sessions" / "20261205-100000-short"
    shutil.copytree(session, dest)
    return dest


async def open_whatif(pilot: Any) -> WhatIfScreen:
    """F4, enter (the only session), w."""
    await pilot.press("f4")
    await pilot.pause()
    await pilot.press("enter")
    await pilot.pause()
    assert isinstance(pilot.app.screen, SessionScreen), pilot.app.screen
    await pilot.press("w")
    await pilot.pause()
    scr = pilot.app.screen
    assert isinstance(scr, WhatIfScreen), scr
    return scr


def status(scr: WhatIfScreen) -> str:
    return text_of(scr.query_one("#wi-status", Static))


def numbers(text: str) -> list[float]:
    return [float(n.replace(",", "")) for n in NUM.findall(text)]


def screen_text(app: Any) -> str:
    return "\n".join(s.text.rstrip() for s in app.screen._compositor.render_strips())


def rows(scr: WhatIfScreen) -> list[list[str]]:
    t = scr.query_one("#wi-table", FitTable)
    return [full_row(t, i) for i in range(t.row_count)]


def check_rows(table: list[list[str]], preds: list[Any]) -> None:
    """Each row: load, output tok/s [band], TTFT p50 ms [band], TPOT p50 ms [band], per-user tok/s, measured,
    note: the figures of `preds` to the digits shown (3 significant at least)."""
    assert len(table) == len(preds)
    for row, p in zip(table, preds, strict=True):
        s, band = p.summary, p.band
        assert row[0].rstrip("*") == p.load.label and row[0].endswith("*") == p.extrapolated
        for cell, value, key in ((row[1], s.output_tok_s, "output_tok_s"), (row[2], s.ttft_ms.p50, "ttft_ms"),
                                 (row[3], s.tpot_ms.p50, "tpot_ms")):
            shown = numbers(cell)
            assert len(shown) == 3, cell
            for got, want in zip(shown, [value, *band[key]], strict=True):
                assert got == pytest.approx(want, rel=0.006, abs=0.006), (p.load.label, key, cell)
        assert numbers(row[4])[0] == pytest.approx(s.per_user_tok_s.mean, rel=0.006, abs=0.006)


@pytest.mark.slow  # 6 s of the --fast lane on 2 cores
async def test_predict_fits_the_twin_first_then_matches_predict(home: Path, measured: Path) -> None:
    path = install(measured, home)
    app = make_app(sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(120, 36)) as pilot:
        scr = await open_whatif(pilot)
        assert "no twin yet" in text_of(scr.query_one("#wi-head", Static))
        assert scr.query_one("#wi-loads", Input).value == ",".join(map(str, LOADS))
        assert scr.query_one("#wi-workload", Input).value == "short"
        assert not scr.predictions  # no twin: nothing is predicted until asked
        said: list[str] = []  # every status line, in order (a short fit replaces the first in a moment)
        show = scr._status

        def record(text: str, error: bool = False) -> None:
            said.append(text)
            show(text, error)

        scr._status = record  # type: ignore[method-assign]
        await pilot.press("ctrl+r")
        assert said and said[0].startswith("fitting the twin") and f"({fit_time_estimate(load_session(path))})" in said[0]
        await wait_until(pilot, lambda: bool(scr.predictions) or "-error" in scr.query_one("#wi-status").classes,
                         240, "the fit and the prediction")
        assert scr.predictions, status(scr)
        assert (path / "twin" / "profile.toml").is_file()
        assert any(t.startswith("fitting the twin") and "start 1/" in t for t in said), said  # the fit's progress
        assert said[-1].startswith("predicted 4 loads of short in"), said
        session = load_session(path)
        twin = load_twin(session)
        assert twin is not None
        head = text_of(scr.query_one("#wi-head", Static))
        assert f"twin fitted to 2 cells, residual tok/s {twin.residuals['output_tok_s']:.1%}" in head
        assert f"TPOT p50 {twin.residuals['tpot_ms.p50']:.1%}" in head

        # the table holds what predict() says for the same question
        w = from_saved(dict(session.info.workloads[0]))
        want = predict(twin, w, [Load(concurrency=c) for c in LOADS], Knobs())
        table = rows(scr)
        check_rows(table, want)
        # measured loads show the measured tok/s beside; the loads beyond c=4 are marked, and say why. A cell the
        # client limited (its verdict "client bound", which a loaded machine can give c=1) measures the client, not
        # the server: it is left out, shown as "-" like a load never measured
        cells = [(int(r["concurrency"]), s) for r, s in zip(session.cells.to_dicts(), session.summaries(), strict=True)
                 if s is not None]
        server_bound = {c: s.output_tok_s for c, s in cells if not s.client_bound}
        assert sorted(c for c, _ in cells) == [1, 4]
        for row, c in zip(table[:2], (1, 4), strict=True):
            if c in server_bound:
                assert numbers(row[5])[0] == pytest.approx(server_bound[c], rel=0.006), row
            else:
                assert row[5] == "-", row
        assert table[2][5] == "-" and table[3][5] == "-"
        for row, c in zip(table, LOADS, strict=True):
            beyond = c > 4
            assert (f"c={c} outside the measured c=1..4" in row[6]) == beyond, row
            if beyond:
                assert row[0] == f"c={c}*" and row[6].startswith(f"extrapolated: c={c} outside")
        assert "c=16 outside the measured c=1..4" in want[3].why

        # the chart: measured solid at c=1,4 (those the server bound), predicted hollow and dashed at every load
        curve = scr.query_one(PredictionCurve)
        assert [p.x for p in curve.measured] == [float(c) for c in sorted(server_bound)]
        assert [p.x for p in curve.predicted] == [float(c) for c in LOADS]
        lines = drawn(curve)
        assert "band (tok/s)" in lines[1], lines[1]
        # the legend names the dashed series against the measured one, or says nothing was measured
        assert ("predicted (dashed)" if server_bound else "(not measured in this session)") in lines[1], lines[1]
        plot = "\n".join(lines[2:])
        assert "□" in plot and "╌" in plot
        assert ("■" in plot) == bool(server_bound)
        # a load beyond what the twin can hold is one line on the screen, not a run that eats the machine
        scr.query_one("#wi-loads", Input).value = "99999999999999"
        await pilot.press("ctrl+r")
        await wait_until(pilot, lambda: "-error" in scr.query_one("#wi-status").classes, 60, "the cap's message")
        assert "give at most" in status(scr), status(scr)
        scr.query_one("#wi-loads", Input).value = ",".join(map(str, LOADS))

        # esc goes back to the session
        await pilot.press("escape")
        await pilot.pause()
        assert isinstance(app.screen, SessionScreen)


BAD = [
    ("#wi-seqs", "abc", "max-num-seqs: 'abc' is not a whole number"),
    ("#wi-workload", "no-such-workload", "unknown workload 'no-such-workload'"),
    ("#wi-gmu", "1.5", "gpu-memory-utilization: 1.5 is outside (0, 1]"),
    ("#wi-loads", "4,x", "loads"),
    # a question the twin itself refuses (in the worker): longin's 8,192 + 256 tokens exceed max_model_len 8,192
    ("#wi-workload", "longin", "do not fit the server's max_model_len"),
]


@pytest.mark.parametrize("field, value, says", BAD, ids=[b[1] for b in BAD])
async def test_bad_input_is_one_line_never_a_traceback(home: Path, fitted: Path, field: str, value: str,
                                                       says: str) -> None:
    install(fitted, home)
    app = make_app(sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(100, 30)) as pilot:
        scr = await open_whatif(pilot)
        await wait_until(pilot, lambda: bool(scr.predictions), 60, "the prediction on opening (fitted already)")
        await set_input(pilot, field, value)
        await pilot.press("enter")
        await wait_until(pilot, lambda: not scr.busy, 60, "the answer")
        await pilot.pause()
        st = scr.query_one("#wi-status", Static)
        text = text_of(st)
        assert says in text, text
        assert "\n" not in text and st.has_class("-error")
        shown = screen_text(app)
        assert "Traceback" not in shown and "Error:" not in shown
        assert app.is_running and isinstance(app.screen, WhatIfScreen)
        if value == "longin":  # the twin's own refusal: nothing left on screen that answers another question
            assert not scr.predictions and scr.query_one("#wi-table", FitTable).row_count == 0


async def test_kv_settings_change_the_prediction_and_are_marked(home: Path, fitted: Path) -> None:
    path = install(fitted, home)
    app = make_app(sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(120, 36)) as pilot:
        scr = await open_whatif(pilot)
        await wait_until(pilot, lambda: bool(scr.predictions), 60, "the prediction on opening")
        scr.query_one("#wi-kv", Select).value = "fp8"
        await set_input(pilot, "#wi-seqs", "2")
        await set_input(pilot, "#wi-loads", "2,8")
        await pilot.press("enter")
        await wait_until(pilot, lambda: not scr.busy and [p.load.concurrency for p in scr.predictions] == [2, 8], 60)
        session = load_session(path)
        twin = load_twin(session)
        assert twin is not None
        knobs = Knobs(kv_cache_dtype="fp8", max_num_seqs=2)
        want = predict(twin, from_saved(dict(session.info.workloads[0])), [Load(concurrency=2), Load(concurrency=8)],
                       knobs)
        table = rows(scr)
        check_rows(table, want)
        for row in table:  # a changed server is outside what was measured, at every load
            assert row[0].endswith("*") and "server settings changed (--kv-cache-dtype fp8 --max-num-seqs 2)" in row[6]
        assert "--kv-cache-dtype fp8 --max-num-seqs 2" in status(scr)


@pytest.mark.parametrize("size", [(80, 24), (160, 48)])
async def test_readable_at_80x24_and_160x48(home: Path, fitted: Path, size: tuple[int, int]) -> None:
    install(fitted, home)
    app = make_app(sessions_dir=str(home / "sessions"))
    async with app.run_test(size=size) as pilot:
        scr = await open_whatif(pilot)
        await wait_until(pilot, lambda: bool(scr.predictions), 60, "the prediction on opening")
        await pilot.pause()
        shown = screen_text(app)
        lines = shown.split("\n")
        assert len(lines) == size[1] and all(len(ln) <= size[0] for ln in lines)
        curve = scr.query_one(PredictionCurve)
        assert curve.size.height >= 7
        chart = [ln.lstrip("▊│ ") for ln in drawn(curve)]
        assert chart[0].startswith("short: output tok/s vs load")
        assert "predicted" in chart[1] and "band" in chart[1]  # the legend, above the plot
        assert sum("┤" in ln for ln in chart) >= 2 and any("c=16" in ln for ln in chart if "└" in ln)
        # every predicted load is a row on screen, with its units in the header
        table = [ln for ln in lines if ln.startswith(("│ c=", "┃ c="))]
        assert [ln.split()[1].rstrip("*") for ln in table] == [f"c={c}" for c in LOADS]
        header = next(ln for ln in lines if "output tok/s [band]" in ln)
        assert "TTFT p50 ms [band]" in header and "TPOT p50 ms [band]" in header
        if size[0] >= 160:
            assert "note" in header and "tok/s/user" in header and "measured tok/s" in header
        # the band's note whole (wrapped at 80 columns), the footer's keys
        assert BAND_NOTE in " ".join(ln.strip() for ln in lines if ln.strip())
        assert "Predict" in lines[-1] and "Back" in lines[-1]


# ---- the chart's dashed series and band ------------------------------------------------------------------------
def test_dashed_series_and_band_are_drawn_apart_from_a_solid_one() -> None:
    solid = Series("measured", ((0, 100.0), (2, 300.0)), "■", short="m")
    dashed = Series("predicted (dashed)", ((0, 110.0), (2, 200.0), (4, 400.0)), "□", dashed=True,
                    band=((0, 100.0, 120.0), (2, 150.0, 260.0), (4, 300.0, 520.0)), band_label="band (tok/s)")
    spec = ChartSpec("t", ("c=1", "c=2", "c=4", "c=8", "c=16"), "users", (solid, dashed))
    lines = draw_chart(spec, 60, 20).plain.split("\n")
    assert "■ measured" in lines[1] and "□╌ predicted (dashed)" in lines[1] and "░ band (tok/s)" in lines[1]
    plot = [ln.split("┤", 1)[-1].split("│", 1)[-1] for ln in lines[2:-1]]
    cols_dash = {i for ln in plot for i, ch in enumerate(ln) if ch == "╌"}
    cols_dot = {i for ln in plot for i, ch in enumerate(ln) if ch == "·"}
    right_of = max(i for ln in plot for i, ch in enumerate(ln) if ch == "■")
    assert cols_dash and cols_dot
    assert min(cols_dot) < right_of and max(cols_dot) < right_of  # dots only between the solid series' points
    assert max(cols_dash) > right_of  # the dashed line goes on to c=16, where only the prediction is
    # the band: shaded between lo and hi, under the lines and markers, widest at c=16 (5 rows for 300..520 of 600)
    shade = [(r, i) for r, ln in enumerate(plot) for i, ch in enumerate(ln) if ch == "░"]
    assert shade
    last = max(i for ln in plot for i, ch in enumerate(ln) if ch == "□")
    assert sum(1 for r, i in shade if i == last) >= 3 or sum(1 for r, i in shade if i == last - 1) >= 3
    # the axis reaches the band's top (520), not only the points' (400)
    ticks = [float(ln.split("┤")[0].replace(",", "")) for ln in lines[2:-1] if "┤" in ln]
    assert max(ticks) >= 520
    # without a band or dashes: none of their characters, and no band in the legend
    plain = draw_chart(ChartSpec("t", ("c=1", "c=2"), "users", (Series("m", ((0, 1.0), (1, 2.0)), "■"),)), 40, 10)
    assert "░" not in plain.plain and "╌" not in plain.plain and "band" not in plain.plain
