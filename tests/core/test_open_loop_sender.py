"""The open loop's sender (issue 46): it walks its schedule from one coroutine with one task per request and none
per sleep, sends what is due together, never early, and keeps its schedule as well as the loop's own timers keep
theirs; request bodies are encoded before the cell starts."""

from __future__ import annotations

import asyncio
import time

import pytest

from servescope.core import client as client_mod
from servescope.core import load as load_mod
from servescope.core.client import Bodies, ClientOptions, RequestSpec, build_body
from servescope.core.health import ClientProbe
from servescope.core.load import CellControl, Limits, Load, _Alarm, run_cell
from servescope.core.records import RequestRecord

uvloop = pytest.importorskip("uvloop")
OPTS = ClientOptions(base_url="http://127.0.0.1:9", model="m")


@pytest.fixture
def fake_stream(monkeypatch: pytest.MonkeyPatch) -> list[tuple[RequestRecord, object]]:
    """The HTTP boundary faked: a request is 'sent' when called and answered 20 ms later; the bodies it was given
    are kept."""
    sent: list[tuple[RequestRecord, object]] = []

    async def stream_request(http: object, opts: object, spec: RequestSpec, rec: RequestRecord,
                             reply: object = None, bodies: Bodies | None = None) -> None:
        rec.sent_ns = time.perf_counter_ns()
        sent.append((rec, bodies.body(spec) if bodies is not None else None))
        await asyncio.sleep(0.02)
        rec.end_ns = time.perf_counter_ns()
        rec.output_tokens = 1

    monkeypatch.setattr(load_mod, "stream_request", stream_request)
    return sent


def _run(coro_fn):  # type: ignore[no-untyped-def]
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as r:
        return r.run(coro_fn())


def test_one_task_per_request_and_none_per_sleep(fake_stream: list[tuple[RequestRecord, object]]) -> None:
    """400 requests at 2,000/s: each wait for the next send is a timer, not a task (asyncio.wait_for made one per
    send), so the cell creates one task per request and a handful besides."""
    made = [0]

    async def go() -> int:
        loop = asyncio.get_running_loop()

        def factory(lp: asyncio.AbstractEventLoop, coro, **kw):  # type: ignore[no-untyped-def]
            made[0] += 1
            return asyncio.Task(coro, loop=lp, **kw)

        loop.set_task_factory(factory)
        run = await run_cell(OPTS, [RequestSpec("completions", "p", 4, 1)] * 10,
                             Load(rate=2000.0, arrival="constant"), Limits(requests=400), seed=1)
        return len(run.records)

    assert _run(go) == 400
    assert 400 <= made[0] <= 400 + 10, made[0]


def test_sends_keep_their_schedule_as_well_as_the_loops_timers(fake_stream: list[tuple[RequestRecord, object]]) -> None:
    """Never early, and late at most as late as a timer on the same loop ran (a probe ticking every 5 ms beside the
    cell: a busy host delays both alike) plus 2 ms (uvloop's millisecond timers)."""

    async def go() -> tuple[list[float], float]:
        probe = ClientProbe(period_s=0.005)
        probe.start()
        try:
            run = await run_cell(OPTS, [RequestSpec("completions", "p", 4, 1)] * 10,
                                 Load(rate=1000.0, arrival="poisson"), Limits(requests=600), seed=3)
        finally:
            part = await probe.stop()
        late = sorted((r.sent_ns - r.scheduled_ns) / 1e6 for r in run.records)
        return late, float(part.loop_lag_ms.max or 0.0)

    late, lag_ms = _run(go)
    assert len(late) == 600 and late[0] >= 0
    assert late[int(0.99 * len(late))] <= lag_ms + 2.0, (late[-10:], lag_ms)


def test_sends_due_together_go_out_in_one_wake_up() -> None:
    """A trace whose 50 requests are all due at one instant: the sender sleeps once, then sends them all."""
    seen: list[int] = []

    async def go() -> None:
        alarm = _Alarm(CellControl())
        when = time.perf_counter_ns() + 3_000_000
        for _ in range(50):
            assert await alarm.until(when)
            seen.append(time.perf_counter_ns() - when)
        assert alarm.sleeps <= 3  # one, and a second for a timer that fired a little early
        alarm.close()

    _run(go)
    assert min(seen) >= 0


def test_a_wait_shorter_than_a_timer_tick_is_no_busy_wait() -> None:
    """uvloop's timers count whole milliseconds from the loop's cached clock: a wait of 0.3 ms on one fired at once,
    again and again until the time came (at 2,000 sends a second, 48 wake-ups per send and most of a core). A short
    wait now takes a wake-up or two (three at most, for timers that fired a little early), and is never early."""
    early: list[int] = []

    async def go() -> int:
        alarm = _Alarm(CellControl())
        for _ in range(20):
            when = time.perf_counter_ns() + 300_000
            assert await alarm.until(when)
            early.append(when - time.perf_counter_ns())
        alarm.close()
        return alarm.sleeps

    sleeps = _run(go)
    assert max(early) <= 0
    assert sleeps <= 3 * 20, sleeps


def test_an_open_loop_at_2000_per_s_wakes_less_than_once_per_send(
        fake_stream: list[tuple[RequestRecord, object]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Sends due within a millisecond go out in one wake-up: at 2,000 requests/s (one due every 0.5 ms) the sender
    sleeps at most about once per send, not dozens of times."""
    alarms: list[_Alarm] = []
    real = load_mod._Alarm

    def keep(control: CellControl) -> _Alarm:
        alarms.append(real(control))
        return alarms[-1]

    monkeypatch.setattr(load_mod, "_Alarm", keep)

    async def go() -> int:
        run = await run_cell(OPTS, [RequestSpec("completions", "p", 4, 1)] * 10,
                             Load(rate=2000.0, arrival="constant"), Limits(requests=400), seed=1)
        return len(run.records)

    assert _run(go) == 400
    assert alarms and alarms[0].sleeps <= 400, alarms[0].sleeps


def test_a_drain_wakes_a_sleeping_sender() -> None:
    async def go() -> bool:
        control = CellControl()
        alarm = _Alarm(control)
        asyncio.get_running_loop().call_later(0.01, control.request_drain, "drained")
        try:
            return await asyncio.wait_for(alarm.until(time.perf_counter_ns() + 60 * 10**9), 30)
        finally:
            alarm.close()

    assert _run(go) is False


def test_bodies_are_encoded_before_the_cell(fake_stream: list[tuple[RequestRecord, object]],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Every send of the measured part finds its body encoded: no JSON encoding happens after the first send."""
    specs = [RequestSpec("completions", f"prompt {i}", 4, 1) for i in range(5)]
    encoded_after_start: list[RequestSpec] = []
    real = client_mod.build_body

    def spy(spec: RequestSpec, opts: ClientOptions) -> bytes:
        if fake_stream:
            encoded_after_start.append(spec)
        return real(spec, opts)

    monkeypatch.setattr(client_mod, "build_body", spy)
    _run(lambda: run_cell(OPTS, specs, Load(rate=500.0, arrival="constant"), Limits(requests=20), seed=1))
    assert len(fake_stream) == 20 and not encoded_after_start
    assert [b for _, b in fake_stream][:5] == [real(s, OPTS) for s in specs]


def test_prepared_bodies_follow_a_setting_the_server_refused() -> None:
    opts = ClientOptions(base_url="http://127.0.0.1:9", model="m")
    spec = RequestSpec("completions", "hello", 4, 2)
    bodies = Bodies([spec, spec], opts)
    assert bodies.body(spec) is bodies.body(spec) and b'"ignore_eos":true' in bodies.body(spec)
    opts.ignore_eos = False  # a server refused it mid-cell: the rest are encoded without it
    assert bodies.body(spec) == build_body(spec, opts) and b"ignore_eos" not in bodies.body(spec)
    other = RequestSpec("completions", "not prepared", 4, 2)
    assert bodies.body(other) == build_body(other, opts)
    small = Bodies([RequestSpec("completions", "x" * 100, 4, 2), spec], ClientOptions("http://h", "m"), budget=10)
    assert len(small.by_id) == 1  # past the budget the rest are encoded at their send
