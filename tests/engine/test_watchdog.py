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


async def _run(server: CountingServer, progress: Any, reached: asyncio.Event | None) -> bool:
    """Run the watchdog (a tick every 20 ms) until the fakes set `reached`, then stop it; with `reached` None,
    until it gives the server up by itself. Whether it gave the server up. It waits on events, never for a time:
    a generous limit only turns a watchdog that never gets there into a failure instead of a hang."""
    stopped, lost = asyncio.Event(), []
    task = asyncio.create_task(watchdog(server, 0.02, stopped, lambda: lost.append(1), progress=progress))
    waiting = {task} if reached is None else {task, asyncio.create_task(reached.wait())}
    done, _ = await asyncio.wait(waiting, timeout=60, return_when=asyncio.FIRST_COMPLETED)
    assert done, "the watchdog neither got there nor ended within 60 s"
    stopped.set()
    for t in waiting - {task}:
        t.cancel()
    await asyncio.wait_for(task, 60)
    return bool(lost)


def test_no_check_while_requests_are_answered() -> None:
    server, done, reached = CountingServer(up=False), [0], asyncio.Event()

    def progress() -> int:
        done[0] += 1  # a request answered between every two ticks
        if done[0] == 15:  # about 15 ticks
            reached.set()
        return done[0]

    assert not asyncio.run(_run(server, progress, reached))
    assert server.checks == 0


def test_checks_resume_when_answers_stop_and_a_dead_server_is_lost() -> None:
    server = CountingServer(up=False)
    assert asyncio.run(_run(server, lambda: 7, None))
    assert server.checks == 2


def test_a_live_server_without_progress_is_checked_every_tick() -> None:
    server, ticks, reached = CountingServer(up=True), [0], asyncio.Event()

    def progress() -> int:
        ticks[0] += 1  # called once at the start, then at each tick
        if ticks[0] == 6:  # 5 ticks
            reached.set()
        return 0

    assert not asyncio.run(_run(server, progress, reached))
    assert server.checks >= 5


def test_a_check_that_fails_while_streams_move_is_no_miss() -> None:
    """An overloaded server answers its streams but not a new connection in time: not lost."""
    moved, reached = [0], asyncio.Event()

    class Slow(CountingServer):
        async def healthy(self, timeout_s: float = 5.0) -> bool:
            self.checks += 1
            moved[0] += 1  # pieces of the streams arrived while the check waited
            if self.checks == 5:
                reached.set()
            return False

    server = Slow(up=False)
    assert not asyncio.run(_run(server, lambda: moved[0], reached))
    assert server.checks >= 5
