from array import array

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servescope.core.errors import ServescopeError
from servescope.core.metrics import (
    itl_frame,
    meets_slos,
    per_request,
    records_frame,
    request_figures,
    summarize,
)
from servescope.core.records import RequestRecord
from servescope.engine.wire import reduce_batch

MS = 1_000_000


def rec(index: int, sent: int, chunks: list[tuple[int, int]], *, status: str = "ok", prompt: int = 100,
        out: int | None = None, content_from: int = 0, scheduled: int | None = None,
        reasoning: int = 0) -> RequestRecord:
    """chunks: (ms after time 0, tokens in chunk); content starts at chunk index content_from."""
    r = RequestRecord(index=index, user=0, warmup=False, input_tokens_requested=100, output_tokens_requested=10,
                      scheduled_ns=(scheduled if scheduled is not None else sent) * MS)
    r.sent_ns = sent * MS
    r.status = status  # type: ignore[assignment]
    r.prompt_tokens = prompt
    r.chunk_ns = array("q", [t * MS for t, _ in chunks])
    r.chunk_tokens = array("i", [n for _, n in chunks])
    if chunks:
        r.first_token_ns = chunks[0][0] * MS
        if content_from < len(chunks):
            r.first_content_ns = chunks[content_from][0] * MS
        r.end_ns = chunks[-1][0] * MS + 1 * MS
    else:
        r.end_ns = sent * MS + 5 * MS
    r.output_tokens = out if out is not None else sum(n for _, n in chunks)
    r.reasoning_tokens = reasoning
    return r


def test_basic_request_metrics() -> None:
    # sent at 0, first token at 100 ms, then 4 more chunks 10 ms apart, end at 141 ms
    r = rec(0, 0, [(100, 1), (110, 1), (120, 1), (130, 1), (140, 1)])
    pr = per_request(records_frame([r])).row(0, named=True)
    assert pr["ttft_ms"] == pytest.approx(100)
    assert pr["ttfo_ms"] == pytest.approx(100)
    assert pr["e2e_ms"] == pytest.approx(141)
    assert pr["tpot_ms"] == pytest.approx((141 - 100) / 4)
    assert pr["per_user_tok_s"] == pytest.approx(5 / 0.141)
    assert pr["prefill_tok_s"] == pytest.approx(100 / 0.1)


def test_one_token_output_has_no_tpot_and_no_itl() -> None:
    r = rec(0, 0, [(50, 1)])
    df = records_frame([r])
    pr = per_request(df).row(0, named=True)
    assert pr["tpot_ms"] is None
    assert pr["ttft_ms"] == pytest.approx(50)
    assert itl_frame(per_request(df)).height == 0
    s = summarize(df, wall_s=1.0)
    assert s.tpot_ms.mean is None
    assert s.itl_ms.p50 is None
    assert s.output_tok_s == pytest.approx(1.0)


def test_failed_requests_are_counted_but_not_in_latencies() -> None:
    ok = rec(0, 0, [(100, 1), (120, 1)])
    bad = rec(1, 0, [], status="error", prompt=-1, out=0)
    bad.error = "HTTP 500: boom"
    s = summarize(records_frame([ok, bad]), wall_s=2.0)
    assert s.requests_ok == 1 and s.requests_failed == 1
    assert s.ttft_ms.mean == pytest.approx(100)
    assert s.request_s == pytest.approx(0.5)
    assert s.errors[0].error == "HTTP 500: boom"


def test_reasoning_then_content_ttft_vs_ttfo() -> None:
    # 3 reasoning chunks then 2 content chunks
    r = rec(0, 0, [(40, 1), (50, 1), (60, 1), (70, 1), (80, 1)], content_from=3, reasoning=3)
    s = summarize(records_frame([r]), wall_s=1.0)
    assert s.ttft_ms.mean == pytest.approx(40)
    assert s.ttfo_ms.mean == pytest.approx(70)
    assert s.reasoning_tokens_mean == 3


def test_itl_pooled_and_per_token() -> None:
    a = rec(0, 0, [(10, 1), (20, 1), (40, 2)])  # gaps 10, 20 (2 tokens)
    b = rec(1, 0, [(5, 1), (35, 1)])  # gap 30
    itl = itl_frame(per_request(records_frame([a, b])))
    assert sorted(itl["itl_ms"].to_list()) == pytest.approx([10, 20, 30])
    assert sorted(itl["itl_token_ms"].to_list()) == pytest.approx([10, 10, 30])


def test_client_queue_and_aggregates() -> None:
    rs = [rec(i, 10 * i + 3, [(10 * i + 50, 1), (10 * i + 60, 1)], scheduled=10 * i) for i in range(4)]
    s = summarize(records_frame(rs), wall_s=0.5)
    assert s.client_queue_ms.mean == pytest.approx(3)
    assert s.output_tok_s == pytest.approx(8 / 0.5)
    assert s.total_tok_s == pytest.approx((8 + 400) / 0.5)
    assert s.input_tokens_mismatch is not None
    assert (s.input_tokens_mismatch.mean, s.input_tokens_mismatch.max_abs) == (0.0, 0)


def test_percentiles() -> None:
    rs = [rec(i, 0, [(i + 1, 1), (i + 2, 1)]) for i in range(100)]  # ttft 1..100 ms
    s = summarize(records_frame(rs), wall_s=1.0)
    assert s.ttft_ms.p50 == pytest.approx(50.5)
    assert s.ttft_ms.p99 == pytest.approx(99.01)
    assert s.ttft_ms.min == 1 and s.ttft_ms.max == 100


def test_goodput_and_slos() -> None:
    fast = [rec(i, 0, [(100, 1), (110, 1)]) for i in range(3)]
    slow = [rec(10 + i, 0, [(5000, 1), (5010, 1)]) for i in range(1)]
    slos = {"ttft_ms": 3000.0, "tpot_ms": 50.0}
    s = summarize(records_frame(fast + slow), wall_s=1.0, slos=slos)
    assert s.goodput_req_s == pytest.approx(3.0)
    assert s.slo_met_fraction == pytest.approx(0.75)
    assert not meets_slos(s)
    s2 = summarize(records_frame(fast), wall_s=1.0, slos=slos)
    assert meets_slos(s2)


def test_warmup_rows_excluded() -> None:
    w = rec(-1, 0, [(10, 1)])
    w.warmup = True
    m = rec(0, 0, [(100, 1), (200, 1)])
    s = summarize(records_frame([w, m]), wall_s=1.0)
    assert s.requests_ok == 1
    assert s.ttft_ms.mean == pytest.approx(100)


def test_bad_slo_strings() -> None:
    from servescope.engine.fields import slos  # the one SLO parser, every command's

    for bad in ("ttft=3", "ttft_ms", "tpot_ms=fast"):
        with pytest.raises(ServescopeError):
            slos(bad, "--slo")


def test_frame_schema_roundtrip(tmp_path) -> None:
    df = records_frame([rec(0, 0, [(1, 1), (2, 1)])])
    df.write_parquet(tmp_path / "r.parquet")
    back = pl.read_parquet(tmp_path / "r.parquet")
    assert back["chunk_ns"].to_list() == [[1 * MS, 2 * MS]]


_ns = st.integers(min_value=0, max_value=10**12)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["ok", "error", "cancelled", "timeout"]), _ns, _ns, _ns,
                          st.integers(min_value=0, max_value=5000)), min_size=1, max_size=12))
def test_request_figures_agree_with_per_request(rows: list[tuple[str, int, int, int, int]]) -> None:
    """The live batches' row-by-row figures are per_request's, value for value (nulls included), on records
    with any order of stamps (a first token before the send, no end, no token)."""
    recs = []
    for i, (status, sent, first, end, out) in enumerate(rows):
        r = RequestRecord(index=i, user=0, warmup=False, input_tokens_requested=1, output_tokens_requested=1,
                          scheduled_ns=sent, sent_ns=sent, first_token_ns=first, end_ns=end, output_tokens=out)
        r.status = status  # type: ignore[assignment]
        recs.append(r)
    frame = per_request(records_frame(recs))
    for r, row in zip(recs, frame.iter_rows(named=True), strict=True):
        got = request_figures(r)._asdict()
        for k, v in got.items():
            assert (v is None) == (row[k] is None), (k, r, v, row[k])
            if v is not None:
                assert v == pytest.approx(row[k], rel=1e-12, abs=1e-9), (k, r)


def test_reduce_batch_figures_and_errors() -> None:
    """A live batch: warm-ups left out, cancelled requests no error, errors cleaned of control bytes."""
    ok = rec(0, 0, [(100, 1), (110, 1), (120, 1), (130, 1), (140, 1)])
    ok.cached_tokens = 64
    warm = rec(1, 0, [(50, 1)])
    warm.warmup = True
    bad = rec(2, 0, [], status="error")
    bad.error = "boom\x1b[31m"
    gone = rec(3, 0, [], status="cancelled")
    ttft, tpot, e2e, per_user, out_tok, errors, turns, cached = reduce_batch([ok, warm, bad, gone])
    assert ttft == [pytest.approx(100)] and tpot == [pytest.approx(10.25)] and e2e == [pytest.approx(141)]
    assert per_user == [pytest.approx(5 / 0.141)] and out_tok == 5
    assert len(errors) == 1 and errors[0][0] == "error" and "\x1b" not in errors[0][1]
    assert turns == [0] and cached == [[64, 100]]


def test_errors_that_differ_only_in_their_numbers_count_as_one_kind() -> None:
    """A rate limit's message names how much was used ("Used 7901, Requested 318"): 429s of one limit are one
    line of the cell's errors, not one line per figure; different messages stay apart."""
    recs = [rec(0, 0, [(100, 1)])]
    for i, (used, asked) in enumerate([(7901, 318), (7904, 319), (7990, 320)]):
        r = rec(i + 1, 0, [], status="rate_limited")
        r.error = f"HTTP 429: Rate limit reached: Limit 8000, Used {used}, Requested {asked}."
        recs.append(r)
    other = rec(9, 0, [], status="error")
    other.error = "HTTP 500: boom"
    s = summarize(records_frame(recs + [other]), wall_s=1.0)
    assert [(e.status, e.len) for e in s.errors] == [("rate_limited", 3), ("error", 1)]
    assert s.errors[0].error == "HTTP 429: Rate limit reached: Limit 8000, Used 7901, Requested 318."
