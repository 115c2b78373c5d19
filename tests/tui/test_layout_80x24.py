"""The 80x24 rule of the app's tables (tui/widgets/table.py): a pane that cannot show every column leaves out the
least important ones by their declared priority, keeps the figure it exists for, says `+N columns: z zooms`, and
never cuts a figure (zoomed or not: a figure is whole or left out). Read from each pane's rendered text."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

from servescope.core.results import CellResult, ClientHealth
from servescope.engine import wire as w
from servescope.tui import messages as m
from servescope.tui.app import make_app
from servescope.tui.screens.run import RunScreen
from servescope.tui.widgets.table import Col, FitTable, fit_widths, prioritized
from tests.support.meta import meta_of

from .fixtures import cell_info, live_sweep_messages, summary_for, telemetry_samples, write_session
from .helpers import drawn, wait_until

# the --fast lane leaves this module out: 6 tests, ~13 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow


def test_a_figure_is_never_cut_a_label_is() -> None:
    cols = [Col("name", "name", 0, min_width=4), Col("tok", "tok/s", 1, min_width=3, right=True)]
    widths = fit_widths(cols, [20, 7], avail=16)  # each column takes 2 of padding
    assert widths == {"name": 5, "tok": 7}  # the figure whole, the label cut to what is left
    assert fit_widths(cols, [20, 7], avail=8) == {"name": 6}  # no room for the whole figure: left out, not cut


def test_the_kept_figure_goes_first_and_a_narrowed_label_fills_only_what_is_left() -> None:
    cols = prioritized([Col("#", "#", 0), Col("status", "status", 1), Col("tok", "out tok/s", 2, right=True),
                        Col("ttft", "TTFT p50", 3, right=True)],
                       ("tok", "#", "ttft", "status"), keep="tok", narrow={"status": 4})
    widths = fit_widths(cols, [1, 18, 9, 8], avail=36)
    assert widths == {"tok": 9, "#": 1, "ttft": 8, "status": 10}  # status takes the room left, no more
    assert fit_widths(cols, [1, 18, 9, 8], avail=80)["status"] == 18  # whole when there is room


def test_a_label_widens_to_whole_at_its_declared_place() -> None:
    cols = prioritized([Col("wl", "workload", 0, min_width=8), Col("tok", "out tok/s", 1, right=True),
                        Col("ttft", "TTFT p50", 2, right=True), Col("p99", "TTFT p99", 3, right=True)],
                       ("tok", "wl", "ttft", "p99"), keep="tok", whole_after={"wl": "ttft"})
    assert fit_widths(cols, [12, 9, 8, 8], avail=33) == {"tok": 9, "wl": 10, "ttft": 8}  # TTFT p50 before whole
    assert fit_widths(cols, [12, 9, 8, 8], avail=40) == {"tok": 9, "wl": 12, "ttft": 8}  # whole before TTFT p99


def _figures_whole(table: FitTable) -> list[str]:
    """The figure cells of a table that end in `…` (should be none)."""
    cut = []
    for r in range(table.row_count):
        for c, cell in zip(table.shown, table.get_row_at(r), strict=True):
            if c.figure and str(getattr(cell, "plain", cell)).endswith("…"):
                cut.append(f"{c.label}: {cell}")
    return cut


def app_for(home: Path) -> Any:
    return make_app(url="sim://tiny", sessions_dir=str(home / "sessions"), workloads_dir=home / "workloads",
                    clock=lambda: 1000.0)


async def _feed_with_a_bound_cell(pilot: Any, home: Path) -> RunScreen:
    app = pilot.app
    await app.switch_mode("run")
    run: RunScreen = app.get_screen("run", RunScreen)
    run.reset("sim://tiny: 1 workload")
    for msg in live_sweep_messages(home / "sessions" / "20261202-100000-demo"):
        if isinstance(msg, m.CellFinished) and msg.cell.index == 1:  # its client was the limit
            s = msg.summary
            client = msgspec.structs.replace(s.client, verdict="bound") if s.client else ClientHealth(verdict="bound")
            msg = m.CellFinished(w.CellFinished(msg.cell, msgspec.structs.replace(s, client=client), "done"))
        run.post_message(msg)
    for tm in telemetry_samples():
        run.post_message(tm)
    await wait_until(pilot, lambda: run.query_one("#cells", FitTable).row_count == 3, what="three finished cells")
    run.flush_charts()
    await pilot.pause()
    return run


async def test_run_finished_cells_keep_their_figures_at_80x24(home: Path) -> None:
    app = app_for(home)
    async with app.run_test(size=(80, 24)) as pilot:
        run = await _feed_with_a_bound_cell(pilot, home)
        table = run.query_one("#cells", FitTable)
        text = "\n".join(drawn(table))
        assert "out tok/s" in text and "TTFT p50" in text and "load" in text, text
        assert "bound" in text and "590.7" in text, text  # the bound cell's status is short, its figures shown
        assert "done, client BOUND" in table.full_row(1)  # the table keeps the whole status (zoom shows it)
        assert "bound: client-limited" in str(table.border_title)
        assert str(table.border_subtitle).endswith("columns: z zooms"), table.border_subtitle
        assert str(table.border_subtitle).startswith(f"+{len(table.cols) - len(table.shown)} columns")
        assert not _figures_whole(table)
        table.focus()
        await pilot.press("z")
        await wait_until(pilot, lambda: table.size.width > 60, what="the table zoomed")
        await pilot.pause()
        text = "\n".join(drawn(table))
        assert "workload" in text and "ok/fail" in text and "done, client BOUND" in text, text
        assert not _figures_whole(table), _figures_whole(table)
        assert "…" not in text, text  # at 80 columns zoomed, nothing of it is cut


async def test_a_pane_that_scrolls_still_shows_the_status_beside_the_figures(home: Path) -> None:
    app = app_for(home)
    async with app.run_test(size=(80, 24)) as pilot:
        run = await _feed_with_a_bound_cell(pilot, home)
        table = run.query_one("#cells", FitTable)
        bound = run.query_one("#cells", FitTable).row_count
        for i, c in ((4, 48), (5, 64)):  # more finished cells than the pane has rows: a scrollbar takes a column
            s = CellResult.from_dict(summary_for(16)[1])
            s = msgspec.structs.replace(s, client=ClientHealth(verdict="bound"))
            run.post_message(m.CellFinished(w.CellFinished(cell_info(i, c), s, "done")))
        await wait_until(pilot, lambda: table.row_count == bound + 2, what="five finished cells")
        await pilot.pause()
        lines = drawn(table)
        assert len(lines) < table.row_count + 1  # the rows do not all fit: the pane scrolls
        text = "\n".join(lines)
        assert "stat" in text and "bound" in text and "out tok/s" in text and "TTFT p50" in text, text


async def test_the_live_panel_stops_reading_now_when_the_sweep_ends(home: Path) -> None:
    from servescope.tui.widgets.panels import TelemetryPanel

    app = app_for(home)
    async with app.run_test(size=(100, 30)) as pilot:
        run = await _feed_with_a_bound_cell(pilot, home)
        panel = run.query_one(TelemetryPanel)
        running = dict((lb, v) for lb, v, _ in panel.series)["running"]
        assert running != "-"
        run.post_message(m.SweepFinished(w.SweepFinished(home / "sessions" / "x", "interrupted", "")))
        await wait_until(pilot, lambda: not run.running, what="the sweep ended")
        await pilot.pause()
        values = dict((lb, v) for lb, v, _ in panel.series)
        assert values["running"] == "-" and values["KV cache"] == "-", values  # gauges read nothing now
        assert "sweep ended" in panel.title
        assert run.quit_text(True).startswith("3/4 cells completed"), run.quit_text(True)


async def test_f3_with_no_sweep_says_why(home: Path) -> None:
    app = app_for(home)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f3")
        await wait_until(pilot, lambda: any("no sweep running" in str(n.message) for n in app._notifications),
                         what="a notice that no sweep runs")
        said = [str(n.message) for n in app._notifications]
        assert any("F2" in s for s in said), said


def _two_workload_session(base: Path) -> Path:
    """A session of two workloads, one cell skipped, as the engine's writer stores it."""
    from servescope.sessions.store import SessionWriter
    from servescope.workloads.spec import PRESETS

    path = base / "20261203-100000-two"
    plan = [(i, wl, c) for i, (wl, c) in enumerate((wl, c) for wl in ("sharegpt", "balanced1k1k") for c in (1, 4))]
    meta = {"name": "two", "target": {"url": "sim://tiny", "version": "0.32.0-sim", "metrics": True,
                                      "tokenizer": "server /tokenize"},
            "model": "tiny", "max_model_len": 8192,
            "workloads": [PRESETS["sharegpt"].to_dict(), PRESETS["balanced1k1k"].to_dict()],
            "load": {"concurrency": [1, 4], "requests": 60}, "slos": {}, "tags": {},
            "cells": [{"index": i, "workload": wl, "concurrency": c, "load_label": f"c={c}", "status": "planned"}
                      for i, wl, c in plan]}
    wr = SessionWriter.create(path, meta_of(**meta))
    for i, wl, c in plan:
        df, s = summary_for(c)
        status = "skipped" if i == 2 else "done"
        row = {"index": i, "workload": wl, "api": "chat", "concurrency": c, "rate": None, "arrival": None,
               "max_concurrency": None, "requests_planned": 60, "duration_s_planned": None, "warmup": 0,
               "load_label": f"c={c}", "status": status, "reason": ""}
        wr.write_cell(row, df, CellResult.from_dict(s))
    wr.update(gpu={"available": False, "reason": "NVML not available: no NVIDIA driver on this machine"})
    wr.finish("completed")
    return path


async def test_a_saved_sessions_cells_name_their_workload_at_80x24(home: Path) -> None:
    _two_workload_session(home / "sessions")
    app = app_for(home)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        listed = pilot.app.screen.query_one("#sessions", FitTable)
        assert listed.value(str(home / "sessions" / "20261203-100000-two"), "cells") == "3/4"  # completed/planned
        detail = str(pilot.app.screen.query_one("#session-detail").render())
        assert "3/4 cells completed" in detail, detail  # the same count, said the same way
        await pilot.press("enter")
        await wait_until(pilot, lambda: pilot.app.screen.query("#session-cells"), what="the session screen")
        await pilot.pause()
        table = pilot.app.screen.query_one("#session-cells", FitTable)
        lines = drawn(table)
        text = "\n".join(lines)
        assert "workload" in text and "out tok/s" in text and "TTFT p50" in text, text
        assert any("sharegpt" in ln for ln in lines) and any("balanced" in ln for ln in lines), text
        assert str(table.border_subtitle).endswith("columns: z zooms"), table.border_subtitle
        assert not _figures_whole(table)
        live = "\n".join(pilot.app.screen.query_one("#session-live").gpu_lines)
        assert "no GPU telemetry: NVML not available" in live and "available False" not in live, live
        table.focus()
        await pilot.press("z")
        await wait_until(pilot, lambda: table.size.width > 60, what="the table zoomed")
        await pilot.pause()
        text = "\n".join(drawn(table))
        assert "skipped" in text and "balanced1k1k" in text, text
        assert not _figures_whole(table), _figures_whole(table)


@pytest.fixture
def sessions(home: Path) -> Path:
    base = home / "sessions"
    write_session(base, "qwen-fp8", "2026-12-01T10:00:00+0000", {"quant": "FP8"}, telemetry=True)
    write_session(base, "qwen-int4", "2026-12-02T09:30:00+0000", {"quant": "GPTQ-Int4"}, status="interrupted",
                  loads=(1, 4), slow=1.5)
    return base


async def test_compare_never_cuts_a_value_or_its_metric_at_80x24(sessions: Path, home: Path) -> None:
    from .helpers import open_compare

    app = app_for(home)
    async with app.run_test(size=(80, 24)) as pilot:
        scr = await open_compare(pilot)
        table = scr.query_one("#compare-table", FitTable)
        await pilot.pause()
        for zoom in (False, True):
            if zoom:
                table.focus()
                await pilot.press("z")
                await wait_until(pilot, lambda: table.zoomed, what="the table zoomed")
                await pilot.pause()
            rows = drawn(table)
            text = "\n".join(rows)
            assert "output tok/s (aggregate)" in text and "184.6" in text, text
            # only the workload's name may be cut (each group's first row names it; `w` shows it whole in the
            # curves' titles): never a figure, a metric or a load
            first = table.shown[0]
            assert first.key == "workload", [c.key for c in table.shown]
            name_w = table.columns[first.key].width + 2 * table.cell_padding
            assert all(ln.find("…") < name_w for ln in rows), text
            assert not _figures_whole(table)
            # the Δ column is there with its interval, in its short form (`-33% [-39,-27]`: the verdict is the ★);
            # the best column, which repeats the ★, is the one left out (once `+1 column left out (Δ GPTQ-Int4)`)
            assert [c.key for c in table.shown][-1] == "d1", [c.key for c in table.shown]
            assert str(table.border_subtitle) == "+1 column left out (best)", table.border_subtitle
            assert re.search(r"[+-]\d+(\.\d)?% \[[+-]\d+(\.\d)?,[+-]\d+(\.\d)?\]", text), text
