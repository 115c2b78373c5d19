"""The client's own health during a cell: is the load generator the bottleneck?

A benchmark whose client saturates measures the client. Each process that sends load measures, over the
measured part of a cell:

- event-loop lag: a timer due every `LAG_PERIOD_S` notes how late it ran (a loop busy with other callbacks
  runs it late: every stamp taken on that loop is late by as much);
- CPU: the process's CPU time (every thread) over the wall time, as a share of one core (one Python process
  runs its load on one core: near 1.0 it has no headroom left);
- CPU wait (Linux): the time the loop's thread was ready to run but waited for a CPU other programs held
  (the kernel's run-queue delay, /proc/thread-self/schedstat), as a share of the wall time. CPU plus CPU wait
  is the share of a core the client wanted: a client that shares its core with a busy program uses only
  half of it, yet wants all of it.

`ClientProbe` measures one process; `merge_client` joins the parts of several worker processes (or Ray
actors) into the cell's figure: the worst loop lag, the busiest worker's CPU, and the workers counted.
The verdict (`ok | strained | bound`, with reasons) is `judge_client`, which also weighs the schedule
lateness of sends and the share of tokens whose events arrived together in one read (both from the records:
`core.metrics.client_figures`). `client_text` is its one line for people (CLI, reports, the app).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

import msgspec

from servescope.core.results import ClientHealth, LoopLag

LAG_PERIOD_S = 0.1  # the probe's timer period: 10 ticks a second (each wake-up of an idle loop costs ~0.1 ms of CPU here)
MAX_LAG_SAMPLES = 200_000  # an hour-long cell keeps every 2nd, 4th, ... sample beyond this

# thresholds of the verdict: `strained` past the first, `bound` past the second. Measured on this project's
# 2-core machine (the simulator on the same cores): a healthy `-c 8 -n 100` cell at a quiet moment had loop lag
# p99 4 ms, 12% CPU, 2% of tokens bunched; while other benchmarks loaded the machine (load average 5-11), an
# idle probe's lag p99 was 6-41 ms (p50 1.3 ms: epoll's millisecond timeouts) and the same cell's 16 ms with
# 10% bunched. A client pinned to a core beside a busy loop at a lower priority (nice 10), at -c 256: CPU 7-11%
# + 46-76% waiting for a CPU, lag p99 67-160 ms, 4-41% bunched (tests/integration/test_client_health.py).
CPU_UTIL = (0.70, 0.90)  # the busiest worker's CPU plus its loop's wait for a CPU, share of one core
LOOP_LAG_P99_MS = (20.0, 50.0)
SEND_LATE_P99_MS = (10.0, 50.0)  # open loop: sends later than their schedule (a trace cell is flagged past 10)
BUNCHED_SHARE = (0.30, 0.60)  # tokens stamped together with the previous one (read late, in one piece)


def _pct(sorted_vals: Sequence[float], q: float) -> float:
    if not sorted_vals:
        return 0.0
    pos = q * (len(sorted_vals) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def lag_summary(lags_ms: Sequence[float]) -> LoopLag:
    s = sorted(lags_ms)
    return LoopLag(p50=_pct(s, 0.5), p99=_pct(s, 0.99), max=s[-1] if s else 0.0)


class ClientPart(msgspec.Struct, kw_only=True, frozen=True):
    """One process's measure of itself over a cell's measured part (`ClientProbe.part`), or several joined
    (`merge_client`): what crosses from a worker process or Ray actor to the driver, pickled. Its raw lag
    samples travel too, so parts merge exactly. None where not measured: a part of only a Ray actor's placement
    (`nodes`, `clock_error_ms`) measured nothing."""

    loop_lag_ms: LoopLag | None = None
    cpu_s: float | None = None
    wall_s: float | None = None
    cpu_util: float | None = None
    loop_cpu_s: float | None = None  # the event loop's own thread's CPU time
    cpu_wait_s: float | None = None
    cpu_wait_share: float | None = None
    workers: int = 1
    lag_samples: list[float] = msgspec.field(default_factory=list)
    nodes: dict[str, int] | None = None  # Ray: node -> requests
    clock_error_ms: float | None = None  # Ray: the bound on the actors' clocks' offset
    start_skew_ms: float | None = None  # several workers: how far the last one started after t0


def run_queue_wait_s() -> float | None:
    """The calling thread's time spent ready to run but waiting for a CPU, in s (Linux's schedstat); None where
    the kernel does not say."""
    try:
        fields = Path("/proc/thread-self/schedstat").read_text().split()
        return int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


class ClientProbe:
    """Measures this process while a cell's load runs on the current event loop: `start()` then `stop()`.
    `stop()` returns its `ClientPart`."""

    def __init__(self, period_s: float = LAG_PERIOD_S) -> None:
        self.period_s = period_s
        self.lags: list[float] = []
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._due = 0.0
        self._n = 0
        self._cpu0 = 0.0
        self._wall0 = 0.0
        self._stride = 1
        self._thread0 = 0.0
        self._wait0: float | None = None

    def start(self) -> None:
        self._cpu0 = time.process_time()
        self._thread0 = time.thread_time()
        self._wait0 = run_queue_wait_s()
        self._wall0 = time.perf_counter()
        self._loop = asyncio.get_running_loop()
        self._due = self._wall0 + self.period_s
        self._handle = self._loop.call_later(self.period_s, self._tick)

    def close(self) -> None:
        """Stop measuring without waiting (the cell failed or was cancelled)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        # a plain timer callback, no task: a tick costs a few microseconds (a task woken 100 times a second
        # cost ~16 ms of CPU per second); lateness on perf_counter (uvloop's loop clock has 1 ms steps)
        now = time.perf_counter()
        self._n += 1
        if self._n % self._stride == 0:
            self.lags.append(max(0.0, (now - self._due) * 1000.0))
            if len(self.lags) >= MAX_LAG_SAMPLES:
                self.lags = self.lags[::2]
                self._stride *= 2
        self._due = max(self._due + self.period_s, now)  # a late tick does not make the next ones look late too
        if self._loop is not None:
            self._handle = self._loop.call_later(max(0.0, self._due - time.perf_counter()), self._tick)

    async def stop(self) -> ClientPart:
        self.close()
        return self.part()

    def part(self) -> ClientPart:
        """Call it on the loop's thread (`loop_cpu_s` is that thread's own CPU time)."""
        cpu = time.process_time() - self._cpu0
        loop_cpu = time.thread_time() - self._thread0
        wait1 = run_queue_wait_s()
        wall = max(1e-9, time.perf_counter() - self._wall0)
        wait = max(0.0, wait1 - self._wait0) if wait1 is not None and self._wait0 is not None else None
        return ClientPart(loop_lag_ms=lag_summary(self.lags), cpu_s=cpu, wall_s=wall, cpu_util=cpu / wall,
                          loop_cpu_s=loop_cpu, cpu_wait_s=wait, cpu_wait_share=wait / wall if wait is not None else None,
                          workers=1, lag_samples=list(self.lags))


def merge_client(parts: Sequence[ClientPart | None]) -> ClientPart | None:
    """One cell's client figure from its workers' parts: loop lag over every worker's samples, CPU of the
    busiest worker (`cpu_util`, the one that saturates first) and of all together (`cpu_s`), `workers` summed;
    `nodes` (Ray: node -> requests) summed when present."""
    got = [p for p in parts if p is not None]
    if not got:
        return None
    if len(got) == 1:
        return got[0]
    lags: list[float] = []
    for p in got:
        lags.extend(p.lag_samples)
    measured = [p.loop_lag_ms for p in got if p.loop_lag_ms is not None]
    out = ClientPart(
        loop_lag_ms=lag_summary(lags) if lags else max(measured, key=lambda d: d.p99 or 0.0, default=None),
        cpu_s=sum(p.cpu_s or 0.0 for p in got),
        wall_s=max(p.wall_s or 0.0 for p in got),
        cpu_util=max(p.cpu_util or 0.0 for p in got),
        cpu_wait_share=max((p.cpu_wait_share for p in got if p.cpu_wait_share is not None), default=None),
        loop_cpu_s=sum(p.loop_cpu_s or 0.0 for p in got),
        workers=sum(p.workers or 1 for p in got),
        lag_samples=lags,
    )
    return add_placement(out, got)


def add_placement(out: ClientPart, parts: Sequence[ClientPart]) -> ClientPart:
    """`out` with the parts' Ray placement: `nodes` (node -> requests) summed, the worst `clock_error_ms`."""
    nodes: dict[str, int] = {}
    for p in parts:
        for k, v in (p.nodes or {}).items():
            nodes[k] = nodes.get(k, 0) + v
    bounds = [p.clock_error_ms for p in parts if p.clock_error_ms is not None]
    return msgspec.structs.replace(out, nodes=nodes or out.nodes,
                                   clock_error_ms=max(bounds) if bounds else out.clock_error_ms)


# --------------------------------------------------------------------------------------------------------
# the verdict
# --------------------------------------------------------------------------------------------------------

VERDICTS = ("ok", "strained", "bound")


def _num(v: float | None) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if f == f and f not in (float("inf"), float("-inf")) else None


def _grade(value: float | None, limits: tuple[float, float]) -> int:
    """0 within the first threshold, 1 past it, 2 past the second (None: not measured, 0)."""
    if value is None:
        return 0
    return 2 if value > limits[1] else 1 if value > limits[0] else 0


class RateShortfall(msgspec.Struct, frozen=True):
    """An open loop with a duration whose send schedule was behind the clock when the duration ended
    (core.load.CellRun.behind_s): the rate asked was not reached. `sent` requests went out over `duration_s`."""

    behind_s: float
    duration_s: float
    sent: int
    asked_per_s: float

    @property
    def reached(self) -> bool:
        return self.behind_s * 1000.0 <= SEND_LATE_P99_MS[1]

    def text(self) -> str:
        return (f"the rate was not reached: {self.sent:,} requests sent in {self.duration_s:g} s "
                f"({self.sent / max(self.duration_s, 1e-9):,.1f} req/s of {self.asked_per_s:,.6g} asked), the send "
                f"schedule {self.behind_s:.1f} s behind when the duration ended")


def judge_client(part: ClientPart | None, send_late_p99_ms: float | None = None,
                 bunched_share: float | None = None, shortfall: RateShortfall | None = None,
                 scrapes: int = 0, scrape_cpu_s: float | None = None) -> ClientHealth | None:
    """The cell's `client` entry from its merged probe part (`merge_client`) and two figures from its records:
    `send_late_p99_ms` (an uncapped open loop's sends after their schedule, p99; None for a closed loop or a
    capped one, whose sends wait for a slot by design) and `bunched_share` (tokens stamped at the same
    nanosecond as the request's previous one). Each figure is graded against its thresholds (`strained` past
    the first, `bound` past the second); the verdict is the worst grade, and each figure past a threshold
    gives one reason naming it and the threshold. An open loop that did not reach its rate (`shortfall`, its
    schedule behind past the send-late bound when the duration ended) is `bound`, saying so first. None when
    there is no part (a cell that did not run). `scrapes` and `scrape_cpu_s`: the /metrics scrapes in the cell and
    their CPU (the telemetry's own cost, `core.telemetry.MetricsSampler.scrape_cost`), said per second of the cell
    and per scrape; not judged (it is no load)."""
    if part is None:
        return None
    tele_s = tele_scrape = None
    if scrapes and scrape_cpu_s is not None:
        tele_scrape = scrape_cpu_s / scrapes * 1000.0
        wall = _num(part.wall_s)
        tele_s = scrape_cpu_s / wall * 1000.0 if wall else None
    lag = part.loop_lag_ms or LoopLag()
    lag_ms = LoopLag(p50=_num(lag.p50), p99=_num(lag.p99), max=_num(lag.max))
    cpu = _num(part.cpu_util)
    wait = _num(part.cpu_wait_share)
    demand = None if cpu is None else cpu + (wait or 0.0)
    workers = part.workers or 1
    late = _num(send_late_p99_ms)
    bunched = _num(bunched_share)

    def cpu_reason(v: float, t: float, w: str) -> str:
        busy = f"CPU {(cpu or 0.0) * 100:.0f}% of a core{_busiest(workers)}"
        if wait:  # the share it waited for a CPU others held: it wanted that much more
            busy += f" + {wait * 100:.0f}% waiting for a CPU = {v * 100:.0f}%"
        return f"{busy} ({w} above {t * 100:.0f}%)"

    checks = (
        (demand, CPU_UTIL, cpu_reason),
        (lag_ms.p99, LOOP_LAG_P99_MS, lambda v, t, w: f"event-loop lag p99 {v:.1f} ms ({w} above {t:g} ms)"),
        (late, SEND_LATE_P99_MS, lambda v, t, w: f"sends late against their schedule p99 {v:.1f} ms ({w} above {t:g} ms)"),
        (bunched, BUNCHED_SHARE,
         lambda v, t, w: f"{v * 100:.0f}% of tokens read together with the previous one ({w} above {t * 100:.0f}%)"),
    )
    grade = 0
    reasons: list[str] = []
    if shortfall is not None and not shortfall.reached:
        grade = 2
        reasons.append(shortfall.text())
    for value, limits, text in checks:
        g = _grade(value, limits)
        if g and value is not None:
            reasons.append(text(value, limits[g - 1], "bound" if g == 2 else "strained"))
        grade = max(grade, g)
    return ClientHealth(
        verdict=VERDICTS[grade],
        loop_lag_ms=lag_ms,
        cpu_util=cpu,
        workers=workers,
        reasons=reasons,
        cpu_wait_share=wait,
        cpu_s=_num(part.cpu_s),
        wall_s=_num(part.wall_s),
        loop_cpu_s=_num(part.loop_cpu_s),
        bunched_share=bunched,
        send_late_p99_ms=late,
        nodes=dict(part.nodes) if part.nodes else None,
        clock_error_ms=_num(part.clock_error_ms),
        start_skew_ms=_num(part.start_skew_ms),  # several workers: the last one's start after the common t0
        rate_behind_s=_num(shortfall.behind_s) if shortfall is not None and not shortfall.reached else None,
        telemetry_cpu_ms_per_s=_num(tele_s),
        telemetry_ms_per_scrape=_num(tele_scrape),
    )


def _busiest(workers: int) -> str:
    return " (busiest of its workers)" if workers > 1 else ""


def client_text(client: ClientHealth | None) -> str:
    """One line for people: `ok (loop lag p99 0.4 ms, CPU 23% of one core, 1 worker)`, or
    `BOUND (CPU 96% of a core (bound above 90%)): the client, not the server, limited this cell`; "" without a
    client entry."""
    if client is None:
        return ""
    verdict = client.verdict or "?"
    p99, cpu, workers = client.loop_lag_ms.p99, client.cpu_util, client.workers
    figures = [f"loop lag p99 {p99:.1f} ms" if p99 is not None else "loop lag p99 -",
               f"CPU {cpu * 100:.0f}% of one core{' (busiest worker)' if workers > 1 else ''}"
               if cpu is not None else "CPU -",
               f"{workers} worker{'s' if workers != 1 else ''}"]
    if client.send_late_p99_ms is not None:
        figures.append(f"sends late p99 {client.send_late_p99_ms:.1f} ms")
    if client.bunched_share is not None:
        figures.append(f"{client.bunched_share * 100:.0f}% tokens bunched")
    if client.telemetry_cpu_ms_per_s is not None:
        per = client.telemetry_ms_per_scrape
        figures.append(f"/metrics scrapes {client.telemetry_cpu_ms_per_s:.2f} ms CPU/s"
                       + (f" ({per:.2f} ms each)" if per is not None else ""))
    reasons = client.reasons
    if verdict == "ok":
        return f"ok ({', '.join(figures)})"
    text = f"{verdict.upper()} ({'; '.join(reasons) or ', '.join(figures)})"
    if verdict == "bound":
        return text + ": the client, not the server, limited this cell"
    return text + f"; {', '.join(figures)}"
