"""The client against hostile servers (issue 11): implausible usage, HTML answers, echoed API keys, garbage
/tokenize, runaway concurrency and the open-file limit. The boundary (the server) is faked; the client is real."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from aiohttp import web

from servescope.core.client import ClientOptions, RequestSpec, make_http_client, stream_request
from servescope.core.errors import ServescopeError
from servescope.core.load import Limits, Load, cell_connections, run_cell
from servescope.core.metrics import records_frame, summarize
from servescope.core.records import RequestRecord
from servescope.core.results import CellResult
from servescope.core.target import ServerTokenizer, has_tokenize
from servescope.core.textsafe import MASK

SPEC = RequestSpec("completions", "hello", 7, 4)


def ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def raw_ev(text: str) -> bytes:
    return b"data: " + text.encode() + b"\n\n"


def stream_with_usage(usage_json: str, n: int = 4) -> bytes:
    """n content chunks; the second one carries `usage_json` verbatim (any JSON text, valid or not)."""
    out = b""
    for i in range(n):
        usage = usage_json if i == 1 else json.dumps({"prompt_tokens": 7, "completion_tokens": i + 1})
        out += raw_ev(f'{{"choices": [{{"index": 0, "text": "t{i}"}}], "usage": {usage}}}')
    return out + b"data: [DONE]\n\n"


@pytest.fixture
async def server() -> AsyncIterator[Callable[..., Any]]:
    runners: list[web.AppRunner] = []

    async def start(handler: Any, tokenize: Any = None) -> str:
        app = web.Application()
        app.router.add_route("POST", "/v1/completions", handler)
        app.router.add_route("POST", "/v1/chat/completions", handler)
        if tokenize is not None:
            app.router.add_route("POST", "/tokenize", tokenize)
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


def body_handler(body: bytes, content_type: str = "text/event-stream", status: int = 200) -> Any:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, status=status, headers={"Content-Type": content_type})

    return handler


async def send(url: str, *, api_key: str | None = None, max_model_len: int | None = None,
               transport: str = "aiohttp") -> RequestRecord:
    opts = ClientOptions(base_url=url, model="m", timeout_s=10, api_key=api_key, max_model_len=max_model_len,
                         transport=transport)
    rec = RequestRecord(0, 0, False, 7, 4, scheduled_ns=time.perf_counter_ns())
    async with make_http_client(opts, 1) as http:
        return await stream_request(http, opts, SPEC, rec)


# ---- item 2 and 3: usage that is not a token count ---------------------------------------------------------
@pytest.mark.parametrize("usage, shown", [
    ('{"completion_tokens": 1000000000000}', "completion_tokens = 1000000000000"),
    ('{"prompt_tokens": 100000000000000000000, "completion_tokens": 2}', "prompt_tokens = an integer of 21 digits"),
    ('{"prompt_tokens": 7, "completion_tokens": -32}', "completion_tokens = -32"),
    ('{"prompt_tokens": 7, "completion_tokens": "n"}', 'completion_tokens = "n"'),
    ('{"prompt_tokens": 7.5, "completion_tokens": 2}', "prompt_tokens = 7.5"),
    ('{"prompt_tokens": 7, "completion_tokens": true}', "completion_tokens = true"),
    ('"lots"', 'usage = "lots"'),
    ('{"completion_tokens": 2, "completion_tokens_details": {"reasoning_tokens": -1}}', "reasoning_tokens = -1"),
])
@pytest.mark.parametrize("transport", ["raw", "aiohttp", "httpx"])
async def test_implausible_usage_is_bad_usage_and_the_stream_is_still_measured(server, usage: str, shown: str,
                                                                              transport: str) -> None:
    r = await send(await server(body_handler(stream_with_usage(usage))), transport=transport)
    assert r.status == "bad_usage"
    assert shown in r.error  # the raw value is kept
    assert len(r.chunk_ns) == 4 and list(r.chunk_tokens) == [1, 1, 1, 1]  # content and timing still measured
    assert r.first_token_ns > r.sent_ns and r.end_ns >= r.chunk_ns[-1]
    assert r.output_tokens == 4 and r.prompt_tokens == 7  # the counts before the bad one, then counted chunks
    records_frame([r])  # fits the frame's Int64 columns (10**20 used to be a polars TypeError)


async def test_a_count_above_the_models_max_length_is_bad_usage(server) -> None:
    url = await server(body_handler(stream_with_usage('{"prompt_tokens": 7, "completion_tokens": 5000}')))
    assert (await send(url, max_model_len=4096)).status == "bad_usage"
    assert (await send(url)).status == "ok"  # unknown max length: 5000 is plausible (bound 10**7)


def _record(i: int, status: str, t0: int) -> RequestRecord:
    r = RequestRecord(i, 0, False, 7, 4, scheduled_ns=t0)
    r.sent_ns, r.first_token_ns, r.first_content_ns, r.end_ns = t0, t0 + 10**7, t0 + 10**7, t0 + 5 * 10**7
    r.status = status  # type: ignore[assignment]
    r.chunk_ns.extend([t0 + 10**7, t0 + 2 * 10**7])
    r.chunk_tokens.extend([1, 1])
    r.prompt_tokens, r.output_tokens = 7, 2
    if status == "bad_usage":
        r.error = "the server's usage is not a token count: completion_tokens = -32"
    return r


def test_bad_usage_requests_are_counted_and_never_ok_nor_goodput() -> None:
    recs = [_record(0, "ok", 0), _record(1, "bad_usage", 10**8), _record(2, "bad_usage", 2 * 10**8)]
    s = summarize(records_frame(recs), wall_s=1.0, slos={"ttft_ms": 1000})
    assert s.requests_ok == 1 and s.requests_failed == 2 and s.requests_bad_usage == 2
    assert s.goodput_req_s == pytest.approx(1.0) and s.output_tokens_total == 2
    assert s.errors[0].status == "bad_usage"
    cs = CellResult.from_dict(s.to_dict())
    assert cs.requests_bad_usage == 2 and cs == s


def test_old_summaries_without_the_bad_usage_count_read_back_unchanged() -> None:
    old = summarize(records_frame([_record(0, "ok", 0)]), wall_s=1.0).to_dict()
    del old["requests_bad_usage"]
    cs = CellResult.from_dict(old)
    assert cs.requests_bad_usage is None and cs.to_dict() == old


# ---- item 12: an HTML page is not "a stream ended before [DONE]" -------------------------------------------
@pytest.mark.parametrize("transport", ["raw", "aiohttp", "httpx"])
async def test_html_200_says_it_is_not_an_event_stream(server, transport: str) -> None:
    html = b"<html><body><h1>Welcome to nginx!</h1></body></html>"
    r = await send(await server(body_handler(html, "text/html; charset=utf-8")), transport=transport)
    assert r.status == "error"
    assert "Content-Type text/html" in r.error and "not an event stream" in r.error and "Welcome" in r.error
    assert "[DONE]" not in r.error


async def test_a_stream_cut_after_some_events_is_still_cut(server) -> None:
    r = await send(await server(body_handler(stream_with_usage('{"completion_tokens": 2}')[:120])))
    assert r.status == "cut" and r.error == "stream ended before [DONE]"


# ---- item 9: the API key never lands in an error text ------------------------------------------------------
@pytest.mark.parametrize("transport", ["raw", "aiohttp", "httpx"])
async def test_a_401_echoing_the_key_stores_it_masked(server, transport: str) -> None:
    key = "sk-hostile-0123456789abcdef"

    async def echo(request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        # the key split by a control character too: cleaning must not glue it back together
        return web.json_response({"error": {"message": f"bad key {auth}; again: sk-hostile-\x070123456789abcdef"}},
                                 status=401)

    r = await send(await server(echo), api_key=key, transport=transport)
    assert r.status == "error" and r.http_status == 401
    assert key not in r.error and "0123456789abcdef" not in r.error
    assert f"Bearer {MASK}" in r.error


async def test_an_error_event_echoing_the_key_is_masked(server) -> None:
    key = "sk-event-key-42"
    body = ev({"choices": [{"text": "a"}]}) + ev({"error": {"message": f"quota exceeded for {key}"}})
    r = await send(await server(body_handler(body)), api_key=key)
    assert r.status == "error" and key not in r.error and MASK in r.error


# ---- item 4: /tokenize answering garbage -------------------------------------------------------------------
@pytest.mark.parametrize("answer", [{"count": "many"}, {"count": -3}, {"count": 1.5}, {"count": None},
                                    {"count": 2, "tokens": ["a", "b"]}])
async def test_garbage_tokenize_is_one_servescope_error(server, answer: dict[str, Any]) -> None:
    async def tokenize(request: web.Request) -> web.Response:
        return web.json_response(answer)

    url = await server(body_handler(b""), tokenize)
    async with httpx.AsyncClient(base_url=url) as http:
        with pytest.raises(ServescopeError) as e:
            await has_tokenize(http, "m")
    assert "/tokenize answered" in e.value.message and "--tokenizer PATH" in e.value.message


async def test_tokenize_without_count_or_not_json_means_no_tokenize(server) -> None:
    async def html(request: web.Request) -> web.Response:
        return web.Response(text="<html>hi</html>", content_type="text/html")

    url = await server(body_handler(b""), html)
    async with httpx.AsyncClient(base_url=url) as http:
        assert await has_tokenize(http, "m") is False


async def test_tokenize_garbage_later_is_a_servescope_error_not_a_valueerror(server) -> None:
    calls = 0

    async def tokenize(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        # has_tokenize's two counts ("hello", then 200 words) are sound; a later one is garbage
        return web.json_response({"count": 1, "tokens": [1]} if calls == 1 else {"count": 200} if calls == 2
                                 else {"count": "many"})

    url = await server(body_handler(b""), tokenize)
    async with httpx.AsyncClient(base_url=url) as http:
        assert await has_tokenize(http, "m") is True
        with pytest.raises(ServescopeError, match="where a token count belongs"):
            await ServerTokenizer(http, "m").count_prompt("hello")


# ---- item 5: a closed loop never starts more users than requests -------------------------------------------
def test_cell_connections_are_capped_by_requests() -> None:
    assert cell_connections(Load(concurrency=100_000_000), 2) == 2
    assert cell_connections(Load(concurrency=100_000_000), 2, warmup=5) == 5
    assert cell_connections(Load(concurrency=8), None) == 8  # a duration-only cell needs all its users
    assert cell_connections(Load(rate=5, max_concurrency=3), 1000) == 3


async def test_a_huge_concurrency_with_two_requests_starts_two_users(server) -> None:
    """`-c 100000000 -n 2` used to create one task per user (5.9 GB, SIGINT ignored); 50,000 shows it cheaply."""
    url = await server(body_handler(stream_with_usage('{"prompt_tokens": 7, "completion_tokens": 2}')))
    loop = asyncio.get_running_loop()
    created = 0

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        nonlocal created
        created += 1
        return asyncio.Task(coro, loop=loop, **kw)

    loop.set_task_factory(factory)
    try:
        run = await asyncio.wait_for(
            run_cell(ClientOptions(base_url=url, model="m"), [SPEC] * 2, Load(concurrency=50_000), Limits(2)), 20)
    finally:
        loop.set_task_factory(None)
    assert [r.status for r in run.records] == ["ok", "ok"]
    assert created < 100


# ---- item 15: the open-file limit --------------------------------------------------------------------------
def _in_child(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_the_soft_open_file_limit_is_raised_up_to_the_hard_one() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard open-file limit here is {hard}")
    p = _in_child("import resource\n"
                  "resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))\n"
                  "from servescope.core.load import ensure_open_files\n"
                  "ensure_open_files(1000)\n"
                  "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    assert p.returncode == 0, p.stderr
    assert int(p.stdout) >= 1064


def test_too_many_users_for_the_hard_limit_is_one_line_with_the_number_that_fits() -> None:
    p = _in_child("import resource\n"
                  "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))\n"
                  "from servescope.core.errors import ServescopeError\n"
                  "from servescope.core.load import ensure_open_files\n"
                  "try:\n    ensure_open_files(2048)\nexcept ServescopeError as e:\n    print(e.message)")
    assert p.returncode == 0, p.stderr
    assert "use at most 192" in p.stdout and "ulimit -n" in p.stdout


async def test_an_endless_line_ends_the_request_instead_of_filling_memory(server) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: ")
        for _ in range(200):  # 12.5 MiB, never a line end
            await resp.write(b"x" * 65536)
        return resp

    r = await send(await server(handler))
    assert r.status == "error" and "without a line end" in r.error


def test_a_line_trickling_in_byte_by_byte_is_parsed_in_linear_time() -> None:
    from servescope.core.sse import SSEParser

    p = SSEParser()
    t0 = time.perf_counter()
    for _ in range(300_000):
        assert p.feed(b"y") == []
    assert p.pending == 300_000
    assert p.feed(b"\n") == [] and p.feed(b"data: z\n") == [b"z"]
    assert time.perf_counter() - t0 < 5  # a quadratic join would copy ~45 GB
