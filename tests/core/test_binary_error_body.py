"""An error body that is compressed or binary (issue 44, item 21) is decoded or described, never shown as bytes:
a gzip-encoded JSON error reads as its message through every transport (the raw one leaves the body as sent), a
body that is still not text after that is said to be binary, with its size and type."""

from __future__ import annotations

import gzip
import json
import os
import time
import zlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import web

from servescope.core.client import ClientOptions, RequestSpec, body_text, make_http_client, stream_request
from servescope.core.records import RequestRecord

MESSAGE = "the model is overloaded, try again later"
NOISE = bytes(range(256)) * 4 + os.urandom(512)


@pytest.fixture
async def server() -> AsyncIterator[Callable[[web.Response], Any]]:
    runners: list[web.AppRunner] = []

    async def start(response: web.Response) -> str:
        async def handle(request: web.Request) -> web.Response:
            await request.read()
            return response

        app = web.Application()
        app.router.add_route("POST", "/v1/completions", handle)
        runner = web.AppRunner(app, shutdown_timeout=0.2)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    yield start
    for r in runners:
        await r.cleanup()


async def _error(url: str, transport: str) -> str:
    opts = ClientOptions(base_url=url, model="m", timeout_s=20, transport=transport)
    async with make_http_client(opts, 1) as http:
        rec = RequestRecord(0, 0, False, 7, 4, scheduled_ns=time.perf_counter_ns())
        await stream_request(http, opts, RequestSpec("completions", "hi", 7, 4), rec)
    assert rec.status == "error"
    return rec.error


@pytest.mark.parametrize("transport", ["raw", "aiohttp", "httpx"])
async def test_a_gzip_encoded_error_reads_as_its_message(server: Any, transport: str) -> None:
    body = gzip.compress(json.dumps({"error": {"message": MESSAGE}}).encode())
    url = await server(web.Response(status=503, body=body, content_type="application/json",
                                    headers={"Content-Encoding": "gzip"}))
    assert await _error(url, transport) == f"HTTP 503: {MESSAGE}"


@pytest.mark.parametrize("transport", ["raw", "aiohttp", "httpx"])
async def test_a_binary_error_body_is_described_not_shown(server: Any, transport: str) -> None:
    url = await server(web.Response(status=500, body=NOISE, content_type="application/octet-stream"))
    err = await _error(url, transport)
    assert err == (f"HTTP 500: a binary body of {len(NOISE):,} bytes (Content-Type application/octet-stream), "
                   "not text"), err


def test_body_text_undoes_what_it_can_and_describes_the_rest() -> None:
    text = "plain words\nand a line"
    assert body_text(text.encode()) == text
    assert body_text(gzip.compress(text.encode())) == text  # known by its first bytes, without a header
    assert body_text(zlib.compress(text.encode()), "deflate") == text
    raw_deflate = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    assert body_text(raw_deflate.compress(text.encode()) + raw_deflate.flush(), "deflate") == text
    assert body_text(b"\x8b\x00\x17 brotli-ish", "br", "text/plain") == ("a binary body of 14 bytes (Content-Type "
                                                                        "text/plain, Content-Encoding br), not text")
    bomb = gzip.compress(b"A" * 50_000_000)  # 49 KB that unpack to 50 MB: only the first 64 KiB are unpacked
    assert len(body_text(bomb)) == 65536
