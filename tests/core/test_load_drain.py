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


async def slow_stream(request: web.Request) -> web.StreamResponse:
    """5 tokens, 60 ms apart: a request is in flight for about 0.3 s."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(5):
        await asyncio.sleep(0.06)
        await resp.write(_ev({"choices": [{"index": 0, "text": f"t{i}", "finish_reason": None}],
                              "usage": {"prompt_tokens": 7, "completion_tokens": i + 1}}))
    await resp.write(_ev({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}}))
    await resp.write(b"data: [DONE]\n\n")
    return resp


@pytest.fixture
async def url() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_route("POST", "/v1/completions", slow_stream)
    runner = web.AppRunner(app, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def _start(url: str, load: Load) -> tuple[CellControl, asyncio.Task[Any]]:
    ctl = CellControl()
    task = asyncio.create_task(run_cell(ClientOptions(base_url=url, model="m"), [SPEC] * 100, load,
                                        Limits(requests=100), control=ctl))
    await asyncio.sleep(0.15)  # the first requests are in flight, none has finished
    return ctl, task


@pytest.mark.parametrize("load", [Load(concurrency=4), Load(rate=40.0, max_concurrency=4)],
                         ids=["closed", "open-capped"])
async def test_drain_lets_the_in_flight_requests_finish_and_sends_no_more(url: str, load: Load) -> None:
    ctl, task = await _start(url, load)
    ctl.request_drain("stopped by the user")
    run = await asyncio.wait_for(task, 10)
    assert run.stopped == "stopped by the user"
    assert run.records and [r.status for r in run.records] == ["ok"] * len(run.records)  # none cancelled
    assert len(run.records) <= 4  # only those in flight when it was drained: nothing sent afterwards
    assert all(r.output_tokens == 5 for r in run.records)


async def test_stop_after_a_drain_cancels_the_in_flight_requests(url: str) -> None:
    ctl, task = await _start(url, Load(concurrency=4))
    ctl.request_drain("stopped by the user")
    await asyncio.sleep(0.02)
    ctl.request_stop("stopped by the user (in-flight requests cancelled)")
    run = await asyncio.wait_for(task, 10)
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
