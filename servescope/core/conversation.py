"""Conversations under load: one simulated user holding a conversation turn by turn, as a chat client would.

Turn k sends the whole history (every earlier user message and the model's actual reply to it, collected from
the stream) plus its new user message, after the turn's think time (counted from the previous reply's end).
A failed turn ends its conversation (a chat client would show the error, not carry on with a missing reply).

The requests of a multi-turn cell are its turns, marked (`RequestSpec.conversation`, `.turn`, `.think_s`:
workloads/conversation.py `mark_turns`); `Pool` groups them into conversations and hands them out. A cell's
request count (`-n`) counts turns, as it counts requests: a conversation that would pass it is shortened to the
turns left. Each record says its conversation (numbered as started in the cell), its turn (from 1) and how many
turns its conversation was to have, so the summary can tell complete conversations from ones cut by the request
count, a duration, a drain or a failure.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace

from servescope.core.client import RequestSpec
from servescope.core.records import RequestRecord

__all__ = ["Conversation", "Pool", "Send", "conversations", "converse", "is_multi_turn"]

_perf = time.perf_counter_ns

# sends one request, filling the record and appending the reply's text to the list
Send = Callable[[RequestSpec, RequestRecord, list[str]], Awaitable[None]]


@dataclass(frozen=True)
class Conversation:
    turns: tuple[RequestSpec, ...]  # turn 1 first: each holds its new user message
    planned: int = 0  # the turns it was to have when the request count shortened it (0: as many as it has)

    @property
    def size(self) -> int:
        return self.planned or len(self.turns)


def is_multi_turn(specs: Sequence[RequestSpec]) -> bool:
    return bool(specs) and specs[0].turn > 0


def conversations(specs: Sequence[RequestSpec]) -> list[Conversation]:
    """Marked turns grouped into conversations, in order; a group that does not start at turn 1 (the rest of
    a conversation whose start went to the warmup) is left out."""
    out: list[Conversation] = []
    group: list[RequestSpec] = []
    for s in specs:
        if group and (s.conversation != group[0].conversation or s.turn != group[-1].turn + 1):
            if group[0].turn == 1:
                out.append(Conversation(tuple(group)))
            group = []
        group.append(s)
    if group and group[0].turn == 1:
        out.append(Conversation(tuple(group)))
    return out


class Pool:
    """Hands out a cell's conversations in order (cycling when a duration needs more), each shortened to the
    turns left of `budget` (None: no request count); numbers them as they start and numbers their requests."""

    def __init__(self, convs: Sequence[Conversation], budget: int | None, warmup: bool = False) -> None:
        self.convs = list(convs)
        self.left = budget
        self.started = 0
        self.requests = 0
        self.warmup = warmup

    def take(self) -> tuple[int, Conversation] | None:
        if not self.convs or self.left == 0:
            return None
        conv = self.convs[self.started % len(self.convs)]
        if self.left is not None:
            if len(conv.turns) > self.left:
                conv = Conversation(conv.turns[: self.left], len(conv.turns))
            self.left -= len(conv.turns)
        cid = self.started
        self.started += 1
        return cid, conv

    def next_index(self) -> int:
        i = self.requests
        self.requests += 1
        return -1 - i if self.warmup else i


async def converse(pool: Pool, cid: int, conv: Conversation, user: int, scheduled_ns: int, send: Send,
                   drained: asyncio.Event, deadline_ns: int | None = None) -> None:
    """Run one conversation turn by turn. It stops early (the rest of its turns never sent) when a turn fails,
    when `drained` is set, or at `deadline_ns` (no turn starts after it)."""
    history: list[dict[str, str]] = []
    prev_in = prev_out = 0
    scheduled = scheduled_ns
    for spec in conv.turns:
        if spec.turn > 1 and spec.think_s > 0:
            scheduled = _perf() + int(spec.think_s * 1e9)
            if not await _sleep_until(scheduled, drained):
                return
        now = _perf()
        if drained.is_set() or (deadline_ns is not None and now >= deadline_ns):
            return
        messages = (*history, {"role": "user", "content": spec.prompt})
        # what this turn should count: the previous turn's prompt (as the server counted it), its reply and the
        # new message in the chat template (a few tokens of the template may differ)
        requested = spec.input_tokens if not history else prev_in + prev_out + spec.input_tokens
        rec = RequestRecord(index=pool.next_index(), user=user, warmup=pool.warmup,
                            input_tokens_requested=requested, output_tokens_requested=spec.output_tokens,
                            scheduled_ns=scheduled if spec.turn == 1 or spec.think_s > 0 else now,
                            conversation=cid, turn=spec.turn, turns=conv.size)
        reply: list[str] = []
        await send(replace(spec, messages=messages), rec, reply)
        if rec.status != "ok":
            return
        history = [*messages, {"role": "assistant", "content": "".join(reply)}]
        prev_in = rec.prompt_tokens if rec.prompt_tokens >= 0 else requested
        prev_out = max(0, rec.output_tokens - rec.reasoning_tokens)  # reasoning is not resent, as chat clients do


async def _sleep_until(when_ns: int, drained: asyncio.Event) -> bool:
    """Sleep until `when_ns` (perf_counter_ns); False when the cell was drained meanwhile."""
    delay = (when_ns - _perf()) / 1e9
    if delay > 0:
        try:
            await asyncio.wait_for(drained.wait(), timeout=delay)
        except TimeoutError:
            pass
    return not drained.is_set()
