"""Nothing on screen can be misread (issue 31's fixes outside the 80x24 tables): the cell table declares its
columns once, names each latency's statistic and unit and shortens a client-bound status itself; the KV budget
has a short form for a half-width pane; a chart's legend explains its ┊ line on a short chart too; the Compose
preview shows its target line at 80 columns; the app's F1-F3 stay in every screen's footer at 80 columns; Compare
draws a client-bound point hollow and reads its intervals as [low, high]."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Static
from textual.widgets._footer import FooterKey

from servescope.core.results import CellResult
from servescope.tui.app import make_app
from servescope.tui.widgets.curve import OverlayCurve, ThroughputCurve, draw_chart
from servescope.tui.widgets.panels import (
    CELL_COLS,
    CELL_COLS_MULTI,
    TelemetryPanel,
    budget_line,
    budget_short_forms,
    cell_row,
)

from . import fixtures
from .fixtures import summary_for, write_session
from .helpers import open_compare, text_of, wait_until
from .test_zoom_wrap_marks import knee_and_capacity

# the --fast lane leaves this module out: 5 tests, ~9 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

KV = {"kv_cache_tokens": 6_506_660, "source": "metrics", "max_concurrency_by_workload": {"sharegpt": 8472.2}}


def app_for(home: Path) -> Any:
    return make_app(url="sim://tiny", sessions_dir=str(home / "sessions"), workloads_dir=home / "workloads",
                    clock=lambda: 1000.0)


def test_the_cell_table_declares_its_columns_once() -> None:
    cols = {c.key: c for c in CELL_COLS}
    assert cols["out tok/s"].keep and [c.key for c in CELL_COLS if c.keep] == ["out tok/s"]
    by_priority = [c.key for c in sorted(CELL_COLS, key=lambda c: c.priority)]
    assert by_priority[:6] == ["out tok/s", "#", "load", "TTFT p50", "status", "workload"], by_priority
    multi = [c.key for c in sorted(CELL_COLS_MULTI, key=lambda c: c.priority)]
    assert multi[:6] == ["out tok/s", "workload", "load", "TTFT p50", "status", "#"], multi
    # each latency names its statistic and its unit
    labels = {c.key: c.label for c in CELL_COLS}
    assert [labels[k] for k in ("TTFT p50", "TTFT p99", "TPOT p50", "E2E p50")] == [
        "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "E2E p50 ms"]


def test_a_client_bound_cell_reads_bound_where_its_status_does_not_fit() -> None:
    _, s = summary_for(4)
    s["client"] = {"verdict": "bound"}
    row = cell_row(1, "sharegpt", "c=4", "done", CellResult.from_dict(s))
    status = next(c for c in CELL_COLS if c.key == "status")
    assert row[3] == "done, client BOUND"
    assert status.shown_value(row[3], 6) == "bound" and status.shown_value(row[3], 30) == "done, client BOUND"
    assert status.shown_value("done", 6) == "done"
    # a cell stopped early (`x`) whose client was also the limit reads stopped, not bound: that it ended early
    stopped = cell_row(1, "sharegpt", "c=4", "stopped", CellResult.from_dict(s))[3]
    assert stopped == "stopped, client BOUND" and status.shown_value(stopped, 7) == "stopped"


def test_the_kv_budget_has_a_short_form_for_a_half_width_pane() -> None:
    assert budget_line(KV, "sharegpt", 1, short=True) == "KV 6.5M tok: sharegpt fits c=8,472; c=1 ok"
    assert budget_line(KV, "sharegpt", 9000, short=True) == "KV 6.5M tok: sharegpt fits c=8,472; c=9000 over"
    assert budget_line(KV, "sharegpt", 1, short=True, named=False) == "KV 6.5M tok: fits c=8,472; c=1 ok"
    assert budget_line(KV, None, None, short=True) == "KV 6.5M tok: fits sharegpt 8,472"
    assert budget_line(KV, "sharegpt", 1) == "KV cache 6,506,660 tokens: sharegpt fits 8,472 at once, c=1 fits"


async def test_the_telemetry_pane_shows_the_short_budget_whole(home: Path) -> None:
    app = app_for(home)
    async with app.run_test(size=(80, 24)) as pilot:
        await app.switch_mode("run")
        panel = app.screen.query_one(TelemetryPanel)
        panel.budget = budget_line(KV, "sharegpt", 1)
        panel.budget_short = budget_short_forms(KV, "sharegpt", 1)
        await pilot.pause()
        assert panel.content_size.width < len(panel.budget)
        shown = panel.render().plain
        assert shown.split("\n")[-1] in panel.budget_short, shown  # the budget's line, whole
        assert panel.budget in panel.full_text()  # zoomed, the whole line


# the chart of the Run screen (a running cell) and of a session at 80x24, taller, zoomed
@pytest.mark.parametrize("width,height,live", [(38, 7, True), (34, 7, False), (38, 12, True), (78, 20, True)])
def test_a_chart_legend_explains_its_lines_rather_than_end_in_an_ellipsis(width: int, height: int, live: bool) -> None:
    curve = ThroughputCurve()
    curve.points = tuple(p for p in knee_and_capacity() if live or not p.live)
    lines = draw_chart(curve.spec(), width, height).plain.split("\n")
    legend = " ".join(lines[1:4])
    assert "┊ knee c=4" in legend and "┊ SLO capacity c=8" in legend, lines
    assert not any(ln.rstrip().endswith("…") for ln in lines), lines
    assert len(lines) == height and any("┤" in ln for ln in lines), lines  # the plot is still drawn


def preview_rows(preview: Static) -> int:
    """How many rows the preview's text takes at its width (each line wraps)."""
    width = preview.content_size.width
    return sum(max(1, math.ceil(len(line) / width)) for line in text_of(preview).split("\n"))


async def test_the_compose_preview_shows_its_target_line_at_80_columns(home: Path) -> None:
    app = app_for(home)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        preview = app.screen.query_one("#preview", Static)
        *grid, target = text_of(preview).split("\n")  # the grid line in one or two rows, then the target
        assert " ".join(grid).startswith("1 workload x 3 load levels = 3 cells, 300 requests, ~"), grid
        assert target == "target sim://tiny"
        assert preview_rows(preview) <= preview.content_size.height, (text_of(preview), preview.content_size)


def footer_cut(app: Any) -> list[str]:
    """The app-wide keys (F1-F4) of the footer that are not wholly on screen."""
    width = app.screen.size.width
    return [k.key for k in app.screen.query(FooterKey)
            if k.key in ("f1", "f2", "f3", "f4") and (k.region.right > width or k.region.width == 0)]


async def test_the_app_keys_stay_in_every_footer_at_80_columns(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = home / "sessions"
    write_session(base, "qwen-fp8", "2026-12-01T10:00:00+0000", {"quant": "FP8"}, telemetry=True)
    write_session(base, "qwen-int4", "2026-12-02T09:30:00+0000", {"quant": "GPTQ-Int4"}, loads=(1, 4), slow=1.5)
    app = app_for(home)
    async with app.run_test(size=(80, 24)) as pilot:
        seen = []

        async def check(name: str) -> None:
            await pilot.pause()
            await pilot.pause()
            keys = {k.key for k in app.screen.query(FooterKey)}
            assert {"f1", "f2", "f3"} & keys, (name, keys)
            assert not footer_cut(app), (name, footer_cut(app))
            seen.append(name)

        await check("compose")
        await pilot.press("f3")
        await check("run")
        await pilot.press("f4")
        await check("sessions")
        await pilot.press("enter")
        await wait_until(pilot, lambda: type(app.screen).__name__ == "SessionScreen", what="the session")
        await check("session")
        await pilot.press("w")
        await wait_until(pilot, lambda: type(app.screen).__name__ == "WhatIfScreen", what="what if")
        await check("whatif")
        await pilot.press("escape", "escape")
        await wait_until(pilot, lambda: type(app.screen).__name__ == "SessionsScreen", what="the sessions list")
        await pilot.press("space", "down", "space", "c")
        await wait_until(pilot, lambda: type(app.screen).__name__ == "CompareScreen", what="compare")
        await check("compare")
        assert len(seen) == 6


async def test_compare_draws_a_client_bound_point_hollow(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = home / "sessions"

    def bound_at_32(conc: int, **kw: Any) -> Any:
        df, s = summary_for(conc, **kw)
        if conc == 32:
            s["client"] = {"verdict": "bound"}
        return df, s

    with monkeypatch.context() as mp:  # the first session's c=32 cell measured its load generator
        mp.setattr(fixtures, "summary_for", bound_at_32)
        write_session(base, "qwen-fp8", "2026-12-01T10:00:00+0000", {"quant": "FP8"})
    write_session(base, "qwen-int4", "2026-12-02T09:30:00+0000", {"quant": "GPTQ-Int4"}, slow=1.5)
    app = app_for(home)
    async with app.run_test(size=(100, 30)) as pilot:
        scr = await open_compare(pilot)
        await pilot.pause()
        curve = scr.query_one("#cmp-aggregate", OverlayCurve)
        [bound] = [p for _, pts in curve.series for p in pts if len(p) > 2 and p[2]]
        assert bound[0] == 32.0
        drawn = curve.render().plain
        assert "□ client-bound" in drawn, drawn
        answers = text_of(scr.query_one("#compare-answers", Static))
        assert "Δ [low, high]: 95% request-level interval (1 repeat); noise: holds 0 or < 2%" in answers, answers
        assert "±" not in answers
