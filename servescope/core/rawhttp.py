"""The lightest streaming transport: HTTP/1.1 over an asyncio Protocol, for the load's POSTs only.

aiohttp wakes a coroutine for every piece a stream delivers (its reader's future, the async iterator, the
task step). Here the bytes are handled in the protocol's `data_received` callback itself: chunked transfer
coding is undone in one pass over what arrived, and the whole read goes to the SSE consumer at once, stamped
with one `perf_counter_ns()`. The awaiting request wakes once, when the body ends (or the exchange fails).

It speaks only what an OpenAI-compatible server answers a streaming POST with: a status line, headers, and a
chunked, Content-Length or close-delimited body; keep-alive connections are pooled per client (closed by us
after `idle_s`, before the server drops them; not pooled against a server that closes each one after a single
response, and a request sent into a connection the server had just closed goes again on a new one). Anything
else (a proxy, HTTP/2, redirects) is for aiohttp (`--transport aiohttp`).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit

from servescope.core.tls import CONNECTIONS, ConnSample

_perf = time.perf_counter_ns
MAX_HEAD = 64 * 1024  # bytes of status line and headers before the response is refused
ERROR_LIMIT = 64 * 1024  # bytes of a GET's error body kept


class RawHTTPError(Exception):
    """The connection failed or the server's answer was not HTTP/1.x we can read."""


class StaleConnection(RawHTTPError):
    """A pooled keep-alive connection was closed by the server before it answered: it never saw the request."""


class Sink(Protocol):
    """Where a 200 body goes: `feed(piece, now_ns)` for each read, `overflow` set to stop reading. A sink may also
    have `whole(payload, now_ns) -> bool`: offered a read that is exactly one whole chunk (the usual read of a
    stream), it handles the payload at once or says False (then the payload goes to `feed` as usual)."""

    overflow: bool

    def feed(self, piece: bytes, now: int) -> None: ...


class _Whole(Protocol):
    """A sink that takes a read which is exactly one whole chunk (see `Sink`)."""

    def whole(self, payload: bytes, now: int) -> bool: ...


class _Collect:
    """A non-200 body, kept up to `limit` bytes (an error text)."""

    __slots__ = ("data", "limit", "overflow")

    def __init__(self, limit: int) -> None:
        self.data = bytearray()
        self.limit = limit
        self.overflow = False

    def feed(self, piece: bytes, now: int) -> None:
        self.data += piece[: self.limit - len(self.data)]
        if len(self.data) >= self.limit:
            self.overflow = True


HEAD, CHUNK_SIZE, CHUNK_DATA, CHUNK_END, TRAILER, LENGTH, CLOSE, DONE = range(8)


class _Conn(asyncio.Protocol):
    """One connection; one request at a time."""

    # slots: a stream's read touches this object alone, not a separate dict of values too (at thousands of
    # streams each read finds its connection's state out of the CPU's cache: every object on the path counts)
    __slots__ = ("loop", "transport", "closed", "used", "idle_since", "state", "buf", "left", "status", "headers",
                 "keep", "got_any", "sink", "error_sink", "head_fut", "done_fut", "whole")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.used = 0  # responses read on it
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.state = HEAD
        self.buf = b""
        self.left = 0  # bytes left of the current chunk or of the Content-Length body
        self.status = 0
        self.headers: dict[str, str] = {}
        self.keep = True
        self.got_any = False
        self.sink: Sink | None = None
        self.error_sink: _Collect | None = None
        self.head_fut: asyncio.Future[None] | None = None
        self.done_fut: asyncio.Future[None] | None = None
        self.whole: _Whole | None = None  # the 200 sink, for a chunked body, when it has `whole`

    # --- asyncio.Protocol ---------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.state == CLOSE:  # a close-delimited body ends here
            self._finish()
            return
        if self.state == DONE or (self.head_fut is None and self.done_fut is None):
            return
        if not self.got_any and self.used:
            err: Exception = StaleConnection("the server closed the pooled connection before answering")
        else:
            err = RawHTTPError(f"the server closed the connection mid-response ({exc or 'EOF'})")
        self._raise(err)

    def data_received(self, data: bytes) -> None:
        now = _perf()
        self.got_any = True
        if self.whole is not None and self.state == CHUNK_SIZE and not self.buf:
            # the usual read of a stream: exactly one whole chunk. Its payload goes to the sink in one step
            nl = data.find(b"\r\n", 0, 18)
            if nl > 0:
                try:
                    end = nl + 2 + int(data[:nl], 16)
                except ValueError:  # an extension, or no size: the general parse says what is wrong
                    end = 0
                if end > nl + 2 and len(data) == end + 2 and data.endswith(b"\r\n") \
                        and self.whole.whole(data[nl + 2:end], now):
                    if self.sink is not None and self.sink.overflow:  # the sink wants no more (e.g. past [DONE])
                        self.keep = False
                        self._finish()
                    return
        if self.state == HEAD:
            data = self._head(self.buf + data if self.buf else data)
            if not data:
                return
        elif self.buf:
            data, self.buf = self.buf + data, b""
        st = self.state
        if st == LENGTH:
            take = data[: self.left]
            self.left -= len(take)
            if take:
                self._feed(take, now)
            if self.left <= 0:
                self._finish()
        elif st == CLOSE:
            self._feed(data, now)
        elif st != DONE:
            self._chunked(data, now)

    # --- parsing ------------------------------------------------------------------------------------------
    def _head(self, data: bytes) -> bytes:
        end = data.find(b"\r\n\r\n")
        if end < 0:
            if len(data) > MAX_HEAD:
                self._fail("the server's response head is over 64 KiB")
            else:
                self.buf = data
            return b""
        self.buf = b""
        lines = data[:end].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
            self._fail(f"not an HTTP/1.x response: {lines[0][:80]!r}")
            return b""
        self.status = int(parts[1])
        h = self.headers
        for line in lines[1:]:
            k, sep, v = line.partition(":")
            if sep:
                h[k.strip().lower()] = v.strip()
        self.keep = parts[0] != "HTTP/1.0" and "close" not in h.get("connection", "").lower()
        if self.status != 200 and self.error_sink is not None:
            self.sink = self.error_sink
        self.whole = None
        if "chunked" in h.get("transfer-encoding", "").lower():
            self.state = CHUNK_SIZE
            self.whole = self.sink if hasattr(self.sink, "whole") else None  # type: ignore[assignment]
        elif "content-length" in h:
            try:
                self.left = int(h["content-length"])
            except ValueError:
                self._fail(f"bad Content-Length {h['content-length'][:40]!r}")
                return b""
            self.state = LENGTH
        else:
            self.state = CLOSE
            self.keep = False
        if self.head_fut is not None and not self.head_fut.done():
            self.head_fut.set_result(None)
        rest = data[end + 4:]
        if self.state == LENGTH and self.left == 0:
            self._finish()
            return b""
        return rest

    def _chunked(self, data: bytes, now: int) -> None:
        """Undo chunked coding in one pass; the payload of this read goes to the sink as one piece."""
        out: list[bytes] = []
        pos, n = 0, len(data)
        st = self.state
        while pos < n:
            if st == CHUNK_DATA:
                end = pos + self.left
                if end > n:
                    out.append(data[pos:])
                    self.left = end - n
                    pos = n
                    break
                out.append(data[pos:end])
                pos = end
                st = CHUNK_END
            elif st == CHUNK_END:  # the CRLF after a chunk's data
                if n - pos < 2:
                    break
                pos += 2
                st = CHUNK_SIZE
            elif st == CHUNK_SIZE:
                nl = data.find(b"\r\n", pos)
                if nl < 0:
                    break
                try:
                    size = int(data[pos:nl].split(b";", 1)[0], 16)
                except ValueError:
                    self.state = st
                    self._fail(f"bad chunk size {data[pos:nl][:20]!r}")
                    return
                pos = nl + 2
                if size == 0:
                    st = TRAILER
                else:
                    self.left = size
                    st = CHUNK_DATA
            elif st == TRAILER:  # trailer lines until an empty one
                nl = data.find(b"\r\n", pos)
                if nl < 0:
                    break
                empty = nl == pos
                pos = nl + 2
                if empty:
                    st = DONE
                    break
            else:
                break
        self.state = st
        if pos < n and st != DONE:
            self.buf = data[pos:]
        if out:
            self._feed(out[0] if len(out) == 1 else b"".join(out), now)
        if st == DONE:
            self._finish()

    def _feed(self, piece: bytes, now: int) -> None:
        sink = self.sink
        if sink is None:
            return
        sink.feed(piece, now)
        if sink.overflow:  # stop reading: this connection cannot be reused
            self.keep = False
            self._finish()

    def _finish(self) -> None:
        self.state = DONE
        self.whole = None
        for f in (self.head_fut, self.done_fut):
            if f is not None and not f.done():
                f.set_result(None)

    def _fail(self, why: str) -> None:
        self.keep = False
        self.state = DONE
        self._raise(RawHTTPError(why))
        self.close()

    def _raise(self, err: Exception) -> None:
        """The request fails: the future awaited now gets the error (the head's, else the body's)."""
        head, done = self.head_fut, self.done_fut
        if head is not None and not head.done():
            head.set_exception(err)
            if done is not None and not done.done():
                done.cancel()  # never awaited now
        elif done is not None and not done.done():
            done.set_exception(err)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class RawClient:
    """A pool of up to `limit` keep-alive HTTP/1.1 connections to one server, for streaming POSTs."""

    def __init__(self, base_url: str, headers: dict[str, str], limit: int, idle_s: float = 4.0,
                 connect_timeout_s: float = 15.0, ssl_context: Callable[[], ssl.SSLContext] | None = None,
                 log_connections: bool = True) -> None:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"bad base URL {base_url!r}")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = None
        if u.scheme == "https":
            self.ssl = ssl_context() if ssl_context else ssl.create_default_context()
        self.prefix = u.path.rstrip("/") + "/"
        hostport = self.host if u.port is None else f"{self.host}:{u.port}"
        self._head_lines = "".join(f"{k}: {v}\r\n" for k, v in {"Host": hostport, **headers}.items())
        self.limit = max(1, limit)
        self.idle_s = idle_s
        self.connect_timeout_s = connect_timeout_s
        self.log_connections = log_connections  # the load's connections are timed (tls.CONNECTIONS); a scrape's not
        self._idle: list[_Conn] = []
        self._all: set[_Conn] = set()
        self._slots = asyncio.Semaphore(self.limit)
        self.opened = 0  # connections this client opened (keep-alive: one per user, not one per request)
        # a server that closes every connection after one response (llama.cpp's server does, though its head
        # says keep-alive) makes each pooled send a stale one: once two were and no connection ever served a
        # second response, connections are not pooled any more (each request on its own, no send wasted)
        self.stale = 0  # pooled connections the server had closed before answering
        self.reused = 0  # responses read on a connection's second or later use
        self.pool = True

    async def __aenter__(self) -> RawClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for c in list(self._all):
            c.close()
        self._all.clear()
        self._idle.clear()

    async def _connect(self) -> _Conn:
        """A new connection: TCP, then (https) the TLS handshake, each timed into `tls.CONNECTIONS` (the handshake
        apart from the TTFT of the request that waits for it)."""
        loop = asyncio.get_running_loop()
        t0 = _perf()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                transport, proto = await loop.create_connection(lambda: _Conn(loop), self.host, self.port)
                t1 = _perf()
                if self.ssl is not None:
                    try:
                        tls = await loop.start_tls(transport, proto, self.ssl, server_hostname=self.host)
                    except BaseException:
                        transport.close()
                        raise
                    assert tls is not None
                    proto.transport = tls
        except TimeoutError:
            raise RawHTTPError(f"could not connect to {self.host}:{self.port} within {self.connect_timeout_s:g} s") from None
        t2 = _perf()
        if self.log_connections:
            CONNECTIONS.add(ConnSample((t1 - t0) / 1e6, (t2 - t1) / 1e6 if self.ssl is not None else None))
        self.opened += 1
        self._all.add(proto)
        return proto

    def _take_idle(self) -> _Conn | None:
        now = time.monotonic()
        while self._idle:
            c = self._idle.pop()
            if not c.closed and now - c.idle_since < self.idle_s:
                return c
            c.close()
            self._all.discard(c)
        return None

    async def post_stream(self, path: str, body: bytes, sink: Sink, error_limit: int,
                          headers_out: dict[str, str] | None = None, fresh: bool = False) -> tuple[int, str, bytes]:
        """POST `body`; a 200 body goes to `sink` read by read; returns (status, content type, error body).
        `headers_out`, when given, gets the response's headers (names in lower case), e.g. a 429's Retry-After.
        `fresh`: on a new connection, never a pooled one (a request sent again after a stale one)."""
        head = (f"POST {self.prefix}{path} HTTP/1.1\r\n{self._head_lines}"
                f"Content-Length: {len(body)}\r\n\r\n").encode("latin-1")
        return await self._exchange(head + body, sink, error_limit, headers_out, fresh)

    async def get(self, path: str, limit: int, headers_out: dict[str, str] | None = None) -> tuple[int, bytes]:
        """GET `path` (e.g. /metrics) on a pooled keep-alive connection: (status, body). A body of more than `limit`
        bytes raises RawHTTPError. A pooled connection the server had closed is tried again once on a new one (a GET
        may be sent twice)."""
        head = f"GET {self.prefix}{path.lstrip('/')} HTTP/1.1\r\n{self._head_lines}\r\n".encode("latin-1")
        for fresh in (False, True):
            body = _Collect(limit)
            try:
                status, _, error = await self._exchange(head, body, ERROR_LIMIT, headers_out, fresh)
            except StaleConnection:
                if fresh:
                    raise
                continue
            if body.overflow:
                raise RawHTTPError(f"the answer to GET {path} is over {limit // 1024:,} KiB")
            return status, bytes(body.data) if status == 200 else error
        raise AssertionError("unreachable")  # pragma: no cover

    async def _exchange(self, request: bytes, sink: Sink, error_limit: int, headers_out: dict[str, str] | None,
                        fresh: bool) -> tuple[int, str, bytes]:
        """Write `request` (its head and body) on a connection and read the answer: a 200 body to `sink`, another
        status's to an error sink of `error_limit` bytes; (status, content type, error body)."""
        async with self._slots:
            conn = (None if fresh or not self.pool else self._take_idle()) or await self._connect()
            ok = False
            try:
                loop = conn.loop
                conn._reset()
                conn.sink = sink
                errors = conn.error_sink = _Collect(error_limit)
                # one future for the whole answer (no second wake-up at its head): a failure before the head, a
                # stale pooled connection's among them, arrives on it too
                conn.done_fut = loop.create_future()
                assert conn.transport is not None
                conn.transport.write(request)
                try:
                    await conn.done_fut
                except StaleConnection:
                    self.stale += 1
                    if self.stale >= 2 and not self.reused:
                        self.pool = False
                    raise
                conn.used += 1
                if conn.used > 1:
                    self.reused += 1
                if headers_out is not None:
                    headers_out.update(conn.headers)
                ok = conn.keep and not conn.closed
                return conn.status, conn.headers.get("content-type", ""), bytes(errors.data)
            finally:
                conn.sink = conn.error_sink = conn.whole = None
                for f in (conn.head_fut, conn.done_fut):
                    if f is not None and not f.done():
                        f.cancel()  # cancelled or failed midway: nothing awaits them any more
                conn.head_fut = conn.done_fut = None
                if ok and self.pool:
                    conn.idle_since = time.monotonic()
                    self._idle.append(conn)
                else:  # cancelled, failed, or a body not read to its end: never reused
                    conn.close()
                    self._all.discard(conn)
