"""The simulator's answers for the quality probe: requests that ask for log-probabilities (`logprobs`,
`top_logprobs`, vLLM's `prompt_logprobs`) or whose prompt is an exact-answer task (`servescope.sim.tasks`).

Their output tokens come from the toy model (`servescope.sim.model`), planned in full before the request enters
the engine (`Plan`): the engine then emits them with the same timing as any other output, and the responses
carry them in vLLM 0.32's shapes:
    /v1/completions       choice.logprobs = {"text_offset", "token_logprobs", "tokens", "top_logprobs": [{text: lp}]}
                          (the sampled token first, then the top-k: k or k + 1 entries);
                          choice.prompt_logprobs = [None, {"<id>": {"logprob", "rank", "decoded_token"}}, ...]
                          (the prompt's own token first, then the top-k)
    /v1/chat/completions  choice.logprobs = {"content": [{"token", "logprob", "bytes", "top_logprobs":
                          [{"token", "logprob", "bytes"}] (k entries)}]}; prompt_logprobs at the response's top level
Every other request keeps the fast path of `servescope.sim.responses`.
"""

from __future__ import annotations

import math
import random
import uuid
from collections.abc import Mapping, Sequence

import msgspec
from aiohttp import web

from servescope.sim.model import ToyModel, context_at
from servescope.sim.request import SimRequest
from servescope.sim.responses import (
    ChatBody,
    ChatLogprobs,
    ChatMessage,
    CompletionBody,
    CompletionLogprobs,
    PromptLogprob,
    PromptLogprobs,
    usage_stats,
)
from servescope.sim.tokenizer import VOCAB_SIZE, Tokenizer

MAX_LOGPROBS = 20  # vLLM's --max-logprobs default
GREEDY_EPS = 1e-5  # vLLM's _SAMPLING_EPS: a lower temperature is greedy
_json_encode = msgspec.json.encode


class LogprobParamError(Exception):
    """A request's log-probability parameters vLLM would refuse (400, with vLLM's message)."""


def _int_param(body: Mapping[str, object], name: str) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    if not isinstance(v, (int, float)) or (isinstance(v, float) and not v.is_integer()):
        raise LogprobParamError(f"`{name}` must be an integer.")
    return int(v)


def logprob_params(body: Mapping[str, object], chat: bool, stream: bool) -> tuple[int | None, int | None]:
    """(top log-probabilities per output token, or None for no logprobs; prompt log-probabilities, or None), as
    vLLM validates them: -1 means the whole vocabulary, which is over the limit of 20."""
    prompt = _int_param(body, "prompt_logprobs")
    if prompt is not None:
        if stream and (prompt > 0 or prompt == -1):
            raise LogprobParamError("`prompt_logprobs` are not available when `stream=True`.")
        if prompt < 0 and prompt != -1:
            raise LogprobParamError("`prompt_logprobs` must be a positive value or -1.")
    if chat:
        top = _int_param(body, "top_logprobs")
        want = body.get("logprobs")
        if want is not None and not isinstance(want, (bool, int)):
            raise LogprobParamError("`logprobs` must be a boolean.")
        if top is not None:
            if top < 0 and top != -1:
                raise LogprobParamError("`top_logprobs` must be a positive value or -1.")
            if (top == -1 or top > 0) and not want:
                raise LogprobParamError("when using `top_logprobs`, `logprobs` must be set to true.")
        sample = (top or 0) if want else None
    else:
        sample = _int_param(body, "logprobs")
        if sample is not None and sample < 0 and sample != -1:
            raise LogprobParamError("`logprobs` must be a positive value or -1.")
    if sample is not None:
        n = VOCAB_SIZE if sample == -1 else sample
        if n > MAX_LOGPROBS:
            raise LogprobParamError(f"Requested sample logprobs of {n}, which is greater than max allowed: {MAX_LOGPROBS}")
    if prompt:
        n = VOCAB_SIZE if prompt == -1 else prompt
        if n > MAX_LOGPROBS:
            raise LogprobParamError(f"Requested prompt logprobs of {n}, which is greater than max allowed: {MAX_LOGPROBS}")
    return sample, prompt


def temperature_of(body: Mapping[str, object]) -> float:
    t = body.get("temperature")
    if t is None:
        return 1.0  # vLLM's default without a generation config
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise LogprobParamError(f"temperature must be non-negative, got {t}.")
    return float(t)


class Plan:
    """A request's whole output, decided before it runs: token ids, the text each token adds, and the
    log-probabilities the response reports."""

    __slots__ = ("ids", "texts", "top", "entries", "offsets", "prompt", "pulled")

    def __init__(self, ids: list[int], texts: list[str], top: int | None, entries: list[list[tuple[str, float]]],
                 prompt: PromptLogprobs | None) -> None:
        self.ids = ids
        self.texts = texts
        self.top = top  # None: no logprobs asked
        self.entries = entries  # per token: (text, logprob) of the sampled token, then the top-k others
        self.prompt = prompt
        self.pulled = 0
        offsets = []
        at = 0
        for e in entries:
            offsets.append(at)
            at += len(e[0][0])
        self.offsets = offsets

    def take(self, n: int) -> list[int]:
        """The next `n` output ids (the prefix cache's `out_ids`)."""
        out = self.ids[self.pulled : self.pulled + n]
        self.pulled += n
        return out

    def completion_logprobs(self, start: int, stop: int) -> CompletionLogprobs:
        entries = self.entries[start:stop]
        return {
            "text_offset": self.offsets[start:stop],
            "token_logprobs": [e[0][1] for e in entries],
            "tokens": [e[0][0] for e in entries],
            "top_logprobs": [dict(e) for e in entries],
        }

    def chat_logprobs(self, start: int, stop: int) -> ChatLogprobs:
        k = self.top or 0
        return {"content": [
            {"token": e[0][0], "logprob": e[0][1], "bytes": list(e[0][0].encode("utf-8", "replace")),
             "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode("utf-8", "replace"))} for t, lp in e[:k]]}
            for e in self.entries[start:stop]
        ]}

    def piece(self, i: int, chat: bool) -> tuple[bytes, bytes]:
        """Token `i` for a stream event: (its text, its logprobs object or null), JSON-encoded."""
        text = _json_encode(self.texts[i])
        if self.top is None:
            return text, b"null"
        return text, _json_encode(self.chat_logprobs(i, i + 1) if chat else self.completion_logprobs(i, i + 1))


def build_plan(
    model: ToyModel,
    tok: Tokenizer,
    prompt_ids: Sequence[int],
    length: int,
    top: int | None,
    prompt_top: int | None,
    temperature: float = 0.0,
    seed: int = 0,
    forced: Sequence[tuple[int, str]] = (),
    forced_at: int = 0,
) -> Plan:
    """The output of a request: `length` tokens after `prompt_ids`, greedy (or sampled at `temperature` with
    `seed`), except that tokens `forced_at`.. are `forced` ((id, text): an answer the model knows)."""
    token_text = tok.token_text
    rng = random.Random(seed) if temperature >= GREEDY_EPS else None
    prev2, prev1, pos = context_at(prompt_ids, len(prompt_ids))
    ids: list[int] = []
    texts: list[str] = []
    entries: list[list[tuple[str, float]]] = []
    for i in range(length):
        j = i - forced_at
        f = forced[j] if 0 <= j < len(forced) else None
        d = model.dist(prev2, prev1, pos + i, f[0] if f is not None else None)
        if f is not None:
            tid, text = f
        else:
            tid = d.ids[0] if rng is None else d.sample(rng, temperature)
            text = token_text(tid)
        ids.append(tid)
        texts.append(text)
        if top is not None:
            row = [(text, d.logprob(tid))]
            row.extend((text if t == tid else token_text(t), lp) for t, lp in d.top(top) if t != tid)
            entries.append(row)
        prev2, prev1 = prev1, tid
    prompt = prompt_logprobs(model, tok, prompt_ids, prompt_top) if prompt_top is not None else None
    return Plan(ids, texts, top, entries, prompt)


def prompt_logprobs(model: ToyModel, tok: Tokenizer, ids: Sequence[int], k: int) -> PromptLogprobs:
    """vLLM's prompt_logprobs: None for the first token, then per token {str(id): {"logprob", "rank",
    "decoded_token"}} for the prompt's own token and the `k` most likely ones."""
    token_text = tok.token_text
    out: PromptLogprobs = [None] if ids else []
    for i in range(1, len(ids)):
        d = model.dist_at(ids, i)
        actual = ids[i]
        pos: dict[str, PromptLogprob] = {
            str(actual): {"logprob": d.logprob(actual), "rank": d.rank(actual), "decoded_token": token_text(actual)}}
        for r, (t, lp) in enumerate(d.top(k)):
            if t != actual:
                pos[str(t)] = {"logprob": lp, "rank": r + 1, "decoded_token": token_text(t)}
        out.append(pos)
    return out


def full_response(
    req: SimRequest, plan: Plan, model_name: str, chat: bool, created: int, prompt_len: int, reasoning: int,
    prompt_details: bool, prompt_ids: list[int] | None = None,
) -> web.Response:
    """The body of a non-streamed completion whose output is `plan`, once the request has finished; with
    `prompt_ids` (vLLM's `return_token_ids`) it carries the prompt's and the output's token ids."""
    n = req.num_output
    texts = plan.texts[:n]
    usage = usage_stats(prompt_len, n, reasoning, True, req.cached_tokens if prompt_details else None)
    if chat:
        r = min(reasoning, n)
        message: ChatMessage = {
            "role": "assistant",
            "content": "".join(texts[r:]) if n > r else None,
            "reasoning_content": "".join(texts[:r]) if r else None,
            "tool_calls": [],
        }
        body: ChatBody = {
            "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": created,
            "model": model_name,
            "choices": [{"index": 0, "message": message,
                         "logprobs": plan.chat_logprobs(0, n) if plan.top is not None else None,
                         "finish_reason": req.finish_reason, "stop_reason": None}],
            "usage": usage,
        }
        if plan.prompt is not None:
            body["prompt_logprobs"] = plan.prompt
        if prompt_ids is not None:
            body["prompt_token_ids"] = prompt_ids
            body["choices"][0]["token_ids"] = plan.ids[:n]
        encoded = _json_encode(body)
    else:
        cbody: CompletionBody = {
            "id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": created,
            "model": model_name,
            "choices": [{"index": 0, "text": "".join(texts),
                         "logprobs": plan.completion_logprobs(0, n) if plan.top is not None else None,
                         "finish_reason": req.finish_reason, "stop_reason": None, "prompt_logprobs": plan.prompt}],
            "usage": usage,
        }
        if prompt_ids is not None:
            cbody["choices"][0]["prompt_token_ids"] = prompt_ids
            cbody["choices"][0]["token_ids"] = plan.ids[:n]
        encoded = _json_encode(cbody)
    return web.Response(body=encoded, content_type="application/json")
