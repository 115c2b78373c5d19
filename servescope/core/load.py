"""Load patterns: a closed loop of N users, or an open loop at a rate (constant, Poisson or gamma arrivals,
shaped by a ramp and a step pattern: servescope.core.arrivals) with an optional concurrency cap; a ramp
starts a closed loop's users one by one. One call of `run_cell` runs one cell: warmup, then the measured
part, stopped by a request count and/or a duration, or early when every request fails or on cancellation.
`CellControl` ends a cell early in one of two ways: `request_drain` sends no more requests and lets the ones
in flight finish; `request_stop` also cancels those in flight (recorded as `cancelled`).

A multi-turn cell (its requests marked as turns: servescope.core.conversation) runs conversations instead of
independent requests: a closed loop's N users each hold one conversation at a time, one after another; an open
loop starts conversations at the rate (its concurrency cap counts conversations). The request count counts
turns; the warmup runs the conversations its turns belong to."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field

import httpx

from servescope.core.arrivals import RateShape, Step, pattern_label, send_times
from servescope.core.client import Bodies, ClientOptions, RequestSpec, make_http_client, stream_request
from servescope.core.conversation import Conversation, Pool, conversations, converse, is_multi_turn
from servescope.core.errors import ServescopeError
from servescope.core.health import SEND_LATE_P99_MS, ClientPart, ClientProbe
from servescope.core.records import RequestRecord

_perf = time.perf_counter_ns


@dataclass(frozen=True)
class Load:
    """One load level: `concurrency` users in a closed loop, or `rate` requests/s in an open loop.
    `ramp_s`: the open loop's rate rises linearly from 0 to `rate` over it (a closed loop's users start one by
    one over it, user u of N at u/N x ramp); `pattern`: the open loop's rate multiplied step by step."""

    concurrency: int | None = None
    rate: float | None = None
    arrival: str = "constant"  # "constant" | "poisson" | "gamma" (open loop only)
    max_concurrency: int | None = None  # cap on in-flight requests for the open loop
    burstiness: float = 1.0  # the gamma shape: 1 is Poisson, below 1 burstier, above 1 more regular
    ramp_s: float | None = None
    pattern: tuple[Step, ...] = ()
    # arrival "trace": each request's send time (s from the cell's start), as a trace file says
    times: tuple[float, ...] = field(default=(), repr=False, compare=False)

    @property
    def label(self) -> str:
        if self.arrival == "trace":
            return f"trace {self.rate:.3g}/s mean"
        ramp = f" ramp {self.ramp_s:g}s" if self.ramp_s else ""
        if self.rate is not None:
            arrival = f"gamma({self.burstiness:g})" if self.arrival == "gamma" else self.arrival
            steps = f" steps {pattern_label(self.pattern)}" if self.pattern else ""
            cap = f", cap {self.max_concurrency}" if self.max_concurrency else ""
            return f"rate {self.rate:g}/s {arrival}{ramp}{steps}{cap}"
        return f"c={self.concurrency}{ramp}"

    @property
    def shape(self) -> RateShape:
        return RateShape(self.ramp_s, self.pattern)

    @property
    def peak_rate(self) -> float | None:
        """The open loop's highest rate (a pattern's spike), None for a closed loop."""
        if self.rate is None:
            return None
        return self.rate * (self.shape.peak if self.pattern else 1.0)

    @property
    def connections(self) -> int:
        if self.rate is not None:
            return self.max_concurrency or max(8, min(1024, int((self.peak_rate or self.rate) * 60)))
        return int(self.concurrency or 1)


@dataclass(frozen=True)
class Limits:
    requests: int | None = 100
    duration_s: float | None = None
    warmup: int = 0


@dataclass
class CellControl:
    """Set from outside (Ctrl-C, a TUI key) to end the current cell early: `request_drain` stops sending
    requests and lets the in-flight ones finish; `request_stop` also cancels the in-flight ones. Either
    makes `drain` set (no new requests); only `request_stop` sets `stop`."""

    stop: asyncio.Event = field(default_factory=asyncio.Event)
    drain: asyncio.Event = field(default_factory=asyncio.Event)
    reason: str = ""

    def request_stop(self, reason: str) -> None:
        if not self.stop.is_set():
            self.reason = reason
        self.stop.set()
        self.drain.set()

    def request_drain(self, reason: str) -> None:
        if not self.drain.is_set():
            self.reason = reason
        self.drain.set()

    def request_finish(self) -> None:
        """End the cell as complete (its figures are precise enough: core/precision.py): no more requests are sent,
        the ones in flight finish, and the cell is not `stopped` (no reason is set)."""
        self.drain.set()

    @property
    def ended(self) -> bool:
        """No more requests are sent (drained or stopped)."""
        return self.drain.is_set()


@dataclass
class CellRun:
    records: list[RequestRecord]
    start_ns: int  # first measured request scheduled
    end_ns: int  # last measured request ended
    stopped: str = ""  # why it ended early ("" when it ran to its limit)
    ramp_end_ns: int = 0  # requests scheduled before this were sent during the ramp (0: the cell had none)
    # the client's own health over the measured part (core.health.ClientProbe's part; core.health.merge_client
    # joins several workers')
    client: ClientPart | None = None
    # an open loop with a duration: how far its send schedule was behind the clock when the duration ended (s; 0
    # when it kept up), and how many requests it sent: past SEND_LATE_P99_MS's bound the rate was not reached
    behind_s: float = 0.0
    sent: int = 0  # requests (an open loop of conversations: conversations) sent
    warmup_note: str = ""  # the warmup was cut short by the cell's duration: how much of it was sent
    workers_note: str = ""  # what --workers auto decided, when there is something to say (core.workers.auto_note)
    workers_short: bool = False  # ... and it is that the load asks for more processes than this machine allows


WARM_POOL = 1024  # distinct warmup prompts a cell has at most: a longer warmup cycles through them


def warm_prompts(warmup: int) -> int:
    """How many of a cell's prompts (the first ones) are its warmup's: one per warmup request, at most `WARM_POOL`
    (a warmup only readies the server: `--warmup 100000000` cycles 1,024 prompts instead of building 10**8)."""
    return min(max(0, warmup), WARM_POOL)


def cell_connections(load: Load, requests: int | None, warmup: int = 0) -> int:
    """The connections one cell holds at most: a closed loop never has more users than requests to send
    (`-c 100000000 -n 2` runs 2 users; the warmup runs first, with as many users as it has requests)."""
    n = load.connections
    if load.rate is None and requests is not None:
        n = min(n, max(requests, warmup))
    return max(1, n)


FD_RESERVE = 64  # open files the process needs besides the load's sockets (interpreter, logs, session, telemetry)


def open_file_room(connections: int) -> int:
    """Make room for `connections` sockets: the soft RLIMIT_NOFILE is raised (up to the hard limit) when it is
    too low. Returns how many connections fit (at least `connections` when they all do)."""
    try:
        import resource
    except ImportError:  # pragma: no cover (Windows: no such limit to manage)
        return connections
    need = connections + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    inf = resource.RLIM_INFINITY
    if soft == inf or soft >= need:
        return connections if soft == inf else soft - FD_RESERVE
    # only as far as needed (a child that closes every possible fd at start would crawl through a huge limit)
    new = need if hard == inf else min(hard, need)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        soft = new
    except (ValueError, OSError):
        pass
    return max(0, soft - FD_RESERVE)


def ensure_open_files(connections: int) -> None:
    """ServescopeError (one line, with the number that fits) when `connections` sockets cannot be opened at
    once even after raising the soft open-file limit: such a cell would only measure failures."""
    room = open_file_room(connections)
    if room < connections:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        raise ServescopeError(
            f"{connections} concurrent requests need about {connections + FD_RESERVE} open files, but this process "
            f"may open {soft} (ulimit -n, hard limit {hard}); use at most {room} (--concurrency, --max-concurrency, "
            "or fewer --requests), or raise the hard limit")


MIN_PENDING = 8  # a capped open loop holds at least this many sends waiting for a slot
DRAIN_MIN_S = 5.0  # a cell that did not reach its rate waits at least this long after its duration for answers


def pending_cap(load: Load) -> int:
    """The open loop's requests outstanding at most: in flight, plus (with --max-concurrency) as many again
    waiting for a slot. Each holds a task, a record and a connection's buffers, so memory stays bounded by the
    load, not by the rate asked (`--rate 100000` once held 300,000 tasks, 1.8 GB); past the cap the schedule
    waits: its sends go late, and what is still unsent when the duration ends is never sent."""
    if load.max_concurrency:
        return max(MIN_PENDING, 2 * load.max_concurrency)
    return load.connections


def drain_grace_s(duration_s: float) -> float:
    """How long an open loop that fell behind its rate waits, after its duration, for the answers still in
    flight before it cancels them: as long as the duration, at least DRAIN_MIN_S (a server that was sent more
    than it can serve would otherwise keep the cell running for as long as its queue takes)."""
    return max(DRAIN_MIN_S, duration_s)


def failure_limit(load: Load) -> int:
    """Consecutive failures after which a cell stops early: the server is failing every request."""
    n = load.max_concurrency or load.concurrency or 8
    return max(5, min(2 * n, 50))


async def run_cell(
    opts: ClientOptions,
    specs: Sequence[RequestSpec],
    load: Load,
    limits: Limits,
    on_record: Callable[[RequestRecord], None] | None = None,
    control: CellControl | None = None,
    seed: int = 0,
    before_measured: Callable[[], Awaitable[None]] | None = None,
) -> CellRun:
    """`specs` holds the warmup prompts first (`warm_prompts(limits.warmup)` of them, cycled when the warmup has
    more requests), then the measured ones (cycled if a duration or a count needs more)."""
    control = control or CellControl()
    conns = cell_connections(load, limits.requests, limits.warmup)
    if load.rate is not None and not load.max_concurrency:
        conns = max(1, min(conns, open_file_room(conns)))  # an uncapped open loop's pool is a guess: fit it
    else:
        ensure_open_files(conns)
    async with make_http_client(opts, conns) as http:
        wn = warm_prompts(limits.warmup)
        warm = list(specs[:wn])
        measured = list(specs[wn:]) or list(specs)
        talk = is_multi_turn(specs)
        warmup_note = ""
        if warm:
            n_warm = limits.warmup
            warm_load = Load(concurrency=min(load.connections, n_warm))
            # a duration-only cell's warmup lasts at most its duration (nothing else bounds `--warmup 100000000`)
            warm_limits = Limits(requests=n_warm, duration_s=limits.duration_s if limits.requests is None else None)
            t_warm = _perf()
            if talk:
                wrun = await _talk(http, opts, Pool(conversations(warm), n_warm, warmup=True), warm_load,
                                   warm_limits, None, control, warmup=True)
            else:
                wrun = await _closed(http, opts, warm, warm_load, warm_limits, None, control, warmup=True)
            if warm_limits.duration_s is not None and not control.ended and wrun.sent < n_warm \
                    and _perf() - t_warm >= warm_limits.duration_s * 1e9:
                warmup_note = (f"the warmup ended with the cell's duration ({warm_limits.duration_s:g} s): "
                               f"{wrun.sent:,} of its {n_warm:,} requests were sent")
        if control.ended:
            return CellRun([], _perf(), _perf(), control.reason, warmup_note=warmup_note)
        if before_measured is not None:
            await before_measured()
        with _quiet_gc():
            probe = ClientProbe()  # after the collection above: its pause is no lag of the cell's
            probe.start()
            try:
                if talk:
                    pool = Pool(conversations(measured) or conversations(specs), limits.requests)
                    if load.rate is not None:
                        run = await _talk_open(http, opts, pool, load, limits, on_record, control, seed)
                    else:
                        run = await _talk(http, opts, pool, load, limits, on_record, control)
                elif load.rate is not None:
                    run = await _open(http, opts, measured, load, limits, on_record, control, seed)
                else:
                    run = await _closed(http, opts, measured, load, limits, on_record, control)
            except BaseException:
                probe.close()
                raise
            run.client = await probe.stop()
            run.warmup_note = warmup_note
            return run


@contextlib.contextmanager
def _quiet_gc() -> Iterator[None]:
    """No long garbage-collector pause during the measured part: what exists before it (prompts, the HTTP
    client, libraries) is collected once and frozen, so a full collection during the cell walks only the
    cell's own new objects (a pause of tens of ms once delayed a trace's sends by that much)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class _Tracker:
    def __init__(self, load: Load, control: CellControl, on_record: Callable[[RequestRecord], None] | None):
        self.records: list[RequestRecord] = []
        self.consecutive_fail = 0
        self.consecutive_limited = 0  # of those, rate-limited ones (HTTP 429)
        self.open_loop = load.rate is not None
        self.limit = failure_limit(load)
        self.control = control
        self.on_record = on_record
        self.cancel_reason = ""  # why requests still in flight are cancelled, when not a stop's (the drain's bound)

    def add(self, rec: RequestRecord) -> None:
        self.records.append(rec)
        if rec.status == "ok":
            self.consecutive_fail = 0
            self.consecutive_limited = 0
        elif rec.status == "rate_limited" and self.open_loop:
            pass  # an open loop's sends keep their schedule whatever the answers: its 429s are data, not a stop
        elif rec.status != "cancelled":
            self.consecutive_fail += 1
            self.consecutive_limited = self.consecutive_limited + 1 if rec.status == "rate_limited" else 0
            if self.consecutive_fail >= self.limit and not self.control.stop.is_set():
                if self.consecutive_limited == self.consecutive_fail:  # a closed loop would only collect 429s
                    after = f", Retry-After {rec.retry_after_s:g} s" if rec.retry_after_s is not None else ""
                    self.control.request_stop(f"{self.consecutive_limited} requests in a row were rate-limited "
                                              f"(HTTP 429{after}): lower the load, or pass --retry-after MAX_WAIT "
                                              "to wait and send them again")
                else:
                    self.control.request_stop(f"{self.consecutive_fail} requests in a row failed, last: {rec.error}")
        if self.on_record is not None:
            self.on_record(rec)


RETRY_LIMIT = 5  # with --retry-after: 429s of one request sent again, at most
RETRY_DEFAULT_S = 1.0  # the wait after a 429 that named none (no Retry-After)


async def _stream_retrying(http: httpx.AsyncClient, opts: ClientOptions, spec: RequestSpec, rec: RequestRecord,
                           control: CellControl | None, reply: list[str] | None, bodies: Bodies | None = None) -> None:
    """Send the request; with --retry-after (`opts.retry_after_max_s`), a 429 is sent again after the server's
    Retry-After (at most `retry_after_max_s`; `RETRY_DEFAULT_S` when it named none), up to `RETRY_LIMIT` times,
    unless the cell ends meanwhile. The record then holds the last attempt (its send stamp: TTFT and E2E are the
    served attempt's) with `retries` and `retry_wait_s`; its client queueing (sent - scheduled) includes the waits."""
    cap = opts.retry_after_max_s
    if bodies is None:
        await (stream_request(http, opts, spec, rec) if reply is None else stream_request(http, opts, spec, rec, reply))
    else:
        await stream_request(http, opts, spec, rec, reply=reply, bodies=bodies)
    waited, tries = 0.0, 0
    while rec.status == "rate_limited" and cap is not None and tries < RETRY_LIMIT and control is not None:
        wait = min(cap, rec.retry_after_s if rec.retry_after_s is not None else RETRY_DEFAULT_S)
        t0 = _perf()
        if not await _until(t0 + int(wait * 1e9), control):  # the cell ended: the 429 stays the record
            rec.retries, rec.retry_wait_s = tries, waited
            return
        waited += (_perf() - t0) / 1e9
        tries += 1
        if reply is not None:
            reply.clear()
        fresh = RequestRecord(rec.index, rec.user, rec.warmup, rec.input_tokens_requested,
                              rec.output_tokens_requested, rec.scheduled_ns, conversation=rec.conversation,
                              turn=rec.turn, turns=rec.turns)
        await (stream_request(http, opts, spec, fresh) if reply is None
               else stream_request(http, opts, spec, fresh, reply))
        seen = rec.retry_after_s
        for name in RequestRecord.__slots__:
            setattr(rec, name, getattr(fresh, name))
        if rec.retry_after_s is None:  # served at last: the record keeps the Retry-After it waited on
            rec.retry_after_s = seen
    rec.retries, rec.retry_wait_s = tries, waited


async def _send(http: httpx.AsyncClient, opts: ClientOptions, spec: RequestSpec, rec: RequestRecord,
                tracker: _Tracker | None, reply: list[str] | None = None, bodies: Bodies | None = None) -> None:
    rec.adapter = spec.model or ""
    try:
        await _stream_retrying(http, opts, spec, rec, tracker.control if tracker is not None else None, reply, bodies)
    except asyncio.CancelledError:
        rec.end_ns = _perf()
        rec.status = "cancelled"
        rec.error = (tracker.cancel_reason if tracker is not None else "") or "cancelled when the cell was stopped"
        if tracker is not None:
            tracker.add(rec)
        raise
    if tracker is not None:
        tracker.add(rec)


async def _closed(http, opts, specs, load, limits, on_record, control, warmup=False) -> CellRun:  # type: ignore[no-untyped-def]
    total = limits.requests
    n_users = int(load.concurrency or 1)
    if total is not None:  # never more users than requests: `-c 100000000 -n 2` starts 2 tasks, not 10**8
        n_users = min(n_users, total)
    deadline = None
    tracker = None if warmup else _Tracker(load, control, on_record)
    next_index = 0
    start = _perf()
    if limits.duration_s is not None:
        deadline = start + int(limits.duration_s * 1e9)
    ramp_ns = int(load.ramp_s * 1e9) if load.ramp_s and not warmup else 0
    bodies = Bodies(specs, opts)  # encoded before the cell starts, as the open loop's

    async def user(u: int) -> None:
        nonlocal next_index
        planned = start + ramp_ns * u // n_users if ramp_ns else 0  # the ramp starts user u of N at u/N x ramp
        if planned and ((deadline is not None and planned >= deadline) or not await _until(planned, control)):
            return
        while not control.ended:
            i = next_index
            if total is not None and i >= total:
                return
            now = _perf()
            if deadline is not None and now >= deadline:
                return
            next_index += 1
            spec = specs[i % len(specs)]
            rec = RequestRecord(
                index=i - (len(specs) if warmup else 0), user=u, warmup=warmup,
                input_tokens_requested=spec.input_tokens, output_tokens_requested=spec.output_tokens,
                scheduled_ns=planned or now,  # a ramped user's first request: when the ramp meant it to go
            )
            planned = 0
            await _send(http, opts, spec, rec, tracker, bodies=bodies)

    tasks = [asyncio.create_task(user(u)) for u in range(n_users)]
    await _wait_or_stop(tasks, control)
    recs = tracker.records if tracker else []
    end = max((r.end_ns for r in recs), default=_perf())
    return CellRun(recs, start, end, control.reason if control.ended else "", start + ramp_ns if ramp_ns else 0,
                   sent=next_index)


# the shortest timer a send waits on: uvloop's timers count whole milliseconds from the loop's cached clock, so a
# shorter one fires at once, again and again until the time comes (a busy wait: at 2,000 sends a second, 48 wake-ups
# per send and most of a core). Sends due within it go out together, up to about a millisecond late, never early.
MIN_WAIT_S = 0.001


async def _until(when_ns: int, control: CellControl) -> bool:
    """Sleep until `when_ns` (perf_counter_ns), never less; False when the cell was drained meanwhile. (uvloop's
    timers count whole milliseconds and may fire up to one early: the rest is waited again, at least `MIN_WAIT_S`,
    and a send is never stamped before its schedule.)"""
    while not control.ended:
        delay = (when_ns - _perf()) / 1e9
        if delay <= 0:
            break
        try:
            await asyncio.wait_for(control.drain.wait(), timeout=max(delay, MIN_WAIT_S))
        except TimeoutError:
            pass
    return not control.ended


class _Outstanding:
    """The open loop's requests outstanding (`pending_cap` at most): `room()` waits for one to end, the cell to be
    drained, or the deadline."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.tasks: set[asyncio.Task[None]] = set()
        self._freed = asyncio.Event()

    def add(self, t: asyncio.Task[None]) -> None:
        self.tasks.add(t)
        t.add_done_callback(self._done)

    def _done(self, t: asyncio.Task[None]) -> None:
        self.tasks.discard(t)
        self._freed.set()

    async def room(self, control: CellControl, deadline: int | None) -> bool:
        """True once fewer than `cap` are outstanding; False when the cell was drained or the deadline came."""
        while len(self.tasks) >= self.cap:
            if control.ended:
                return False
            self._freed.clear()
            timeout = None if deadline is None else (deadline - _perf()) / 1e9
            if timeout is not None and timeout <= 0:
                return False
            waiter = asyncio.ensure_future(self._freed.wait())
            drained = asyncio.ensure_future(control.drain.wait())
            try:
                await asyncio.wait({waiter, drained}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
                drained.cancel()
        return not control.ended


def _sending_until(deadline: int | None, sched: int) -> bool:
    """Whether a send scheduled at `sched` is still to go: before the deadline, by the schedule and by the clock
    (a schedule behind the clock stops with it: the duration bounds the cell, not the rate asked)."""
    return deadline is None or (sched < deadline and _perf() < deadline)


async def _finish_open(outstanding: _Outstanding, tracker: _Tracker, control: CellControl, deadline: int | None,
                       behind_ns: int, duration_s: float | None) -> None:
    """Wait for the requests still in flight. An open loop whose schedule was behind when its duration ended (the
    rate was not reached) waits `drain_grace_s` for them, then cancels the rest: its cell ends near its duration."""
    if deadline is None or duration_s is None or behind_ns <= SEND_LATE_P99_MS[1] * 1e6 or not outstanding.tasks:
        await _wait_or_stop(list(outstanding.tasks), control)
        return
    grace = drain_grace_s(duration_s)
    tasks = list(outstanding.tasks)
    end_at = deadline + int(grace * 1e9)
    pending: set[asyncio.Task[object]] = set(tasks)
    stopper: asyncio.Task[object] = asyncio.ensure_future(control.stop.wait())
    try:
        while pending and not control.stop.is_set():
            timeout = (end_at - _perf()) / 1e9
            if timeout <= 0:
                break
            _, pending = await asyncio.wait(pending | {stopper}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            pending.discard(stopper)
    finally:
        stopper.cancel()
    left = [t for t in tasks if not t.done()]
    if left:
        if not control.stop.is_set():
            tracker.cancel_reason = (f"cancelled: still in flight {grace:g} s after the cell's duration, which ended "
                                     f"with the send schedule {behind_ns / 1e9:.1f} s behind (the rate was not "
                                     "reached)")
        for t in left:
            t.cancel()
        await asyncio.gather(*left, return_exceptions=True)
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            raise t.exception()  # type: ignore[misc]


class _Alarm:
    """The open loop's sleep: until a perf_counter_ns time or the cell's drain, on one timer and one future per
    wake-up (the drain is watched by one task for the whole cell). No task per send: `asyncio.wait_for`, which
    `_until` sleeps with, makes one on every call."""

    def __init__(self, control: CellControl) -> None:
        self.control = control
        self.loop = asyncio.get_running_loop()
        self._fut: asyncio.Future[None] | None = None
        self._drained = asyncio.ensure_future(control.drain.wait())
        self._drained.add_done_callback(self._ring)
        self.sleeps = 0  # wake-ups it slept for (sends due in the same one go out together)

    def _ring(self, _: object = None) -> None:
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result(None)

    async def until(self, when_ns: int) -> bool:
        """True once `when_ns` has come, never before it (uvloop's millisecond timers may fire up to one early: the
        rest is waited again); False when the cell was drained meanwhile. A time already past returns at once,
        without yielding to the loop; a wait shorter than `MIN_WAIT_S` waits that long (no busy wait)."""
        while not self.control.ended:
            delay = when_ns - _perf()
            if delay <= 0:
                return True
            self.sleeps += 1
            self._fut = fut = self.loop.create_future()
            handle = self.loop.call_later(max(delay / 1e9, MIN_WAIT_S), self._ring)
            try:
                await fut
            finally:
                handle.cancel()
                self._fut = None
        return False

    def close(self) -> None:
        self._drained.cancel()


async def _open(http, opts, specs, load, limits, on_record, control, seed) -> CellRun:  # type: ignore[no-untyped-def]
    """The open loop's sender: one coroutine walks the arrival schedule against perf_counter_ns (a monotonic
    clock), sleeping on `_Alarm` until the next send is due and then sending every request due by then at once
    (at thousands a second several fall in one millisecond); each send is one task, its request, with its body
    encoded before the cell started (`Bodies`)."""
    rate = float(load.rate or 1.0)
    times = (iter(load.times) if load.arrival == "trace" else
             send_times(load.arrival, rate, load.burstiness, load.shape, random.Random(f"servescope-arrivals:{seed}")))
    tracker = _Tracker(load, control, on_record)
    sem = asyncio.Semaphore(load.max_concurrency) if load.max_concurrency else None
    total = limits.requests
    bodies = Bodies(specs, opts)
    n_specs = len(specs)
    start = _perf()
    deadline = start + int(limits.duration_s * 1e9) if limits.duration_s is not None else None
    outstanding = _Outstanding(pending_cap(load))
    alarm = _Alarm(control)
    nxt = next(times, None)
    sched = start + int(nxt * 1e9) if nxt is not None else 0

    async def capped(spec: RequestSpec, rec: RequestRecord) -> None:
        assert sem is not None
        async with sem:
            if control.ended or (deadline is not None and _perf() >= deadline):
                return  # it waited for a slot while the cell was drained or past its duration: never sent
            await _send(http, opts, spec, rec, tracker, bodies=bodies)

    i = 0
    behind = 0  # how far the schedule was behind when the duration ended (ns)
    try:
        while not control.ended and nxt is not None:
            if total is not None and i >= total:
                break
            if not _sending_until(deadline, sched) or not await outstanding.room(control, deadline) \
                    or not await alarm.until(sched) or not _sending_until(deadline, sched):
                if deadline is not None and not control.ended and sched < deadline:
                    behind = deadline - sched
                break
            spec = specs[i % n_specs]
            rec = RequestRecord(index=i, user=-1, warmup=False, input_tokens_requested=spec.input_tokens,
                                output_tokens_requested=spec.output_tokens, scheduled_ns=sched)
            outstanding.add(asyncio.create_task(_send(http, opts, spec, rec, tracker, bodies=bodies) if sem is None
                                                else capped(spec, rec)))
            i += 1
            nxt = next(times, None)  # a trace ends
            sched = start + int(nxt * 1e9) if nxt is not None else 0
    finally:
        alarm.close()
    await _finish_open(outstanding, tracker, control, deadline, behind, limits.duration_s)
    end = max((r.end_ns for r in tracker.records), default=_perf())
    ramp_end = start + int(load.ramp_s * 1e9) if load.ramp_s else 0
    return CellRun(tracker.records, start, end, control.reason if control.ended else "", ramp_end,
                   behind_s=behind / 1e9, sent=i)


async def _talk(http, opts, pool: Pool, load: Load, limits: Limits, on_record, control: CellControl,  # type: ignore[no-untyped-def]
                warmup: bool = False) -> CellRun:
    """The closed loop of conversations: each user runs one conversation after another."""
    n_users = int(load.concurrency or 1)
    if limits.requests is not None:  # every conversation has a turn: never more users than turns to send
        n_users = min(n_users, limits.requests)
    tracker = None if warmup else _Tracker(load, control, on_record)
    start = _perf()
    deadline = start + int(limits.duration_s * 1e9) if limits.duration_s is not None else None
    ramp_ns = int(load.ramp_s * 1e9) if load.ramp_s and not warmup else 0

    async def send(spec: RequestSpec, rec: RequestRecord, reply: list[str]) -> None:
        await _send(http, opts, spec, rec, tracker, reply)

    async def user(u: int) -> None:
        planned = start + ramp_ns * u // n_users if ramp_ns else 0  # the ramp starts user u of N at u/N x ramp
        if planned and ((deadline is not None and planned >= deadline) or not await _until(planned, control)):
            return
        while not control.ended and (deadline is None or _perf() < deadline):
            got = pool.take()
            if got is None:
                return
            await converse(pool, *got, u, planned or _perf(), send, control.drain, deadline)
            planned = 0

    await _wait_or_stop([asyncio.create_task(user(u)) for u in range(n_users)], control)
    recs = tracker.records if tracker else []
    end = max((r.end_ns for r in recs), default=_perf())
    return CellRun(recs, start, end, control.reason if control.ended else "", start + ramp_ns if ramp_ns else 0,
                   sent=pool.requests)


async def _talk_open(http, opts, pool: Pool, load: Load, limits: Limits, on_record, control: CellControl,  # type: ignore[no-untyped-def]
                     seed: int) -> CellRun:
    """The open loop of conversations: conversations start at the load's rate (and arrival shape)."""
    rate = float(load.rate or 1.0)
    times = send_times(load.arrival, rate, load.burstiness, load.shape, random.Random(f"servescope-arrivals:{seed}"))
    tracker = _Tracker(load, control, on_record)
    sem = asyncio.Semaphore(load.max_concurrency) if load.max_concurrency else None
    start = _perf()
    deadline = start + int(limits.duration_s * 1e9) if limits.duration_s is not None else None
    outstanding = _Outstanding(pending_cap(load))

    async def send(spec: RequestSpec, rec: RequestRecord, reply: list[str]) -> None:
        await _send(http, opts, spec, rec, tracker, reply)

    async def begin(cid: int, conv: Conversation, scheduled: int) -> None:
        if sem is None:
            await converse(pool, cid, conv, -1, scheduled, send, control.drain, deadline)
            return
        async with sem:
            if not control.ended and (deadline is None or _perf() < deadline):  # else it waited for a slot while
                # the cell was drained or past its duration: never started
                await converse(pool, cid, conv, -1, scheduled, send, control.drain, deadline)

    sched = start + int(next(times) * 1e9)
    started = 0
    behind = 0
    while not control.ended:
        if not _sending_until(deadline, sched) or not await outstanding.room(control, deadline) \
                or not await _until(sched, control) or not _sending_until(deadline, sched):
            if deadline is not None and not control.ended and sched < deadline:
                behind = deadline - sched
            break
        got = pool.take()
        if got is None:
            break
        outstanding.add(asyncio.create_task(begin(*got, sched)))
        started += 1
        sched = start + int(next(times) * 1e9)
    await _finish_open(outstanding, tracker, control, deadline, behind, limits.duration_s)
    end = max((r.end_ns for r in tracker.records), default=_perf())
    ramp_end = start + int(load.ramp_s * 1e9) if load.ramp_s else 0
    return CellRun(tracker.records, start, end, control.reason if control.ended else "", ramp_end,
                   behind_s=behind / 1e9, sent=started)


async def _wait_or_stop(tasks: list[asyncio.Task[None]], control: CellControl) -> None:
    if not tasks:
        return
    stopper: asyncio.Task[object] = asyncio.create_task(control.stop.wait())  # results unread: only done or not
    pending: set[asyncio.Task[object]] = set(tasks)
    try:
        while pending:
            done, pending = await asyncio.wait(pending | {stopper}, return_when=asyncio.FIRST_COMPLETED)
            if stopper in done:
                pending.discard(stopper)
                for t in pending:
                    t.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
                return
            pending.discard(stopper)
    finally:
        stopper.cancel()
    for t in tasks:
        if t.done() and not t.cancelled() and t.exception() is not None:
            raise t.exception()  # type: ignore[misc]
