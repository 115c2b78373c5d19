"""The one SLO rule (servescope.core.slo): every reader that judges requests against SLOs gets the same verdict,
the null-TTFO case included."""

import math
import re
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servescope.core.metrics import per_request, records_frame, summarize
from servescope.core.slo import attains, requests_needed, slo_margins, slo_met, slo_terms
from servescope.engine.tune import MARGIN_CAP, margins_of
from servescope.sessions.stats import measured
from tests.core.test_metrics import rec

PKG = Path(__file__).resolve().parents[2] / "servescope"


def _three() -> pl.DataFrame:
    """An answer (content from its first token), a request that reasoned and never answered, and one whose content
    stamp is missing but that streamed no reasoning (its first token was content)."""
    answered = rec(0, 0, [(100, 1), (110, 1), (120, 1)])
    reasoned = rec(1, 0, [(100, 1), (110, 1), (120, 1)], content_from=3, reasoning=3)
    unstamped = rec(2, 0, [(100, 1), (110, 1), (120, 1)], content_from=3)
    return records_frame([answered, reasoned, unstamped])


def test_a_request_that_reasoned_and_never_answered_fails_ttfo_in_every_reader() -> None:
    df = _three()
    slos = {"ttfo_ms": 1000.0}
    pr = per_request(df)
    assert pr["ttfo_ms"].to_list()[1:] == [None, None]
    assert pr.select(slo_met(slos).alias("met"))["met"].to_list() == [True, False, True]
    s = summarize(df, wall_s=1.0, slos=slos)  # a cell's goodput
    assert s.slo_met_fraction == pytest.approx(2 / 3) and s.goodput_req_s == pytest.approx(2.0)
    boot = measured(df, slos)  # compare's and gate's bootstrap
    assert boot is not None and boot["good"].to_list() == [True, False, True]
    m = margins_of(pr, slos)  # tune's measured cells (and the twin's predicted ones)
    assert m[0] == -math.inf and all(x >= 0 for x in m[1:])


def test_the_margin_is_how_far_from_the_tightest_slo() -> None:
    pr = per_request(records_frame([rec(0, 0, [(100, 1), (110, 1)]), rec(1, 0, [(400, 1), (410, 1)]),
                                    rec(2, 0, [(100, 1)], status="error")]))
    m = slo_margins(pr, {"ttft_ms": 200.0, "e2e_ms": 1000.0})
    assert m[0] == pytest.approx(math.log(2)) and m[1] == pytest.approx(math.log(200 / 400)) and m[2] == -math.inf
    assert slo_margins(pr, {})[:2] == [math.inf, math.inf]
    assert margins_of(pr, {}) == [-math.inf, MARGIN_CAP, MARGIN_CAP]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 5000), st.floats(0, 200), st.booleans()), min_size=1, max_size=20),
       st.floats(1, 4000), st.floats(1, 100))
def test_a_margin_of_zero_or_more_is_exactly_meeting_every_slo(
        reqs: list[tuple[float, float, bool]], ttft_limit: float, speed_floor: float) -> None:
    frame = pl.DataFrame({"status": ["ok" if ok else "error" for _, _, ok in reqs],
                          "ttft_ms": [t for t, _, _ in reqs], "per_user_tok_s": [u for _, u, _ in reqs],
                          "reasoning_tokens": [0] * len(reqs)})
    slos = {"ttft_ms": ttft_limit, "per_user_tok_s": speed_floor}
    direct = [ok and t <= ttft_limit and u >= speed_floor for t, u, ok in reqs]
    assert frame.select(slo_met(slos).alias("met"))["met"].to_list() == direct
    assert [m >= 0 for m in slo_margins(frame, slos)] == direct


def test_a_cell_meets_the_slos_at_ninety_percent() -> None:
    assert attains(0.9) and not attains(0.89) and not attains(None)
    assert requests_needed(10) == 9 and requests_needed(30) == 27 and requests_needed(1) == 1
    assert slo_terms({"ttft_ms": 3000.0, "per_user_tok_s": 20.0}) == ["ttft_ms <= 3000", "per_user_tok_s >= 20"]


def test_no_module_but_the_rule_judges_against_an_slo() -> None:
    """A bound's direction or the attainment share compared anywhere else is a second rule."""
    judging = re.compile(r"'>=' if|\"<=\" if|>=\s*(?:SLO_ATTAINMENT|ATTAINMENT|0\.9\b)|fill_null\(float\(\"inf\"\)\)")
    found = [f"{p.relative_to(PKG.parent)}:{i}" for p in sorted(PKG.rglob("*.py")) if p.name != "slo.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if judging.search(line)]
    assert not found, found
