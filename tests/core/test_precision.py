"""The intervals of a cell's figures (batch means over spans of time) and the precision stop rule, on hand-built
records where the answer is known (core/precision.py), and the steady window (core/steady.py)."""

from __future__ import annotations

import math
import random
from array import array

import pytest

from servescope.core.errors import ServescopeError
from servescope.core.load import Load
from servescope.core.precision import (
    MIN_BATCHES,
    Precision,
    PrecisionRule,
    intervals,
    parse_precision,
    point_of,
    t_quantile,
    window_rates,
)
from servescope.core.records import RequestRecord
from servescope.core.steady import ramp_from_probe, steady_span

S = 1_000_000_000


def rec(i: int, sent_s: float, ttft_s: float, e2e_s: float, out: int = 10, status: str = "ok") -> RequestRecord:
    """A request sent at `sent_s` whose `out` tokens arrive one each, evenly from its first token to its end."""
    sent, first, end = int(sent_s * S), int((sent_s + ttft_s) * S), int((sent_s + e2e_s) * S)
    stamps = [first + (end - first) * k // max(out - 1, 1) for k in range(out)]
    return RequestRecord(i, 0, False, 100, out, sent, sent_ns=sent, first_token_ns=first, first_content_ns=first,
                         end_ns=end, status=status, prompt_tokens=100, output_tokens=out, usage_reported=True,  # type: ignore[arg-type]
                         chunk_ns=array("q", stamps), chunk_tokens=array("i", [1] * out))


def test_t_quantiles_are_students() -> None:
    for df, want in ((1, 12.706), (2, 4.303), (9, 2.262), (19, 2.093), (29, 2.045), (120, 1.980)):
        assert t_quantile(df) == pytest.approx(want, abs=0.002)


def test_precision_reads_a_share_or_figures_and_refuses_the_rest() -> None:
    assert parse_precision("5%", "--precision") == Precision(share=0.05)
    assert parse_precision("0.02", "--precision") == Precision(share=0.02)
    got = parse_precision("output_tok_s:2%,ttft_ms.p50:5%", "--precision")
    assert got is not None and got.figures == (("output_tok_s", 0.02), ("ttft_ms.p50", 0.05))
    assert got.text() == "output_tok_s:2%,ttft_ms.p50:5%"
    # the default figures: output tok/s and the median of each metric an SLO is set on (TTFT's without SLOs)
    assert Precision(share=0.05).targets({}) == (("output_tok_s", 0.05), ("ttft_ms.p50", 0.05))
    assert Precision(share=0.05).targets({"tpot_ms": 40, "ttft_ms": 1500}) == (
        ("output_tok_s", 0.05), ("tpot_ms.p50", 0.05), ("ttft_ms.p50", 0.05))
    for bad, said in (("150%", "between 0% and 100%"), ("tpot_ms.p99x:5%", "did you mean tpot_ms.p99?"),
                      ("itl_ms.p50:5%", "no figure 'itl_ms.p50' has an interval"),
                      ("output_tok_s:2%,output_tok_s:3%", "named twice"), ("fast", "not a share")):
        with pytest.raises(ServescopeError) as e:
            parse_precision(bad, "--precision")
        assert said in e.value.message and e.value.message.startswith("--precision")


def test_a_rate_counts_what_happened_inside_the_window() -> None:
    """One user, one request after another, each just under 1 s with 10 tokens: a window from the first send to the
    sixth holds five requests' tokens in 5 s (10 tok/s), not six (12 tok/s): N sends span N-1 gaps."""
    recs = [rec(i, float(i), 0.1, 0.99) for i in range(6)]
    rates = window_rates([point_of(r) for r in recs], 0, 5 * S, {})
    assert rates["output_tok_s"] == pytest.approx(10.0) and rates["request_s"] == pytest.approx(1.0)


def test_batch_means_of_a_steady_stream_match_hand_computed_values() -> None:
    """A request every 0.5 s, 1 s long, TTFT alternating 100 and 300 ms: over 40 s cut into 10 spans of 4 s, every
    span holds the same tokens (no spread: the rate's interval has no width) and the TTFT median is 200 ms."""
    recs = [rec(i, i * 0.5, 0.1 if i % 2 else 0.3, 1.0) for i in range(90)]
    pts = [point_of(r) for r in recs]
    out, p50, mean = intervals(pts, 1 * S, 40_900_000_000, ["output_tok_s", "ttft_ms.p50", "ttft_ms.mean"],
                               batches=10)
    assert out.batches == 10 and out.value == pytest.approx(20.0, rel=0.01)
    assert out.reached < 0.01
    assert p50.value == pytest.approx(200.0) and p50.low is not None and p50.low <= 200.0 <= (p50.high or 0)
    assert mean.value == pytest.approx(200.0, rel=1e-3) and mean.reached < 0.05


def test_requests_that_share_batches_get_a_wider_interval_than_independent_ones() -> None:
    """Latencies that move together for stretches of time (a slow minute slows every request in it) carry less
    information than as many independent ones: the batch-means interval is wider where they are correlated."""
    rng = random.Random(3)
    indep, corr = [], []
    level = 0.0
    for i in range(600):
        t = i * 0.2
        if i % 50 == 0:
            level = rng.gauss(0, 0.3)  # a stretch of 10 s at one level
        noise = rng.gauss(0, 0.3)
        indep.append(rec(i, t, 0.2 * math.exp(rng.gauss(0, 0.3)), 0.5))
        corr.append(rec(i, t, 0.2 * math.exp(level + 0.2 * noise), 0.5))
    [a] = intervals([point_of(r) for r in indep], 0, 120 * S, ["ttft_ms.mean"], batches=20)
    [b] = intervals([point_of(r) for r in corr], 0, 120 * S, ["ttft_ms.mean"], batches=20)
    assert b.reached > 2 * a.reached


def test_intervals_cover_the_truth_about_95_percent_of_the_time() -> None:
    """200 cells of independent requests (TTFT lognormal, median 100 ms): the 95% intervals of the median and of
    the mean hold the true values in about 95% of them (the figures' own definitions, linear quantiles)."""
    rng = random.Random(7)
    hit_p50 = hit_mean = 0
    cells = 200
    for _ in range(cells):
        recs = [rec(i, i * 0.1, 0.1 * math.exp(rng.gauss(0, 0.5)), 0.3) for i in range(400)]
        p50, mean = intervals([point_of(r) for r in recs], 0, 40 * S, ["ttft_ms.p50", "ttft_ms.mean"], batches=20)
        hit_p50 += (p50.low or 0) <= 100.0 <= (p50.high or 0)
        hit_mean += (mean.low or 0) <= 100.0 * math.exp(0.125) <= (mean.high or 0)
    assert 0.88 * cells <= hit_p50 <= cells and 0.88 * cells <= hit_mean <= cells


def test_the_rule_waits_for_its_floor_and_stops_once_every_figure_is_within_its_share() -> None:
    """A steady stream of requests: the rule does not stop before MIN_BATCHES spans of 2 median E2Es (here 20 s of
    1 s requests), then stops once output tok/s and the TTFT median are within 5%."""
    rule = PrecisionRule((("output_tok_s", 0.05), ("ttft_ms.p50", 0.05)), users=2)
    rule.begin(0)
    rng = random.Random(1)
    stopped_at = None
    for i in range(400):
        rule.add(rec(i, i * 0.5, 0.1 * math.exp(rng.gauss(0, 0.1)), 1.0))
        if rule.check() is not None:
            stopped_at = i
            break
    assert stopped_at is not None
    assert stopped_at * 0.5 >= MIN_BATCHES * 2 * 1.0 - 1  # not before the floor: 10 spans of 2 s
    end = rule.complete_until()
    assert end is not None and all(iv.reached <= 0.05 for iv in rule.last)


def test_the_rule_only_judges_spans_whose_requests_all_finished() -> None:
    """Request 3 is still out (not added): the window the rule judges ends at request 2's send."""
    rule = PrecisionRule((("output_tok_s", 0.05),))
    rule.begin(0)
    for i in (0, 1, 2, 4, 5):
        rule.add(rec(i, float(i), 0.1, 1.0))
    assert rule.complete_until() == 2 * S


def test_the_steady_window_of_each_load() -> None:
    recs = [rec(i, i * 0.25, 0.1, 1.0) for i in range(40)]
    # closed loop of 4 users started over 2 s: from the last user's start (1.5 s) to the last send
    span = steady_span(recs, Load(concurrency=4, ramp_s=2.0), 40)
    assert span is not None and (span.start_ns, span.end_ns) == (int(1.5 * S), int(9.75 * S))
    assert "once the last of 4 users started" in span.basis
    # users started together, or an open loop with no ramp: from the first send
    span = steady_span(recs, Load(rate=4.0), 40)
    assert span is not None and span.start_ns == 0 and "no ramp" in span.basis
    # an open loop's ramp: from its end; the precision rule's end, when it stopped the cell
    span = steady_span(recs, Load(rate=4.0, ramp_s=3.0), 40, precise_end_ns=8 * S)
    assert span is not None and (span.start_ns, span.end_ns) == (3 * S, 8 * S)
    assert steady_span(recs, Load(rate=4.0, arrival="trace"), 40) is None  # a trace's times are its own
    assert ramp_from_probe(2.84) == 2.8 and ramp_from_probe(0.01) == 0.1
