"""The client's own health (core/health.py): the probe measures a blocked loop and an idle one, parts merge,
and `judge_client` grades each figure against its thresholds with a reason naming it."""

from __future__ import annotations

import asyncio
import json
import time
from array import array
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from servescope.core import health
from servescope.core.health import (
    BUNCHED_SHARE,
    CPU_UTIL,
    LAG_PERIOD_S,
    LOOP_LAG_P99_MS,
    SEND_LATE_P99_MS,
    ClientPart,
    ClientProbe,
    client_text,
    judge_client,
    merge_client,
)
from servescope.core.metrics import client_figures, records_frame, summarize
from servescope.core.records import RequestRecord
from servescope.core.results import CellResult, ClientHealth, LoopLag
from tests.sessions.conftest import CellSpec, _records


def part(cpu: float = 0.2, p99: float = 1.0, wait: float | None = 0.0, **kw: Any) -> ClientPart:
    return msgspec.convert({"loop_lag_ms": {"p50": 0.5, "p99": p99, "max": p99 * 2}, "cpu_s": cpu * 10,
                            "wall_s": 10.0, "cpu_util": cpu, "cpu_wait_share": wait, "loop_cpu_s": cpu * 9,
                            "workers": 1, "lag_samples": [0.5] * 98 + [p99, p99 * 2], **kw}, ClientPart)


# ---- judge_client -----------------------------------------------------------------------------------
def test_healthy_part_is_ok_without_reasons() -> None:
    c = judge_client(part(), send_late_p99_ms=1.0, bunched_share=0.02)
    assert c is not None
    assert c.verdict == "ok" and c.reasons == []
    assert c.loop_lag_ms == LoopLag(p50=0.5, p99=1.0, max=2.0)
    assert c.cpu_util == 0.2 and c.workers == 1
    d = c.to_dict()
    assert "lag_samples" not in d  # the raw samples never reach the summary
    assert {"verdict", "loop_lag_ms", "cpu_util", "workers", "reasons"} <= set(d)
    json.dumps(d)


def test_the_workers_start_skew_reaches_the_saved_summary() -> None:
    """Several workers: how far the last one started after the common instant is part of the cell's `client`
    entry, typed, and written only when measured."""
    c = judge_client(part(workers=2, start_skew_ms=3.5))
    assert c is not None and c.start_skew_ms == 3.5
    typed = CellResult.from_dict({"requests_ok": 1, "client": c.to_dict()})
    assert typed.client is not None and typed.client.start_skew_ms == 3.5
    assert typed.to_dict()["client"]["start_skew_ms"] == 3.5
    one = judge_client(part())
    assert one is not None and "start_skew_ms" not in one.to_dict()
    assert "start_skew_ms" not in CellResult.from_dict({"client": one.to_dict()}).to_dict()["client"]


def test_no_part_no_verdict() -> None:
    assert judge_client(None) is None


@pytest.mark.parametrize(("kw", "verdict", "reason"), [
    ({"cpu": 0.80}, "strained", "CPU 80% of a core (strained above 70%)"),
    ({"cpu": 0.96}, "bound", "CPU 96% of a core (bound above 90%)"),
    ({"cpu": 0.45, "wait": 0.50}, "bound", "CPU 45% of a core + 50% waiting for a CPU = 95% (bound above 90%)"),
    ({"p99": 30.0}, "strained", "event-loop lag p99 30.0 ms (strained above 20 ms)"),
    ({"p99": 60.0}, "bound", "event-loop lag p99 60.0 ms (bound above 50 ms)"),
])
def test_each_probe_figure_grades(kw: dict[str, float], verdict: str, reason: str) -> None:
    c = judge_client(part(**kw))
    assert c is not None and c.verdict == verdict
    assert c.reasons == [reason]


def test_record_figures_grade() -> None:
    late = judge_client(part(), send_late_p99_ms=60.0)
    assert late is not None and late.verdict == "bound"
    assert late.reasons == ["sends late against their schedule p99 60.0 ms (bound above 50 ms)"]
    bunched = judge_client(part(), bunched_share=0.35)
    assert bunched is not None and bunched.verdict == "strained"
    assert bunched.reasons == ["35% of tokens read together with the previous one (strained above 30%)"]


def test_at_the_threshold_is_not_past_it() -> None:
    c = judge_client(part(cpu=CPU_UTIL[0], p99=LOOP_LAG_P99_MS[0]), send_late_p99_ms=SEND_LATE_P99_MS[0],
                     bunched_share=BUNCHED_SHARE[0])
    assert c is not None and c.verdict == "ok"


def test_worst_figure_wins_and_every_figure_past_a_threshold_is_named() -> None:
    c = judge_client(part(cpu=0.75, p99=120.0), bunched_share=0.5)
    assert c is not None and c.verdict == "bound"
    assert [r.split(" (")[-1] for r in c.reasons] == ["strained above 70%)", "bound above 50 ms)",
                                                         "strained above 30%)"]


def test_client_text() -> None:
    ok = judge_client(part(p99=0.4, cpu=0.23))
    assert client_text(ok) == "ok (loop lag p99 0.4 ms, CPU 23% of one core, 1 worker)"
    bound = judge_client(part(cpu=0.96))
    assert client_text(bound) == ("BOUND (CPU 96% of a core (bound above 90%)): the client, not the server, "
                                  "limited this cell")
    assert bound is not None and client_text(ClientHealth.from_dict(bound.to_dict())) == client_text(bound)
    assert client_text(None) == ""


# ---- merge_client -----------------------------------------------------------------------------------
def test_merge_of_workers() -> None:
    a = part(cpu=0.3, p99=2.0, nodes={"n1": 10}, clock_error_ms=0.2)
    b = part(cpu=0.8, p99=40.0, wait=0.1, nodes={"n1": 5, "n2": 7}, clock_error_ms=0.5)
    m = merge_client([a, None, b])
    assert m is not None
    assert m.workers == 2
    assert m.cpu_util == 0.8  # the busiest worker: the one that saturates first
    assert m.cpu_s == pytest.approx(11.0)  # every worker's CPU together
    assert m.cpu_wait_share == 0.1
    assert len(m.lag_samples) == 200
    assert m.loop_lag_ms.max == 80.0  # the worst worker's lag is the cell's
    assert m.nodes == {"n1": 15, "n2": 7}
    assert m.clock_error_ms == 0.5
    j = judge_client(m)
    assert j is not None and j.verdict == "strained" and j.workers == 2
    assert "busiest of its workers" in j.reasons[0]
    assert j.nodes == {"n1": 15, "n2": 7} and j.clock_error_ms == 0.5


def test_merge_of_one_and_of_none() -> None:
    a = part()
    assert merge_client([a]) == a
    assert merge_client([]) is None
    assert merge_client([None, None]) is None


# ---- the probe's cadence, on a clock and a timer this test drives ---------------------------------------
class DrivenLoop:
    """Stands in for the loop's timer: keeps what the probe asks for (`call_later`) and runs it when told."""

    def __init__(self) -> None:
        self.asked: list[float] = []  # each delay the probe asked for
        self.due: Any = None

    def call_later(self, delay: float, callback: Any) -> asyncio.TimerHandle:
        self.asked.append(delay)
        self.due = callback
        return asyncio.TimerHandle(0.0, callback, (), asyncio.get_running_loop())


def _clock(monkeypatch: pytest.MonkeyPatch, now: list[float]) -> None:
    """The probe's perf_counter reads `now[0]` (its CPU clocks stay real)."""
    monkeypatch.setattr(health, "time", SimpleNamespace(perf_counter=lambda: now[0], process_time=time.process_time,
                                                         thread_time=time.thread_time))


def test_probe_cadence_a_late_tick_does_not_make_the_next_ones_late(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    _clock(monkeypatch, now)

    async def go() -> tuple[DrivenLoop, ClientPart]:
        timer = DrivenLoop()
        monkeypatch.setattr(asyncio.get_running_loop(), "call_later", timer.call_later)
        p = ClientProbe(period_s=0.1)
        p.start()
        for step in (0.1, 0.102, 0.348, 0.0, 0.1):  # on time, 2 ms late, 250 ms late, the reset tick, on time
            now[0] += step
            timer.due()
        return timer, await p.stop()

    timer, out = asyncio.run(go())
    assert out.lag_samples == pytest.approx([0.0, 2.0, 250.0, 0.0, 0.0], abs=1e-6)
    # the next tick is due a period after the previous one's due time; after a late one, at once (no burst of
    # catch-up ticks, each of which would look late by one period less)
    assert timer.asked == pytest.approx([0.1, 0.1, 0.098, 0.0, 0.1, 0.1], abs=1e-9)
    assert out.wall_s == pytest.approx(0.65) and out.loop_lag_ms.max == pytest.approx(250.0)


def test_probe_keeps_every_other_sample_past_its_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    _clock(monkeypatch, now)
    monkeypatch.setattr(health, "MAX_LAG_SAMPLES", 4)

    async def go() -> ClientPart:
        timer = DrivenLoop()
        monkeypatch.setattr(asyncio.get_running_loop(), "call_later", timer.call_later)
        p = ClientProbe(period_s=1.0)
        p.start()
        for k in range(1, 13):  # tick k (due at k s) runs k ms late
            now[0] = k + 0.001 * k
            timer.due()
        return await p.stop()

    out = asyncio.run(go())
    # ticks 1-4 kept, then halved to 1, 3 with every 2nd tick kept from there (6, 8); at 4 again halved to
    # 1, 6 with every 4th kept (12)
    assert out.lag_samples == pytest.approx([1.0, 6.0, 12.0], abs=1e-6)


# ---- the probe on a real event loop --------------------------------------------------------------
async def _until(cond: Any, limit_s: float = 60.0) -> None:
    """Return once `cond()` holds; fail after `limit_s` (a generous limit: it returns as soon as it holds)."""
    async with asyncio.timeout(limit_s):
        while not cond():  # noqa: ASYNC110 - the probe has no event to wait on: its samples are polled
            await asyncio.sleep(0.01)


def test_probe_sees_a_blocked_loop() -> None:
    async def go() -> ClientPart:
        p = ClientProbe()
        p.start()
        # the loop's thread held 300 ms by a callback that runs before the first tick (due at 100 ms, a timer),
        # which then runs at least 200 ms late
        asyncio.get_running_loop().call_soon(time.sleep, 0.3)
        await _until(lambda: len(p.lags) >= 2)
        return await p.stop()

    out = asyncio.run(go())
    assert out.loop_lag_ms.max >= 200.0 - 1.0  # less only by the two clocks' reading order
    assert out.workers == 1 and out.wall_s >= 0.3
    j = judge_client(out)
    assert j is not None and j.verdict == "bound", j  # p99 over few samples: the blocked tick


def test_probe_on_an_idle_loop_sees_much_less_lag_than_on_a_blocked_one() -> None:
    """Relative, so that it holds on a busy host too (a loaded machine delays every timer a little, and both
    probes alike); the absolute figure of an idle loop's lag is `benchmarks/loop_timings.py`'s."""

    async def go() -> tuple[ClientPart, ClientPart]:
        idle = ClientProbe()
        idle.start()
        await _until(lambda: len(idle.lags) >= 10)
        quiet = await idle.stop()
        blocked = ClientProbe()
        blocked.start()
        asyncio.get_running_loop().call_soon(time.sleep, 0.3)
        await _until(lambda: len(blocked.lags) >= 2)
        return quiet, await blocked.stop()

    idle, blocked = asyncio.run(go())
    # one sample per period, never more (ticks are not early), fewer only when a tick ran late
    assert 10 <= len(idle.lag_samples) <= idle.wall_s / LAG_PERIOD_S + 1
    # lateness against each tick's due time, not the time between ticks (that would be a period, 100 ms)
    assert idle.loop_lag_ms.p50 < LAG_PERIOD_S * 1000 / 2, idle.loop_lag_ms
    assert idle.loop_lag_ms.p50 < blocked.loop_lag_ms.max / 4, (idle.loop_lag_ms, blocked.loop_lag_ms)
    assert idle.cpu_util < 0.5


def test_probe_counts_cpu() -> None:
    async def go() -> ClientPart:
        p = ClientProbe()
        p.start()
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.25:  # CPU work on the loop's thread (CPU time: a busy host only delays it)
            pass
        return await p.stop()

    out = asyncio.run(go())
    # the two clocks are read at slightly different moments and with different resolutions: a margin
    assert out.cpu_s >= 0.2 and out.loop_cpu_s >= 0.2
    assert out.cpu_util > 0.0


# ---- figures from the records and the typed summary ---------------------------------------------
def _rec(i: int, stamps: list[int], scheduled: int = 0, sent: int = 0) -> RequestRecord:
    r = RequestRecord(index=i, user=-1, warmup=False, input_tokens_requested=10, output_tokens_requested=len(stamps),
                      scheduled_ns=scheduled, sent_ns=sent or scheduled)
    r.first_token_ns = stamps[0]
    r.chunk_ns = array("q", stamps)
    r.chunk_tokens = array("i", [1] * len(stamps))
    r.end_ns = stamps[-1] + 1
    r.output_tokens = len(stamps)
    r.prompt_tokens = 10
    return r


def test_bunched_share_and_send_lateness() -> None:
    # request 0: 4 events after its first, 2 stamped with the previous one; request 1: 2 after, none bunched
    recs = [_rec(0, [100, 200, 200, 300, 300], scheduled=0, sent=2_000_000),
            _rec(1, [1000, 1100, 1200], scheduled=10, sent=10)]
    df = records_frame(recs)
    figs = client_figures(df, open_loop=True)
    assert figs["bunched_share"] == pytest.approx(2 / 6)
    assert figs["send_late_p99_ms"] == pytest.approx(2.0 * 0.99, rel=0.01)
    assert client_figures(df, open_loop=False)["send_late_p99_ms"] is None


def test_summary_round_trip_with_the_client() -> None:
    recs, wall = _records(CellSpec("w", 4))
    s = summarize(records_frame(recs), wall).to_dict()
    client = judge_client(part(cpu=0.95), send_late_p99_ms=None, bunched_share=0.0)
    assert client is not None
    s["client"] = client.to_dict()
    cs = CellResult.from_dict(s)
    assert cs.to_dict() == s
    assert json.dumps(cs.to_dict()) == json.dumps(s)  # key order too
    assert cs.client is not None and cs.client.verdict == "bound" and cs.client_bound
    assert cs.value("client", "cpu_util") == 0.95
    client = judge_client(part(nodes={"a": 3}, clock_error_ms=1.5))
    assert client is not None and client.nodes == {"a": 3} and client.clock_error_ms == 1.5
    s["client"] = client.to_dict()
    assert CellResult.from_dict(s).to_dict() == s
    del s["client"]
    cs = CellResult.from_dict(s)
    assert cs.client is None and not cs.client_bound and "client" not in cs.to_dict()


def test_the_telemetry_cost_is_in_the_client_line_and_the_summary() -> None:
    """The /metrics scrapes' own CPU is said per second of the cell and per scrape; it never changes the verdict."""
    c = judge_client(part(p99=0.4, cpu=0.23), scrapes=20, scrape_cpu_s=0.012)
    assert c is not None and c.verdict == "ok"
    assert c.telemetry_cpu_ms_per_s == pytest.approx(1.2) and c.telemetry_ms_per_scrape == pytest.approx(0.6)
    assert client_text(c) == ("ok (loop lag p99 0.4 ms, CPU 23% of one core, 1 worker, /metrics scrapes 1.20 ms CPU/s "
                              "(0.60 ms each))")
    d = c.to_dict()
    assert d["telemetry_cpu_ms_per_s"] == pytest.approx(1.2)
    assert ClientHealth.from_dict(d) == c
    off = judge_client(part())  # no scrape in the cell: nothing said, and nothing saved
    assert off is not None and "/metrics" not in client_text(off)
    assert "telemetry_cpu_ms_per_s" not in off.to_dict()
