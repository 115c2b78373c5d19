"""summarize() flags request records whose stamps cannot be real (issue 32): a negative end once gave goodput 0
without a word; now such a record is a failed request that says why, and the figures come from the others."""

from __future__ import annotations

from array import array

import pytest

from servescope.core.metrics import STAMP_FAULT, records_frame, summarize
from servescope.core.records import RequestRecord

MS = 1_000_000


def _ok(i: int, t: int) -> RequestRecord:
    return RequestRecord(i, 0, False, 7, 4, t, sent_ns=t, first_token_ns=t + 10 * MS, first_content_ns=t + 10 * MS,
                         end_ns=t + 40 * MS, prompt_tokens=7, output_tokens=4, usage_reported=True,
                         chunk_ns=array("q", [t + k * 10 * MS for k in range(1, 5)]), chunk_tokens=array("i", [1] * 4))


@pytest.mark.parametrize("damage, why", [
    ({"end_ns": -5}, "a negative stamp"),
    ({"end_ns": 1}, "end before send"),
    ({"first_token_ns": 1, "first_content_ns": 1}, "first token before send"),
    ({"first_token_ns": 10**15}, "first token after the end"),
    ({"end_ns": 0}, "an ok request without an end"),
    ({"chunk_ns": array("q", [3 * 10**9, 2 * 10**9])}, "token stamps out of order"),
])
def test_a_damaged_record_is_a_counted_failure_that_says_why(damage: dict[str, object], why: str) -> None:
    recs = [_ok(i, 10**9 + i * 100 * MS) for i in range(4)]
    for k, v in damage.items():
        setattr(recs[1], k, v)
    s = summarize(records_frame(recs), 1.0, {"ttft_ms": 1000.0})
    assert (s.requests_ok, s.requests_failed) == (3, 1)
    assert s.goodput_req_s == pytest.approx(3.0) and s.request_s == pytest.approx(3.0)
    assert s.slo_met_fraction == pytest.approx(0.75)
    (err,) = s.errors
    assert err.len == 1 and err.error.startswith(f"{STAMP_FAULT} ({why}): ")
    assert s.e2e_ms.min == pytest.approx(40.0) and s.ttft_ms.max == pytest.approx(10.0)


def test_a_cancelled_request_is_left_as_it_is() -> None:
    recs = [_ok(0, 10**9), _ok(1, 2 * 10**9)]
    recs[1].status, recs[1].end_ns = "cancelled", -1
    s = summarize(records_frame(recs), 1.0)
    assert (s.requests_ok, s.requests_failed, [e.status for e in s.errors]) == (1, 1, ["cancelled"])
    assert s.slo_met_fraction == 1.0
