"""Conversations under load (core/conversation.py through core/load.py run_cell), with the HTTP boundary faked:
each turn resends the history with the model's actual replies, users hold one conversation at a time, the
request count counts turns. Also the client's reply collection and cached tokens, and the per-turn summary."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from typing import Any

import polars as pl
import pytest

import servescope.core.load as load_mod
from servescope.core.client import ClientOptions, RequestSpec, _Stream, build_body
from servescope.core.conversation import Conversation, Pool, conversations
from servescope.core.load import CellControl, Limits, Load, run_cell
from servescope.core.metrics import records_frame, summarize
from servescope.core.records import RequestRecord
from servescope.core.results import CellResult

OPTS = ClientOptions(base_url="http://127.0.0.1:9", model="m")


def turns(n_convs: int, size: int, think_s: float = 0.0, new: int = 10, out: int = 4) -> list[RequestSpec]:
    return [RequestSpec("chat", f"c{c}t{t}", new, out, conversation=c, turn=t, think_s=think_s if t > 1 else 0.0)
            for c in range(n_convs) for t in range(1, size + 1)]


class Fake:
    """The HTTP boundary: answers each turn with a reply naming it, counts the prompt as the history's
    messages x 10 tokens, takes `delay` seconds; fails the turns whose new message is in `fail`."""

    def __init__(self, delay: float = 0.02, fail: frozenset[str] = frozenset(), cached: bool = True) -> None:
        self.delay = delay
        self.fail = fail
        self.cached = cached
        self.sent: list[tuple[RequestSpec, RequestRecord]] = []
        self.in_flight: dict[int, int] = {}
        self.sent_n: dict[int, asyncio.Event] = {}  # set once that many turns were sent

    async def __call__(self, http: object, opts: object, spec: RequestSpec, rec: RequestRecord,
                       reply: list[str] | None = None) -> RequestRecord:
        rec.sent_ns = time.perf_counter_ns()
        self.sent.append((spec, rec))
        if len(self.sent) in self.sent_n:
            self.sent_n[len(self.sent)].set()
        self.in_flight[rec.user] = self.in_flight.get(rec.user, 0) + 1
        assert self.in_flight[rec.user] == 1 or rec.user < 0  # a user holds one conversation, one turn at a time
        await asyncio.sleep(self.delay)
        self.in_flight[rec.user] -= 1
        rec.end_ns = time.perf_counter_ns()
        if spec.prompt in self.fail:
            rec.status, rec.error = "error", "HTTP 500: boom"
            return rec
        rec.first_token_ns = rec.sent_ns + 1000
        msgs = spec.messages or ()
        rec.prompt_tokens = 10 * len(msgs)
        rec.cached_tokens = 10 * (len(msgs) - 1) if self.cached else None
        rec.output_tokens = spec.output_tokens
        if reply is not None:
            reply += ["reply to ", spec.prompt]
        return rec


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Fake:
    f = Fake()
    monkeypatch.setattr(load_mod, "stream_request", f)
    return f


async def test_each_turn_resends_the_history_with_the_actual_replies(fake: Fake) -> None:
    run = await run_cell(OPTS, turns(2, 5), Load(concurrency=2), Limits(requests=10))
    assert len(run.records) == 10 and all(r.status == "ok" for r in run.records)
    by_conv: dict[int, list[RequestSpec]] = {}
    for spec, rec in fake.sent:
        by_conv.setdefault(rec.conversation, []).append(spec)
        assert rec.turns == 5 and spec.turn == rec.turn
    assert sorted(by_conv) == [0, 1]
    for c, specs in by_conv.items():
        assert [s.turn for s in specs] == [1, 2, 3, 4, 5]
        last = specs[-1].messages
        assert last is not None and [m["role"] for m in last] == ["user", "assistant"] * 4 + ["user"]
        assert [m["content"] for m in last[:4]] == [f"c{c}t1", f"reply to c{c}t1", f"c{c}t2", f"reply to c{c}t2"]
        assert last[-1]["content"] == f"c{c}t5"
    # the request estimates the history: the previous prompt as counted, its reply, the new message
    recs = sorted(run.records, key=lambda r: (r.conversation, r.turn))
    assert [r.input_tokens_requested for r in recs[:3]] == [10, 10 + 4 + 10, 30 + 4 + 10]


async def test_users_run_conversations_one_after_another_and_the_count_counts_turns(fake: Fake) -> None:
    run = await run_cell(OPTS, turns(6, 3), Load(concurrency=2), Limits(requests=7))
    assert len(run.records) == 7
    convs = sorted({(r.conversation, r.user) for r in run.records})
    assert [c for c, _ in convs] == [0, 1, 2]  # 3 + 3 + 1 turns: the third conversation shortened to fit
    third = [r for r in run.records if r.conversation == 2]
    assert len(third) == 1 and third[0].turns == 3  # ... and it says how many it was to have
    s = summarize(records_frame(run.records), 1.0)
    assert s.conversations is not None and (s.conversations.started, s.conversations.complete) == (3, 2)
    assert [t.turn for t in s.turns] == [1, 2, 3] and [t.requests_ok for t in s.turns] == [3, 2, 2]


async def test_think_time_is_waited_after_each_reply(fake: Fake) -> None:
    run = await run_cell(OPTS, turns(1, 3, think_s=0.1), Load(concurrency=1), Limits(requests=3))
    recs = sorted(run.records, key=lambda r: r.turn)
    for prev, nxt in zip(recs, recs[1:], strict=False):
        assert (nxt.sent_ns - prev.end_ns) / 1e9 >= 0.095
        # scheduled after the pause, counted from the reply's end (not at the conversation's start, which would
        # count the pause as client queueing), and sent no earlier than that
        assert nxt.scheduled_ns - prev.end_ns >= 100_000_000 and nxt.sent_ns >= nxt.scheduled_ns
    s = summarize(records_frame(run.records), 1.0)
    assert s.conversations is not None and s.conversations.duration_s.mean is not None
    assert s.conversations.duration_s.mean >= 0.2 + 3 * 0.02


async def test_a_failed_turn_ends_its_conversation(monkeypatch: pytest.MonkeyPatch) -> None:
    f = Fake(fail=frozenset({"c0t2"}))
    monkeypatch.setattr(load_mod, "stream_request", f)
    run = await run_cell(OPTS, turns(2, 4), Load(concurrency=1), Limits(requests=8))
    assert [(r.conversation, r.turn, r.status) for r in run.records] == [
        (0, 1, "ok"), (0, 2, "error"), (1, 1, "ok"), (1, 2, "ok"), (1, 3, "ok"), (1, 4, "ok")]
    s = summarize(records_frame(run.records), 1.0)
    assert s.conversations is not None and (s.conversations.started, s.conversations.complete) == (2, 1)


async def test_an_open_loop_starts_conversations_at_the_rate(fake: Fake) -> None:
    run = await run_cell(OPTS, turns(4, 2), Load(rate=20.0, arrival="constant"), Limits(requests=8), seed=1)
    assert len(run.records) == 8 and {r.user for r in run.records} == {-1}
    firsts = sorted(r.scheduled_ns for r in run.records if r.turn == 1)
    gaps = [(b - a) / 1e9 for a, b in zip(firsts, firsts[1:], strict=False)]
    assert all(g == pytest.approx(0.05, abs=0.005) for g in gaps)


async def test_warmup_runs_its_own_conversations_and_the_measured_ones_start_at_turn_1(fake: Fake) -> None:
    specs = turns(4, 3)
    run = await run_cell(OPTS, specs, Load(concurrency=2), Limits(requests=6, warmup=2))
    warm = [s.prompt for s, r in fake.sent if r.warmup]
    assert warm == ["c0t1", "c0t2"]
    assert sorted((r.conversation, r.turn) for r in run.records) == [(0, 1), (0, 2), (0, 3), (1, 1), (1, 2), (1, 3)]
    assert {s.prompt for s, r in fake.sent if not r.warmup} == {f"c{c}t{t}" for c in (1, 2) for t in (1, 2, 3)}


async def test_a_drain_sends_no_further_turn(fake: Fake) -> None:
    ctl = CellControl()
    task = asyncio.create_task(run_cell(OPTS, turns(2, 50), Load(concurrency=2), Limits(requests=100), control=ctl))
    await asyncio.wait_for(fake.sent_n.setdefault(6, asyncio.Event()).wait(), 60)  # both users a few turns in
    ctl.request_drain("stopped by the user")
    sent = len(fake.sent)
    run = await asyncio.wait_for(task, 60)
    assert run.stopped == "stopped by the user"
    assert len(fake.sent) == sent and len(run.records) == sent  # the turns in flight finished; no turn after


def test_grouping_leaves_out_a_conversation_begun_elsewhere() -> None:
    specs = turns(3, 3)[2:]  # conversation 0 lost its first two turns (to the warmup)
    assert [[s.prompt for s in c.turns] for c in conversations(specs)] == [["c1t1", "c1t2", "c1t3"],
                                                                           ["c2t1", "c2t2", "c2t3"]]
    pool = Pool([Conversation(tuple(turns(1, 2)))], None)
    assert [pool.take() is not None for _ in range(3)] == [True] * 3  # a duration cycles through the pool


# ---- the client: the reply's text, cached tokens ------------------------------------------------------
def _ev(obj: object) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def test_the_stream_keeps_the_reply_only_when_asked_and_reads_cached_tokens() -> None:
    body = (_ev({"choices": [{"delta": {"reasoning_content": "hmm"}}]})
            + _ev({"choices": [{"delta": {"content": "Hel"}}]}) + _ev({"choices": [{"delta": {"content": "lo"}}]})
            + _ev({"choices": [], "usage": {"prompt_tokens": 50, "completion_tokens": 3,
                                            "prompt_tokens_details": {"cached_tokens": 32}}})
            + b"data: [DONE]\n\n")
    replies: tuple[list[str] | None, ...] = (None, [])
    for reply in replies:
        rec = RequestRecord(0, 0, False, 50, 3, 0)
        st = _Stream(rec, reply=reply)
        st.feed(body, 1)
        st.finish(200, "text/event-stream")
        assert rec.status == "ok" and rec.cached_tokens == 32 and rec.prompt_tokens == 50
        if reply is not None:
            assert "".join(reply) == "Hello"  # content only: a chat client resends no reasoning
    rec = RequestRecord(0, 0, False, 50, 3, 0)
    _Stream(rec).feed(_ev({"choices": [], "usage": {"prompt_tokens": 10, "prompt_tokens_details": None}}), 1)
    assert rec.cached_tokens is None and rec.prompt_tokens == 10


@pytest.mark.parametrize("details", [{"cached_tokens": 60}, {"cached_tokens": -1}, {"cached_tokens": "x"}, [1]])
def test_implausible_cached_tokens_are_bad_usage(details: Any) -> None:
    rec = RequestRecord(0, 0, False, 50, 3, 0)
    _Stream(rec).feed(_ev({"choices": [], "usage": {"prompt_tokens": 50, "prompt_tokens_details": details}}), 1)
    assert rec.status == "bad_usage" and "prompt_tokens_details" in rec.error and rec.cached_tokens is None


def test_a_turn_sends_its_messages_instead_of_the_prompt() -> None:
    msgs = ({"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"})
    body = json.loads(build_body(replace(RequestSpec("chat", "c", 5, 2), messages=msgs), OPTS))
    assert body["messages"] == list(msgs)
    assert json.loads(build_body(RequestSpec("chat", "c", 5, 2), OPTS))["messages"] == [{"role": "user", "content": "c"}]


# ---- the summary ----------------------------------------------------------------------------------------
def _rec(conv: int, turn: int, prompt: int, cached: int | None, turns_: int = 2, ttft_ms: float = 10.0) -> RequestRecord:
    r = RequestRecord(conv * 10 + turn, 0, False, prompt, 4, 0, sent_ns=1_000_000_000 * conv,
                      first_token_ns=1_000_000_000 * conv + int(ttft_ms * 1e6),
                      end_ns=1_000_000_000 * conv + 500_000_000 * turn, prompt_tokens=prompt, output_tokens=4,
                      usage_reported=True, cached_tokens=cached, conversation=conv, turn=turn, turns=turns_)
    return r


def test_per_turn_figures_and_the_hit_rate_from_the_usage() -> None:
    recs = [_rec(0, 1, 100, 0), _rec(0, 2, 200, 100, ttft_ms=4), _rec(1, 1, 100, 50), _rec(1, 2, 200, 150, ttft_ms=6)]
    s = summarize(records_frame(recs), 2.0, server_prefix_hit_rate=0.9)
    assert s.prefix_cache_hit_rate == pytest.approx(300 / 600) and s.prefix_cache_source == "usage"
    assert (s.prompt_tokens_cached, s.prompt_tokens_uncached) == (300, 300)
    t1, t2 = s.turns
    assert (t1.turn, t1.input_tokens_mean, t1.prefix_cache_hit_rate) == (1, 100.0, 0.25)
    assert (t2.turn, t2.input_tokens_mean, t2.prefix_cache_hit_rate, t2.ttft_ms_p50) == (2, 200.0, 0.625, 5.0)
    c = s.conversations
    assert c is not None and (c.started, c.complete, c.turns_mean) == (2, 2, 2.0)
    assert c.input_tokens.mean == 300 and c.output_tokens.mean == 8 and c.duration_s.mean == pytest.approx(1.0)
    d = s.to_dict()
    assert CellResult.from_dict(d).to_dict() == d and CellResult.from_json(json.dumps(d)) == s


def test_the_hit_rate_falls_back_to_the_servers_metrics_and_single_turn_cells_have_no_turns() -> None:
    r = _rec(0, 1, 100, None)
    r.conversation, r.turn, r.turns = -1, 0, 0
    s = summarize(records_frame([r]), 1.0, server_prefix_hit_rate=0.4)
    assert (s.prefix_cache_hit_rate, s.prefix_cache_source) == (0.4, "server_metrics")
    d = s.to_dict()
    assert "turns" not in d and "conversations" not in d and "prompt_tokens_cached" not in d
    s = summarize(records_frame([r]), 1.0)
    assert s.prefix_cache_hit_rate is None and "prefix_cache_hit_rate" not in s.to_dict()
    assert CellResult.from_dict(s.to_dict()) == s


def test_request_rows_written_before_conversations_still_summarize() -> None:
    r = _rec(0, 1, 100, 20)
    old = records_frame([r]).drop("cached_tokens", "conversation", "turn", "turns")
    s = summarize(old, 1.0)
    d = s.to_dict()
    assert s.requests_ok == 1 and "turns" not in d and "prefix_cache_hit_rate" not in d
    assert pl.DataFrame(old).height == 1
