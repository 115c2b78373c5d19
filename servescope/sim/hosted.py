"""The simulator's hosted mode (`servescope sim --hosted`): the same engine behind what a hosted
OpenAI-compatible API shows a client, for tests and demos without the internet.

- no `/tokenize`, `/detokenize`, `/metrics`, `/health`, `/ping` or `/version`: each answers 404 with an
  OpenAI-style error body, as a hosted API does for a path it does not serve;
- a tokens-per-minute limit (`--tpm`): a request costs its prompt tokens plus its `max_tokens` (charged when
  it arrives, as OpenAI counts it), taken from a bucket that holds one minute's tokens and refills evenly; a
  request the bucket cannot pay is answered 429 with `Retry-After` (whole seconds, rounded up), `retry-after-ms`
  and the `x-ratelimit-*-tokens` headers, and an OpenAI-style body (`code: rate_limit_exceeded`);
- network latency and jitter (`--net-latency-ms`, `--net-jitter-ms`): every request waits that long before
  the server reads it, so a client's TTFT and end-to-end latency carry a network share while the gaps
  between streamed tokens do not;
- optionally (`--reject-vllm-fields`) a 400 for vLLM's own request fields (`ignore_eos`, `min_tokens`,
  `continuous_usage_stats`...), worded as OpenAI's API words an unrecognized argument.

An API key (`--api-key`) and TLS (`--tls-cert`, `--tls-key`) work in either mode: servescope.sim.cli."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass

import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

_json_encode = msgspec.json.encode

# the paths a hosted API does not serve (a vLLM server does)
SERVER_ONLY_PATHS = ("/tokenize", "/detokenize", "/metrics", "/health", "/ping", "/version", "/reset_prefix_cache")
# vLLM's own request fields, which OpenAI's API refuses ("Unrecognized request argument supplied: ...")
VLLM_FIELDS = ("ignore_eos", "min_tokens", "add_special_tokens", "chat_template_kwargs", "return_token_ids",
               "prompt_logprobs", "top_k", "min_p", "repetition_penalty", "skip_special_tokens", "vllm_xargs")
DEFAULT_TPM = 100_000  # hosted mode's tokens-per-minute limit unless --tpm says otherwise
DEFAULT_LATENCY_MS = 40.0  # hosted mode's added network latency per request
DEFAULT_JITTER_MS = 10.0  # ... and the most its random share adds


@dataclass(frozen=True)
class Hosted:
    """What the simulator does beyond vLLM's behaviour: `hosted` drops the server-only paths; `tpm` (0: no
    limit) limits tokens per minute; each request waits `latency_ms` plus a uniform draw in [0, `jitter_ms`]
    (seeded by `seed`); `api_key` (None: any) is required as `Authorization: Bearer KEY`;
    `reject_vllm_fields` refuses vLLM's own request fields; `close_connections` closes each connection after its
    response."""

    hosted: bool = False
    tpm: int = 0
    latency_ms: float = 0.0
    jitter_ms: float = 0.0
    api_key: str | None = None
    reject_vllm_fields: bool = False
    seed: int = 0
    close_connections: bool = False  # every response closes its connection (a server or proxy without keep-alive)

    @property
    def delays(self) -> bool:
        return self.latency_ms > 0 or self.jitter_ms > 0


async def close_after(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: this response closes its connection (`Connection: close`). aiohttp builds the
    headers before this hook runs, so the header is set here: without it a client learns of the close only when
    the socket's end arrives, and may send its next request on the closing connection."""
    response.force_close()
    response.headers["Connection"] = "close"


def openai_error(status: int, message: str, etype: str, code: str | None = None, param: str | None = None,
                 headers: Mapping[str, str] | None = None) -> web.Response:
    """An error as OpenAI's API writes one: {"error": {"message", "type", "param", "code"}}."""
    body = {"error": {"message": message, "type": etype, "param": param, "code": code}}
    return web.Response(status=status, body=_json_encode(body), content_type="application/json", headers=headers)


def not_served(request: web.Request) -> web.Response:
    return openai_error(404, f"Invalid URL ({request.method} {request.path})", "invalid_request_error")


def vllm_field(body: Mapping[str, object]) -> str | None:
    """The first vLLM-only field of a request body, None when it has none."""
    for name in VLLM_FIELDS:
        if name in body:
            return name
    opts = body.get("stream_options")
    if isinstance(opts, dict) and "continuous_usage_stats" in opts:
        return "stream_options.continuous_usage_stats"
    return None


class TokenBucket:
    """A tokens-per-minute limit: the bucket holds `tpm` tokens, starts full and refills at `tpm / 60` a
    second; `take(n, now)` pays n tokens (None) or says how many seconds until it could (and pays nothing)."""

    def __init__(self, tpm: int, now: float) -> None:
        self.tpm = tpm
        self.rate = tpm / 60.0
        self.level = float(tpm)
        self.t = now

    def _refill(self, now: float) -> None:
        if now > self.t:
            self.level = min(float(self.tpm), self.level + (now - self.t) * self.rate)
            self.t = now

    def take(self, n: int, now: float) -> float | None:
        self._refill(now)
        if n <= self.level:
            self.level -= n
            return None
        if n > self.tpm:
            return 60.0  # never payable; a hosted API says "request too large" and a minute
        return (n - self.level) / self.rate

    def remaining(self, now: float) -> int:
        self._refill(now)
        return int(self.level)


def rate_limited(model: str, bucket: TokenBucket, wait_s: float, requested: int, now: float) -> web.Response:
    """The 429 a hosted API answers a request over its tokens-per-minute limit."""
    limit = bucket.tpm
    if requested > limit:
        msg = (f"Request too large for {model} on tokens per min (TPM): Limit {limit}, Requested {requested}. "
               "The input or output tokens must be reduced in order to run successfully.")
    else:
        used = limit - bucket.remaining(now)
        msg = (f"Rate limit reached for {model} on tokens per min (TPM): Limit {limit}, Used {used}, "
               f"Requested {requested}. Please try again in {wait_s:.3g}s.")
    headers = {
        "Retry-After": str(max(1, math.ceil(wait_s))),
        "retry-after-ms": str(max(1, math.ceil(wait_s * 1000))),
        "x-ratelimit-limit-tokens": str(limit),
        "x-ratelimit-remaining-tokens": str(bucket.remaining(now)),
        "x-ratelimit-reset-tokens": f"{wait_s:.3f}s",
    }
    return openai_error(429, msg, "tokens", "rate_limit_exceeded", headers=headers)


def middlewares(cfg: Hosted) -> list[Middleware]:
    """The network delay (first: a refused request is delayed too) and the API key check."""
    out: list[Middleware] = []
    if cfg.delays:
        rng = random.Random(cfg.seed * 7919 + 1)
        base_s, jitter_s = cfg.latency_ms / 1000.0, cfg.jitter_ms / 1000.0

        @web.middleware
        async def network(request: web.Request, handler: Handler) -> web.StreamResponse:
            await asyncio.sleep(base_s + (rng.random() * jitter_s if jitter_s > 0 else 0.0))
            return await handler(request)

        out.append(network)
    if cfg.api_key is not None:
        want = f"Bearer {cfg.api_key}"

        @web.middleware
        async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
            got = request.headers.get("Authorization")
            if got != want and request.path.startswith("/v1"):  # as vLLM's --api-key: /health, /metrics stay open
                msg = ("You didn't provide an API key. You need to provide your API key in an Authorization header "
                       "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)." if not got else
                       "Incorrect API key provided.")
                return openai_error(401, msg, "invalid_request_error", "invalid_api_key")
            return await handler(request)

        out.append(auth)
    return out
