"""The lightest streaming transport: HTTP/1.1 for the load's POSTs only, read without a coroutine per piece.

aiohttp wakes a coroutine for every piece a stream delivers (its reader's future, the async iterator, the
task step). Here the bytes are handled in a callback: chunked transfer coding is undone in one pass over what
arrived, and the whole read goes to the SSE consumer at once, with one stamp. The awaiting request wakes
twice: when the head arrives and when the body ends.

Plain-HTTP connections on Linux go further (`_Poller`): they sit in one epoll set of their own, which the event
loop watches as a single descriptor. When it turns ready, the poller waits out a short window
(`COALESCE_S`) and then reads every connection that has data, so the tokens of one engine step, which the
server writes stream after stream, cost one wake-up of the client instead of one each. The window does not
delay any stamp: each read is stamped with the time the kernel received its last packet (`SO_TIMESTAMPNS`),
not the time it was read. TLS connections, and systems without epoll, use an asyncio Protocol stamped on read.

It speaks only what an OpenAI-compatible server answers a streaming POST with: a status line, headers, and a
chunked, Content-Length or close-delimited body; keep-alive connections are pooled per client (closed by us
after `idle_s`, before the server drops them). Anything else (a proxy, HTTP/2, redirects) is for aiohttp
(`--transport aiohttp`).
"""

from __future__ import annotations

import asyncio
import select
import socket
import ssl
import struct
import sys
import time
from collections.abc import Callable
from typing import Protocol
from urllib.parse import urlsplit

_perf = time.perf_counter_ns
MAX_HEAD = 64 * 1024  # bytes of status line and headers before the response is refused
COALESCE_S = 0.001  # how long the poller lets reads gather after its first wake-up (stamps are the kernel's)
SKIP_AFTER_MISS = 16  # wake-ups read at once after a window that gathered only one connection's data
READ_BUF = 256 * 1024  # one receive buffer per poller (reads are copied out at their size)
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux's value; Python does not name it
_ANC_SIZE = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 0
_timespec = struct.Struct("qq").unpack


class RawHTTPError(Exception):
    """The connection failed or the server's answer was not HTTP/1.x we can read."""


class StaleConnection(RawHTTPError):
    """A pooled keep-alive connection was closed by the server before it answered: it never saw the request."""


class Sink(Protocol):
    """Where a 200 body goes: `feed(piece, now_ns)` for each read, `overflow` set to stop reading."""

    overflow: bool

    def feed(self, piece: bytes, now: int) -> None: ...


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
        self.last_ns = 0  # the stamp of the latest read
        self.end_ns = 0  # the stamp of the read that ended the response
        self.sink: Sink | None = None
        self.error_sink: _Collect | None = None
        self.head_fut: asyncio.Future[None] | None = None
        self.done_fut: asyncio.Future[None] | None = None

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
        self._received(data, _perf())

    async def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def _received(self, data: bytes, now: int) -> None:
        """One read's bytes, stamped `now` (perf_counter_ns): the head, then the body's payload to the sink."""
        self.got_any = True
        self.last_ns = now
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
        if "chunked" in h.get("transfer-encoding", "").lower():
            self.state = CHUNK_SIZE
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
        self.end_ns = self.last_ns
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


def kernel_stamps_available() -> bool:
    """Whether plain-HTTP connections can use the poller: Linux's epoll and receive timestamps."""
    return sys.platform.startswith("linux") and hasattr(select, "epoll") and _ANC_SIZE > 0


class _Poller:
    """One epoll set for a client's plain-HTTP connections; the event loop watches it as one descriptor.

    On a wake-up it first lets reads gather for `window_s` (unless the last poll was itself longer than the
    window: a busy client has gathered enough), then reads every ready connection once. A window that gathered
    only one connection's data (a lone stream) is not tried again for `SKIP_AFTER_MISS` wake-ups."""

    def __init__(self, loop: asyncio.AbstractEventLoop, window_s: float = COALESCE_S) -> None:
        self.loop = loop
        self.window_s = window_s
        self.ep = select.epoll()
        self.conns: dict[int, _SockConn] = {}
        self.buf = bytearray(READ_BUF)
        self.view = memoryview(self.buf)
        self.last_end = 0.0  # perf_counter s at which the latest poll ended
        self.busy = False  # the latest poll took longer than the window
        self.skip = 0
        self.closed = False
        self.polls = self.pauses = self.reads = 0  # wake-ups, of which windows waited out, and reads
        loop.add_reader(self.ep.fileno(), self._ready)

    def add(self, conn: _SockConn) -> None:
        self.conns[conn.fd] = conn
        self.ep.register(conn.fd, select.EPOLLIN)

    def remove(self, conn: _SockConn) -> None:
        if self.conns.pop(conn.fd, None) is not None and not self.closed:
            try:
                self.ep.unregister(conn.fd)
            except (OSError, ValueError):
                pass

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.loop.remove_reader(self.ep.fileno())
        except (RuntimeError, ValueError):  # the loop is closed already
            pass
        self.ep.close()

    def _ready(self) -> None:
        t0 = time.perf_counter()
        waited = 0.0
        if self.skip:
            self.skip -= 1
        elif not self.busy and self.window_s > 0:
            since = t0 - self.last_end
            waited = self.window_s if since >= self.window_s else self.window_s - since
            time.sleep(waited)
            self.pauses += 1
        try:
            events = self.ep.poll(0, len(self.conns) or 1)
        except (OSError, ValueError):  # closed under us
            return
        p0 = _perf()  # the kernel stamps on the real-time clock, ours are perf_counter_ns: the offset, bracketed
        off = time.time_ns() - (p0 + _perf()) // 2
        self.polls += 1
        self.reads += len(events)
        conns = self.conns
        for fd, _ in events:
            conn = conns.get(fd)
            if conn is not None:
                conn.read_ready(off)
        if waited and len(events) <= 1:
            self.skip = SKIP_AFTER_MISS
        end = time.perf_counter()
        self.busy = end - t0 - waited > self.window_s
        self.last_end = end


class _SockConn(_Conn):
    """A plain-HTTP connection read by the `_Poller`, each read stamped with the kernel's receive time."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, poller: _Poller) -> None:
        super().__init__(loop)
        self.sock = sock
        self.fd = sock.fileno()
        self.poller = poller
        poller.add(self)

    async def send(self, data: bytes) -> None:
        try:
            await self.loop.sock_sendall(self.sock, data)
        except OSError as e:  # the peer closed it (a pooled connection: it never saw this request)
            if self.used and not self.got_any:
                raise StaleConnection(f"the server closed the pooled connection before the request was sent ({e})") from e
            raise RawHTTPError(f"could not send the request: {e}") from e

    def read_ready(self, off: int) -> None:
        """Read what the socket holds; `off` is real-time minus perf_counter, in ns, taken after the poll."""
        view = self.poller.view
        while True:
            try:
                n, anc, _, _ = self.sock.recvmsg_into([view], _ANC_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self._lost(e)
                return
            if n == 0:
                self._lost(None)
                return
            now = _perf()
            if anc and anc[0][1] == _SO_TIMESTAMPNS:
                sec, ns = _timespec(anc[0][2])
                stamp = sec * 1_000_000_000 + ns - off
                if now - 10_000_000_000 < stamp < now:  # a clock step between arrival and read: keep the read's
                    now = stamp
            self._received(bytes(view[:n]), now)
            if n < READ_BUF or self.closed:
                return

    def _lost(self, exc: Exception | None) -> None:
        self._drop()
        self.connection_lost(exc)

    def _drop(self) -> None:
        self.closed = True
        self.poller.remove(self)
        self.sock.close()

    def close(self) -> None:
        if self.sock.fileno() >= 0:
            self._drop()
        self.closed = True


class RawClient:
    """A pool of up to `limit` keep-alive HTTP/1.1 connections to one server, for streaming POSTs."""

    def __init__(self, base_url: str, headers: dict[str, str], limit: int, idle_s: float = 4.0,
                 connect_timeout_s: float = 15.0, ssl_context: Callable[[], ssl.SSLContext] | None = None,
                 window_s: float = COALESCE_S) -> None:
        u = urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"bad base URL {base_url!r}")
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.ssl = ssl_context() if u.scheme == "https" and ssl_context else (True if u.scheme == "https" else None)
        self.prefix = u.path.rstrip("/") + "/"
        hostport = self.host if u.port is None else f"{self.host}:{u.port}"
        self._head_lines = "".join(f"{k}: {v}\r\n" for k, v in {"Host": hostport, **headers}.items())
        self.limit = max(1, limit)
        self.idle_s = idle_s
        self.connect_timeout_s = connect_timeout_s
        self._idle: list[_Conn] = []
        self._all: set[_Conn] = set()
        self._slots = asyncio.Semaphore(self.limit)
        self.poll = u.scheme == "http" and kernel_stamps_available()  # else: the asyncio Protocol
        self.window_s = window_s
        self._poller: _Poller | None = None
        self._addrs: list[tuple] | None = None

    async def __aenter__(self) -> RawClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        for c in list(self._all):
            c.close()
        self._all.clear()
        self._idle.clear()
        if self._poller is not None:
            self._poller.close()
            self._poller = None

    async def _connect(self) -> _Conn:
        loop = asyncio.get_running_loop()
        if self.poll:
            return await self._connect_polled(loop)
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, proto = await loop.create_connection(lambda: _Conn(loop), self.host, self.port, ssl=self.ssl)
        except TimeoutError:
            raise RawHTTPError(f"could not connect to {self.host}:{self.port} within {self.connect_timeout_s:g} s") from None
        self._all.add(proto)
        return proto

    async def _connect_polled(self, loop: asyncio.AbstractEventLoop) -> _Conn:
        if self._poller is None or self._poller.loop is not loop or self._poller.closed:
            self._poller = _Poller(loop, self.window_s)
        if self._addrs is None:
            self._addrs = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        error: OSError = OSError(f"could not connect to {self.host}:{self.port}: no address")
        for family, kind, proto, _, addr in self._addrs:
            sock = socket.socket(family, kind, proto)
            try:
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
                async with asyncio.timeout(self.connect_timeout_s):
                    await loop.sock_connect(sock, addr)
            except TimeoutError:
                sock.close()
                raise RawHTTPError(
                    f"could not connect to {self.host}:{self.port} within {self.connect_timeout_s:g} s") from None
            except OSError as e:
                sock.close()
                error = e
                continue
            except BaseException:
                sock.close()
                raise
            conn = _SockConn(loop, sock, self._poller)
            self._all.add(conn)
            return conn
        raise error

    def _take_idle(self) -> _Conn | None:
        now = time.monotonic()
        while self._idle:
            c = self._idle.pop()
            if not c.closed and now - c.idle_since < self.idle_s:
                return c
            c.close()
            self._all.discard(c)
        return None

    async def post_stream(self, path: str, body: bytes, sink: Sink,
                          error_limit: int) -> tuple[int, str, bytes, int]:
        """POST `body`; a 200 body goes to `sink` read by read; returns (status, content type, error body, the
        stamp of the read that ended the response)."""
        async with self._slots:
            conn = self._take_idle() or await self._connect()
            ok = False
            try:
                loop = conn.loop
                conn._reset()
                conn.sink = sink
                errors = conn.error_sink = _Collect(error_limit)
                conn.head_fut = loop.create_future()
                conn.done_fut = loop.create_future()
                await conn.send(f"POST {self.prefix}{path} HTTP/1.1\r\n{self._head_lines}"
                                f"Content-Length: {len(body)}\r\n\r\n".encode("latin-1") + body)
                await conn.head_fut
                await conn.done_fut
                conn.used += 1
                ok = conn.keep and not conn.closed
                return conn.status, conn.headers.get("content-type", ""), bytes(errors.data), conn.end_ns
            finally:
                conn.sink = conn.error_sink = None
                for f in (conn.head_fut, conn.done_fut):
                    if f is not None and not f.done():
                        f.cancel()  # cancelled or failed midway: nothing awaits them any more
                conn.head_fut = conn.done_fut = None
                if ok:
                    conn.idle_since = time.monotonic()
                    self._idle.append(conn)
                else:  # cancelled, failed, or a body not read to its end: never reused
                    conn.close()
                    self._all.discard(conn)
