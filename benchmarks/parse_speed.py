"""How fast servescope turns streamed bytes into token stamps: SSE parsing + chunk decoding, per chunk.

    .venv/bin/python benchmarks/parse_speed.py [--streams 512,4096]

Feeds a vLLM-shaped completions stream (one token per event, continuous usage) through the SSE parser
and the msgspec chunk decoder in network-sized pieces, and prints microseconds per chunk (median of 5). Then
the whole per-token path of the default transport as one vLLM read arrives: chunked transfer coding undone in
`core/rawhttp`'s `data_received`, SSE split, decode and the request's record (`core/client._Stream`); with
`--streams`, that path over N connections at once, one read each in turn, in a new random order every round
(as a server's writes arrive): at thousands of streams each read finds its connection's state out of the CPU's
caches, which is what makes a token cost more at 4,096 streams than at 512. Run it from a checkout to measure
that checkout's code.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's servescope

from servescope.core.client import _decode_chunk, _Stream  # noqa: E402
from servescope.core.rawhttp import DONE, _Conn  # noqa: E402
from servescope.core.records import RequestRecord  # noqa: E402
from servescope.core.sse import SSEParser  # noqa: E402


def stream(n: int) -> bytes:
    out = []
    for i in range(n):
        out.append(b"data: " + json.dumps({
            "id": "cmpl-0123456789abcdef", "object": "text_completion", "created": 1764700000, "model": "/models/dense",
            "choices": [{"index": 0, "text": " token", "logprobs": None, "finish_reason": None, "stop_reason": None}],
            "usage": {"prompt_tokens": 256, "total_tokens": 257 + i, "completion_tokens": i + 1},
        }).encode() + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return b"".join(out)


def run(data: bytes, piece: int) -> float:
    t0 = time.perf_counter()
    p = SSEParser()
    n = 0
    for i in range(0, len(data), piece):
        for ev in p.feed(data[i : i + piece]):
            if ev != b"[DONE]":
                _decode_chunk(ev)
                n += 1
    return (time.perf_counter() - t0) / n * 1e6


def run_transport(events: list[bytes], per_read: int = 1) -> float:
    """One HTTP chunk per event, `per_read` chunks in each read (1: as vLLM streams them; more: a client that read
    late), through the raw transport."""
    conn = _Conn(asyncio.new_event_loop())
    conn.sink = _Stream(RequestRecord(0, 0, False, 256, len(events), scheduled_ns=0))  # before the head, as a request
    conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunks = [b"%x\r\n" % len(e) + e + b"\r\n" for e in events]
    reads = [b"".join(chunks[i:i + per_read]) for i in range(0, len(chunks), per_read)]
    reads.append(b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n")  # the last event and the body's end
    t0 = time.perf_counter()
    for r in reads:
        conn.data_received(r)
    dt = time.perf_counter() - t0
    assert conn.state == DONE and len(conn.sink.rec.chunk_ns) == len(events), "the stream was not read to its end"
    return dt / len(events) * 1e6


def run_streams(events: list[bytes], n: int, rng: random.Random) -> float:
    """`n` connections, each streaming len(events) tokens, one read per connection in turn (a random order each
    round); microseconds per token."""
    loop = asyncio.new_event_loop()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    reads = [b"%x\r\n" % len(e) + e + b"\r\n" for e in events]
    conns, recs = [], []
    for i in range(n):
        conn = _Conn(loop)
        recs.append(RequestRecord(i, 0, False, 256, len(events), scheduled_ns=0))
        conn.sink = _Stream(recs[-1])
        conn.data_received(head)
        conns.append(conn)
    orders = [rng.sample(conns, n) for _ in reads]
    t0 = time.perf_counter()
    for r, order in zip(reads, orders, strict=True):
        for conn in order:
            conn.data_received(r)
    dt = time.perf_counter() - t0
    assert all(len(r.chunk_ns) == len(events) for r in recs), "a stream lost a token"
    loop.close()
    return dt / (n * len(events)) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", default="", help="also the per-token path over N connections in turn, e.g. 512,4096")
    args = ap.parse_args()
    data = stream(20_000)
    for piece in (64, 300, 4096):
        us = statistics.median(run(data, piece) for _ in range(5))
        print(f"pieces of {piece:>5} bytes: {us:6.2f} us per chunk (SSE parse + msgspec decode)")
    events = [e + b"\n\n" for e in data.split(b"\n\n") if e and e != b"data: [DONE]"]
    us = statistics.median(run_transport(events) for _ in range(5))
    print(f"one chunk per read: {us:6.2f} us per token (raw transport + SSE + decode + record)")
    us = statistics.median(run_transport(events, 4) for _ in range(5))
    print(f"four chunks per read: {us:6.2f} us per token (the same, a client reading late)")
    if args.streams:
        rng = random.Random(1)
        counts = [int(x) for x in args.streams.split(",")]
        got: dict[int, list[float]] = {n: [] for n in counts}
        for _ in range(5):  # interleaved: the machine's noise falls on every count alike
            for n in counts:
                got[n].append(run_streams(events[:64], n, rng))
        for n in counts:
            print(f"{n:>5} streams, 64 tokens each, one read each in turn: {statistics.median(got[n]):6.2f} us per token")


if __name__ == "__main__":
    main()
