"""Fuzz tests that stay in the suite (Hypothesis, bounded): the SSE parser and the chunk decoder with arbitrary
bytes and split points, usage objects with arbitrary JSON, and summarize() over whatever that produced.
Properties: never an uncaught exception, counts always in range, never a negative or non-finite metric."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servescope.core.client import USAGE_BOUND, _Stream
from servescope.core.metrics import records_frame, summarize
from servescope.core.records import STATUSES, RequestRecord
from servescope.core.results import DIST_KEYS, STATS
from servescope.core.sse import SSEParser

# the --fast lane leaves this module out: 3 tests, ~3 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# JSON values a hostile server might send: huge and negative integers, floats (NaN and infinity as Python's
# json writes them), strings, booleans, null, nested lists and objects
json_leaf = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
                      st.integers(min_value=-5, max_value=5000), st.floats(allow_nan=True, allow_infinity=True),
                      st.text(max_size=12))
json_value = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=12)
usage_obj = st.one_of(
    json_value,
    st.fixed_dictionaries({}, optional={"prompt_tokens": json_value, "completion_tokens": json_value,
                                        "completion_tokens_details": st.one_of(
                                            json_value, st.fixed_dictionaries({"reasoning_tokens": json_value}))}),
)
chunk_obj = st.fixed_dictionaries({}, optional={
    "choices": st.one_of(json_value, st.lists(st.fixed_dictionaries({}, optional={
        "text": json_value, "delta": st.one_of(json_value, st.fixed_dictionaries({}, optional={
            "content": json_value, "reasoning_content": json_value, "reasoning": json_value}))}), max_size=3)),
    "usage": usage_obj,
    "error": st.one_of(st.none(), json_value),
})


def _sse_line(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


event = st.one_of(
    chunk_obj.map(_sse_line),
    st.binary(max_size=40),  # garbage
    st.sampled_from([b"data: [DONE]\n\n", b": keep-alive\n\n", b"data:\r\n", b"event: x\n", b"\n", b"\r\n"]),
    st.text(max_size=30).map(lambda t: b"data: " + t.encode() + b"\n"),
)


def _split(body: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(body) + 1) for c in cuts})
    pieces, last = [], 0
    for p in points:
        pieces.append(body[last:p])
        last = p
    pieces.append(body[last:])
    return pieces


def _feed_all(pieces: list[bytes]) -> list[bytes]:
    p = SSEParser()
    out: list[bytes] = []
    for piece in pieces:
        out.extend(p.feed(piece))
    return out + p.flush()


@FUZZ
@given(st.lists(event, max_size=12), st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_sse_parser_gives_the_same_events_however_the_bytes_are_split(events: list[bytes], cuts: list[int]) -> None:
    body = b"".join(events)
    assert _feed_all(_split(body, cuts)) == _feed_all([body])


def _stream(events: list[bytes], cuts: list[int], bound: int = USAGE_BOUND, status: int = 200,
            ctype: str = "text/event-stream") -> RequestRecord:
    rec = RequestRecord(0, 0, False, 7, 4, scheduled_ns=1_000)
    rec.sent_ns = 2_000
    st_ = _Stream(rec, bound, "sk-fuzz-secret")
    now = 10_000
    for piece in _split(b"".join(events), cuts):
        now += 1_000_000
        st_.feed(piece, now)
    rec.end_ns = now + 1_000_000
    st_.close(rec.end_ns)
    st_.finish(status, ctype)
    return rec


def _check_record(rec: RequestRecord, bound: int) -> None:
    assert rec.status in STATUSES
    assert rec.prompt_tokens == -1 or 0 <= rec.prompt_tokens <= bound
    assert 0 <= rec.output_tokens <= bound * max(1, len(rec.chunk_ns)) + len(rec.chunk_ns)
    assert rec.reasoning_tokens >= 0
    assert all(1 <= n <= bound for n in rec.chunk_tokens)
    assert list(rec.chunk_ns) == sorted(rec.chunk_ns)
    assert "sk-fuzz-secret" not in rec.error and "\x1b" not in rec.error and len(rec.error) <= 500


@FUZZ
@given(st.lists(event, max_size=12), st.lists(st.integers(min_value=0, max_value=10_000), max_size=8),
       st.sampled_from([USAGE_BOUND, 4096, 1]))
def test_the_chunk_decoder_takes_any_bytes(events: list[bytes], cuts: list[int], bound: int) -> None:
    rec = _stream(events, cuts, bound)
    _check_record(rec, bound)
    records_frame([rec])  # every value fits the frame's columns


@FUZZ
@given(usage_obj, st.integers(min_value=1, max_value=5))
def test_usage_with_any_json_is_a_count_or_bad_usage_and_content_is_measured(usage: Any, n: int) -> None:
    events = [_sse_line({"choices": [{"text": f"t{i}"}], "usage": usage if i == 0 else None}) for i in range(n)]
    rec = _stream([*events, b"data: [DONE]\n\n"], [])
    _check_record(rec, USAGE_BOUND)
    assert len(rec.chunk_ns) == n and rec.first_token_ns > 0  # the content counts whatever the usage said
    if rec.status == "bad_usage":
        assert rec.error.startswith("the server's usage is not a token count")
    else:
        assert rec.status == "ok"


def _assert_metrics_sane(s: dict[str, Any]) -> None:
    for k in DIST_KEYS:
        for stat in STATS:
            v = s[k][stat]
            assert v is None or (math.isfinite(v) and v >= 0), (k, stat, v)
    for k in ("requests_ok", "requests_failed", "requests_bad_usage", "output_tokens_total", "input_tokens_total",
              "request_s", "output_tok_s", "total_tok_s", "goodput_req_s", "slo_met_fraction", "output_tokens_mean",
              "input_tokens_mean", "reasoning_tokens_mean", "input_tokens_requested", "output_tokens_requested"):
        v = s[k]
        assert v is None or (math.isfinite(v) and v >= 0), (k, v)


@pytest.mark.slow
@FUZZ
@given(st.lists(st.tuples(st.lists(event, max_size=6), st.lists(st.integers(0, 1000), max_size=4)),
                min_size=1, max_size=5),
       st.floats(min_value=0, max_value=100))
def test_summarize_never_gives_a_negative_or_non_finite_metric(streams: list[tuple[list[bytes], list[int]]],
                                                               wall: float) -> None:
    recs = []
    for i, (events, cuts) in enumerate(streams):
        r = _stream(events, cuts)
        r.index = i
        recs.append(r)
    _assert_metrics_sane(summarize(records_frame(recs), wall, {"ttft_ms": 100.0, "per_user_tok_s": 1.0}).to_dict())
