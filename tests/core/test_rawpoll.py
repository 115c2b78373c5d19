"""The raw transport's poller (plain HTTP on Linux): reads are stamped with the kernel's receive time, so a
client loop that is busy when a token arrives still stamps it when it arrived; the tokens of one engine step,
written stream after stream, are read in one wake-up; a lone stream does not wait out windows for nothing."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest

from servescope.core.client import ClientOptions, RequestSpec, make_http_client, stream_request
from servescope.core.rawhttp import RawClient, _Poller, kernel_stamps_available
from servescope.core.records import RequestRecord

pytestmark = pytest.mark.skipif(not kernel_stamps_available(), reason="the poller needs Linux's epoll and SO_TIMESTAMPNS")

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def event(i: int) -> bytes:
    data = b'data: {"choices":[{"text":"t%d"}],"usage":{"prompt_tokens":7,"completion_tokens":%d}}\n\n' % (i, i + 1)
    return b"%x\r\n" % len(data) + data + b"\r\n"


END = b"%x\r\n" % len(b"data: [DONE]\n\n") + b"data: [DONE]\n\n\r\n0\r\n\r\n"


def read_request(conn: socket.socket) -> None:
    buf = b""
    while b"\r\n\r\n" not in buf:
        buf += conn.recv(65536)
    head, _, body = buf.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    while len(body) < length:
        body += conn.recv(65536)


class StepServer:
    """A threaded server that answers `streams` requests together, one token per stream per step (every
    `step_s`), each written to its connection right after the other's, as vLLM's frontend does; it keeps
    the perf_counter_ns at which it wrote each token."""

    def __init__(self, streams: int, tokens: int, step_s: float) -> None:
        self.streams, self.tokens, self.step_s = streams, tokens, step_s
        self.sent: list[list[int]] = [[] for _ in range(streams)]
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.srv.getsockname()[1]}"
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        conns = []
        for _ in range(self.streams):
            c, _ = self.srv.accept()
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            read_request(c)
            conns.append(c)
        for c in conns:
            c.sendall(HEAD)
        for i in range(self.tokens):
            time.sleep(self.step_s)
            for k, c in enumerate(conns):
                self.sent[k].append(time.perf_counter_ns())
                c.sendall(event(i))
        for c in conns:
            c.sendall(END)
        time.sleep(0.2)
        for c in conns:
            c.close()
        self.srv.close()


@pytest.fixture
def step_server() -> Iterator[type[StepServer]]:
    yield StepServer


async def run_streams(url: str, streams: int, on_start: Callable[[list[RequestRecord]], Awaitable[None]] | None = None,
                      window_s: float = 0.001) -> tuple[list[RequestRecord], _Poller]:
    opts = ClientOptions(base_url=url, model="m", timeout_s=20, transport="raw", read_window_s=window_s)
    spec = RequestSpec("completions", "hello", 7, 3)
    http = make_http_client(opts, streams)
    assert isinstance(http, RawClient) and http.poll
    recs = [RequestRecord(i, i, False, 7, 3, scheduled_ns=0) for i in range(streams)]
    async with http:
        aside = asyncio.create_task(on_start(recs)) if on_start else None
        await asyncio.gather(*(stream_request(http, opts, spec, r) for r in recs))
        if aside is not None:
            await aside
        assert http._poller is not None
        return recs, http._poller  # its counts outlive the client


@pytest.mark.parametrize("window_s", [0.001, 0.0])
async def test_a_token_that_arrives_while_the_loop_is_busy_is_stamped_when_it_arrived(step_server, window_s: float,
                                                                                      ) -> None:
    server = step_server(1, 5, 0.1)

    async def block_over_token_2(recs: list[RequestRecord]) -> None:
        while len(recs[0].chunk_ns) < 2:  # noqa: ASYNC110 - the transport fills the record, nothing to await
            await asyncio.sleep(0.005)
        # token 2 comes ~100 ms after token 1: the loop is blocked from +50 to +170 ms, and reads it only then
        asyncio.get_running_loop().call_later(0.05, time.sleep, 0.12)

    (rec,), _ = await run_streams(server.url, 1, block_over_token_2, window_s)
    assert rec.status == "ok" and len(rec.chunk_ns) == 5
    late = [(got - sent) / 1e6 for got, sent in zip(rec.chunk_ns, server.sent[0], strict=True)]
    # stamped on read, token 2 would be ~70 ms late; the kernel's stamp is microseconds after the send
    assert max(late) < 20, f"stamps late by {late} ms"
    assert min(late) > -1, f"a stamp before its token was sent: {late} ms"  # the clocks' offset: microseconds
    assert rec.end_ns >= rec.chunk_ns[-1] and (rec.end_ns - rec.chunk_ns[-1]) / 1e6 < 20


async def test_the_tokens_of_one_step_are_read_in_one_wake_up(step_server) -> None:
    server = step_server(8, 20, 0.02)
    recs, poller = await run_streams(server.url, 8)
    assert all(r.status == "ok" and len(r.chunk_ns) == 20 for r in recs)
    # 8 streams x 22 reads (head, 20 tokens, end): one wake-up each would be 1 read per poll
    assert poller.reads / poller.polls >= 3, f"{poller.reads} reads in {poller.polls} polls"
    for r, sent in zip(recs, server.sent, strict=True):
        late = [(got - s) / 1e6 for got, s in zip(r.chunk_ns, sent, strict=True)]
        assert min(late) > -1 and max(late) < 20, f"stamps late by {late} ms"


async def test_a_lone_stream_does_not_wait_out_windows(step_server) -> None:
    server = step_server(1, 40, 0.01)
    (rec,), poller = await run_streams(server.url, 1)
    assert rec.status == "ok" and len(rec.chunk_ns) == 40
    assert poller.pauses <= 1 + poller.polls // 10, f"{poller.pauses} windows waited in {poller.polls} polls"


async def test_a_zero_window_reads_each_piece_as_it_comes(step_server) -> None:
    server = step_server(8, 10, 0.02)
    recs, poller = await run_streams(server.url, 8, window_s=0.0)
    assert all(r.status == "ok" and len(r.chunk_ns) == 10 for r in recs)
    assert poller.pauses == 0 and poller.polls > 0
