"""A test's server on an asyncio loop of its own, in a daemon thread, for a `with` block: the hostile, lying and
killing servers the integration tests stand in front of servescope."""

from __future__ import annotations

import asyncio
import threading
from typing import Self

from aiohttp import web


class LoopThread:
    """`with Sub() as s:` starts the loop thread and returns once `_serve` said it is ready (`self._ready.set()`);
    leaving the block sets `self._stop`, which `_serve` awaits before it cleans up."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop = asyncio.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        raise NotImplementedError

    async def _serve_app(self, app: web.Application) -> str:
        """Serve `app` on a free port of 127.0.0.1 until the block ends; its URL (set before ready)."""
        runner = web.AppRunner(app, shutdown_timeout=0.2)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        self._ready.set()
        await self._stop.wait()
        await runner.cleanup()
        return self.url
