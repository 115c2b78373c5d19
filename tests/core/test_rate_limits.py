"""Rate limits and refused fields as a hosted API answers them, against a scripted local server (the boundary is
faked, the client and the load are real): an HTTP 429 is its own status (`rate_limited`, its Retry-After kept),
never sent again unless --retry-after asks (then each wait is recorded), counted apart from the failures; a 400
for vLLM's `ignore_eos` drops the field once and sends the request again."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from servescope.core.client import (
    ClientOptions,
    RequestSpec,
    make_http_client,
    retry_after_s,
    retry_hint_s,
    stream_request,
)
from servescope.core.load import CellControl, Limits, Load, run_cell
from servescope.core.metrics import records_frame, summarize
from servescope.core.records import STATUSES, RequestRecord
from servescope.core.results import CellResult, rate_limit_line

SPEC = RequestSpec("completions", "hello", 7, 3)
LIMIT_TEXT = "Rate limit reached for m on tokens per min (TPM): Limit 100, Used 99. Please try again in 1.5s."


def _ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def _stream(request: web.Request, n: int = 3) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(n):
        await resp.write(_ev({"choices": [{"index": 0, "text": f"t{i}"}],
                              "usage": {"prompt_tokens": 7, "completion_tokens": i + 1}}))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


def _limited(retry_after: str | None = "2") -> web.Response:
    body = {"error": {"message": LIMIT_TEXT, "type": "tokens", "param": None, "code": "rate_limit_exceeded"}}
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return web.json_response(body, status=429, headers=headers)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_route("POST", "/v1/completions", handler)
        app.router.add_route("POST", "/v1/chat/completions", handler)
        runner = web.AppRunner(app, shutdown_timeout=0.2)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}"

    yield start
    for r in runners:
        await r.cleanup()


async def _send(url: str, transport: str) -> RequestRecord:
    opts = ClientOptions(base_url=url, model="m", timeout_s=10, transport=transport)
    rec = RequestRecord(0, 0, False, SPEC.input_tokens, SPEC.output_tokens, scheduled_ns=0)
    async with make_http_client(opts, 1) as http:
        return await stream_request(http, opts, SPEC, rec)


def test_rate_limited_is_a_status_of_its_own() -> None:
    assert "rate_limited" in STATUSES


@pytest.mark.parametrize("transport", ["raw", "aiohttp", "httpx"])
async def test_a_429_is_rate_limited_with_its_retry_after(serve, transport: str) -> None:  # type: ignore[no-untyped-def]
    async def handler(request: web.Request) -> web.StreamResponse:
        return _limited("2")

    rec = await _send(await serve(handler), transport)
    assert (rec.status, rec.http_status, rec.retry_after_s) == ("rate_limited", 429, 2.0)
    assert "Rate limit reached" in rec.error


@pytest.mark.parametrize("transport", ["raw", "aiohttp", "httpx"])
async def test_a_429_without_the_header_keeps_the_wait_its_text_names(serve, transport: str) -> None:  # type: ignore[no-untyped-def]
    async def handler(request: web.Request) -> web.StreamResponse:
        return _limited(None)

    rec = await _send(await serve(handler), transport)
    assert (rec.status, rec.retry_after_s) == ("rate_limited", 1.5)


def test_retry_after_values() -> None:
    assert retry_after_s("20") == 20.0 and retry_after_s(" 1.5 ") == 1.5
    assert retry_after_s("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # a date in the past: no wait
    assert retry_after_s("Wed, 21 Oct 2015 07:28:30 GMT", now=1445412480.0) == 30.0
    for bad in (None, "", "soon", "nan", "inf", "-"):
        assert retry_after_s(bad) is None, bad
    assert retry_after_s("-3") == 0.0
    assert retry_hint_s("Please try again in 20s.") == 20.0
    assert retry_hint_s("retry after 350ms") == 0.35
    assert retry_hint_s("Try again in 1.5 seconds") == 1.5
    assert retry_hint_s("Please try again in 2m") == 120.0
    assert retry_hint_s("the server is busy") is None


class Counter:
    """Answers each request's first `limited` sends 429 (Retry-After `after`), then streams it."""

    def __init__(self, limited: int, after: str = "0.05") -> None:
        self.limited = limited
        self.after = after
        self.seen = 0
        self.bodies: list[dict[str, object]] = []

    async def handler(self, request: web.Request) -> web.StreamResponse:
        self.seen += 1
        self.bodies.append(await request.json())
        if self.seen <= self.limited:
            return _limited(self.after)
        return await _stream(request)


async def test_without_retry_after_a_429_is_recorded_and_never_sent_again(serve) -> None:  # type: ignore[no-untyped-def]
    srv = Counter(limited=3)
    opts = ClientOptions(base_url=await serve(srv.handler), model="m", timeout_s=10, transport="aiohttp")
    run = await run_cell(opts, [SPEC], Load(concurrency=1), Limits(requests=6))
    statuses = [r.status for r in run.records]
    assert statuses == ["rate_limited"] * 3 + ["ok"] * 3 and srv.seen == 6  # the schedule as planned: 6 sends
    assert all(r.retries == 0 and r.retry_wait_s == 0 for r in run.records)
    s = summarize(records_frame(run.records), 1.0)
    assert (s.requests_ok, s.requests_failed, s.requests_rate_limited) == (3, 0, 3)
    assert s.requests == 6 and s.rate_limit_retries is None and s.retry_after_s_max == 0.05
    assert s.to_dict()["requests_rate_limited"] == 3


async def test_retry_after_waits_and_records_the_wait(serve) -> None:  # type: ignore[no-untyped-def]
    srv = Counter(limited=2, after="0.2")
    opts = ClientOptions(base_url=await serve(srv.handler), model="m", timeout_s=10, retry_after_max_s=5.0,
                         transport="aiohttp")
    run = await run_cell(opts, [SPEC], Load(concurrency=1), Limits(requests=2))
    first, second = run.records
    assert first.status == "ok" and first.retries == 2 and srv.seen == 4
    assert 0.4 <= first.retry_wait_s < 2.0, first.retry_wait_s  # two waits of the server's 0.2 s
    assert first.retry_after_s == 0.2  # the Retry-After it waited on, kept once served
    assert (second.status, second.retries, second.retry_wait_s) == ("ok", 0, 0.0)
    # latency is the served attempt's; the waits are in its client queueing (sent - scheduled)
    assert (first.sent_ns - first.scheduled_ns) / 1e9 >= first.retry_wait_s
    s = summarize(records_frame(run.records), 1.0)
    assert (s.requests_ok, s.requests_rate_limited, s.rate_limit_retries) == (2, 0, 2)
    assert s.retry_wait_s is not None and abs(s.retry_wait_s - first.retry_wait_s) < 1e-6
    assert s.client_queue_ms.max is not None and s.client_queue_ms.max >= 400


async def test_retry_after_is_capped_and_gives_up_after_five_tries(serve) -> None:  # type: ignore[no-untyped-def]
    srv = Counter(limited=100, after="3600")  # an hour: capped at the flag's 0.05 s
    opts = ClientOptions(base_url=await serve(srv.handler), model="m", timeout_s=10, retry_after_max_s=0.05,
                         transport="aiohttp")
    run = await run_cell(opts, [SPEC], Load(concurrency=1), Limits(requests=1))
    [rec] = run.records
    assert (rec.status, rec.retries, srv.seen, rec.retry_after_s) == ("rate_limited", 5, 6, 3600.0)
    assert 0.25 <= rec.retry_wait_s < 3.0


async def test_a_closed_loop_of_429s_stops_saying_so(serve) -> None:  # type: ignore[no-untyped-def]
    srv = Counter(limited=10_000)
    opts = ClientOptions(base_url=await serve(srv.handler), model="m", timeout_s=10)
    run = await run_cell(opts, [SPEC], Load(concurrency=2), Limits(requests=None, duration_s=30), control=CellControl())
    assert "in a row were rate-limited (HTTP 429" in run.stopped and "--retry-after" in run.stopped, run.stopped
    s = summarize(records_frame(run.records), 1.0)
    assert s.mostly_rate_limited and s.requests_ok == 0
    assert rate_limit_line(s).startswith(f"rate-limited: {s.requests_rate_limited} of {s.requests} requests")


def test_mostly_rate_limited_means_more_than_half() -> None:
    assert not CellResult(requests_ok=5, requests_rate_limited=5).mostly_rate_limited
    assert CellResult(requests_ok=4, requests_failed=1, requests_rate_limited=6).mostly_rate_limited
    assert rate_limit_line(CellResult(requests_ok=5, requests_rate_limited=5)) == ""
    old = CellResult.from_dict({"requests_ok": 3, "requests_failed": 1})  # written before 429s were counted
    assert old.requests_rate_limited is None and old.requests == 4 and not old.mostly_rate_limited
    assert "requests_rate_limited" not in old.to_dict()


class RefusesEos:
    """An OpenAI-style API: a body with vLLM's ignore_eos or min_tokens gets a 400 naming the field."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, object]] = []

    async def handler(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        for name in ("ignore_eos", "min_tokens"):
            if name in body:
                return web.json_response({"error": {"message": f"Unrecognized request argument supplied: {name}",
                                                     "type": "invalid_request_error"}}, status=400)
        return await _stream(request)


@pytest.mark.parametrize("transport", ["raw", "aiohttp"])
async def test_a_refused_ignore_eos_is_dropped_once_for_every_request(serve, transport: str) -> None:  # type: ignore[no-untyped-def]
    srv = RefusesEos()
    opts = ClientOptions(base_url=await serve(srv.handler), model="m", timeout_s=10, transport=transport)
    # four users at once: each first request carries the field; every one of them is sent again, none fails
    run = await run_cell(opts, [SPEC], Load(concurrency=4), Limits(requests=12))
    assert [r.status for r in run.records] == ["ok"] * 12
    assert opts.ignore_eos is False and "ignore_eos" in opts.ignore_eos_refused
    refused = [b for b in srv.bodies if "ignore_eos" in b]
    assert 1 <= len(refused) <= 4 and len(srv.bodies) == 12 + len(refused)  # each refused once, then never sent
    assert all("ignore_eos" not in b and "min_tokens" not in b for b in srv.bodies[len(refused):])


async def test_an_open_loop_of_429s_keeps_its_schedule(serve) -> None:  # type: ignore[no-untyped-def]
    srv = Counter(limited=10_000)
    opts = ClientOptions(base_url=await serve(srv.handler), model="m", timeout_s=10, transport="aiohttp")
    # its sends do not wait on answers: 429s are what the rate met, never a reason to end the cell early
    run = await run_cell(opts, [SPEC], Load(rate=200.0, arrival="constant"), Limits(requests=40))
    assert run.stopped == "" and srv.seen == 40
    assert [r.status for r in run.records] == ["rate_limited"] * 40


def test_a_retried_request_is_no_sign_of_a_late_client() -> None:
    from servescope.core.metrics import client_figures

    def rec(i: int, late_ms: float, retries: int) -> RequestRecord:
        t = 1_000_000_000 + i * 10_000_000
        sent = t + int(late_ms * 1e6)
        return RequestRecord(i, -1, False, 7, 3, t, sent_ns=sent, first_token_ns=sent + 1_000_000,
                             first_content_ns=sent + 1_000_000, end_ns=sent + 3_000_000, retries=retries,
                             retry_wait_s=late_ms / 1000 if retries else 0.0)

    df = records_frame([rec(i, 0.5, 0) for i in range(20)] + [rec(20 + i, 4000.0, 2) for i in range(20)])
    late = client_figures(df, open_loop=True)["send_late_p99_ms"]
    assert late is not None and late < 1.0  # the retried half waited as the server asked: not the client's lag
    assert summarize(df, 1.0).client_queue_ms.max == 4000.0  # and that wait is in its client queueing
