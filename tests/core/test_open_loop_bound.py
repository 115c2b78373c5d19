"""An open loop asked for more than it can send (issue 44, item 15): the requests outstanding stay within
`pending_cap` (memory bounded by the load, not by the rate), nothing is sent after the duration, the answers still
in flight are waited for `drain_grace_s` and then cancelled (the cell ends near its duration), and the run says how
far behind its schedule was (`CellRun.behind_s`), which the client's verdict turns into `bound`."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from servescope.core.client import ClientOptions, RequestSpec
from servescope.core.health import ClientPart, RateShortfall, judge_client
from servescope.core.load import Limits, Load, drain_grace_s, pending_cap, run_cell

# the --fast lane leaves this module out: 1 tests, ~7 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

SPEC = RequestSpec("completions", "hello", 7, 5)


class Holding:
    """Every request streams one token, then is held until the test ends."""

    def __init__(self) -> None:
        self.url = ""
        self.received = 0
        self.release = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.received += 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: " + json.dumps({"choices": [{"index": 0, "text": "t", "finish_reason": None}]}).encode()
                         + b"\n\n")
        await self.release.wait()
        await resp.write(b"data: [DONE]\n\n")
        return resp


@pytest.fixture
async def server() -> AsyncIterator[Holding]:
    held = Holding()
    app = web.Application()
    app.router.add_route("POST", "/v1/completions", held.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    held.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    yield held
    held.release.set()
    await runner.cleanup()


def test_the_bound_is_derived_from_the_load() -> None:
    assert pending_cap(Load(rate=100_000.0)) == Load(rate=100_000.0).connections == 1024
    assert pending_cap(Load(rate=100_000.0, max_concurrency=4)) == 8
    assert drain_grace_s(0.5) == 5.0 and drain_grace_s(60.0) == 60.0


async def test_a_rate_past_what_can_be_sent_stays_bounded_and_ends_after_its_grace(server: Holding) -> None:
    load = Load(rate=100_000.0, max_concurrency=4)
    t0 = time.monotonic()
    run = await asyncio.wait_for(run_cell(ClientOptions(base_url=server.url, model="m"), [SPEC] * 64, load,
                                          Limits(requests=None, duration_s=0.5)), 120)
    took = time.monotonic() - t0
    assert run.sent == pending_cap(load) == 8  # 50,000 were due in the duration: 8 were ever outstanding
    assert server.received == 4  # the 4 slots; the 4 waiting for one were never sent (past the duration)
    assert [r.status for r in run.records] == ["cancelled"] * 4  # held past the grace: cancelled, saying why
    assert all("the rate was not reached" in r.error for r in run.records), run.records[0].error
    assert run.behind_s > 0.4  # the schedule had hardly begun when the duration ended
    assert took >= drain_grace_s(0.5)  # the answers were waited for, the grace long (a bound from below only)
    health = judge_client(ClientPart(cpu_util=0.1), shortfall=RateShortfall(run.behind_s, 0.5, run.sent, 100_000.0))
    assert health is not None and health.verdict == "bound" and health.rate_behind_s == run.behind_s
    assert health.reasons[0].startswith("the rate was not reached: 8 requests sent in 0.5 s (16.0 req/s of 100,000")


def test_a_rate_that_was_reached_is_no_reason() -> None:
    health = judge_client(ClientPart(cpu_util=0.1), shortfall=RateShortfall(0.001, 3.0, 300, 100.0))
    assert health is not None and health.verdict == "ok" and health.rate_behind_s is None
    assert "rate_behind_s" not in health.to_dict()
