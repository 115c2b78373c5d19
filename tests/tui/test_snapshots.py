"""Snapshots of the main screens with fixed data, built through `make_app` (the factory run_app uses),
with a fixed clock and no blinking cursor. Update with `pytest tests/tui --snapshot-update`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from textual.widgets import Input

from servescope.engine import wire as w
from servescope.tui import messages as m
from servescope.tui.app import make_app
from servescope.tui.screens.run import RunScreen

from .fixtures import live_sweep_messages, telemetry_samples, write_session

# the --fast lane leaves this module out: 12 tests, ~26 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow


def fixed_clock() -> float:
    return 1000.0


@pytest.fixture
def sessions(home: Path) -> Path:
    base = home / "sessions"
    write_session(base, "qwen-fp8", "2026-12-01T10:00:00+0000", {"quant": "FP8"}, telemetry=True)
    write_session(base, "qwen-int4", "2026-12-02T09:30:00+0000", {"quant": "GPTQ-Int4"}, status="interrupted",
                  loads=(1, 4), slow=1.5)
    return base


def app_for(home: Path) -> Any:
    return make_app(url="sim://tiny", sessions_dir=str(home / "sessions"), workloads_dir=home / "workloads",
                    clock=fixed_clock)


async def no_blink(pilot: Any) -> None:
    for i in pilot.app.screen.query(Input):
        i.cursor_blink = False
    await pilot.pause()


def test_compose_target_80x24(home: Path, snap_compare: Any) -> None:
    assert snap_compare(app_for(home), terminal_size=(80, 24), run_before=no_blink)


def test_compose_load_with_bad_input_80x24(home: Path, snap_compare: Any) -> None:
    async def before(pilot: Any) -> None:
        await pilot.press("f8")
        inp = pilot.app.screen.query_one("#concurrency", Input)
        inp.focus()
        inp.value = "1,x,4"
        await no_blink(pilot)

    assert snap_compare(app_for(home), terminal_size=(80, 24), run_before=before)


def test_compose_workloads_120x40(home: Path, snap_compare: Any) -> None:
    async def before(pilot: Any) -> None:
        await pilot.press("f7")
        await no_blink(pilot)

    assert snap_compare(app_for(home), terminal_size=(120, 40), run_before=before)


def _feed_run(home: Path) -> Any:
    async def before(pilot: Any) -> None:
        app = pilot.app
        await app.switch_mode("run")
        run = app.get_screen("run", RunScreen)
        run.reset("sim://tiny: 1 workload")
        for msg in live_sweep_messages(home / "sessions" / "20261202-100000-demo"):
            run.post_message(msg)
        run.post_message(m.TelemetryMeta(w.TelemetryMeta({"kv_cache_tokens": 12752, "max_concurrency_by_workload": {"sharegpt": 16.6}},
                                         {"available": False, "reason": "NVML is not available: no NVIDIA driver"})))
        for tm in telemetry_samples():
            run.post_message(tm)
        await pilot.pause()
        await pilot.pause()
        run.flush_charts()  # charts redraw on a 0.5 s timer; draw now so the snapshot does not race it
        await pilot.pause()

    return before


def test_run_live_120x40(home: Path, snap_compare: Any) -> None:
    assert snap_compare(app_for(home), terminal_size=(120, 40), run_before=_feed_run(home))


def test_run_live_80x24(home: Path, snap_compare: Any) -> None:
    assert snap_compare(app_for(home), terminal_size=(80, 24), run_before=_feed_run(home))


def test_sessions_list(sessions: Path, home: Path, snap_compare: Any) -> None:
    assert snap_compare(app_for(home), terminal_size=(100, 30), press=["f4", "space"])


def test_session_detail_120x40(sessions: Path, home: Path, snap_compare: Any) -> None:
    async def before(pilot: Any) -> None:
        await pilot.press("f4")
        await pilot.pause()
        await pilot.press("down", "enter")
        await pilot.pause()
        await pilot.press("down", "down")  # the third cell's histograms
        await pilot.pause()

    assert snap_compare(app_for(home), terminal_size=(120, 40), run_before=before)


def test_help_80x24(home: Path, snap_compare: Any) -> None:
    async def before(pilot: Any) -> None:
        await pilot.press("f1")
        await no_blink(pilot)  # the search field's cursor: shown, not blinking with the 0.5 s timer

    assert snap_compare(app_for(home), terminal_size=(80, 24), run_before=before)


def test_compare_100x30(sessions: Path, home: Path, snap_compare: Any) -> None:
    assert snap_compare(app_for(home), terminal_size=(100, 30), press=["f4", "space", "down", "space", "c"])


def test_compare_export_80x24(sessions: Path, home: Path, snap_compare: Any) -> None:
    async def before(pilot: Any) -> None:
        await pilot.press("f4", "space", "down", "space", "c")
        await pilot.pause()
        await pilot.press("e")
        await no_blink(pilot)

    assert snap_compare(app_for(home), terminal_size=(80, 24), run_before=before)


def test_run_curve_zoomed_80x24(home: Path, snap_compare: Any) -> None:
    """`z` on the focused throughput chart: the whole screen, the legend above the plot, round ticks."""
    feed = _feed_run(home)

    async def before(pilot: Any) -> None:
        await feed(pilot)
        pilot.app.screen.query_one("#curve").focus()
        await pilot.press("z")
        await pilot.pause()

    assert snap_compare(app_for(home), terminal_size=(80, 24), run_before=before)


def test_sessions_list_80x24(sessions: Path, home: Path, snap_compare: Any) -> None:
    """The columns that fit (whole, or cut with …) and the highlighted session in full under the table."""
    from servescope.sessions.store import SessionWriter

    w = SessionWriter.open(next(sessions.glob("*qwen-int4")))
    w.update(target=msgspec.structs.replace(w.meta.target, url="sim://rtx-pro-6000/qwen3.5-35b-a3b-gptq-int4"),
             model="Qwen/Qwen3.5-35B-A3B-GPTQ-Int4")
    assert snap_compare(app_for(home), terminal_size=(80, 24), press=["f4"])
