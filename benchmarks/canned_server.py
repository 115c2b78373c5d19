"""The cheapest server that still answers with real streamed responses: for the open loop's sender benchmark.

    .venv/bin/python benchmarks/canned_server.py [--port 0] [--out 16]

An OpenAI-compatible completions server with no model and no scheduler: each streaming POST to /v1/completions
is answered with `--out` token events (vLLM's chunk shape, continuous usage), the final usage chunk and [DONE], each
event its own HTTP chunk: the first token at once, then one token per stream every `--tick-ms` (one timer for all
streams, as an engine's steps: each token its own write, as vLLM writes them), [DONE] with the last. `GET /v1/models` names one model (`canned`); anything
else is a 404 (so `servescope run` counts prompts with its own estimate, and there is no /metrics to scrape).
It is an asyncio Protocol on uvloop, a few us of CPU per request: at thousands of requests a second it leaves the
CPU to the client whose sender is measured (benchmarks/open_loop.py `--url canned`). Prints `listening on
http://127.0.0.1:PORT` once it accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

MODEL = "canned"


def stream_writes(out: int, prompt: int = 32) -> list[bytes]:
    """The writes of one streamed completion's chunked body: one per token event, the last with the usage chunk,
    [DONE] and the body's end."""
    events = []
    for i in range(out):
        events.append(b"data: " + json.dumps({
            "id": "cmpl-canned", "object": "text_completion", "created": 1764700000, "model": MODEL,
            "choices": [{"index": 0, "text": " tok", "logprobs": None,
                         "finish_reason": "length" if i == out - 1 else None, "stop_reason": None}],
            "usage": {"prompt_tokens": prompt, "total_tokens": prompt + i + 1, "completion_tokens": i + 1},
        }, separators=(",", ":")).encode() + b"\n\n")
    events.append(b"data: " + json.dumps({
        "id": "cmpl-canned", "object": "text_completion", "created": 1764700000, "model": MODEL, "choices": [],
        "usage": {"prompt_tokens": prompt, "total_tokens": prompt + out, "completion_tokens": out},
    }, separators=(",", ":")).encode() + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    chunks = [b"%x\r\n%b\r\n" % (len(e), e) for e in events]
    return [*chunks[:out - 1], b"".join(chunks[out - 1:]) + b"0\r\n\r\n"]


STREAM_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n"
               b"Connection: keep-alive\r\n\r\n")


def plain(status: str, body: bytes, ctype: str = "application/json") -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
            "Connection: keep-alive\r\n\r\n").encode() + body


MODELS = plain("200 OK", json.dumps({"object": "list", "data": [
    {"id": MODEL, "object": "model", "owned_by": "canned", "max_model_len": 4096}]}).encode())
NOT_FOUND = plain("404 Not Found", b'{"error": {"message": "not found", "code": 404}}')


class Ticker:
    """The streams being answered, each sent its next token on every tick of one timer."""

    def __init__(self, writes: list[bytes], tick_s: float) -> None:
        self.writes = writes
        self.tick_s = tick_s
        self.active: list[tuple[asyncio.Transport, int]] = []  # (transport, its next write)
        self.handle: asyncio.TimerHandle | None = None

    def start(self, transport: asyncio.Transport) -> None:
        transport.write(STREAM_HEAD + self.writes[0])
        if len(self.writes) > 1:
            self.active.append((transport, 1))
            if self.handle is None:
                self.handle = asyncio.get_running_loop().call_later(self.tick_s, self.tick)

    def tick(self) -> None:
        writes, n = self.writes, len(self.writes)
        keep = []
        for t, i in self.active:
            if t.is_closing():
                continue
            t.write(writes[i])
            if i + 1 < n:
                keep.append((t, i + 1))
        self.active = keep
        self.handle = asyncio.get_running_loop().call_later(self.tick_s, self.tick) if keep else None


class Canned(asyncio.Protocol):
    """HTTP/1.1 keep-alive, requests read one after another (Content-Length bodies only)."""

    def __init__(self, ticker: Ticker) -> None:
        self.ticker = ticker
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        out: list[bytes] = []
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                break
            head = buf[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                k, _, v = line.partition(":")
                if k.strip().lower() == "content-length":
                    length = int(v.strip())
            if len(buf) < end + 4 + length:
                break
            line0 = head.split("\r\n", 1)[0]
            buf = buf[end + 4 + length:]
            if line0.startswith("POST ") and "/v1/completions" in line0 and self.transport is not None:
                if out:
                    self.transport.write(b"".join(out))
                    out = []
                self.ticker.start(self.transport)
            elif line0.startswith("GET ") and "/v1/models" in line0:
                out.append(MODELS)
            else:
                out.append(NOT_FOUND)
        self.buf = buf
        if out and self.transport is not None:
            self.transport.write(b"".join(out))


async def serve(port: int, out: int, tick_ms: float) -> None:
    ticker = Ticker(stream_writes(out), tick_ms / 1000)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Canned(ticker), "127.0.0.1", port, backlog=4096)
    bound = server.sockets[0].getsockname()[1]
    print(f"listening on http://127.0.0.1:{bound}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--out", type=int, default=16)
    ap.add_argument("--tick-ms", type=float, default=1.0, help="the time between a stream's tokens (default 1)")
    args = ap.parse_args()
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        try:
            runner.run(serve(args.port, args.out, args.tick_ms))
        except KeyboardInterrupt:
            sys.exit(0)


if __name__ == "__main__":
    main()
