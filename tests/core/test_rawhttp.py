"""The raw HTTP/1.1 transport against servers that answer with exact bytes: chunked bodies split anywhere,
Content-Length and close-delimited bodies, keep-alive reuse, a pooled connection the server closed (sent
again, not an error), and answers that are not HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servescope.core.client import ClientOptions, RequestSpec, make_http_client, stream_request
from servescope.core.rawhttp import CHUNK_SIZE, DONE, RawClient, RawHTTPError, _Collect, _Conn
from servescope.core.records import RequestRecord

SPEC = RequestSpec("completions", "hello", 7, 3)


def sse(n: int) -> bytes:
    events = [b'data: {"choices":[{"text":"t%d"}],"usage":{"prompt_tokens":7,"completion_tokens":%d}}\n\n' % (i, i + 1)
              for i in range(n)]
    return b"".join(events) + b"data: [DONE]\n\n"


def chunked(payload: bytes, sizes: list[int]) -> bytes:
    out, pos = b"", 0
    for s in sizes:
        if pos >= len(payload):
            break
        part = payload[pos:pos + s]
        out += b"%x;ext=1\r\n" % len(part) + part + b"\r\n"
        pos += s
    if pos < len(payload):
        out += b"%x\r\n" % (len(payload) - pos) + payload[pos:] + b"\r\n"
    return out + b"0\r\nX-Trailer: 1\r\n\r\n"


HEAD_CHUNKED = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


class Feed:
    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.overflow = False

    def feed(self, piece: bytes, now: int) -> None:
        self.pieces.append(piece)


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=12), cuts=st.lists(st.integers(1, 60), max_size=40))
def test_chunked_bodies_split_anywhere_give_back_the_payload(sizes: list[int], cuts: list[int]) -> None:
    payload = sse(4)
    wire = HEAD_CHUNKED + chunked(payload, sizes)
    conn = _Conn(asyncio.new_event_loop())
    sink = Feed()
    conn.sink = sink
    pos = 0
    for c in [*cuts, len(wire)]:
        if pos >= len(wire):
            break
        conn.data_received(wire[pos:pos + c])
        pos += c
    assert b"".join(sink.pieces) == payload
    assert conn.state == DONE and conn.status == 200 and conn.keep


def test_a_bad_chunk_size_is_an_error_not_a_hang() -> None:
    loop = asyncio.new_event_loop()
    conn = _Conn(loop)
    conn.sink = Feed()
    conn.done_fut = loop.create_future()
    conn.data_received(HEAD_CHUNKED + b"zz\r\nhello\r\n")
    assert conn.state == DONE and isinstance(conn.done_fut.exception(), RawHTTPError)
    assert "bad chunk size" in str(conn.done_fut.exception())


def test_an_error_body_is_kept_up_to_its_limit() -> None:
    c = _Collect(10)
    c.feed(b"0123456789abcdef", 0)
    assert bytes(c.data) == b"0123456789" and c.overflow


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
async def raw_server() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    servers: list[asyncio.Server] = []

    async def start(handler: Handler) -> str:
        srv = await asyncio.start_server(handler, "127.0.0.1", 0)
        servers.append(srv)
        return f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"

    yield start
    for s in servers:
        s.close()


async def read_request(r: asyncio.StreamReader) -> bytes:
    head = await r.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    return head + await r.readexactly(length)


async def send(url: str, transport: str = "raw", http: object = None) -> RequestRecord:
    opts = ClientOptions(base_url=url, model="m", timeout_s=5, transport=transport)
    rec = RequestRecord(0, 0, False, 7, 3, scheduled_ns=0)
    if http is not None:
        return await stream_request(http, opts, SPEC, rec)
    async with make_http_client(opts, 1) as h:
        return await stream_request(h, opts, SPEC, rec)


async def test_keep_alive_connections_are_reused(raw_server) -> None:
    connections = 0

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        while True:
            try:
                req = await read_request(r)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            assert req.startswith(b"POST /v1/completions HTTP/1.1\r\n")
            w.write(HEAD_CHUNKED + chunked(sse(3), [7, 100]))
            await w.drain()

    url = await raw_server(handler)
    opts = ClientOptions(base_url=url, model="m", transport="raw")
    async with make_http_client(opts, 1) as http:
        assert isinstance(http, RawClient)
        recs = [await send(url, http=http) for _ in range(5)]
    assert all(r.status == "ok" and r.output_tokens == 3 and len(r.chunk_ns) == 3 for r in recs)
    assert connections == 1


def answer_once(answered: list[int]) -> Handler:
    """A server that answers one streamed request per connection (appending to `answered`) and, keep-alive
    promised, drops the connection at the next request without answering."""

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        answered.append(1)
        w.write(HEAD_CHUNKED + chunked(sse(3), [50]))
        await w.drain()
        try:  # the next request on this connection: read, never answered
            await r.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        w.close()

    return handler


async def test_a_pooled_connection_the_server_closed_is_sent_again(raw_server) -> None:
    answered: list[int] = []
    url = await raw_server(answer_once(answered))
    opts = ClientOptions(base_url=url, model="m", transport="raw")
    async with make_http_client(opts, 1) as http:
        first = await send(url, http=http)
        second = await send(url, http=http)
    assert first.status == "ok" and second.status == "ok" and second.output_tokens == 3
    assert len(answered) == 2


async def test_a_server_that_closes_each_connection_after_one_answer(raw_server) -> None:
    """llama.cpp's server closes every connection after one streamed answer, its head saying keep-alive: a
    request sent into a pooled connection it had closed goes again on a new connection (never into another
    pooled one the server has closed too: three of those in a row failed a request), and after two such sends
    the client stops pooling, so no later request is sent twice."""
    answered: list[int] = []
    url = await raw_server(answer_once(answered))
    opts = ClientOptions(base_url=url, model="m", transport="raw")
    async with make_http_client(opts, 3) as http:
        assert isinstance(http, RawClient)
        first = await asyncio.gather(*(send(url, http=http) for _ in range(3)))  # three pooled connections
        assert len(http._idle) == 3
        after = [await send(url, http=http) for _ in range(6)]
    assert [r.status for r in first + after] == ["ok"] * 9, [r.error for r in first + after]
    assert (http.stale, http.pool) == (2, False)
    assert len(answered) == 9 and http.opened == 9


@pytest.mark.parametrize("framing", ["length", "close", "http10"])
async def test_content_length_and_close_delimited_bodies(raw_server, framing: str) -> None:
    body = sse(3)

    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        if framing == "length":
            w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(body))
            w.write(body[:10])
            await w.drain()
            await asyncio.sleep(0.01)
            w.write(body[10:])
        else:
            proto = b"HTTP/1.0" if framing == "http10" else b"HTTP/1.1"
            w.write(proto + b" 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n" + body)
            await w.drain()
            w.close()
        await w.drain()

    r = await send(await raw_server(handler))
    assert r.status == "ok" and r.output_tokens == 3 and len(r.chunk_ns) == 3


@pytest.mark.parametrize("answer", [b"SSH-2.0-OpenSSH_9.6\r\n\r\n", b"HTTP/1.1 200 OK\r\n" + b"X: " + b"y" * 70000])
async def test_an_answer_that_is_not_http_is_an_error(raw_server, answer: bytes) -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(answer)
        await w.drain()
        await r.read()  # until the client hangs up: the error must come from the answer, not from a close
        w.close()

    r = await send(await raw_server(handler))
    assert r.status == "error"
    assert "not an HTTP/1.x response" in r.error or "over 64 KiB" in r.error


async def test_a_server_gone_mid_stream_is_cut(raw_server) -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(HEAD_CHUNKED + chunked(sse(3), [100])[:150])  # one event, then the connection drops
        await w.drain()
        w.close()

    r = await send(await raw_server(handler))
    assert r.status == "cut" and len(r.chunk_ns) >= 1 and "closed the connection" in r.error


def test_the_states_start_from_the_head() -> None:
    conn = _Conn(asyncio.new_event_loop())
    conn.data_received(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert conn.state == CHUNK_SIZE


# --- the usual read (exactly one chunk holding one event) takes a shortcut; it must read the same -----------------

def one_event_chunks(n: int, eol: bytes = b"\n\n", ext: bytes = b"") -> list[bytes]:
    """A vLLM-shaped stream: each token one event in one chunk, each chunk its own read; then [DONE] and the end."""
    events = [e + eol for e in sse(n).split(b"\n\n")[:-1]]
    return [b"%x" % len(e) + ext + b"\r\n" + e + b"\r\n" for e in events] + [b"0\r\n\r\n"]


def read_stream(reads: list[bytes], monkeypatch: pytest.MonkeyPatch, n: int) -> tuple[RequestRecord, _Conn, int]:
    """The reads through a connection into a request's record; the clock moves 1,000 ns per read. Also how many
    reads the shortcut took."""
    from servescope.core import rawhttp
    from servescope.core.client import _Stream

    clock = iter(range(1_000, 10**9, 1_000))
    monkeypatch.setattr(rawhttp, "_perf", lambda: next(clock))
    class Counted(_Stream):
        __slots__ = ("took",)

        def whole(self, piece: bytes, now: int) -> bool:
            ok = super().whole(piece, now)
            self.took += ok
            return ok

    conn = _Conn(asyncio.new_event_loop())
    rec = RequestRecord(0, 0, False, 7, n, scheduled_ns=0)
    sink = Counted(rec)
    sink.took = 0
    conn.sink = sink
    for r in reads:
        conn.data_received(r)
    return rec, conn, sink.took


def test_one_chunk_per_read_is_stamped_read_by_read(monkeypatch: pytest.MonkeyPatch) -> None:
    rec, conn, took = read_stream([HEAD_CHUNKED, *one_event_chunks(20)], monkeypatch, 20)
    assert conn.state == DONE and rec.output_tokens == 20
    assert list(rec.chunk_ns) == list(range(2_000, 22_000, 1_000))  # each token's own read
    assert took >= 16  # the shortcut was taken (the first reads fill the body's kept head the usual way)


@settings(max_examples=150, deadline=None)
@given(cuts=st.lists(st.integers(1, 400), max_size=30), crlf=st.booleans(), ext=st.booleans())
def test_the_shortcut_and_the_general_parse_read_the_same(cuts: list[int], crlf: bool, ext: bool) -> None:
    """The same stream read one chunk per read (the shortcut) and cut anywhere (the general parse): the same
    tokens, counts and status; with CRLF line ends or chunk extensions the shortcut stands aside."""
    with pytest.MonkeyPatch.context() as mp:
        reads = one_event_chunks(6, b"\r\n\r\n" if crlf else b"\n\n", b";x=1" if ext else b"")
        a, conn_a, _ = read_stream([HEAD_CHUNKED, *reads], mp, 6)
        wire = HEAD_CHUNKED + b"".join(reads)
        pieces, pos = [], 0
        for c in [*cuts, len(wire)]:
            if pos < len(wire):
                pieces.append(wire[pos:pos + c])
                pos += c
        b, conn_b, _ = read_stream(pieces, mp, 6)
    assert conn_a.state == conn_b.state == DONE
    for name in ("status", "output_tokens", "prompt_tokens", "usage_reported"):
        assert getattr(a, name) == getattr(b, name), name
    assert len(a.chunk_ns) == len(b.chunk_ns) == 6 and list(a.chunk_tokens) == list(b.chunk_tokens)


@pytest.mark.parametrize("end", [[b"0\r\n", b"\r\n"], [b"0\r", b"\n\r\n"], [b"0\r\nX-T: 1\r\n\r\n"]])
def test_the_body_s_end_split_across_reads_ends_the_request(end: list[bytes]) -> None:
    from servescope.core.client import _Stream

    loop = asyncio.new_event_loop()
    conn = _Conn(loop)
    rec = RequestRecord(0, 0, False, 7, 3, scheduled_ns=0)
    conn.sink = _Stream(rec)
    conn.done_fut = loop.create_future()
    conn.data_received(HEAD_CHUNKED)
    for r in [*one_event_chunks(3)[:-1], *end]:
        conn.data_received(r)
    assert conn.done_fut.done() and conn.state == DONE and len(rec.chunk_ns) == 3


async def test_tokens_before_the_server_drops_the_connection_count(raw_server) -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(HEAD_CHUNKED)
        for chunk in one_event_chunks(3)[:3]:  # three whole token chunks, then the connection drops
            w.write(chunk)
            await w.drain()
            await asyncio.sleep(0.01)
        w.close()

    r = await send(await raw_server(handler))
    assert r.status == "cut" and len(r.chunk_ns) == 3 and "closed the connection" in r.error


async def test_tokens_before_the_request_times_out_count(raw_server) -> None:
    async def handler(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await read_request(r)
        w.write(HEAD_CHUNKED)
        for chunk in one_event_chunks(3)[:3]:  # three whole token chunks, then nothing more
            w.write(chunk)
            await w.drain()
            await asyncio.sleep(0.01)
        await r.read()  # nothing more, until the client gives up and hangs up

    url = await raw_server(handler)
    opts = ClientOptions(base_url=url, model="m", timeout_s=0.5, transport="raw")
    rec = RequestRecord(0, 0, False, 7, 3, scheduled_ns=0)
    async with make_http_client(opts, 1) as h:
        r = await stream_request(h, opts, SPEC, rec)
    assert r.status == "timeout" and len(r.chunk_ns) == 3 and r.output_tokens == 3


def test_a_chunk_after_done_is_not_counted_and_ends_the_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 32: one whole chunk after [DONE] (the shortcut's read) counts nowhere, and the connection stops
    reading (it is not reused) instead of waiting for whatever else the server sends."""
    extra = b'data: {"choices":[{"text":"x"}],"usage":{"completion_tokens":21}}\n\n'
    chunks = one_event_chunks(16)
    reads = [HEAD_CHUNKED, *chunks[:-1], b"%x\r\n" % len(extra) + extra + b"\r\n"]  # and no end of the body
    rec, conn, took = read_stream(reads, monkeypatch, 16)
    assert conn.state == DONE and not conn.keep and took
    assert rec.output_tokens == 16 and len(rec.chunk_ns) == 16
