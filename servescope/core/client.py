"""Streaming OpenAI-compatible client.

One httpx.AsyncClient per cell with a pool as large as the cell's concurrency (httpx caps pools at 100
connections by default), keep-alive, SSE parsed incrementally and chunks decoded with msgspec.
Nothing here raises for a failed request: it ends up in the RequestRecord.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

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
    return "/v1/chat/completions" if api == "chat" else "/v1/completions"


def make_http_client(opts: ClientOptions, connections: int) -> httpx.AsyncClient:
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if opts.api_key:
        headers["Authorization"] = f"Bearer {opts.api_key}"
    n = max(1, connections)
    return httpx.AsyncClient(
        base_url=opts.base_url,
        headers=headers,
        limits=httpx.Limits(max_connections=n, max_keepalive_connections=n, keepalive_expiry=60),
        timeout=httpx.Timeout(opts.timeout_s, connect=15.0),
        http2=False,
        trust_env=False,
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


async def stream_request(
    http: httpx.AsyncClient,
    opts: ClientOptions,
    spec: RequestSpec,
    rec: RequestRecord,
) -> RequestRecord:
    """Send one streaming request and fill `rec` in place. Never raises (except CancelledError)."""
    body = build_body(spec, opts)
    parser = SSEParser()
    decode = _decode_chunk
    chunk_ns = rec.chunk_ns
    chunk_tokens = rec.chunk_tokens
    last_completion = 0
    counted = 0
    reasoning_counted = 0
    done = False
    try:
        async with asyncio.timeout(opts.timeout_s):
            rec.sent_ns = _perf()
            async with http.stream("POST", endpoint(spec.api), content=body) as resp:
                rec.http_status = resp.status_code
                if resp.status_code != 200:
                    raw = await resp.aread()
                    rec.end_ns = _perf()
                    rec.status = "error"
                    rec.error = f"HTTP {resp.status_code}: {_error_text(raw)}"
                    if resp.status_code in (400, 422) and opts.continuous_usage and _rejects_usage_stats(rec.error):
                        # a server that does not know continuous_usage_stats: drop it and send again
                        opts.continuous_usage = False
                        fresh = RequestRecord(rec.index, rec.user, rec.warmup, rec.input_tokens_requested,
                                              rec.output_tokens_requested, rec.scheduled_ns)
                        return _copy_into(rec, await stream_request(http, opts, spec, fresh))
                    return rec
                async for piece in resp.aiter_raw():
                    now = _perf()
                    for data in parser.feed(piece):
                        if data == b"[DONE]":
                            done = True
                            continue
                        try:
                            ch = decode(data)
                        except msgspec.DecodeError:
                            continue
                        if ch.error is not None:
                            rec.status = "error"
                            e = ch.error
                            rec.error = clean_text(e if isinstance(e, str) else (e.message or "error"))[:500]
                            continue
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
                        # a chunk carries tokens when it has text, or when continuous usage says the
                        # count grew (a token can detokenize to "" until the next one completes a character)
                        grew = 0
                        if usage is not None and usage.completion_tokens is not None and ch.choices:
                            grew = usage.completion_tokens - last_completion
                            if grew > 0:
                                last_completion = usage.completion_tokens
                                if not has_reasoning:
                                    has_content = True
                        if has_content or has_reasoning:
                            ntok = grew if grew > 0 else 1
                            counted += ntok
                            if has_reasoning and not has_content:
                                reasoning_counted += ntok
                            if not chunk_ns:
                                rec.first_token_ns = now
                            if has_content and not rec.first_content_ns:
                                rec.first_content_ns = now
                            chunk_ns.append(now)
                            chunk_tokens.append(ntok)
                        if usage is not None:
                            if usage.prompt_tokens is not None:
                                rec.prompt_tokens = usage.prompt_tokens
                            if usage.completion_tokens is not None:
                                rec.output_tokens = usage.completion_tokens
                                rec.usage_reported = True
                            det = usage.completion_tokens_details
                            if det is not None and det.reasoning_tokens is not None:
                                rec.reasoning_tokens = det.reasoning_tokens
                for data in parser.flush():
                    if data == b"[DONE]":
                        done = True
                rec.end_ns = _perf()
    except TimeoutError:
        rec.end_ns = _perf()
        rec.status = "timeout"
        rec.error = f"no complete response within {opts.timeout_s:g} s (raise --timeout)"
    except httpx.HTTPError as e:
        rec.end_ns = _perf()
        rec.status = "cut" if chunk_ns else "error"
        rec.error = clean_text(f"{type(e).__name__}: {e}")[:500] or type(e).__name__
    except OSError as e:
        rec.end_ns = _perf()
        rec.status = "error"
        rec.error = clean_text(f"{type(e).__name__}: {e}")[:500]
    if not rec.usage_reported:
        rec.output_tokens = counted
    if not rec.reasoning_tokens and reasoning_counted:
        rec.reasoning_tokens = reasoning_counted
    if rec.status == "ok" and not done:
        rec.status = "cut"
        rec.error = "stream ended before [DONE]"
    return rec
