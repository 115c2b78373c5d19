"""An event loop in a daemon thread for a sweep's side work (/metrics scrapes and their parsing, health
checks), so that none of it ever runs on the load's loop between a token's arrival and its stamp."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import TypeVar, TypeVarTuple

from servescope.engine.aio import new_loop

T = TypeVar("T")
Ts = TypeVarTuple("Ts")


class Background:
    def __init__(self) -> None:
        self.loop = new_loop()  # uvloop's where installed: a scrape costs a fifth less CPU on it
        self.thread = threading.Thread(target=self.loop.run_forever, name="servescope-telemetry", daemon=True)
        self.thread.start()

    async def call(self, coro: Coroutine[object, None, T]) -> T:
        """Await `coro` run on the background loop."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def sync(self, fn: Callable[[*Ts], T], *args: *Ts) -> T:
        """Call `fn(*args)` on the background thread (e.g. a summary over samples it appends to)."""
        async def run() -> T:
            return fn(*args)

        return await self.call(run())

    def close(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        if not self.thread.is_alive():
            self.loop.close()
