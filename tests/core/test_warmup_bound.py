"""`--warmup 100000000` (issue 44, item 16): with a request count it is bad input (servescope.engine.spec's check,
tests/engine/test_warmup_rule.py); a duration-only cell's warmup lasts at most the cell's duration, and the run says
how much of it was sent."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from servescope.core.client import ClientOptions, RequestSpec
from servescope.core.load import Limits, Load, run_cell

# the --fast lane leaves this module out: 3 tests, ~10 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

SPEC = RequestSpec("completions", "hello", 7, 2)


@pytest.fixture
async def url() -> AsyncIterator[str]:
    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(2):
            await resp.write(b"data: " + json.dumps({"choices": [{"index": 0, "text": f"t{i}", "finish_reason": None}],
                                                     "usage": {"prompt_tokens": 7, "completion_tokens": i + 1}}).encode()
                             + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        return resp

    app = web.Application()
    app.router.add_route("POST", "/v1/completions", handle)
    runner = web.AppRunner(app, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    await runner.cleanup()


@pytest.mark.parametrize("load", [Load(concurrency=2), Load(rate=50.0)], ids=["closed", "open"])
async def test_a_duration_only_cells_huge_warmup_ends_with_its_duration_and_says_so(url: str, load: Load) -> None:
    run = await asyncio.wait_for(run_cell(ClientOptions(base_url=url, model="m"), [SPEC] * 1100, load,
                                          Limits(requests=None, duration_s=0.3, warmup=100_000_000)), 60)
    assert run.warmup_note.startswith("the warmup ended with the cell's duration (0.3 s): "), run.warmup_note
    assert run.warmup_note.endswith(" of its 100,000,000 requests were sent")
    assert run.records and all(not r.warmup for r in run.records)  # the measured part ran after it


async def test_a_warmup_that_fits_is_not_cut(url: str) -> None:
    run = await asyncio.wait_for(run_cell(ClientOptions(base_url=url, model="m"), [SPEC] * 10, Load(concurrency=2),
                                          Limits(requests=None, duration_s=5.0, warmup=4)), 60)
    assert run.warmup_note == ""
