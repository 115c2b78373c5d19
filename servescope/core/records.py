"""Raw per-request records: integer perf_counter_ns stamps, token counts, status. Metrics are derived
from these in one place (servescope.core.metrics)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from typing import Literal

Status = Literal["ok", "error", "timeout", "cut", "cancelled", "bad_usage", "rate_limited"]
# bad_usage: the stream was measured, but the server's token counts (usage) were not plausible counts; the
# raw value is in `error`, and the request never counts as ok (nor as goodput)
# rate_limited: the server answered HTTP 429 (its Retry-After in `retry_after_s`): the server refused the request
# by policy, not by failing; counted apart from the failures (`requests_rate_limited`)
STATUSES: tuple[str, ...] = ("ok", "error", "timeout", "cut", "cancelled", "bad_usage", "rate_limited")
RETRY_STATUS = 429  # the HTTP status of a rate limit


@dataclass(slots=True)
class RequestRecord:
    """One request as the client saw it. Times are perf_counter_ns() integers."""

    index: int  # order of issue inside its cell (warmup requests count from -K)
    user: int  # closed-loop user id, or -1 for open loop
    warmup: bool
    input_tokens_requested: int
    output_tokens_requested: int
    scheduled_ns: int  # when the load pattern wanted it sent
    sent_ns: int = 0  # just before the request bytes were handed to the connection
    first_token_ns: int = 0  # first chunk carrying a token (content or reasoning)
    first_content_ns: int = 0  # first chunk carrying content
    end_ns: int = 0  # end of stream (or failure)
    status: Status = "ok"
    http_status: int = 0
    error: str = ""
    prompt_tokens: int = -1  # usage.prompt_tokens, -1 when the server did not say
    output_tokens: int = 0  # usage.completion_tokens, or counted chunks when the server gave no usage
    reasoning_tokens: int = 0
    usage_reported: bool = False
    # one entry per token-carrying chunk: arrival stamp and tokens in that chunk
    chunk_ns: array[int] = field(default_factory=lambda: array("q"))
    chunk_tokens: array[int] = field(default_factory=lambda: array("i"))
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens (prefix cache), None: not sent
    server_prompt_ms: float | None = None  # the server's own prompt time for it (llama.cpp's `timings.prompt_ms`)
    # a turn of a conversation (or a call of an agent session): its id in the cell (from 0), its place (from 1)
    # and how many turns it was to have; -1, 0, 0 for a single-turn request
    conversation: int = -1
    turn: int = 0
    turns: int = 0
    # rate limits: the Retry-After (s) of the last HTTP 429 the request got (None: no 429, or none said), and with
    # --retry-after the 429s it got before the answer recorded here and the time it waited after them (s)
    retry_after_s: float | None = None
    retries: int = 0
    retry_wait_s: float = 0.0
    adapter: str = ""  # the LoRA adapter it named as its model ("": the sweep's model)
