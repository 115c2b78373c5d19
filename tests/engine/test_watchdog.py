"""The cell's watchdog: a health check every interval, the server lost after two misses in a row, and no check
while requests keep being answered (the load itself shows the server alive)."""

from __future__ import annotations

import asyncio
from typing import Any

from servescope.engine.server import watchdog


class CountingServer:
    def __init__(self, up: bool) -> None:
        self.up = up
        self.checks = 0

    async def healthy(self, timeout_s: float = 5.0) -> bool:
        self.checks += 1
        return self.up

    def __getattr__(self, name: str) -> Any:  # the rest of ServerManager is not used by the watchdog
        raise AttributeError(name)


async def _run(server: CountingServer, progress: Any, seconds: float) -> bool:
    stopped, lost = asyncio.Event(), []
    task = asyncio.create_task(watchdog(server, 0.02, stopped, lambda: lost.append(1), progress=progress))
    await asyncio.sleep(seconds)
    stopped.set()
    await asyncio.wait_for(task, 1.0)
    return bool(lost)


def test_no_check_while_requests_are_answered() -> None:
    server, done = CountingServer(up=False), [0]

    def progress() -> int:
        done[0] += 1  # a request answered between every two ticks
        return done[0]

    assert not asyncio.run(_run(server, progress, 0.3))
    assert server.checks == 0


def test_checks_resume_when_answers_stop_and_a_dead_server_is_lost() -> None:
    server = CountingServer(up=False)
    assert asyncio.run(_run(server, lambda: 7, 0.5))
    assert server.checks == 2


def test_a_live_server_without_progress_is_checked_every_tick() -> None:
    server = CountingServer(up=True)
    assert not asyncio.run(_run(server, lambda: 0, 0.3))
    assert server.checks >= 5


def test_a_check_that_fails_while_streams_move_is_no_miss() -> None:
    """An overloaded server answers its streams but not a new connection in time: not lost."""
    moved = [0]

    class Slow(CountingServer):
        async def healthy(self, timeout_s: float = 5.0) -> bool:
            self.checks += 1
            moved[0] += 1  # pieces of the streams arrived while the check waited
            return False

    server = Slow(up=False)
    assert not asyncio.run(_run(server, lambda: moved[0], 0.4))
    assert server.checks >= 3
