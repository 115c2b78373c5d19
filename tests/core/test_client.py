"""The streaming client against a scripted local HTTP server (the boundary is faked, the client is real)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web

from servescope.core.client import ClientOptions, RequestSpec, make_http_client, stream_request
from servescope.core.load import CellControl, Limits, Load, run_cell
from servescope.core.records import RequestRecord


def ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def completion_stream(n: int, prompt: int = 7) -> bytes:
    out = b""
    for i in range(n):
        out += ev({"choices": [{"index": 0, "text": f"t{i}", "finish_reason": None}],
                   "usage": {"prompt_tokens": prompt, "completion_tokens": i + 1}})
    out += ev({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": n}})
    return out + b"data: [DONE]\n\n"


Handler = Callable[[web.Request], "asyncio.Future[web.StreamResponse]"]


@pytest.fixture
async def server() -> AsyncIterator[Callable[[Handler], asyncio.Future[str]]]:
    runners: list[web.AppRunner] = []

    async def start(handler) -> str:  # type: ignore[no-untyped-def]
        app = web.Application()
        app.router.add_route("POST", "/v1/completions", handler)
        app.router.add_route("POST", "/v1/chat/completions", handler)
        runner = web.AppRunner(app, shutdown_timeout=0.2)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        runners.append(runner)
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}"

    yield start  # type: ignore[misc]
    for r in runners:
        await r.cleanup()


async def send(url: str, spec: RequestSpec, timeout_s: float = 10, transport: str = "aiohttp") -> RequestRecord:
    opts = ClientOptions(base_url=url, model="m", timeout_s=timeout_s, transport=transport)
    rec = RequestRecord(0, 0, False, spec.input_tokens, spec.output_tokens, scheduled_ns=0)
    async with make_http_client(opts, 1) as http:
        return await stream_request(http, opts, spec, rec)


SPEC = RequestSpec("completions", "hello", 7, 5)


@pytest.mark.parametrize("transport", ["raw", "aiohttp", "httpx"])
async def test_stream_split_in_odd_pieces(server, transport: str) -> None:
    body = completion_stream(5)
    seen: dict[str, object] = {}

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.update(await request.json())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(0, len(body), 7):  # 7-byte pieces split events and JSON everywhere
            await resp.write(body[i : i + 7])
            await asyncio.sleep(0)
        await resp.write_eof()
        return resp

    url = await server(handler)
    r = await send(url, SPEC, transport=transport)
    assert r.status == "ok", r.error
    assert r.output_tokens == 5 and r.prompt_tokens == 7 and r.usage_reported
    assert len(r.chunk_ns) == 5 and list(r.chunk_tokens) == [1] * 5
    assert r.sent_ns <= r.first_token_ns <= r.chunk_ns[-1] <= r.end_ns
    assert seen["ignore_eos"] is True and seen["max_tokens"] == 5 and seen["min_tokens"] == 5
    assert seen["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


async def test_chat_reasoning_then_content(server) -> None:
    events = [ev({"choices": [{"delta": {"role": "assistant", "content": ""}}]})]
    for i in range(3):
        events.append(ev({"choices": [{"delta": {"reasoning_content": f"r{i}"}}], "usage": {"completion_tokens": i + 1}}))
    for i in range(2):
        events.append(ev({"choices": [{"delta": {"content": f"c{i}"}}], "usage": {"completion_tokens": i + 4}}))
    events.append(ev({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 5}}))
    events.append(b"data: [DONE]\n\n")
    seen: dict[str, object] = {}

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.update(await request.json())
        resp = web.StreamResponse()
        await resp.prepare(request)
        for e in events:
            await resp.write(e)
            await asyncio.sleep(0.005)
        return resp

    url = await server(handler)
    r = await send(url, RequestSpec("chat", "hi", 9, 5, thinking=True))
    assert r.status == "ok"
    assert r.output_tokens == 5 and r.reasoning_tokens == 3
    assert r.first_token_ns == r.chunk_ns[0] and r.first_content_ns == r.chunk_ns[3]
    assert seen["messages"] == [{"role": "user", "content": "hi"}]
    assert seen["chat_template_kwargs"] == {"enable_thinking": True}


async def test_multi_token_chunks_from_usage(server) -> None:
    body = (ev({"choices": [{"text": "ab"}], "usage": {"completion_tokens": 2}})
            + ev({"choices": [{"text": "cde"}], "usage": {"completion_tokens": 5}})
            + ev({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}}) + b"data: [DONE]\n\n")

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/event-stream")

    r = await send(await server(handler), SPEC)
    assert list(r.chunk_tokens) == [2, 3] and r.output_tokens == 5


@pytest.mark.parametrize("transport", ["raw", "aiohttp", "httpx"])
async def test_http_error_is_data_and_escapes_are_stripped(server, transport: str) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "bad \x1b[31mred\x1b[0m thing\x07"}}, status=400)

    r = await send(await server(handler), SPEC, transport=transport)
    assert r.status == "error" and r.http_status == 400
    assert r.error == "HTTP 400: bad red thing"


@pytest.mark.parametrize("transport", ["raw", "aiohttp", "httpx"])
async def test_cut_stream(server, transport: str) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(completion_stream(5)[:150])
        return resp  # ends without [DONE]

    r = await send(await server(handler), SPEC, transport=transport)
    assert r.status == "cut" and len(r.chunk_ns) >= 1


@pytest.mark.parametrize("transport", ["raw", "aiohttp", "httpx"])
async def test_timeout(server, transport: str) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(ev({"choices": [{"text": "a"}]}))
        await asyncio.Event().wait()  # never answers the rest: only the client's timeout ends the request
        return resp

    r = await send(await server(handler), SPEC, timeout_s=0.3, transport=transport)
    assert r.status == "timeout" and "timeout" in r.error
    assert r.output_tokens == 1  # partial counts kept


@pytest.mark.parametrize("transport", ["raw", "aiohttp", "httpx"])
async def test_connection_refused(transport: str) -> None:
    r = await send("http://127.0.0.1:9", SPEC, transport=transport)
    assert r.status == "error" and r.error


async def test_256_users_hold_256_streams(server) -> None:
    live = 0
    peak = 0
    all_in = asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal live, peak
        live += 1
        peak = max(peak, live)
        if live == 256:
            all_in.set()
        resp = web.StreamResponse()
        await resp.prepare(request)
        # each stream stays open until all 256 are (however long a busy host takes to open them); a limit so
        # that a client holding fewer fails the count below instead of hanging
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_in.wait(), 60)
        await resp.write(completion_stream(2))
        live -= 1
        return resp

    url = await server(handler)
    opts = ClientOptions(base_url=url, model="m", timeout_s=30)
    specs = [RequestSpec("completions", "x", 7, 2)] * 256
    run = await run_cell(opts, specs, Load(concurrency=256), Limits(requests=256))
    assert peak == 256
    assert sum(r.status == "ok" for r in run.records) == 256


async def test_all_failing_cell_stops_early(server) -> None:
    calls = 0

    async def handler(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        return web.json_response({"error": {"message": "overloaded"}}, status=500)

    url = await server(handler)
    opts = ClientOptions(base_url=url, model="m")
    run = await run_cell(opts, [SPEC] * 10, Load(concurrency=2), Limits(requests=1000))
    assert "in a row failed" in run.stopped and "overloaded" in run.stopped
    assert calls < 50 and len(run.records) >= 5


async def test_open_loop_rate_and_queueing(server) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await asyncio.sleep(0.2)
        await resp.write(completion_stream(2))
        return resp

    url = await server(handler)
    opts = ClientOptions(base_url=url, model="m")
    # 50 req/s, but at most 2 in flight: requests queue on the client, and that shows as client_queue
    run = await run_cell(opts, [SPEC] * 20, Load(rate=50, max_concurrency=2), Limits(requests=12))
    assert len(run.records) == 12
    queue_ms = sorted((r.sent_ns - r.scheduled_ns) / 1e6 for r in run.records)
    assert queue_ms[-1] > 500  # the last ones waited for a slot
    sched = sorted(r.scheduled_ns for r in run.records)
    gaps = [(b - a) / 1e6 for a, b in zip(sched, sched[1:], strict=False)]
    assert all(abs(g - 20) < 1 for g in gaps)  # constant arrivals every 20 ms


async def test_cancel_ends_cell_cleanly(server) -> None:
    arrived, all_in = 0, asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal arrived
        resp = web.StreamResponse()
        await resp.prepare(request)
        arrived += 1
        if arrived == 4:
            all_in.set()
        await asyncio.Event().wait()  # never answers: only the stop ends these requests
        return resp

    url = await server(handler)
    ctl = CellControl()
    task = asyncio.create_task(run_cell(ClientOptions(base_url=url, model="m"), [SPEC] * 4, Load(concurrency=4),
                                        Limits(requests=4), control=ctl))
    await asyncio.wait_for(all_in.wait(), 60)  # the 4 requests are at the server (a generous limit)
    ctl.request_stop("stopped by test")
    run = await asyncio.wait_for(task, 60)
    assert run.stopped == "stopped by test"
    assert [r.status for r in run.records] == ["cancelled"] * 4


async def test_server_without_continuous_usage_stats(server) -> None:
    """A server that rejects continuous_usage_stats gets the request again without it."""
    bodies: list[dict[str, object]] = []

    async def handler(request: web.Request) -> web.Response:
        body = await request.json()
        bodies.append(body)
        if body["stream_options"].get("continuous_usage_stats"):
            return web.json_response({"error": {"message": "unknown field stream_options.continuous_usage_stats"}},
                                     status=400)
        ev_text = ev({"choices": [{"text": "a"}]}) + ev({"choices": [{"text": "b"}]})
        usage = ev({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
        return web.Response(body=ev_text + usage + b"data: [DONE]\n\n", content_type="text/event-stream")

    url = await server(handler)
    opts = ClientOptions(base_url=url, model="m")
    async with make_http_client(opts, 1) as http:
        r1 = await stream_request(http, opts, SPEC, RequestRecord(0, 0, False, 7, 5, 0))
        r2 = await stream_request(http, opts, SPEC, RequestRecord(1, 0, False, 7, 5, 0))
    assert r1.status == "ok" and r1.output_tokens == 2 and r1.index == 0
    assert r2.status == "ok" and r2.index == 1
    assert opts.continuous_usage is False and len(bodies) == 3  # one rejected, then two without the option
