"""Streaming OpenAI-compatible client.

One pooled client per cell (aiohttp by default, httpx selectable) with as many keep-alive connections as the
cell has users (httpx and aiohttp both cap pools at 100 by default: ours are sized to the load), SSE
parsed incrementally and chunks decoded with msgspec, every token-carrying chunk stamped with
perf_counter_ns() as its bytes arrive.
Nothing here raises for a failed request: it ends up in the RequestRecord.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
import msgspec

from servescope.core.records import RequestRecord
from servescope.core.sse import SSEParser
from servescope.core.textsafe import clean_text

_perf = time.perf_counter_ns


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None  # newer vLLM / some servers name it so


class _Choice(msgspec.Struct):
    text: str | None = None
    delta: _Delta | None = None
    finish_reason: str | None = None


class _Details(msgspec.Struct):
    reasoning_tokens: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    completion_tokens_details: _Details | None = None


class _ErrorBody(msgspec.Struct):
    message: str | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: _ErrorBody | str | None = None


_decode_chunk = msgspec.json.Decoder(_Chunk).decode
_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What to send. `prompt` is text for completions; `messages` for chat."""

    api: str  # "completions" | "chat"
    prompt: str
    input_tokens: int
    output_tokens: int
    thinking: bool | None = None


@dataclass(slots=True)
class ClientOptions:
    base_url: str
    model: str
    api_key: str | None = None
    timeout_s: float = 600.0
    ignore_eos: bool = True
    continuous_usage: bool = True
    extra_body: dict[str, Any] | None = None
    transport: str = "aiohttp"  # or "httpx"


def build_body(spec: RequestSpec, opts: ClientOptions) -> bytes:
    body: dict[str, Any] = {
        "model": opts.model,
        "stream": True,
        "max_tokens": spec.output_tokens,
        "stream_options": {"include_usage": True},
    }
    if opts.continuous_usage:
        body["stream_options"]["continuous_usage_stats"] = True
    if opts.ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = spec.output_tokens
    if spec.api == "chat":
        body["messages"] = [{"role": "user", "content": spec.prompt}]
        if spec.thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": spec.thinking}
    else:
        body["prompt"] = spec.prompt
    if opts.extra_body:
        body.update(opts.extra_body)
    return _encode(body)


def endpoint(api: str) -> str:
    return "v1/chat/completions" if api == "chat" else "v1/completions"


@functools.cache
def ssl_context() -> ssl.SSLContext:
    """One verifying SSL context for every client: building one loads the CA bundle (~0.1 s of CPU),
    too much to pay per health check."""
    return ssl.create_default_context()


def async_client(**kw: Any) -> httpx.AsyncClient:
    """An httpx.AsyncClient sharing the one SSL context, ignoring proxy variables (targets are direct)."""
    kw.setdefault("verify", ssl_context())
    kw.setdefault("trust_env", False)
    return httpx.AsyncClient(**kw)


TRANSPORTS = ("aiohttp", "httpx")


def make_http_client(opts: ClientOptions, connections: int, transport: str | None = None) -> Any:
    """A pooled HTTP client holding up to `connections` keep-alive streams (one per user).

    aiohttp is the default: on 2 cores it streamed with 4-6x less CPU per token than httpx
    (benchmarks/client_transport.py). httpx stays selectable (`--transport httpx`)."""
    if (transport or opts.transport) == "aiohttp":
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if opts.api_key:
            headers["Authorization"] = f"Bearer {opts.api_key}"
        n = max(1, connections)
        conn = aiohttp.TCPConnector(limit=n, limit_per_host=n, keepalive_timeout=60, ttl_dns_cache=300,
                                    ssl=ssl_context() if opts.base_url.startswith("https") else False)
        return aiohttp.ClientSession(base_url=opts.base_url.rstrip("/") + "/", connector=conn, headers=headers,
                                     timeout=aiohttp.ClientTimeout(total=None, sock_connect=15),
                                     trust_env=False)
    return _make_httpx_client(opts, connections)


def _make_httpx_client(opts: ClientOptions, connections: int) -> httpx.AsyncClient:
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if opts.api_key:
        headers["Authorization"] = f"Bearer {opts.api_key}"
    n = max(1, connections)
    return async_client(
        base_url=opts.base_url,
        headers=headers,
        limits=httpx.Limits(max_connections=n, max_keepalive_connections=n, keepalive_expiry=60),
        timeout=httpx.Timeout(opts.timeout_s, connect=15.0),
        http2=False,
    )


def _rejects_usage_stats(error: str) -> bool:
    e = error.lower()
    return "continuous_usage_stats" in e or "stream_options" in e


def _copy_into(dst: RequestRecord, src: RequestRecord) -> RequestRecord:
    for name in RequestRecord.__slots__:  # type: ignore[attr-defined]
        setattr(dst, name, getattr(src, name))
    return dst


def _error_text(raw: bytes) -> str:
    try:
        obj = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return clean_text(raw.decode("utf-8", "replace"))[:500]
    msg: Any = obj
    if isinstance(obj, dict):
        err = obj.get("error", obj.get("message", obj.get("detail", obj)))
        msg = err.get("message", err) if isinstance(err, dict) else err
    return clean_text(str(msg))[:500]


class _Stream:
    """Turns the bytes of one response into the record's stamps and counts. Transport-independent."""

    __slots__ = ("rec", "parser", "last_completion", "counted", "reasoning_counted", "done")

    def __init__(self, rec: RequestRecord) -> None:
        self.rec = rec
        self.parser = SSEParser()
        self.last_completion = 0
        self.counted = 0
        self.reasoning_counted = 0
        self.done = False

    def feed(self, piece: bytes, now: int) -> None:
        for data in self.parser.feed(piece):
            self._event(data, now)

    def close(self, now: int) -> None:
        for data in self.parser.flush():
            self._event(data, now)

    def _event(self, data: bytes, now: int) -> None:
        rec = self.rec
        if data == b"[DONE]":
            self.done = True
            return
        try:
            ch = _decode_chunk(data)
        except msgspec.DecodeError:
            return
        if ch.error is not None:
            rec.status = "error"
            e = ch.error
            rec.error = clean_text(e if isinstance(e, str) else (e.message or "error"))[:500]
            return
        usage = ch.usage
        has_content = False
        has_reasoning = False
        if ch.choices:
            for c in ch.choices:
                d = c.delta
                if d is not None:
                    if d.content:
                        has_content = True
                    if d.reasoning_content or d.reasoning:
                        has_reasoning = True
                elif c.text:
                    has_content = True
        # a chunk carries tokens when it has text, or when continuous usage says the count grew
        # (a token can detokenize to "" until the next one completes a character)
        grew = 0
        if usage is not None and usage.completion_tokens is not None and ch.choices:
            grew = usage.completion_tokens - self.last_completion
            if grew > 0:
                self.last_completion = usage.completion_tokens
                if not has_reasoning:
                    has_content = True
        if has_content or has_reasoning:
            ntok = grew if grew > 0 else 1
            self.counted += ntok
            if has_reasoning and not has_content:
                self.reasoning_counted += ntok
            if not rec.chunk_ns:
                rec.first_token_ns = now
            if has_content and not rec.first_content_ns:
                rec.first_content_ns = now
            rec.chunk_ns.append(now)
            rec.chunk_tokens.append(ntok)
        if usage is not None:
            if usage.prompt_tokens is not None:
                rec.prompt_tokens = usage.prompt_tokens
            if usage.completion_tokens is not None:
                rec.output_tokens = usage.completion_tokens
                rec.usage_reported = True
            det = usage.completion_tokens_details
            if det is not None and det.reasoning_tokens is not None:
                rec.reasoning_tokens = det.reasoning_tokens


async def stream_request(
    http: Any,
    opts: ClientOptions,
    spec: RequestSpec,
    rec: RequestRecord,
) -> RequestRecord:
    """Send one streaming request and fill `rec` in place. Never raises (except CancelledError).
    `http` is an aiohttp.ClientSession (the default transport) or an httpx.AsyncClient."""
    body = build_body(spec, opts)
    st = _Stream(rec)
    status = 0
    raw_error = b""
    try:
        async with asyncio.timeout(opts.timeout_s):
            if isinstance(http, httpx.AsyncClient):
                rec.sent_ns = _perf()
                async with http.stream("POST", endpoint(spec.api), content=body) as resp:
                    status = rec.http_status = resp.status_code
                    if status != 200:
                        raw_error = await resp.aread()
                    else:
                        async for piece in resp.aiter_raw():
                            st.feed(piece, _perf())
            else:
                rec.sent_ns = _perf()
                async with http.post(endpoint(spec.api), data=body) as resp:
                    status = rec.http_status = resp.status
                    if status != 200:
                        raw_error = await resp.read()
                    else:
                        async for piece in resp.content.iter_any():
                            st.feed(piece, _perf())
            rec.end_ns = _perf()
            st.close(rec.end_ns)
            if status != 200:
                rec.status = "error"
                rec.error = f"HTTP {status}: {_error_text(raw_error)}"
                if status in (400, 422) and opts.continuous_usage and _rejects_usage_stats(rec.error):
                    # a server that does not know continuous_usage_stats: drop it and send again
                    opts.continuous_usage = False
                    fresh = RequestRecord(rec.index, rec.user, rec.warmup, rec.input_tokens_requested,
                                          rec.output_tokens_requested, rec.scheduled_ns)
                    return _copy_into(rec, await stream_request(http, opts, spec, fresh))
                return rec
    except TimeoutError:
        rec.end_ns = _perf()
        rec.status = "timeout"
        rec.error = f"no complete response within {opts.timeout_s:g} s (raise --timeout)"
    except (httpx.HTTPError, aiohttp.ClientError) as e:
        rec.end_ns = _perf()
        rec.status = "cut" if rec.chunk_ns else "error"
        rec.error = clean_text(f"{type(e).__name__}: {e}")[:500] or type(e).__name__
    except OSError as e:
        rec.end_ns = _perf()
        rec.status = "error"
        rec.error = clean_text(f"{type(e).__name__}: {e}")[:500]
    if not rec.usage_reported:
        rec.output_tokens = st.counted
    if not rec.reasoning_tokens and st.reasoning_counted:
        rec.reasoning_tokens = st.reasoning_counted
    if rec.status == "ok" and not st.done:
        rec.status = "cut"
        rec.error = "stream ended before [DONE]"
    return rec
