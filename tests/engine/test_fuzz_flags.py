"""Generated values for the flags' parsers (issue 32): whatever is typed, each parser returns a value within its
bounds or raises one ServescopeError line that starts with the flag; nothing else escapes. The SLOs of
`report`, `compare`, `gate` and `whatif` are the ones `run` reads, and a value that starts with a minus reaches
its flag's check instead of argparse's "expected one argument"."""

from __future__ import annotations

import argparse
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servescope.cli import compare as cli_compare
from servescope.core.errors import ServescopeError
from servescope.core.metrics import SLO_KEYS
from servescope.engine import fields as f
from servescope.engine.spec import SweepSpec

EXAMPLES = 300  # each test below runs this many generated cases

_number = st.one_of(st.integers(-10**6, 10**6).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                    st.sampled_from(["nan", "inf", "-inf", "1e308", "-0", "0", "1e-320", ".5", "5.", "", " "]))
_unit = st.sampled_from(["", "s", "ms", "m", "h", "x", " s", "S"])
_slo_item = st.builds(lambda k, v: f"{k}={v}", st.sampled_from([*sorted(SLO_KEYS), "ttft", "", " ttft_ms"]), _number)
_typed = st.text(alphabet=st.characters(codec="utf-8"), max_size=30)  # anything at all, as a shell passes it


def _one_line(e: ServescopeError, flag: str) -> None:
    assert e.message.startswith(f"{flag}: ") and "\n" not in e.message, e.message


def _durations() -> st.SearchStrategy[str]:
    return st.one_of(st.builds(lambda n, u: f"{n}{u}", _number, _unit), _typed)


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.one_of(st.lists(_slo_item, max_size=4).map(",".join), _typed))
def test_slos_are_finite_and_above_0_or_one_line(text: str) -> None:
    try:
        v = f.slos(text, "--slo")
    except ServescopeError as e:
        _one_line(e, "--slo")
        return
    assert v and set(v) <= SLO_KEYS and all(math.isfinite(x) and x > 0 for x in v.values())
    # report, compare and gate read --slo with the same parser (whatif too: servescope/cli/twin.py)
    assert cli_compare._slos(argparse.Namespace(slo=text)) == v


@settings(max_examples=EXAMPLES, deadline=None)
@given(_durations())
def test_durations_are_within_bounds_or_one_line(text: str) -> None:
    try:
        v = f.duration(text, "--duration")
    except ServescopeError as e:
        _one_line(e, "--duration")
        return
    assert 0 < v <= f.MAX_DURATION_S


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.one_of(st.lists(_number, max_size=4).map(",".join), _typed))
def test_load_lists_are_positive_or_one_line(text: str) -> None:
    for parse, flag in ((f.int_list, "--concurrency"), (f.float_list, "--rate")):
        try:
            v = parse(text, flag)
        except ServescopeError as e:
            _one_line(e, flag)
            continue
        assert v and all(math.isfinite(x) and x > 0 for x in v)
        assert "" not in [p.strip() for p in text.split(",")]  # '1,,4' is never read as 1,4


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.one_of(st.builds(lambda s, h: f"{s}://{h}", st.sampled_from(["http", "https", "sim", "ftp", ""]),
                           _typed), _typed))
def test_urls_are_http_with_a_host_or_one_line(text: str) -> None:
    try:
        v = f.url(text, "--url")
    except ServescopeError as e:
        _one_line(e, "--url")
        return
    assert v.startswith(("http://", "https://", "sim://"))


@settings(max_examples=EXAMPLES, deadline=None)
@given(st.sampled_from(["--ramp", "--duration", "--timeout", "--telemetry-interval", "--recover-timeout"]),
       st.integers(0, 10**9), _unit.filter(lambda u: u.strip() in ("", "s", "ms", "m", "h")))
def test_a_negative_value_reaches_its_check(flag: str, n: int, unit: str) -> None:
    """`--ramp -5s` parses as `--ramp=-5s` does, and is refused by the duration's own check."""
    from servescope.__main__ import _parser

    argv = ["run", "--rate", "2", flag, f"-{n}{unit.strip()}"]
    args = _parser().parse_args(argv)  # argparse exited here: "expected one argument"
    with pytest.raises(ServescopeError) as e:
        SweepSpec.from_args(args)
    _one_line(e.value, flag)
    assert "must be above 0" in e.value.message
