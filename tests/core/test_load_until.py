"""An open loop's send waits until its scheduled time and never less: uvloop's timers count whole milliseconds and
may fire up to one early, which once showed as a negative send lateness (p50 -0.03 ms) on a replayed trace."""

from __future__ import annotations

import asyncio
import time

import pytest

from servescope.core.load import CellControl, _until

uvloop = pytest.importorskip("uvloop")


def test_until_never_returns_before_its_time() -> None:
    async def go() -> list[int]:
        control = CellControl()
        early = []
        for i in range(60):
            when = time.perf_counter_ns() + 300_000 + 97_000 * i  # 0.3-6 ms ahead, off the millisecond grid
            assert await _until(when, control)
            early.append(when - time.perf_counter_ns())
        return early

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as r:
        early = r.run(go())
    assert max(early) <= 0, f"woke {max(early) / 1e3:.0f} us before its time"


def test_until_returns_false_once_drained() -> None:
    async def go() -> bool:
        control = CellControl()
        asyncio.get_running_loop().call_later(0.01, control.request_drain, "drained")
        return await _until(time.perf_counter_ns() + 60 * 10**9, control)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as r:
        assert r.run(asyncio.wait_for(go(), 30)) is False
