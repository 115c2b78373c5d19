"""Ending a cell early, the two ways: `request_drain` sends no more requests and lets the in-flight ones finish
(the app's `x`); `request_stop` cancels them (Ctrl-C, skip, a second `x`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from servescope.core.client import ClientOptions, RequestSpec
from servescope.core.load import CellControl, Limits, Load, run_cell

SPEC = RequestSpec("completions", "hello", 7, 5)


def _ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class Held:
    """The fake server's requests: each streams its first token, says it is in flight, then waits until the
    test lets it go (so none finishes before the test has acted, however slow the host), then streams the
    rest, 5 tokens in all."""

    def __init__(self, n: int = 4) -> None:
        self.url = ""
        self.in_flight = 0
        self.n = n
        self.all_in = asyncio.Event()  # set once n requests are in flight
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(5):
            await resp.write(_ev({"choices": [{"index": 0, "text": f"t{i}", "finish_reason": None}],
                                  "usage": {"prompt_tokens": 7, "completion_tokens": i + 1}}))
            if i == 0:
                self.in_flight += 1
                if self.in_flight == self.n:
                    self.all_in.set()
                await self.release.wait()
        await resp.write(_ev({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}}))
        await resp.write(b"data: [DONE]\n\n")
        return resp


@pytest.fixture
async def server() -> AsyncIterator[Held]:
    held = Held()
    app = web.Application()
    app.router.add_route("POST", "/v1/completions", held.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    held.url = f"http://127.0.0.1:{port}"
    yield held
    held.release.set()
    await runner.cleanup()


async def _start(server: Held, load: Load) -> tuple[CellControl, asyncio.Task[Any]]:
    """A cell of 100 requests, 4 at a time, returned once 4 are in flight (none has finished: the server holds
    them)."""
    ctl = CellControl()
    task = asyncio.create_task(run_cell(ClientOptions(base_url=server.url, model="m"), [SPEC] * 100, load,
                                        Limits(requests=100), control=ctl))
    await asyncio.wait_for(server.all_in.wait(), 60)  # a generous limit: it returns once 4 are in flight
    return ctl, task


@pytest.mark.parametrize("load", [Load(concurrency=4), Load(rate=40.0, max_concurrency=4)],
                         ids=["closed", "open-capped"])
async def test_drain_lets_the_in_flight_requests_finish_and_sends_no_more(server: Held, load: Load) -> None:
    ctl, task = await _start(server, load)
    ctl.request_drain("stopped by the user")
    server.release.set()
    run = await asyncio.wait_for(task, 60)
    assert run.stopped == "stopped by the user"
    assert [r.status for r in run.records] == ["ok"] * 4  # the 4 in flight finished, none cancelled
    assert server.in_flight == 4  # nothing sent after the drain
    assert all(r.output_tokens == 5 for r in run.records)


async def test_stop_after_a_drain_cancels_the_in_flight_requests(server: Held) -> None:
    ctl, task = await _start(server, Load(concurrency=4))
    ctl.request_drain("stopped by the user")
    await asyncio.sleep(0.02)  # the drain is under way (the server still holds the requests)
    ctl.request_stop("stopped by the user (in-flight requests cancelled)")
    run = await asyncio.wait_for(task, 60)
    assert [r.status for r in run.records] == ["cancelled"] * 4
    assert run.stopped == "stopped by the user (in-flight requests cancelled)"


def test_the_control_says_when_it_ended() -> None:
    c = CellControl()
    assert not c.ended
    c.request_drain("a")
    assert c.ended and not c.stop.is_set() and c.reason == "a"
    c.request_stop("b")
    assert c.stop.is_set() and c.reason == "b"
    c.request_stop("c")  # the first stop's reason stays
    assert c.reason == "b"
