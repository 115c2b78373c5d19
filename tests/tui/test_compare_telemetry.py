"""Pilot tests of the Compare screen, the Export dialog, the live server/GPU panel, and the engine bridge
(process by default on two or more CPUs, the thread path as fallback)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.widgets import DataTable, Select, Static

from servescope.engine import wire as w
from servescope.tui import messages as m
from servescope.tui.app import make_app
from servescope.tui.screens.compare import CompareScreen
from servescope.tui.screens.export import ExportScreen
from servescope.tui.screens.run import RunScreen
from servescope.tui.screens.sessions import SessionScreen, SessionsScreen
from servescope.tui.widgets import CellTable, OverlayCurve, ServerPanel, TelemetryPanel

from .conftest import FAST_WORKLOAD
from .fixtures import LOADS, telemetry_samples, write_session
from .helpers import open_compare, row_text, set_input, text_of

# the --fast lane leaves this module out: 7 tests, ~24 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

SIZE = (100, 30)


def two_sessions(home: Path) -> Path:
    base = home / "sessions"
    write_session(base, "qwen-fp8", "2026-12-01T10:00:00+0000", {"quant": "FP8"}, telemetry=True)
    write_session(base, "qwen-int4", "2026-12-02T09:30:00+0000", {"quant": "GPTQ-Int4"}, slow=1.5, loads=(1, 4))
    return base


async def test_compare_table_curves_label_and_export(home: Path) -> None:
    base = two_sessions(home)
    app = make_app(sessions_dir=str(base))
    async with app.run_test(size=SIZE) as pilot:
        scr = await open_compare(pilot)
        # the marked sessions in date order: FP8 is the baseline; the label key is `quant`
        assert scr.comparison.labels == ["FP8", "GPTQ-Int4"]
        t = scr.query_one("#compare-table", DataTable)
        rows = [row_text(t, i) for i in range(t.row_count)]
        tpot = next(r for r in rows if r[2] == "TPOT p50 ms")
        assert tpot[3].endswith("★") and tpot[5].startswith("+") and tpot[6] == "FP8"  # lower TPOT wins
        assert any(r[2].startswith("only in FP8") for r in rows)  # c=16, c=32 only in one session
        agg = scr.query_one("#cmp-aggregate", OverlayCurve)
        assert [lb for lb, _ in agg.series] == ["FP8", "GPTQ-Int4"] and len(agg.series[0][1]) == 4
        assert "capacity" in text_of(scr.query_one("#compare-answers", Static))
        # label by session name instead of the tag, then back
        await pilot.press("l")
        await pilot.pause()
        assert scr.comparison.labels == ["qwen-fp8", "qwen-int4"]
        assert scr.query_one("#label-key", Select).value == "quant" or scr.label_key is None
        # export: the default path is in the sessions folder
        await pilot.press("e")
        await pilot.pause()
        assert isinstance(app.screen, ExportScreen)
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, CompareScreen)
        reports = list(base.glob("report-*.md"))
        assert len(reports) == 1
        text = reports[0].read_text()
        assert "qwen-int4" in text and "| load | metric |" in text


async def test_export_to_a_typed_path_and_bad_paths(home: Path) -> None:
    base = two_sessions(home)
    app = make_app(sessions_dir=str(base))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, SessionScreen)
        await pilot.press("e")
        await pilot.pause()
        await set_input(pilot, "#export-path", "no/such/folder/r.md")
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, ExportScreen)  # the problem is shown under the field
        assert "no folder" in text_of(app.screen.query_one("#export-error", Static))
        (home / "out").mkdir()
        await set_input(pilot, "#export-path", "out/")
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, SessionScreen)
        written = list((home / "out").iterdir())
        assert len(written) == 1 and written[0].name.startswith("report-") and written[0].suffix == ".md"
        assert "# servescope report" in written[0].read_text()


async def test_compare_without_common_cells_says_so(home: Path) -> None:
    base = home / "sessions"
    write_session(base, "a", "2026-12-01T10:00:00+0000", {}, loads=(1,))
    write_session(base, "b", "2026-12-02T10:00:00+0000", {}, loads=(4,))
    app = make_app(sessions_dir=str(base))
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        await pilot.press("space", "down", "space", "c")
        await pilot.pause()
        assert isinstance(app.screen, SessionsScreen) and app.is_running
        assert any("share no cell" in str(n.message) for n in app._notifications)


async def test_session_detail_shows_stored_telemetry(home: Path) -> None:
    base = two_sessions(home)
    app = make_app(sessions_dir=str(base))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        await pilot.press("down", "enter")  # the FP8 session (with telemetry)
        await pilot.pause()
        panel = app.screen.query_one(TelemetryPanel)
        assert panel.display and [r[0] for r in panel.series] == ["KV peak", "running max", "waiting max",
                                                                   "preemptions"]
        out = panel.full_text()
        assert "NVML not available" in out and "KV cache 12,752 tokens: sharegpt fits 16.6 at once, c=1 fits" in out
        # the value column is the highlighted cell's, whichever it is (its sparkline runs over every cell)
        table = app.screen.query_one(CellTable)
        for row, conc in enumerate(LOADS):
            if row:
                await pilot.press("down")
                await pilot.pause()
            assert table.cursor_row == row
            values = {label: value for label, value, _ in panel.series}
            assert panel.title == f"server per cell (/metrics): cell {row + 1}", panel.title
            assert values["KV peak"] == f"{min(1.0, conc / 20) * 100:.1f}%", (conc, values)
            assert values["waiting max"] == f"{max(0, conc - 16):.0f}", (conc, values)
        assert "c=32 is over it" in panel.full_text()  # the last cell, c=32: over the budget
        await pilot.press("t")
        assert not panel.display
        server = app.screen.query_one(ServerPanel)
        assert server.display
        await pilot.press("up")  # c=16
        await pilot.pause()
        shown = server.full_text()
        assert shown.splitlines()[0] == f"server /metrics per cell: cell {len(LOADS) - 1}", shown
        preempt = next(ln for ln in shown.splitlines() if ln.startswith("preemptions"))
        assert preempt.split()[1] == "0", shown  # c=16's, not the last cell's 16


async def test_run_screen_live_panel(home: Path) -> None:
    app = make_app(sessions_dir=str(home / "sessions"))
    async with app.run_test(size=(80, 24)) as pilot:
        await app.switch_mode("run")
        run = app.get_screen("run", RunScreen)
        run.reset("x")
        from .fixtures import cell_info

        run.post_message(m.CellStarted(w.CellStarted(cell_info(3, 32), 4)))
        run.post_message(m.TelemetryMeta(w.TelemetryMeta({"kv_cache_tokens": 12752, "max_concurrency_by_workload": {"sharegpt": 16.6}},
                                         {"available": False, "reason": "NVML is not available here"})))
        for msg in telemetry_samples():
            run.post_message(msg)
        run.post_message(m.TelemetryUpdated(w.TelemetryUpdated(None, [{"gpu": 0, "mem_used_gib": 61.2, "mem_total_gib": 80.0,
                                                    "util_pct": 97.0, "power_w": 412.0, "sm_clock_mhz": 1980.0,
                                                    "temp_c": 71.0, "energy_j": 1.0}])))
        await pilot.pause()
        run.flush_charts()
        await pilot.pause()
        panel = run.query_one(TelemetryPanel)
        rows = {r[0]: r[1] for r in panel.series}
        assert rows == {"KV cache": "100.0%", "running": "16", "waiting": "13", "preemptions": "5"}
        out = panel.full_text()
        assert "GPU0 61.2/80 GiB 97% 412 W" in out and "c=32 is over it" in out


def _tiny_sweep(home: Path) -> Any:
    from servescope.engine.spec import SweepSpec
    from servescope.workloads.spec import load_toml

    (home / "fast.toml").write_text(FAST_WORKLOAD)
    return SweepSpec(url="sim://tiny", workloads=tuple(load_toml(home / "fast.toml")), concurrency=(2,), requests=4,
                     name="bridge")


def test_engine_process_falls_back_to_the_thread(home: Path, sim_url: str) -> None:
    from servescope.tui.sweepworker import SimPool, SweepDriver

    sweep = _tiny_sweep(home).replace(url=sim_url)
    object.__setattr__(sweep, "unpicklable", lambda: None)  # the runner cannot start: the thread path runs it
    got: list[Any] = []
    d = SweepDriver(got.append, mode="detached")
    assert d.run(sweep, SimPool(), home / "sessions") == "completed"
    assert d.mode == "thread"
    kinds = [type(x).__name__ for x in got]
    assert kinds[0] == "EngineNotice" and "running in a thread" in got[0].text
    assert "SweepStarted" in kinds and "CellFinished" in kinds and kinds[-1] == "SweepFinished"
    assert any(isinstance(x, m.TelemetryUpdated) and x.server for x in got)  # the simulator has /metrics


async def test_markup_in_server_and_user_text_is_shown_as_typed(home: Path) -> None:
    """Session names, tags and model names are data: `[/x]` must neither crash a widget nor vanish."""
    from servescope.sessions.store import SessionWriter

    base = home / "sessions"
    odd = write_session(base, "odd", "2026-12-01T10:00:00+0000", {"quant": "[/x] Q|4"})
    write_session(base, "plain", "2026-12-02T10:00:00+0000", {"quant": "[bold]FP8"})
    w = SessionWriter.open(odd)
    w.update(name="[/b] a|b", model="[red]m")
    app = make_app(sessions_dir=str(base))
    async with app.run_test(size=(140, 30)) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        t = app.screen.query_one("#sessions", DataTable)
        rows = [row_text(t, i) for i in range(t.row_count)]
        odd_row = next(r for r in rows if "[/b] a|b" in r)
        assert "[red]m" in odd_row and "quant=[/x] Q|4" in odd_row
        scr = await open_compare(pilot)
        assert scr.comparison.labels == ["[/x] Q|4", "[bold]FP8"]
        assert "[/x] Q|4 vs [bold]FP8" in text_of(scr.query_one("#compare-head", Static))
        ct = scr.query_one("#compare-table", DataTable)
        assert "[/x] Q|4" in [str(getattr(c.label, "plain", c.label)) for c in ct.columns.values()]
        await pilot.press("escape")
        await pilot.pause()
        t.focus()
        await pilot.press("end", "enter")
        await pilot.pause()
        assert isinstance(app.screen, SessionScreen)
        head = text_of(app.screen.query_one("#session-head", Static))
        assert "[/b] a|b  [completed]" in head and "model [red]m" in head
