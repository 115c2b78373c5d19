"""The per-token path's one-step shortcut (core/tokenstream.py `_Stream.whole`, issue 46): a read that is one whole
chunk of one `data: ` event is decoded and recorded in one step. Whatever a stream holds (tokens, empty tokens whose
usage grew, reasoning, usage-only chunks, an error mid-stream, implausible usage, non-ASCII text, [DONE] and events
after it, timings), the record must be exactly the one the general path makes of the same reads, and the one made of
the same bytes cut anywhere (apart from the stamps, which follow the reads)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servescope.core import rawhttp
from servescope.core.rawhttp import DONE, _Conn
from servescope.core.records import RequestRecord
from servescope.core.tokenstream import _Stream

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def usage(prompt: object, completion: object, **more: object) -> dict[str, object]:
    return {"prompt_tokens": prompt, "total_tokens": 0, "completion_tokens": completion, **more}


def token(i: int, text: str = " tok", chat: bool = False) -> dict[str, object]:
    choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text, "logprobs": None}
    return {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
            "choices": [{**choice, "finish_reason": None, "stop_reason": None}], "usage": usage(256, i)}


# what a stream may hold, event by event (`i`: the completion count so far)
KINDS: dict[str, Callable[[int], object]] = {
    "token": lambda i: token(i),
    "non_ascii": lambda i: token(i, " dé🙂\u2028x"),
    "chat": lambda i: token(i, "ü", chat=True),
    "empty_grew": lambda i: token(i, ""),  # a token that detokenizes to "" for now: its usage grew
    "empty_same": lambda i: token(i - 1, ""),  # nothing new
    "two_tokens": lambda i: token(i + 1),  # a chunk of two tokens (usage grew by 2)
    "reasoning": lambda i: {"choices": [{"index": 0, "delta": {"reasoning_content": "hm"}}], "usage": usage(256, i)},
    "usage_only": lambda i: {"choices": [], "usage": usage(256, i - 1)},
    "details": lambda i: {"choices": [{"text": "x"}], "usage": usage(256, i, prompt_tokens_details={"cached_tokens": 3},
                                                                      completion_tokens_details={"reasoning_tokens": 0})},
    "no_usage": lambda i: {"choices": [{"text": "x"}]},
    "two_choices": lambda i: {"choices": [{"text": "a"}, {"text": "b"}], "usage": usage(256, i)},
    "timings": lambda i: {"choices": [{"text": "x"}], "usage": usage(256, i), "timings": {"prompt_ms": 12.5}},
    "bad_usage": lambda i: {"choices": [{"text": "x"}], "usage": usage(256, -4)},
    "string_usage": lambda i: {"choices": [{"text": "x"}], "usage": usage("256", i)},
    "huge_usage": lambda i: {"choices": [{"text": "x"}], "usage": usage(256, 10**30)},
    "error": lambda i: {"error": {"message": "engine died: \u00e9\x1b[31m"}},
    "error_text": lambda i: {"error": "overloaded"},
    "not_json": lambda i: "{not json",
}


def event(kind: str, i: int, space: bool = True) -> bytes:
    obj = KINDS[kind](i)
    data = obj.encode() if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False).encode()
    return (b"data: " if space else b"data:") + data + b"\n\n"


def stream_events(kinds: list[str], done: bool, after_done: int) -> list[bytes]:
    out = [event(k, i + 1, space=k != "token" or i % 5 != 4) for i, k in enumerate(kinds)]
    if done:
        out.append(b"data: [DONE]\n\n")
        out += [event("token", 99)] * after_done
    return out


def one_chunk_reads(events: list[bytes]) -> list[bytes]:
    return [b"%x\r\n%b\r\n" % (len(e), e) for e in events] + [b"0\r\n\r\n"]


def read(reads: list[bytes], monkeypatch: pytest.MonkeyPatch, quick: bool = True) -> tuple[RequestRecord, _Stream, int]:
    """The reads through a connection into a record, the clock 1,000 ns on per read; with `quick` False the
    shortcut's one-step path is never taken (the parser's rules decide every read). Also how many reads the
    one-step path took."""
    clock = iter(range(1_000, 10**9, 1_000))
    monkeypatch.setattr(rawhttp, "_perf", lambda: next(clock))
    taken = 0

    class Counted(_Stream):
        __slots__ = ()

        def whole(self, piece: bytes, now: int) -> bool:
            nonlocal taken
            if not quick:
                self.quick = False
            was = self.quick
            ok = super().whole(piece, now)
            taken += was and ok
            return ok

        def _whole(self, piece: bytes, now: int) -> bool:
            nonlocal taken
            taken -= self.quick  # the one-step path handed the read to the parser's rules
            return super()._whole(piece, now)

        def feed(self, piece: bytes, now: int) -> None:
            if not quick:
                self.quick = False
            super().feed(piece, now)

    loop = asyncio.new_event_loop()
    conn = _Conn(loop)
    rec = RequestRecord(0, 0, False, 256, 64, scheduled_ns=0)
    sink = Counted(rec, bound=4096)
    conn.sink = sink
    for r in reads:
        if conn.state == DONE:
            break
        conn.data_received(r)
    sink.close(next(clock))
    sink.finish(200, "text/event-stream")
    loop.close()
    return rec, sink, taken


def record(rec: RequestRecord) -> dict[str, object]:
    return {name: (list(v) if name in ("chunk_ns", "chunk_tokens") else v)
            for name in RequestRecord.__slots__ for v in [getattr(rec, name)]}


kinds_st = st.lists(st.sampled_from(sorted(KINDS)), min_size=1, max_size=12)


def grouped_reads(events: list[bytes], groups: list[int]) -> list[bytes]:
    """The events' chunks, `groups[k]` whole chunks in the k-th read (1 each once the groups run out)."""
    chunks = one_chunk_reads(events)
    out, pos = [], 0
    for g in groups:
        if pos < len(chunks):
            out.append(b"".join(chunks[pos:pos + g]))
            pos += g
    return out + chunks[pos:]


@settings(max_examples=300, deadline=None)
@given(kinds=kinds_st, done=st.booleans(), after_done=st.integers(0, 2),
       groups=st.lists(st.integers(1, 4), max_size=8))
def test_the_one_step_path_records_what_the_general_path_records(kinds: list[str], done: bool, after_done: int,
                                                                 groups: list[int]) -> None:
    """The same reads, each one or several whole chunks of one event each: with the one-step path and without it,
    every field of the record is the same (stamps, counts, status, error text)."""
    reads = [HEAD, *grouped_reads(stream_events(kinds, done, after_done), groups)]
    with pytest.MonkeyPatch.context() as mp:
        fast, _, _ = read(reads, mp)
        slow, _, taken = read(reads, mp, quick=False)
    assert taken == 0
    assert record(fast) == record(slow)


@settings(max_examples=200, deadline=None)
@given(kinds=kinds_st, done=st.booleans(), cuts=st.lists(st.integers(1, 300), max_size=40))
def test_the_one_step_path_reads_what_any_cut_of_the_bytes_reads(kinds: list[str], done: bool,
                                                                 cuts: list[int]) -> None:
    """Events split across reads and several events in one read (the general path) count the same tokens, usage,
    status and error as one event per read (the one-step path); only the stamps follow the reads."""
    events = stream_events(kinds, done, 0)
    reads = one_chunk_reads(events)
    wire = b"".join(reads)
    pieces, pos = [], 0
    for c in [*cuts, len(wire)]:
        if pos < len(wire):
            pieces.append(wire[pos:pos + c])
            pos += c
    with pytest.MonkeyPatch.context() as mp:
        a, _, _ = read([HEAD, *reads], mp)
        b, _, _ = read([HEAD, *pieces], mp)
    ra, rb = record(a), record(b)
    for r in (ra, rb):
        r.pop("chunk_ns"), r.pop("first_token_ns"), r.pop("first_content_ns"), r.pop("end_ns")
    assert ra == rb
    assert len(a.chunk_ns) == len(b.chunk_ns)
    assert bool(a.first_token_ns) == bool(b.first_token_ns) and bool(a.first_content_ns) == bool(b.first_content_ns)


def test_the_usual_stream_takes_the_one_step_path_and_keeps_each_read_s_stamp(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's usual stream: after the first read (the body's head is kept the usual way) every token read takes the
    one-step path, and each token is stamped with its own read's time."""
    n = 40
    events = stream_events(["token"] * n, True, 0)
    rec, st_, taken = read([HEAD, *one_chunk_reads(events)], monkeypatch)
    assert rec.status == "ok" and rec.output_tokens == n and rec.usage_reported and rec.prompt_tokens == 256
    assert list(rec.chunk_ns) == list(range(2_000, 2_000 + 1_000 * n, 1_000))  # read i at 1,000 ns x (i + 2)
    assert list(rec.chunk_tokens) == [1] * n
    assert rec.first_token_ns == rec.first_content_ns == 2_000
    assert taken >= n - 1 - n // 5  # the `data:` spelled without its space goes the parser's way
    assert st_.done and not st_.quick


def test_several_events_in_one_read_are_recorded_in_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """A read of several whole token events (a client that read late): each token counted, all stamped with that
    read's time, without the SSE parser (nothing held in it)."""
    events = stream_events(["token"] * 9, True, 0)
    rec, st_, _ = read([HEAD, *grouped_reads(events, [1, 3, 5, 1])], monkeypatch)
    assert rec.output_tokens == 9 and list(rec.chunk_tokens) == [1] * 9
    assert list(rec.chunk_ns) == [2_000, 3_000, 3_000, 3_000, 4_000, 4_000, 4_000, 4_000, 4_000]
    assert st_.done and st_.parser.idle and st_.events == 10


def test_after_done_the_one_step_path_stands_aside(monkeypatch: pytest.MonkeyPatch) -> None:
    """Events after [DONE] are never counted, whichever path reads them; the request ends at [DONE]."""
    events = stream_events(["token"] * 3, True, 2)
    rec, st_, _ = read([HEAD, *one_chunk_reads(events)], monkeypatch)
    assert rec.output_tokens == 3 and len(rec.chunk_ns) == 3
    assert st_.after_done == 1 and st_.overflow  # reading stopped at the first event after [DONE]
    assert "after [DONE]" in rec.error and rec.status == "ok"


def test_bad_usage_mid_stream_leaves_the_one_step_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """An implausible usage marks the record and is ignored from then on: the tokens after it are still counted (by
    their text), by the general path."""
    events = stream_events(["token", "token", "bad_usage", "token", "token"], True, 0)
    rec, st_, _ = read([HEAD, *one_chunk_reads(events)], monkeypatch)
    assert rec.status == "bad_usage" and "completion_tokens = -4" in rec.error
    assert len(rec.chunk_ns) == 5 and rec.output_tokens == 5  # the counted chunks, not the server's usage
    assert st_.bad and not st_.quick


def test_an_error_mid_stream_is_the_record_s_error(monkeypatch: pytest.MonkeyPatch) -> None:
    events = stream_events(["token", "token", "error", "token"], True, 0)
    rec, _, _ = read([HEAD, *one_chunk_reads(events)], monkeypatch)
    assert rec.status == "error" and rec.error.startswith("engine died: é") and "\x1b" not in rec.error
    assert len(rec.chunk_ns) == 3
