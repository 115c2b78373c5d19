"""Snapshots of every screen at 80x24 and 160x48, in colour and under NO_COLOR: Compose (its Target and Load
tabs), Run (a sweep's messages fed in), the Sessions list, a session, Compare of two sessions, What-if, Help and
Export. Fixed data, a fixed clock, no blinking cursor. Update with
`pytest tests/tui/test_screen_snapshots.py --snapshot-update`, then read the changed SVGs' text."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import Input

from servescope.engine import wire as w
from servescope.tui import messages as m
from servescope.tui.app import make_app
from servescope.tui.screens.run import RunScreen

from .fixtures import live_sweep_messages, telemetry_samples, write_session
from .helpers import wait_until

# the --fast lane leaves this module out: 36 tests, ~96 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

Before = Callable[[Any], Awaitable[None]]


async def settle(pilot: Any) -> None:
    """No blinking cursor, and every pending repaint done."""
    for i in pilot.app.screen.query(Input):
        i.cursor_blink = False
    await pilot.pause()
    await pilot.pause()


async def to_screen(pilot: Any, name: str) -> None:
    await wait_until(pilot, lambda: type(pilot.app.screen).__name__ == name, what=name)
    await settle(pilot)


async def compose_target(pilot: Any) -> None:
    await settle(pilot)


async def compose_load(pilot: Any) -> None:
    await pilot.press("f8")
    await settle(pilot)


async def run(pilot: Any) -> None:
    app = pilot.app
    await app.switch_mode("run")
    scr = app.get_screen("run", RunScreen)
    scr.reset("sim://tiny: 1 workload")
    for msg in live_sweep_messages(app.sessions_dir / "20261202-100000-demo"):
        scr.post_message(msg)
    scr.post_message(m.TelemetryMeta(w.TelemetryMeta(
        {"kv_cache_tokens": 12752, "max_concurrency_by_workload": {"sharegpt": 16.6}},
        {"available": False, "reason": "NVML is not available: no NVIDIA driver"})))
    for tm in telemetry_samples():
        scr.post_message(tm)
    await pilot.pause()
    await pilot.pause()
    scr.flush_charts()  # charts redraw on a 0.5 s timer: draw now, so that the snapshot does not race it
    await settle(pilot)


async def sessions(pilot: Any) -> None:
    await pilot.press("f4")
    await to_screen(pilot, "SessionsScreen")


async def session(pilot: Any) -> None:
    await sessions(pilot)
    await pilot.press("down", "enter")  # the older session, of four cells
    await to_screen(pilot, "SessionScreen")


async def compare(pilot: Any) -> None:
    await sessions(pilot)
    await pilot.press("space", "down", "space", "c")
    await to_screen(pilot, "CompareScreen")


async def whatif(pilot: Any) -> None:
    await session(pilot)
    await pilot.press("w")
    await to_screen(pilot, "WhatIfScreen")


async def help_(pilot: Any) -> None:
    await pilot.press("f1")
    await to_screen(pilot, "HelpScreen")


async def export(pilot: Any) -> None:
    await session(pilot)
    await pilot.press("e")
    await to_screen(pilot, "ExportScreen")


SCREENS: dict[str, Before] = {"compose_target": compose_target, "compose_load": compose_load, "run": run,
                              "sessions": sessions, "session": session, "compare": compare, "whatif": whatif,
                              "help": help_, "export": export}


@pytest.mark.parametrize("colour", ["colour", "no_color"])
@pytest.mark.parametrize("size", [(80, 24), (160, 48)], ids=["80x24", "160x48"])
@pytest.mark.parametrize("screen", list(SCREENS))
def test_screen(screen: str, size: tuple[int, int], colour: str, home: Path, snap_compare: Any,
                monkeypatch: pytest.MonkeyPatch) -> None:
    # the what-if screen's fit-time estimate counts this machine's CPUs (the fit's starts run side by side on 4
    # or more): the snapshots are taken as on a 2-CPU machine, whatever runs them
    monkeypatch.setattr("servescope.engine.twin.fit_workers", lambda: 1)
    if colour == "no_color":
        monkeypatch.setenv("NO_COLOR", "1")
    else:
        monkeypatch.delenv("NO_COLOR", raising=False)
    base = home / "sessions"
    write_session(base, "qwen-fp8", "2026-12-01T10:00:00+0000", {"quant": "FP8"}, telemetry=True)
    write_session(base, "qwen-int4", "2026-12-02T09:30:00+0000", {"quant": "GPTQ-Int4"}, status="interrupted",
                  loads=(1, 4), slow=1.5)
    app = make_app(url="sim://tiny", sessions_dir=str(base), workloads_dir=home / "workloads", clock=lambda: 1000.0)
    assert snap_compare(app, terminal_size=size, run_before=SCREENS[screen])
