"""The event loop a sweep runs on: uvloop where installed (less CPU per streamed token), else asyncio's."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TypeVar

T = TypeVar("T")


def new_loop() -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's where installed, else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run_loop(coro: Coroutine[object, None, T]) -> T:
    """Run `coro` to completion on a new event loop, as `servescope run` and the app's engine do."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as r:
        return r.run(coro)
