"""A tiny SSE reader for the tests (independent of servescope's client)."""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp


async def stream(
    url: str, path: str, body: dict[str, Any], session: aiohttp.ClientSession | None = None
) -> tuple[list[Any], bool, list[float]]:
    """POST a streaming request; returns (decoded events, saw [DONE], arrival time of each event)."""
    if session is None:
        async with aiohttp.ClientSession() as s:
            return await stream(url, path, body, s)
    events: list[Any] = []
    stamps: list[float] = []
    done = False
    async with session.post(url + path, json=body) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"].startswith("text/event-stream")
        buf = b""
        try:
            async for piece in r.content.iter_any():
                now = time.perf_counter()
                buf += piece
                while b"\n\n" in buf:
                    raw, buf = buf.split(b"\n\n", 1)
                    assert raw.startswith(b"data: "), raw
                    data = raw[6:]
                    if data == b"[DONE]":
                        done = True
                    else:
                        events.append(json.loads(data))
                        stamps.append(now)
        except aiohttp.ClientPayloadError:
            pass  # a cut stream
    return events, done, stamps
