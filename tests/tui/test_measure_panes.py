"""The app says how each cell was measured (issue 47): the Run pane's cell table and log and the Results pane name
the window a cell's figures are over, mark a cell `imprecise` (with the precision reached) or `saturated`, give its
interference probes' TTFT and E2E, and say why a load was skipped; the Compose screen's sweeps stop climbing past
saturation by default (headless runs ask for it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import DataTable

from servescope.core.results import CellPrecision, CellProbes, CellResult, CellWindow, Dist, Saturation
from servescope.engine import wire as w
from servescope.tui import messages as m
from servescope.tui.app import make_app
from servescope.tui.screens.compose import ComposeScreen
from servescope.tui.screens.run import RunScreen
from servescope.tui.screens.sessions import SessionScreen
from servescope.tui.widgets.panels import CELL_COLUMNS, CellTable, TelemetryPanel, short_status
from tests.support.meta import meta_of

from .fixtures import summary_for
from .helpers import wait_until

# the --fast lane leaves this module out: 3 tests, ~3 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

CELLS = [m.CellInfo(i, "sharegpt", f"c={c}", c, None, 40, None, "in 200-512 (uniform) / out 256 (chat)")
         for i, c in enumerate((16, 32, 64))]
SAT_REASON = "saturated: the server's queue never emptied (a request waiting in every sample of the window)"


def measured(imprecise: bool, saturated: bool) -> CellResult:
    return CellResult(
        requests_ok=40, output_tok_s=500.0, per_user_tok_s=Dist(mean=30.0),
        window=CellWindow(kind="steady", start_s=2.5, end_s=19.0, requests=33, requests_ok=33, ramp_requests=7,
                          basis="once the last of 32 users started to the last send"),
        precision=CellPrecision(target=0.02, reached=0.031 if imprecise else 0.018, requests=40,
                                figure="output_tok_s", imprecise=imprecise, ceiling="40 requests"),
        saturation=Saturation(saturated=saturated, reason=SAT_REASON if saturated else "", basis="server waiting"),
        probes=CellProbes(rate=0.5, input_tokens=64, output_tokens=16, sent=9, ok=9,
                          ttft_ms=Dist(p50=41.0, p90=80.0), e2e_ms=Dist(p50=310.0, p90=420.0)))


def col(name: str) -> int:
    return CELL_COLUMNS.index(name)


def test_a_marked_cells_short_status_is_its_mark() -> None:
    assert short_status("done, saturated") == "saturated"
    assert short_status("done, imprecise, saturated") == "imprecise, saturated"
    assert short_status("done, saturated, client BOUND") == "bound"
    assert short_status("stopped, client BOUND") == "stopped" and short_status("done") == "done"


async def test_the_run_pane_says_each_cells_window_precision_saturation_probes_and_skips(home: Path) -> None:
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(200, 50)) as pilot:
        app.switch_mode("run")
        await pilot.pause()
        run = app.screen
        assert isinstance(run, RunScreen)
        run.reset("t")
        run.post_message(m.SweepStarted(w.SweepStarted(home / "sessions" / "x", CELLS, "sim://tiny", "tiny", None,
                                                       "t", True)))
        logged: list[str] = []
        event = run.log_view.event
        run.log_view.event = lambda level, text: (logged.append(f"{level} {text}"), event(level, text))[1]  # type: ignore[method-assign]
        for cell, s in ((CELLS[0], measured(True, False)), (CELLS[1], measured(False, True))):
            run.post_message(m.CellStarted(w.CellStarted(cell, 3)))
            run.post_message(m.CellFinished(w.CellFinished(cell, s, "done")))
        why = ("skipped after saturation (--stop-after-saturation): the load 32 users was saturated (the server's queue "
               "never emptied) and 64 users was run past it")
        run.post_message(m.CellSkipped(w.CellSkipped(CELLS[2], why)))
        await pilot.pause()
        table = run.query_one(CellTable)
        first, second = table.data["0"], table.data["1"]
        assert first[col("status")] == "done, imprecise" and second[col("status")] == "done, saturated"
        assert first[col("window")] == "steady" and first[col("precision")] == "imprecise +-3.1%"
        assert second[col("precision")] == "+-1.8%"
        assert first[col("probe TTFT p50")] == "41.0" and first[col("probe E2E p50")] == "310"
        assert table.data["2"][col("status")] == "skipped"
        text = "\n".join(logged)
        assert ("info cell 1 steady window, 2.5-19.0 s of the cell: 33 of 40 requests (7 in the ramp, 0 in the drain "
                "left out)") in text
        assert ("warning cell 1 imprecise, +-3.1% on output_tok_s (target 2%) over 40 requests: the ceiling (40 "
                "requests) came first") in text
        assert f"warning cell 2 {SAT_REASON}" in text
        assert "cell 1 interference probes (0.5/s, 64 in / 16 out): 9 sent; TTFT p50 41.00 ms" in text
        assert f"cell 3/3 sharegpt c=64 skipped: {why}" in text


def measured_session(base: Path) -> Path:
    """A saved session of two cells written by the store, the second measured as the engine saves one: a window, a
    precision, a saturation mark, probes."""
    from servescope.sessions.store import SessionWriter
    from servescope.workloads.spec import PRESETS

    path = base / "20261207-100000-m"
    meta = {"name": "m", "target": {"url": "sim://tiny", "version": "0.32.0-sim", "metrics": True}, "model": "tiny",
            "workloads": [PRESETS["sharegpt"].to_dict()], "slos": {}, "tags": {},
            "cells": [{"index": i, "workload": "sharegpt", "concurrency": c, "load_label": f"c={c}",
                       "status": "planned"} for i, c in enumerate((16, 32))]}
    w = SessionWriter.create(path, meta_of(**meta))
    for i, c in enumerate((16, 32)):
        df, s = summary_for(c)
        if i == 1:
            s.update({k: v for k, v in measured(False, True).to_dict().items()
                      if k in ("window", "precision", "saturation", "probes")})
        row = {"index": i, "workload": "sharegpt", "api": "chat", "concurrency": c, "rate": None, "arrival": None,
               "max_concurrency": None, "requests_planned": 60, "duration_s_planned": None, "warmup": 0,
               "load_label": f"c={c}", "status": "done", "reason": ""}
        w.write_cell(row, df, CellResult.from_dict(s))
    w.finish("completed")
    return path


async def test_the_results_pane_says_how_the_highlighted_cell_was_measured(home: Path) -> None:
    path = measured_session(home / "sessions")
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(200, 50)) as pilot:
        scr = SessionScreen(path)
        await app.push_screen(scr)
        await pilot.pause()
        scr.show_cell(1)
        await pilot.pause()
        lines = "\n".join(scr.query_one(TelemetryPanel).gpu_lines)
        assert "cell 2 steady window, 2.5-19.0 s of the cell: 33 of 40 requests" in lines
        assert f"cell 2 {SAT_REASON}" in lines and "cell 2 interference probes (0.5/s" in lines
        assert scr.query_one(CellTable).data["1"][col("status")] == "done, saturated"


async def test_the_apps_sweeps_stop_after_saturation_and_a_loaded_sweep_file_says_for_itself(home: Path) -> None:
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ComposeScreen)
        spec = screen.collect()
        assert spec is not None and spec.stop_after_saturation is True
        sweep = home / "s.toml"
        spec.replace(stop_after_saturation=False).save(sweep)
        from servescope.engine.spec import SweepSpec

        screen.apply_sweep(SweepSpec.from_toml(sweep))
        await pilot.pause()
        again = screen.collect()
        assert again is not None and again.stop_after_saturation is False


async def test_the_results_panes_histograms_are_over_the_cells_steady_window(home: Path) -> None:
    """The cell table's TTFT p50 is the steady window's; the histograms beside it drew every measured request of
    the cell (the ramp's too), so their p50 read another figure under the same name. They draw the window's."""
    from servescope.sessions.store import load_session
    from servescope.tui.widgets.histogram import LatencyHistogram, percentile

    from .fixtures import write_session

    path = write_session(home / "sessions", "ramped", "2026-12-01T10:00:00+0000", {}, loads=(4,), ramp=20)
    session = load_session(path)
    df = session.requests(0)
    inside = df.filter(df["in_window"] & (df["status"] == "ok"))
    assert 0 < inside.height < df.filter(df["status"] == "ok").height
    [summary] = session.summaries()
    assert summary is not None
    stored_p50 = summary.ttft_ms.stat("p50")
    app = make_app(url="sim://tiny", sessions_dir=str(home / "sessions"), workloads_dir=home / "workloads")
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("f4")
        await wait_until(pilot, lambda: bool(app.screen.query("#sessions"))
                         and app.screen.query_one("#sessions", DataTable).row_count == 1, 30, "the sessions list")
        await pilot.press("enter")
        await wait_until(pilot, lambda: isinstance(app.screen, SessionScreen), 30, "the session screen")
        h = app.screen.query_one("#s-hist-ttft", LatencyHistogram)
        await wait_until(pilot, lambda: bool(h.values), 30, "the TTFT histogram")
        assert len(h.values) == inside.height
        assert percentile(sorted(h.values), 50) == pytest.approx(stored_p50, rel=1e-6)
