"""Arrival shapes: gamma gaps with a burstiness (as `vllm bench serve --burstiness`), a linear ramp within a
cell (an open loop's rate, a closed loop's users), and a step pattern of rate multipliers."""

from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from collections.abc import Coroutine
from itertools import islice
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from servescope.core import load as load_mod
from servescope.core.arrivals import RateShape, Step, parse_pattern, pattern_label, pattern_text, send_times
from servescope.core.client import ClientOptions, RequestSpec
from servescope.core.errors import ServescopeError
from servescope.core.health import ClientProbe
from servescope.core.load import CellRun, Limits, Load, run_cell
from servescope.core.records import RequestRecord

SPEC = RequestSpec("completions", "hello", 7, 5)
HOW = 'e.g. "1x for 20s, 4x for 5s, 1x" (a rate multiplier and how long it lasts; the last step holds)'


def _gaps(arrival: str, rate: float, burstiness: float = 1.0, n: int = 20_000, seed: int = 3) -> list[float]:
    times = list(islice(send_times(arrival, rate, burstiness, RateShape(), random.Random(seed)), n + 1))
    return [b - a for a, b in zip(times, times[1:], strict=False)]


# ---- gamma ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("burstiness", [0.25, 0.5, 1.0, 2.0, 8.0])
def test_gamma_gaps_keep_the_mean_rate_and_vary_as_one_over_sqrt_burstiness(burstiness: float) -> None:
    gaps = _gaps("gamma", 8.0, burstiness)
    mean = statistics.fmean(gaps)
    cv = statistics.pstdev(gaps) / mean
    assert mean == pytest.approx(1 / 8, rel=0.04)
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_gamma_of_burstiness_one_is_poisson_like_and_constant_has_no_spread() -> None:
    poisson = _gaps("poisson", 4.0)
    assert statistics.pstdev(poisson) / statistics.fmean(poisson) == pytest.approx(1.0, rel=0.05)
    assert set(_gaps("constant", 4.0, n=50)) == {0.25}


def test_the_same_seed_sends_at_the_same_times() -> None:
    shape = RateShape(5.0, parse_pattern("1x for 3s, 4x for 1s, 1x", "p"))
    a = list(islice(send_times("gamma", 10, 0.5, shape, random.Random("s:1")), 200))
    b = list(islice(send_times("gamma", 10, 0.5, shape, random.Random("s:1")), 200))
    c = list(islice(send_times("gamma", 10, 0.5, shape, random.Random("s:2")), 200))
    assert a == b and a != c
    assert a == sorted(a) and a[0] == 0.0


# ---- the shape: ramp and pattern --------------------------------------------------------------------------
def test_a_ramp_rises_linearly_from_zero_then_holds() -> None:
    shape = RateShape(10.0)
    assert [shape.multiplier(t) for t in (0, 2.5, 5, 10, 60)] == [0, 0.25, 0.5, 1, 1]
    # M(t) = t^2 / 20 during the ramp, so the steady process's s seconds are sent at sqrt(20 s)
    assert shape.warp(0) == 0 and shape.warp(1.25) == pytest.approx(5.0) and shape.warp(5) == pytest.approx(10.0)
    assert shape.warp(7) == pytest.approx(12.0)  # after the ramp: one second per second, 5 s behind
    assert not shape.steady and RateShape().steady and RateShape(None, ()).warp(3.5) == 3.5


def test_constant_arrivals_under_a_ramp() -> None:
    times = list(islice(send_times("constant", 20, 1.0, RateShape(1.0), random.Random(0)), 15))
    want = [math.sqrt(k / 10) for k in range(11)] + [1 + (k / 20 - 0.5) for k in range(11, 15)]
    assert times == pytest.approx(want)
    # the mean rate over the ramp is half the target: 10 requests in its 1 s at 20/s
    assert sum(t < 1.0 for t in times) == 10


def test_a_pattern_multiplies_the_rate_step_by_step() -> None:
    steps = parse_pattern("1x for 10s, 4x for 5s, 0x for 5s, 2x", "p")
    shape = RateShape(None, steps)
    assert [shape.multiplier(t) for t in (0, 9.9, 10, 14.9, 15, 19.9, 20, 1000)] == [1, 1, 4, 4, 0, 0, 2, 2]
    assert shape.peak == 4
    times = list(islice(send_times("constant", 10, 1.0, shape, random.Random(0)), 400))
    count = [sum(a <= t < b for t in times) for a, b in ((0, 10), (10, 15), (15, 20), (20, 25))]
    assert count == [100, 200, 0, 100]  # 10/s, 40/s, a pause, 20/s


def test_a_pattern_under_poisson_arrivals_keeps_its_rates() -> None:
    shape = RateShape(None, parse_pattern("1x for 100s, 5x for 100s, 1x", "p"))
    times = list(islice(send_times("poisson", 10, 1.0, shape, random.Random(9)), 8000))
    assert sum(t < 100 for t in times) == pytest.approx(1000, rel=0.1)
    assert sum(100 <= t < 200 for t in times) == pytest.approx(5000, rel=0.05)


def test_a_ramp_and_a_pattern_combine() -> None:
    shape = RateShape(4.0, parse_pattern("2x for 2s, 1x", "p"))
    assert [shape.multiplier(t) for t in (0, 1, 2, 3, 4, 9)] == [0, 0.5, 0.5, 0.75, 1, 1]
    # M(t) = t^2/4 up to 2 s (2x of t/4), then 1 + (t^2 - 4)/8 up to 4 s, then 2.5 + (t - 4)
    assert [shape.warp(m) for m in (0.25, 1.0, 1.625, 2.5, 4.5)] == pytest.approx([1, 2, 3, 4, 6])
    assert RateShape(None, parse_pattern("0x for 5s, 1x", "p")).warp(0) == 5.0  # the first request after the pause


# ---- the pattern's text ---------------------------------------------------------------------------------
def test_pattern_parsing_and_writing() -> None:
    steps = parse_pattern(" 1x for 20s,4X FOR 500ms , 0.5x for 1m, 1.5x ", "p")
    assert steps == (Step(1, 20), Step(4, 0.5), Step(0.5, 60), Step(1.5))
    assert pattern_text(steps) == "1x for 20s, 4x for 0.5s, 0.5x for 60s, 1.5x"
    assert parse_pattern(pattern_text(steps), "p") == steps
    assert parse_pattern(["1x for 20s", "4x for 5s", "1x"], "p") == parse_pattern("1x for 20s, 4x for 5s, 1x", "p")
    assert pattern_label(steps) == "1x:20s 4x:0.5s 0.5x:60s 1.5x"
    assert parse_pattern("3x", "p") == (Step(3.0),)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", f"--pattern: empty pattern; {HOW}"),
        ("fast", f"--pattern: bad step 'fast'; {HOW}"),
        ("1x for 20s, -4x for 5s, 1x", f"--pattern: bad step '-4x for 5s'; {HOW}"),
        ("1x for soon, 1x", f"--pattern: bad duration 'soon' in step '1x for soon'; {HOW}"),
        ("1x for 0s, 1x", f"--pattern: step '1x for 0s' must last more than 0s; {HOW}"),
        ("1x for 20s, 4x for 5s", f"--pattern: the last step '4x for 5s' holds until the cell ends: drop its "
                                  f"'for ...'; {HOW}"),
        ("1x for 20s, 4x, 1x", f"--pattern: step 2 '4x' needs a duration ('4x for 10s'): only the last step "
                               f"holds; {HOW}"),
        ("1x for 20s, 0x", f"--pattern: the last step '0x' must be above 0x (the rate would stay at 0); {HOW}"),
    ],
)
def test_pattern_errors_are_one_line_with_an_example(text: str, message: str) -> None:
    with pytest.raises(ServescopeError) as e:
        parse_pattern(text, "--pattern")
    assert e.value.message == message


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.one_of(st.text(max_size=30), st.from_regex(r"(\d{1,3}(\.\d)?x( for \d{1,4}(ms|s|m|h)?)?, ?){0,4}\d?x?")))
def test_pattern_parsing_never_fails_otherwise(text: str) -> None:
    try:
        steps = parse_pattern(text, "p")
    except ServescopeError as e:
        assert "\n" not in e.message
        return
    shape = RateShape(2.0, steps)
    times = list(islice(send_times("poisson", 5, 1.0, shape, random.Random(0)), 50))
    assert all(math.isfinite(t) and t >= 0 for t in times) and times == sorted(times)


# ---- labels ---------------------------------------------------------------------------------------------
def test_the_label_describes_the_shape() -> None:
    assert Load(rate=8, arrival="gamma", burstiness=0.5).label == "rate 8/s gamma(0.5)"
    assert Load(concurrency=16, ramp_s=10).label == "c=16 ramp 10s"
    assert Load(rate=2, arrival="poisson", max_concurrency=4).label == "rate 2/s poisson, cap 4"
    steps = parse_pattern("1x for 20s, 4x for 5s, 1x", "p")
    assert (Load(rate=2, arrival="poisson", ramp_s=5, pattern=steps, max_concurrency=4).label
            == "rate 2/s poisson ramp 5s steps 1x:20s 4x:5s 1x, cap 4")
    assert Load(rate=10, pattern=steps).peak_rate == 40 and Load(rate=10, pattern=steps).connections == 1024
    assert Load(rate=1, pattern=steps).connections == 240  # the pool is sized for the spike


# ---- in a cell: send times follow the ramp ------------------------------------------------------------
@pytest.fixture
def fake_stream(monkeypatch: pytest.MonkeyPatch) -> list[RequestRecord]:
    """The HTTP boundary faked: each request is 'sent' when called and takes 50 ms."""
    sent: list[RequestRecord] = []

    async def stream_request(http: object, opts: object, spec: object, rec: RequestRecord, **_: object) -> None:
        rec.sent_ns = time.perf_counter_ns()
        sent.append(rec)
        await asyncio.sleep(0.05)
        rec.end_ns = time.perf_counter_ns()
        rec.output_tokens = 5

    monkeypatch.setattr(load_mod, "stream_request", stream_request)
    return sent


async def _measured(cell: Coroutine[Any, Any, CellRun]) -> tuple[CellRun, float]:
    """Run a cell, and the most its event loop's timers ran late meanwhile (ms; a timer every 5 ms). A busy
    host delays the cell's sends and that timer alike: how late a send may be is judged against it."""
    probe = ClientProbe(period_s=0.005)
    probe.start()
    try:
        run = await cell
    finally:
        part = await probe.stop()
    return run, float(part.loop_lag_ms.max)


async def test_an_open_loop_ramps_its_rate(fake_stream: list[RequestRecord]) -> None:
    load = Load(rate=40.0, arrival="constant", ramp_s=0.5)
    run, lag_ms = await _measured(run_cell(ClientOptions(base_url="http://127.0.0.1:9", model="m"), [SPEC] * 30,
                                           load, Limits(requests=30), seed=1))
    assert len(run.records) == 30 and run.ramp_end_ns == run.start_ns + 500_000_000
    at = sorted((r.scheduled_ns - run.start_ns) / 1e9 for r in run.records)
    # M(t) = 40 t^2 / (2 x 0.5) during the ramp: request k at sqrt(k / 40); then 40/s
    want = [math.sqrt(k / 40) for k in range(11)] + [0.5 + (k - 10) / 40 for k in range(11, 30)]
    assert at == pytest.approx(want, abs=2e-9)
    assert sum(r.scheduled_ns < run.ramp_end_ns for r in run.records) == 10  # the metrics can tell them apart
    late = sorted((r.sent_ns - r.scheduled_ns) / 1e6 for r in run.records)
    assert late[0] >= 0 and late[len(late) // 2] < 20 + lag_ms, (late, lag_ms)  # sent on schedule (ms), never early


async def test_a_closed_loop_starts_its_users_over_the_ramp(fake_stream: list[RequestRecord]) -> None:
    load = Load(concurrency=4, ramp_s=0.4)
    run, lag_ms = await _measured(run_cell(ClientOptions(base_url="http://127.0.0.1:9", model="m"), [SPEC] * 40,
                                           load, Limits(requests=40)))
    assert len(run.records) == 40 and run.ramp_end_ns == run.start_ns + 400_000_000
    first = {}
    for r in sorted(run.records, key=lambda r: r.sent_ns):
        first.setdefault(r.user, r)
    assert sorted(first) == [0, 1, 2, 3]
    for u, r in first.items():
        assert r.scheduled_ns - run.start_ns == u * 100_000_000  # user u of 4 at u/4 x 0.4 s
        assert r.sent_ns >= r.scheduled_ns and (r.sent_ns - r.scheduled_ns) / 1e6 < 30 + lag_ms, lag_ms


async def test_a_closed_loop_without_a_ramp_starts_every_user_at_once(fake_stream: list[RequestRecord]) -> None:
    run, lag_ms = await _measured(run_cell(ClientOptions(base_url="http://127.0.0.1:9", model="m"), [SPEC] * 8,
                                           Load(concurrency=4), Limits(requests=8)))
    assert run.ramp_end_ns == 0
    starts = sorted(r.sent_ns for r in run.records)[:4]
    assert (starts[-1] - starts[0]) / 1e6 < 30 + lag_ms, lag_ms


async def test_a_ramp_longer_than_the_duration_does_not_hold_the_cell(fake_stream: list[RequestRecord]) -> None:
    t0 = time.perf_counter()
    run = await run_cell(ClientOptions(base_url="http://127.0.0.1:9", model="m"), [SPEC] * 4,
                         Load(concurrency=4, ramp_s=60), Limits(requests=None, duration_s=0.3))
    assert time.perf_counter() - t0 < 14  # user 1 of 4 is due at 15 s: a cell that waited for it took that long
    assert {r.user for r in run.records} == {0}  # the other users were due after the cell's end


POSITIVE = st.floats(min_value=1e-12, max_value=1e12, allow_nan=False, allow_infinity=False)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.floats(min_value=0, max_value=1e12), POSITIVE), max_size=4), POSITIVE)
def test_a_written_pattern_reads_back(steps: list[tuple[float, float]], last: float) -> None:
    pattern = (*(Step(m, d) for m, d in steps), Step(last))
    back = parse_pattern(pattern_text(pattern), "p")  # as a session stores it and resume reads it
    assert len(back) == len(pattern)
    for a, b in zip(back, pattern, strict=True):
        assert a.multiplier == pytest.approx(b.multiplier, rel=1e-11)
        assert (a.duration_s is None) == (b.duration_s is None)
        if a.duration_s is not None:
            assert a.duration_s == pytest.approx(b.duration_s, rel=1e-11)
