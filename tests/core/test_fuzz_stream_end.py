"""Fuzz tests (Hypothesis, bounded) for issue 32's rules: SSE line ends (CRLF, LF and lone CR in any mix, split
anywhere: the same events), nothing after `[DONE]` counts, and impossible request stamps are flagged by
summarize() (never a crash, never a negative or non-finite figure from them)."""

from __future__ import annotations

import itertools
import json
import math
import re
from array import array
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servescope.core.client import USAGE_BOUND
from servescope.core.metrics import STAMP_FAULT, records_frame, summarize
from servescope.core.records import RequestRecord
from servescope.core.results import DIST_KEYS, STATS
from servescope.core.sse import SSEParser
from tests.core.test_fuzz_client import _check_record, _split, _stream, chunk_obj, event

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])  # cases per test

# ---- SSE line ends --------------------------------------------------------------------------------------------
line_text = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=20)
sse_line = st.one_of(
    line_text.map(lambda t: b"data: " + t.encode()),
    line_text.map(lambda t: b"data:" + t.encode()),
    st.sampled_from([b"", b": keep-alive", b"event: x", b"id: 7", b"data: [DONE]", b"retry: 5"]),
)
ENDS = (b"\n", b"\r", b"\r\n")


def _feed(pieces: list[bytes]) -> list[bytes]:
    p = SSEParser()
    out: list[bytes] = []
    for piece in pieces:
        out.extend(p.feed(piece))
    return out + p.flush()


def _spec_events(body: bytes) -> list[bytes]:
    """The SSE specification's reading, as a reference: lines end with CRLF, LF or CR; the last line may have
    none; a `data:` line's value loses one leading space."""
    out = []
    for line in re.split(rb"\r\n|\r|\n", body):
        if line.startswith(b"data:"):
            v = line[5:]
            out.append(v[1:] if v.startswith(b" ") else v)
    return out


@FUZZ
@given(st.lists(st.tuples(sse_line, st.sampled_from(ENDS)), max_size=14), st.booleans(),
       st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_any_mix_of_line_ends_split_anywhere_gives_the_same_events(lines: list[tuple[bytes, bytes]], last_end: bool,
                                                                   cuts: list[int]) -> None:
    fixed: list[tuple[bytes, bytes]] = []
    for i, (line, end) in enumerate(lines):
        if end == b"\n" and line == b"" and i and fixed[-1][1] == b"\r":
            end = b"\r"  # a CR then an empty line ending in LF is one CRLF: keep the lines as meant
        fixed.append((line, end))
    body = b"".join(line + end for line, end in fixed)
    if fixed and not last_end:  # the stream may end without a final line end
        body = body[: len(body) - len(fixed[-1][1])]
    meant = [line for line, _ in fixed if line.startswith(b"data:")]
    meant = [v[6:] if v.startswith(b"data: ") else v[5:] for v in meant]
    got = _feed(_split(body, cuts))
    assert got == meant == _spec_events(body)
    # the same lines with LF only read the same
    assert got == _feed([b"\n".join(line for line, _ in fixed)])


@FUZZ
@given(st.lists(st.one_of(event, st.sampled_from([b"data: a\r", b"\r", b"data: b\r\r", b"\r\n", b"data: c\n\r"])),
                max_size=10), st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_arbitrary_bytes_read_as_the_specification_says_however_split(events: list[bytes], cuts: list[int]) -> None:
    body = b"".join(events)
    assert _feed(_split(body, cuts)) == _spec_events(body)


# ---- nothing after [DONE] counts ----------------------------------------------------------------------------
def _tok(i: int, completion: int | None) -> bytes:
    usage = {"prompt_tokens": 7, "completion_tokens": completion} if completion is not None else None
    return b"data: " + json.dumps({"choices": [{"text": f"t{i}"}], "usage": usage}).encode() + b"\n\n"


before = st.lists(st.one_of(st.integers(min_value=0, max_value=40).map(lambda n: _tok(n, None)),
                            st.integers(min_value=1, max_value=40).map(lambda n: _tok(n, n)),
                            chunk_obj.map(lambda o: b"data: " + json.dumps(o).encode() + b"\n\n")), max_size=8)
after = st.lists(st.one_of(event, st.integers(min_value=1, max_value=10**6).map(lambda n: _tok(n, n))), max_size=6)


@FUZZ
@given(before, after, st.lists(st.integers(min_value=0, max_value=10_000), max_size=8))
def test_nothing_after_done_counts(head: list[bytes], tail: list[bytes], cuts: list[int]) -> None:
    done = [*head, b"data: [DONE]\n\n"]
    rec = _stream([*done, *tail], cuts)
    ref = _stream(done, [])
    _check_record(rec, USAGE_BOUND)
    assert (rec.status, rec.output_tokens, rec.prompt_tokens, rec.reasoning_tokens, list(rec.chunk_tokens)) == \
           (ref.status, ref.output_tokens, ref.prompt_tokens, ref.reasoning_tokens, list(ref.chunk_tokens))
    assert len(rec.chunk_ns) == len(ref.chunk_ns)
    assert rec.end_ns >= (rec.chunk_ns[-1] if rec.chunk_ns else rec.sent_ns)
    after_done = _spec_events(b"".join(tail))
    if rec.status == "ok":
        assert ("after [DONE]" in rec.error) == bool(after_done), rec.error
    elif ref.status == "error" and not ref.chunk_ns:
        assert rec.error == ref.error


# ---- request stamps ---------------------------------------------------------------------------------------------
stamp = st.one_of(st.just(0), st.integers(min_value=1, max_value=10**13), st.integers(min_value=-(10**13), max_value=-1))
record = st.fixed_dictionaries({
    "status": st.sampled_from(["ok", "ok", "ok", "error", "cut", "timeout", "cancelled", "bad_usage"]),
    "scheduled_ns": stamp, "sent_ns": stamp, "first_token_ns": stamp, "first_content_ns": stamp, "end_ns": stamp,
    "chunk_ns": st.lists(st.integers(min_value=-(10**13), max_value=10**13), max_size=6),
    "output_tokens": st.integers(min_value=0, max_value=5000), "prompt_tokens": st.integers(min_value=-1, max_value=5000),
})
# a plausible record: stamps in order, as the client takes them
sane = st.tuples(st.integers(min_value=1, max_value=10**12), st.lists(st.integers(min_value=0, max_value=10**9),
                                                                        min_size=4, max_size=8))


def _fault(r: dict[str, Any]) -> bool:
    """The reference: stamps no real request can have (0 is a stamp never taken)."""
    q, s, f, c, e, ch = (r[k] for k in ("scheduled_ns", "sent_ns", "first_token_ns", "first_content_ns", "end_ns",
                                        "chunk_ns"))
    return (min(q, s, f, c, e, *ch) < 0 or (r["status"] == "ok" and e == 0) or (s > 0 and 0 < e < s)
            or (s > 0 and 0 < f < s) or (f > 0 and 0 < e < f) or (f > 0 and 0 < c < f) or (s > 0 and 0 < c < s)
            or any(b < a for a, b in itertools.pairwise(ch)))


def _rec(i: int, r: dict[str, Any]) -> RequestRecord:
    chunks = r["chunk_ns"]
    return RequestRecord(i, 0, False, 7, 4, r["scheduled_ns"], sent_ns=r["sent_ns"], first_token_ns=r["first_token_ns"],
                         first_content_ns=r["first_content_ns"], end_ns=r["end_ns"], status=r["status"],
                         error="" if r["status"] == "ok" else "failed", prompt_tokens=r["prompt_tokens"],
                         output_tokens=r["output_tokens"], usage_reported=True, chunk_ns=array("q", chunks),
                         chunk_tokens=array("i", [1] * len(chunks)))


def _sane(i: int, t0: int, gaps: list[int]) -> dict[str, Any]:
    q, s, f, *more = (t0 + sum(gaps[:k + 1]) for k in range(len(gaps)))
    return {"status": "ok", "scheduled_ns": q, "sent_ns": s, "first_token_ns": f, "first_content_ns": f,
            "end_ns": more[-1], "chunk_ns": [f, *more], "output_tokens": len(more) + 1, "prompt_tokens": 7}


@pytest.mark.slow  # summarize() costs milliseconds a case (~10 s in all), as the other summarize fuzz test
@FUZZ
@given(st.lists(record, max_size=8), st.lists(sane, min_size=0, max_size=4),
       st.floats(min_value=0.001, max_value=1000), st.booleans())
def test_impossible_stamps_are_flagged_never_measured(wild: list[dict[str, Any]], good: list[tuple[int, list[int]]],
                                                      wall: float, with_slos: bool) -> None:
    rows = [*wild, *(_sane(i, t0, gaps) for i, (t0, gaps) in enumerate(good))]
    recs = [_rec(i, r) for i, r in enumerate(rows)]
    s = summarize(records_frame(recs), wall, {"ttft_ms": 1e9} if with_slos else None)
    damaged = sum(_fault(r) and r["status"] != "cancelled" for r in rows)
    flagged = sum(e.len for e in s.errors if e.error.startswith(STAMP_FAULT))
    assert flagged == damaged or (len({e.error for e in s.errors}) > 5 and flagged <= damaged)  # errors: top 5 kinds
    assert s.requests_ok == sum(r["status"] == "ok" and not _fault(r) for r in rows)
    assert s.requests_ok + s.requests_failed == len(rows)
    if with_slos:  # every plausible ok request with a token meets an SLO this loose; a damaged one never counts
        good_n = sum(r["status"] == "ok" and not _fault(r) and r["first_token_ns"] > 0 for r in rows)
        assert s.goodput_req_s == good_n / wall
    d = s.to_dict()
    for k in DIST_KEYS:
        if k == "client_queue_ms":  # a send before its schedule is no impossible stamp (the planned time is a plan)
            continue
        for stat in STATS:
            v = d[k][stat]
            assert v is None or (math.isfinite(v) and v >= 0), (k, stat, v)
