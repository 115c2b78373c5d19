"""The simulator's responses in vLLM 0.32's OpenAI-compatible format: errors, full completions and streamed
(server-sent events) ones, with the output tokens a request gets."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Required, TypedDict

import msgspec
from aiohttp import web

from servescope.sim.request import SimRequest
from servescope.sim.tokenizer import NUM_WORDS, WORD_BASE, Tokenizer

_json_encode = msgspec.json.encode


class Usage(TypedDict, total=False):
    """A response's `usage` object (the details only in the last one)."""

    prompt_tokens: Required[int]
    total_tokens: Required[int]
    completion_tokens: Required[int]
    prompt_tokens_details: dict[str, int]  # {"cached_tokens": n}
    completion_tokens_details: dict[str, int]  # {"reasoning_tokens": n}


class CompletionLogprobs(TypedDict):
    """A completion choice's `logprobs`: per token its offset, log-probability, text and top-k {text: lp}."""

    text_offset: list[int]
    token_logprobs: list[float]
    tokens: list[str]
    top_logprobs: list[dict[str, float]]


class TopLogprob(TypedDict):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(TypedDict):
    """A chat choice's `logprobs`."""

    content: list[TokenLogprob]


class PromptLogprob(TypedDict):
    logprob: float
    rank: int
    decoded_token: str


# vLLM's prompt_logprobs: None for the first token, then {str(id): ...} for the prompt's own token and the top-k
PromptLogprobs = list[dict[str, PromptLogprob] | None]


class ChatMessage(TypedDict):
    role: str
    content: str | None
    reasoning_content: str | None
    tool_calls: list[object]  # always empty: the simulator calls no tools


class ChatChoice(TypedDict, total=False):
    index: Required[int]
    message: Required[ChatMessage]
    logprobs: Required[ChatLogprobs | None]
    finish_reason: Required[str]
    stop_reason: Required[None]
    token_ids: list[int]  # with vLLM's return_token_ids


class CompletionChoice(TypedDict, total=False):
    index: Required[int]
    text: Required[str]
    logprobs: Required[CompletionLogprobs | None]
    finish_reason: Required[str]
    stop_reason: Required[None]
    prompt_logprobs: Required[PromptLogprobs | None]
    prompt_token_ids: list[int]  # with vLLM's return_token_ids
    token_ids: list[int]


class _Head(TypedDict):
    id: str
    object: str
    created: int
    model: str


class ChatBody(_Head, total=False):
    """A non-streamed /v1/chat/completions response."""

    choices: Required[list[ChatChoice]]
    usage: Required[Usage]
    prompt_logprobs: PromptLogprobs  # asked for (the quality probe)
    prompt_token_ids: list[int]  # with vLLM's return_token_ids


class CompletionBody(_Head):
    """A non-streamed /v1/completions response."""

    choices: list[CompletionChoice]
    usage: Usage


def error_response(status: int, message: str, etype: str) -> web.Response:
    body = {"error": {"message": message, "type": etype, "param": None, "code": status}}
    return web.Response(status=status, body=_json_encode(body), content_type="application/json")


class Channel:
    """Tokens the engine produced for one request and not yet written to its stream."""

    __slots__ = ("pending", "finished", "event")

    def __init__(self) -> None:
        self.pending = 0
        self.finished = False
        self.event = asyncio.Event()


class TokenSource:
    """Deterministic pseudo-random output token ids (a 64-bit LCG over the word ids)."""

    __slots__ = ("x",)

    def __init__(self, seed: int) -> None:
        self.x = (seed * 2862933555777941757 + 3037000493) & 0xFFFFFFFFFFFFFFFF

    def next(self) -> int:
        self.x = (self.x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        return WORD_BASE + (self.x >> 33) % NUM_WORDS

    def take(self, n: int) -> list[int]:
        """The next `n` ids (as `n` calls of `next`)."""
        x = self.x
        out = []
        for _ in range(n):
            x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
            out.append(WORD_BASE + (x >> 33) % NUM_WORDS)
        self.x = x
        return out


def usage_stats(prompt_len: int, completion: int, reasoning: int, final: bool, cached: int | None = None) -> Usage:
    """The `usage` object of a response (`final`: the last one, which counts the reasoning tokens and, when
    `cached` is not None, the prompt tokens the prefix cache had)."""
    u: Usage = {"prompt_tokens": prompt_len, "total_tokens": prompt_len + completion, "completion_tokens": completion}
    if final and cached is not None:
        u["prompt_tokens_details"] = {"cached_tokens": cached}
    if reasoning and final:
        u["completion_tokens_details"] = {"reasoning_tokens": min(reasoning, completion)}
    return u


def full_response(
    req: SimRequest, gen: TokenSource, tok: Tokenizer, model_name: str, chat: bool, created: int, prompt_len: int,
    reasoning: int, prompt_details: bool,
) -> web.Response:
    """The body of a non-streamed completion, once the request has finished (`prompt_details`: the usage
    says how many prompt tokens were cached)."""
    ids = [gen.next() for _ in range(req.num_output)]
    usage = usage_stats(prompt_len, req.num_output, reasoning, True, req.cached_tokens if prompt_details else None)
    if chat:
        r = min(reasoning, len(ids))
        message: ChatMessage = {
            "role": "assistant",
            "content": tok.decode(ids[r:]) if len(ids) > r else None,
            "reasoning_content": tok.decode(ids[:r]) if r else None,
            "tool_calls": [],
        }
        body: ChatBody | CompletionBody = {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": created,
            "model": model_name,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": req.finish_reason,
                         "stop_reason": None}],
            "usage": usage,
        }
    else:
        body = {
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": created,
            "model": model_name,
            "choices": [{"index": 0, "text": tok.decode(ids), "logprobs": None, "finish_reason": req.finish_reason,
                         "stop_reason": None, "prompt_logprobs": None}],
            "usage": usage,
        }
    return web.Response(body=_json_encode(body), content_type="application/json")


async def stream_response(
    request: web.Request,
    req: SimRequest,
    chan: Channel,
    gen: TokenSource,
    tok: Tokenizer,
    model_bytes: bytes,
    chat: bool,
    created: int,
    prompt_len: int,
    reasoning: int,
    include_usage: bool,
    continuous: bool,
    cut_at: int,
    prompt_details: bool,
    piece: Callable[[int], tuple[bytes, bytes]] | None = None,
    usage_factor: float = 1.0,
) -> web.StreamResponse:
    """Stream the request's tokens as server-sent events while the engine produces them (`chan`); cut the
    connection after `cut_at` tokens when it is not 0 (a fault). The final usage chunk says how many prompt
    tokens were cached when `prompt_details` (the continuous ones do not, as in vLLM), and `usage_factor` times the
    tokens streamed (a fault: a server whose usage miscounts; 1 tells the truth). `piece(i)`, when given, is token
    i's JSON text and logprobs object (a planned output, `servescope.sim.quality`) instead of `gen`'s."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    tok_text = tok.token_text
    head = (
        b'data: {"id":"' + (f"chatcmpl-{uuid.uuid4().hex}" if chat else f"cmpl-{uuid.uuid4().hex}").encode()
        + (b'","object":"chat.completion.chunk","created":' if chat else b'","object":"text_completion","created":')
        + str(created).encode() + b',"model":' + model_bytes + b',"choices":'
    )
    if chat:
        pre_content = head + b'[{"index":0,"delta":{"content":'
        pre_reason = head + b'[{"index":0,"delta":{"reasoning_content":'
        mid = b'},"logprobs":null,"finish_reason":'
    else:
        pre_content = pre_reason = head + b'[{"index":0,"text":'
        mid = b',"logprobs":null,"finish_reason":'
    tail_open = b',"stop_reason":null}]'
    lp_open, lp_close = mid.split(b"null", 1)
    fin_null = b"null"
    fin_done = b'"' + req.finish_reason.encode() + b'"'
    sent = 0
    write = resp.write
    try:
        if chat:
            first = head + b'[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]'
            if continuous:
                first += b',"usage":' + _json_encode(usage_stats(prompt_len, 0, 0, False))
            first_event: bytes | None = first + b"}\n\n"
        else:
            first_event = None
        while True:
            await chan.event.wait()
            chan.event.clear()
            n = chan.pending
            chan.pending = 0
            if n == 0 and not chan.finished:
                continue
            parts: list[bytes] = []
            if first_event is not None:
                parts.append(first_event)
                first_event = None
            for _ in range(n):
                sent += 1
                if piece is None:
                    text = _json_encode(tok_text(gen.next()))
                    lp_mid = mid
                else:
                    text, lp = piece(sent - 1)
                    lp_mid = lp_open + lp + lp_close
                last = chan.finished and sent == req.num_output
                pre = pre_reason if sent <= reasoning else pre_content
                ev = pre + text + lp_mid + (fin_done if last else fin_null) + tail_open
                if continuous:
                    ev += b',"usage":' + _json_encode(usage_stats(prompt_len, sent, reasoning, False))
                parts.append(ev + b"}\n\n")
                if sent == cut_at:
                    await write(b"".join(parts))
                    if request.transport is not None:
                        request.transport.abort()
                    return resp
            if chan.finished and sent >= req.num_output:
                if include_usage:
                    usage = usage_stats(prompt_len, round(sent * usage_factor), reasoning, True,
                                        req.cached_tokens if prompt_details else None)
                    parts.append(head + b'[],"usage":' + _json_encode(usage) + b"}\n\n")
                parts.append(b"data: [DONE]\n\n")
                await write(b"".join(parts))
                break
            await write(parts[0] if len(parts) == 1 else b"".join(parts))
        await resp.write_eof()
    except (ConnectionResetError, ConnectionError, asyncio.CancelledError):
        pass
    return resp
