"""One cell's load split across worker processes, so a load that needs more than one core gets it.

`run_cell_workers(..., workers=N)` runs the cell in N processes (fresh interpreters: "forkserver", else
"spawn"), each with its own event loop and connection pool running `core.load.run_cell` on its share, and
merges what they measured into one `CellRun` that means what one process's would:

- a closed loop's users are split as evenly as possible (user ids stay 0..c-1: worker k runs users k, k+N, ...)
  and its request count in proportion to them (worker k's requests keep the indices, and so the prompts, of a
  contiguous block of the single-process order; a cell with a duration and no count interleaves them instead);
- an open loop's arrival schedule is drawn once, here, from the cell's seed (the same times one process would
  send at), and worker k sends every N-th of them, as a trace (its records keep the single-process indices
  and prompts); a concurrency cap is split like users;
- the warmup is split the same way; every worker finishes its warmup, the cell's `before_measured` runs once,
  then all workers start the measured part at one instant `t0` (`perf_counter_ns`, CLOCK_MONOTONIC on Linux:
  one clock for every process of the host) fixed here a little in the future.

Records come back in batches (every `BATCH_S`) and `on_record` sees each, as with one process; a drain or a stop
of the cell's `CellControl` reaches every worker, and a worker's own early stop (every request failing) stops
the others. A worker that dies ends the cell with one line naming it; the others are stopped and every process
is reaped. Multi-turn cells (conversations) run in one process.

The driver loop (`drive`) is shared with `core.rayworkers`, which runs the same worker loop in Ray actors.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import math
import multiprocessing
import os
import random
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import msgspec

from servescope.core.arrivals import send_times
from servescope.core.client import ClientOptions, RequestSpec
from servescope.core.conversation import is_multi_turn
from servescope.core.errors import ServescopeError, error_text
from servescope.core.health import ClientPart, add_placement, merge_client
from servescope.core.load import CellControl, CellRun, Limits, Load, run_cell, warm_prompts
from servescope.core.records import RequestRecord
from servescope.core.tls import CONNECTIONS, ConnSample
from servescope.core.workercount import Workers, cores, too_many_workers

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.context import ForkServerContext, SpawnContext
    from multiprocessing.process import BaseProcess

__all__ = ["Share", "auto_note", "auto_workers", "wanted_workers", "drive", "local_workers", "open_schedule", "resolve_workers", "run_cell_workers",
           "split_cell"]

_perf = time.perf_counter_ns

BATCH_S = 0.1  # how often a worker sends the records it finished
START_MARGIN_S = 0.05  # t0 is this far after the moment every worker said it is ready (local processes)
MAX_SCHEDULE = 20_000_000  # an open loop's schedule longer than this is not drawn up front: one process runs it

# the `auto` rule: one worker per this many concurrent streams, per this many expected streamed tokens/s, or per
# this many requests/s an open loop sends (each request costs a process ~0.3 ms of CPU besides its tokens: its
# send, its connection's head and end, its record; benchmarks/open_loop.py)
STREAMS_PER_WORKER = 256
TOK_S_PER_WORKER = 8000.0
REQ_S_PER_WORKER = 1500.0


def wanted_workers(load: Load, output_tokens: float | None = None) -> int:
    """The processes a cell's load asks for by the `auto` rule, before this machine's cores cap them: one per
    `STREAMS_PER_WORKER` concurrent streams (a closed loop's users, an open loop's cap), per `TOK_S_PER_WORKER`
    expected streamed tokens/s (an open loop's peak rate x the cell's mean output tokens) or per
    `REQ_S_PER_WORKER` requests/s (an open loop's peak rate), whichever asks for more; at least 1."""
    streams = float(load.concurrency or 0) if load.rate is None else float(load.max_concurrency or 0)
    rate = float(load.peak_rate or 0.0)
    tok_s = rate * float(output_tokens or 0.0)
    return max(math.ceil(streams / STREAMS_PER_WORKER), math.ceil(tok_s / TOK_S_PER_WORKER),
               math.ceil(rate / REQ_S_PER_WORKER), 1)


def auto_workers(load: Load, cores: int | None = None, output_tokens: float | None = None) -> int:
    """How many worker processes `--workers auto` runs a cell with: `wanted_workers`, never more than the cores
    less one (the parent: the UI, telemetry), never fewer than 1. Conservative: one Python process with the raw
    transport keeps up with a few hundred streams, well over ten thousand streamed tokens/s and a couple of
    thousand requests/s. c=64, or 20 requests/s of 300 tokens, stays at 1."""
    cores = cores if cores is not None else _cores()
    return max(1, min(wanted_workers(load, output_tokens), cores - 1))


def auto_note(load: Load, specs: Sequence[RequestSpec], warmup: int = 0,
              cores: int | None = None) -> tuple[str, bool]:
    """What `--workers auto` decided for a cell, in one line, when there is something to say (else ""): that it
    spread the load over several processes and why, or that one process cannot keep the load and this machine's
    cores allowed fewer than it asks for (then True: a warning)."""
    mean_out = _mean_output(specs, warmup)
    want = wanted_workers(load, mean_out)
    if want <= 1:
        return "", False
    cores = cores if cores is not None else _cores()
    got = auto_workers(load, cores, mean_out)
    why = _load_text(load, mean_out)
    if got >= want:
        return f"--workers auto: {got} load processes for {why} (one keeps about {_capacity_text()})", False
    return (f"--workers auto: {why} asks for {want} load processes (one keeps about {_capacity_text()}), but this "
            f"machine's {cores} core{'s' if cores != 1 else ''} allow {got}: the client may limit this cell (its "
            "client line says)"), True


def _mean_output(specs: Sequence[RequestSpec], warmup: int) -> float:
    measured = list(specs[warm_prompts(warmup):]) or list(specs)
    return sum(s.output_tokens for s in measured) / len(measured) if measured else 0.0


def _load_text(load: Load, mean_out: float) -> str:
    if load.rate is None:
        return f"{int(load.concurrency or 0):,} concurrent streams"
    rate = float(load.peak_rate or 0.0)
    return f"{rate:,.6g} requests/s (~{rate * mean_out:,.0f} streamed tokens/s)"


def _capacity_text() -> str:
    return (f"{STREAMS_PER_WORKER} streams, {TOK_S_PER_WORKER:,.0f} tokens/s or {REQ_S_PER_WORKER:,.0f} requests/s")


def _cores() -> int:
    return cores()


def resolve_workers(workers: Workers, load: Load, specs: Sequence[RequestSpec], warmup: int = 0) -> int:
    """`--workers N|auto` (as `engine.fields.workers` read it, the one place it is parsed) for one cell: N as
    given, or `auto_workers` from the cell's load and the mean output tokens of its measured requests."""
    if workers == "auto":
        return auto_workers(load, output_tokens=_mean_output(specs, warmup))
    if workers < 1:  # a caller that skipped the parser
        raise ServescopeError(f"--workers: must be at least 1 (got {workers})")
    return workers


def local_workers(workers: int) -> int:
    """`workers` processes on this machine, refused (one line naming the number that fits) above its cores x 4:
    a caller that skipped the parser (`engine.fields.workers`) still never starts 100,000 processes."""
    if (refusal := too_many_workers(workers)) is not None:
        raise ServescopeError(refusal)
    return workers


@dataclass(frozen=True)
class Share:
    """Worker k of n: its load, limits and requests (its warmup first), and how its records' local numbers map
    to the cell's: index -> index_base + i x index_stride, user -> k + u x n (a closed loop)."""

    k: int
    n: int
    load: Load
    limits: Limits
    specs: tuple[RequestSpec, ...]
    index_base: int
    index_stride: int
    closed: bool

    def place(self, rec: RequestRecord) -> RequestRecord:
        """The record numbered as in the whole cell (in place)."""
        rec.index = self.index_base + rec.index * self.index_stride
        if self.closed and rec.user >= 0:
            rec.user = self.k + rec.user * self.n
        return rec


def _even(total: int, n: int) -> list[int]:
    """`total` split into n parts as evenly as possible, the larger parts first."""
    return [total // n + (1 if k < total % n else 0) for k in range(n)]


def _proportional(total: int, weights: Sequence[int]) -> list[int]:
    """`total` split in proportion to `weights` (largest remainder: the parts sum to `total`)."""
    wsum = sum(weights)
    exact = [total * w / wsum for w in weights]
    parts = [int(x) for x in exact]
    order = sorted(range(len(weights)), key=lambda k: (-(exact[k] - parts[k]), k))
    for k in order[: total - sum(parts)]:
        parts[k] += 1
    return parts


def open_schedule(load: Load, limits: Limits, seed: int) -> list[float] | None:
    """The open loop's send times (s from the measured part's start) exactly as one process would send them:
    the same seeded draw (or the trace), cut by the request count and the duration as `core.load` cuts them.
    None when neither limits it (or it is longer than `MAX_SCHEDULE`)."""
    if limits.requests is None and limits.duration_s is None:
        return None
    if load.arrival == "trace":
        src = iter(load.times)
    else:
        src = send_times(load.arrival, float(load.rate or 1.0), load.burstiness, load.shape,
                         random.Random(f"servescope-arrivals:{seed}"))
    end = int(limits.duration_s * 1e9) if limits.duration_s is not None else None
    out: list[float] = []
    for t in src:
        if limits.requests is not None and len(out) >= limits.requests:
            break
        if end is not None and int(t * 1e9) >= end:
            break
        if len(out) >= MAX_SCHEDULE:
            return None
        out.append(t)
    return out


def split_cell(specs: Sequence[RequestSpec], load: Load, limits: Limits, workers: int, seed: int = 0) -> list[Share]:
    """The cell's shares for `workers` processes; fewer when the load has fewer users (or cap slots, or
    requests) than that, and a single share (the cell as it is) when it cannot be split."""
    whole = [Share(0, 1, load, limits, tuple(specs), 0, 1, load.rate is None)]
    if workers <= 1 or not specs or is_multi_turn(specs):
        return whole
    wn = warm_prompts(limits.warmup)
    warm = list(specs[:wn])
    measured = list(specs[wn:]) or list(specs)
    size = len(measured)
    if load.rate is None:
        return _split_closed(warm, measured, size, load, limits, workers) or whole
    return _split_open(warm, measured, size, load, limits, workers, seed) or whole


def _split_closed(warm: list[RequestSpec], measured: list[RequestSpec], size: int, load: Load, limits: Limits,
                  workers: int) -> list[Share]:
    users = int(load.concurrency or 1)
    n = min(workers, users, limits.requests if limits.requests is not None else users)
    if n <= 1:
        return []
    user_parts = _even(users, n)
    shares: list[Share] = []
    if limits.requests is not None:  # contiguous blocks of the single-process order, in proportion to users
        req_parts = _proportional(limits.requests, user_parts)
        base = 0
        for k in range(n):
            # request i of worker k is request base + i of the cell: one pass of the pool, which the worker cycles
            mine = [measured[(base + i) % size] for i in range(min(req_parts[k], size))]
            shares.append(_share(k, n, load, user_parts[k], limits.duration_s, req_parts[k], warm, mine, base, 1,
                                 True, limits.warmup))
            base += req_parts[k]
        return shares
    cycle = size // math.gcd(size, n)  # a duration only: request i of worker k is request k + i x n of the cell
    for k in range(n):
        mine = [measured[(k + i * n) % size] for i in range(cycle)]
        shares.append(_share(k, n, load, user_parts[k], limits.duration_s, None, warm, mine, k, n, True,
                             limits.warmup))
    return shares


def _split_open(warm: list[RequestSpec], measured: list[RequestSpec], size: int, load: Load, limits: Limits,
                workers: int, seed: int) -> list[Share]:
    times = open_schedule(load, limits, seed)
    if times is None:
        return []
    n = min(workers, len(times), load.max_concurrency or workers)
    if n <= 1:
        return []
    caps = _even(load.max_concurrency, n) if load.max_concurrency else [0] * n
    cycle = size // math.gcd(size, n)  # request i of worker k is request k + i x n of the cell: this many repeat
    shares = []
    for k in range(n):
        mine_t = times[k::n]
        mine = [measured[(k + i * n) % size] for i in range(min(len(mine_t), cycle))]
        wload = dataclasses.replace(load, arrival="trace", times=tuple(mine_t), max_concurrency=caps[k] or None)
        shares.append(_share(k, n, wload, None, limits.duration_s, len(mine_t), warm, mine, k, n, False,
                             limits.warmup))
    return shares


def _share(k: int, n: int, load: Load, users: int | None, duration_s: float | None, requests: int | None,
           warm: list[RequestSpec], mine: list[RequestSpec], base: int, stride: int, closed: bool,
           warmup: int) -> Share:
    # worker k's warmup: every n-th of the cell's `warmup` requests, its prompts cycled as `core.load` cycles them
    my_count = _even(warmup, n)[k] if warm else 0
    my_warm = [warm[(k + i * n) % len(warm)] for i in range(warm_prompts(my_count))] if warm else []
    wload = dataclasses.replace(load, concurrency=users) if users is not None else load
    wlimits = Limits(requests=requests, duration_s=duration_s, warmup=my_count)
    return Share(k, n, wload, wlimits, tuple(my_warm + mine), base, stride, closed)


# --- the worker's side: run in a spawned process (here) or in a Ray actor (core.rayworkers) ------------------

# the messages between the driver and a worker (pickled over a pipe, or through Ray)


@dataclass(frozen=True, slots=True)
class Ready:
    """The worker's warmup is done."""


@dataclass(frozen=True, slots=True)
class Recs:
    """Records the worker finished since its last batch."""

    records: list[RequestRecord]


@dataclass(frozen=True, slots=True)
class End:
    """The worker ended the cell itself (every request failing): a stop, else a drain."""

    stop: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Done:
    """The worker's share is done: its run's stamps (in its clock), its record count and its client part."""

    start_ns: int
    end_ns: int
    stopped: str
    ramp_end_ns: int
    records: int
    start_late_ns: int | None  # its measured part began this long after t0 (None: it never got `Go`)
    client: ClientPart | None
    conns: tuple[ConnSample, ...] = ()  # the connections its load opened (core/tls.py), logged again by the driver
    behind_s: float = 0.0  # an open loop's schedule behind the clock when the duration ended (core.load.CellRun)
    sent: int = 0
    warmup_note: str = ""  # its warmup was cut by the cell's duration (core.load.CellRun)


@dataclass(frozen=True, slots=True)
class Failed:
    """The worker failed (one line): its last message."""

    text: str


@dataclass(frozen=True, slots=True)
class Dead:
    """The driver's own note that a worker went away without a last message."""

    why: str


@dataclass(frozen=True, slots=True)
class Go:
    """Start the measured part at t0, in the worker's clock."""

    t0_ns: int


@dataclass(frozen=True, slots=True)
class Drain:
    reason: str


@dataclass(frozen=True, slots=True)
class Stop:
    reason: str


WorkerMsg = Ready | Recs | End | Done | Failed | Dead
DriverMsg = Go | Drain | Stop
Send = Callable[[WorkerMsg], None]


class WorkerLoop:
    """One worker: runs its share with `run_cell` on an event loop of its own. Messages out through `send`:
    `Ready` when its warmup is done, `Recs` every BATCH_S, `End` when it ended the cell itself, `Done` or
    `Failed` last. Messages in through `deliver` (any thread): `Go` (t0 in this process's clock), `Drain`,
    `Stop`."""

    def __init__(self, share: Share, opts: ClientOptions, seed: int, send: Send) -> None:
        self.share = share
        self.opts = opts
        self.seed = seed
        self.send = send
        self.loop: asyncio.AbstractEventLoop | None = None
        self.control: CellControl | None = None
        self.go: asyncio.Event | None = None
        self.t0 = 0
        self.early: list[DriverMsg] = []  # delivered before the loop ran
        self.lock = threading.Lock()
        self.told: set[str] = set()  # "drain", "stop": the cell's end that came from the driver
        self.pending: list[RequestRecord] = []

    def deliver(self, msg: DriverMsg) -> None:
        with self.lock:
            if self.loop is None:
                self.early.append(msg)
                return
            loop = self.loop
        with contextlib.suppress(RuntimeError):  # the loop already closed: the worker is done
            loop.call_soon_threadsafe(self._handle, msg)

    def _handle(self, msg: DriverMsg) -> None:
        assert self.control is not None and self.go is not None
        if isinstance(msg, Go):
            self.t0 = msg.t0_ns
            self.go.set()
        elif isinstance(msg, Stop):
            self.told |= {"drain", "stop"}
            self.control.request_stop(msg.reason)
        else:
            self.told |= {"drain"}
            self.control.request_drain(msg.reason)

    def run(self) -> None:
        """Blocks until the share is done (its own event loop)."""
        asyncio.run(self.main())

    async def main(self) -> None:
        self.control = CellControl()
        self.go = asyncio.Event()
        with self.lock:
            self.loop = asyncio.get_running_loop()
            early, self.early = self.early, []
        for m in early:
            self._handle(m)
        flusher = asyncio.create_task(self._flush_every())
        watcher = asyncio.create_task(self._watch())
        s = self.share
        mark = CONNECTIONS.mark()
        try:
            run = await run_cell(self.opts, list(s.specs), s.load, s.limits, self._on_record, self.control,
                                 seed=self.seed, before_measured=self._before_measured)
        except Exception as e:  # one line for the driver; the traceback is of no use to a user
            self.send(Failed(error_text(e)))
            return
        finally:
            flusher.cancel()
            watcher.cancel()
            await asyncio.gather(flusher, watcher, return_exceptions=True)
        self._flush()
        self.send(Done(start_ns=run.start_ns, end_ns=run.end_ns, stopped=run.stopped, ramp_end_ns=run.ramp_end_ns,
                       records=len(run.records), start_late_ns=run.start_ns - self.t0 if self.t0 else None,
                       client=run.client, conns=tuple(CONNECTIONS.take(mark)), behind_s=run.behind_s, sent=run.sent,
                       warmup_note=run.warmup_note))

    async def _before_measured(self) -> None:
        assert self.control is not None and self.go is not None
        gc.collect()  # the collection run_cell makes before the measured part then has (almost) nothing to do:
        gc.freeze()  # every worker starts at t0, not t0 plus its own collection (run_cell unfreezes at the end)
        self.send(Ready())
        drained = asyncio.create_task(self.control.drain.wait())
        went = asyncio.create_task(self.go.wait())
        await asyncio.wait({drained, went}, return_when=asyncio.FIRST_COMPLETED)
        drained.cancel()
        went.cancel()
        if self.go.is_set() and not self.control.ended:
            delay = self.t0 - _perf() - 2_000_000
            if delay > 0:
                await asyncio.sleep(delay / 1e9)
            while _perf() < self.t0:  # the last 2 ms spun: a timer would wake up to a millisecond late
                pass

    def _on_record(self, rec: RequestRecord) -> None:
        self.pending.append(rec)

    def _flush(self) -> None:
        if self.pending:
            batch, self.pending = self.pending, []
            self.send(Recs(batch))

    async def _flush_every(self) -> None:
        while True:
            await asyncio.sleep(BATCH_S)
            self._flush()

    async def _watch(self) -> None:
        """A cell this worker ended itself (every request failing) ends for every worker: say so."""
        assert self.control is not None
        await self.control.drain.wait()
        if "drain" not in self.told:
            self.send(End(self.control.stop.is_set(), self.control.reason))
        if not self.control.stop.is_set():
            await self.control.stop.wait()
            if "stop" not in self.told:
                self.send(End(True, self.control.reason))


# --- the driver's side --------------------------------------------------------------------------------------


class Channel(Protocol):
    """The driver's end of one worker: `send` a message (never blocks long); `label` names it in errors."""

    label: str

    def send(self, msg: DriverMsg) -> None: ...


async def drive(
    shares: Sequence[Share],
    channels: Sequence[Channel],
    inbox: asyncio.Queue[tuple[int, WorkerMsg]],
    on_record: Callable[[RequestRecord], None] | None,
    control: CellControl,
    before_measured: Callable[[], Awaitable[None]] | None,
    margin_s: float = START_MARGIN_S,
    on_batch: Callable[[int, list[RequestRecord]], None] | None = None,
) -> tuple[CellRun, list[ClientPart | None], float | None]:
    """Run the workers' cell from their messages (`inbox`: (worker, message); a worker that died sends
    `Dead`): records to `on_record`, the warmup barrier and the common start, the cell's control both
    ways. Returns the merged run, each worker's client part and how far the latest worker started its measured
    part after t0 (ms; None: none started). A worker's error or death stops the others and raises
    ServescopeError (one line)."""
    n = len(shares)
    ready: set[int] = set()
    done: dict[int, Done] = {}
    finished: set[int] = set()  # done, failed or dead
    got: dict[int, int] = dict.fromkeys(range(n), 0)
    records: list[RequestRecord] = []
    went = False
    told_drain = told_stop = False
    failure = ""

    def broadcast(msg: DriverMsg) -> None:
        for k, ch in enumerate(channels):
            if k not in finished:
                with contextlib.suppress(Exception):
                    ch.send(msg)

    while len(finished) < n:
        if control.drain.is_set() and not told_drain:
            told_drain = True
            broadcast(Stop(control.reason) if control.stop.is_set() else Drain(control.reason))
            told_stop = control.stop.is_set()
        if control.stop.is_set() and not told_stop:
            told_stop = True
            broadcast(Stop(control.reason))
        if not went and len(ready) + len(finished) == n:
            went = True
            if not control.ended and before_measured is not None:
                await before_measured()
            t0 = _perf() + int(margin_s * 1e9)
            for k in ready:
                if k not in finished:
                    channels[k].send(Go(t0))
            continue
        try:
            k, msg = await asyncio.wait_for(inbox.get(), timeout=0.05)
        except TimeoutError:
            continue
        if isinstance(msg, Recs):
            batch = msg.records
            got[k] += len(batch)
            if on_batch is not None:
                on_batch(k, batch)
            for rec in batch:
                shares[k].place(rec)
                records.append(rec)
                if on_record is not None:
                    on_record(rec)
        elif isinstance(msg, Ready):
            ready.add(k)
        elif isinstance(msg, End):
            if msg.stop:
                control.request_stop(msg.reason)
            else:
                control.request_drain(msg.reason)
        elif isinstance(msg, Done):
            done[k] = msg
            finished.add(k)
            CONNECTIONS.extend(msg.conns)  # the cell's connections, as if this process had opened them
        else:
            why = msg.text if isinstance(msg, Failed) else msg.why
            failure = f"load worker {k + 1} of {n} ({channels[k].label}) " \
                      f"{'failed' if isinstance(msg, Failed) else 'died'}: " \
                      f"{why.splitlines()[0] if why.strip() else 'no reason given'}"
            finished.add(k)
            control.request_stop(failure)
            broadcast(Stop(failure))
            told_drain = told_stop = True
    if failure:
        raise ServescopeError(failure)
    lost = [k for k in range(n) if done[k].records != got[k]]
    if lost:
        raise ServescopeError(f"load worker {lost[0] + 1} of {n} lost records on the way back")
    parts = [done[k].client for k in range(n)]
    starts = [d.start_ns for d in done.values()]
    ramps = [d.ramp_end_ns for d in done.values() if d.ramp_end_ns]
    ends = [r.end_ns for r in records]
    run = CellRun(records, min(starts), max(ends, default=max(d.end_ns for d in done.values())),
                  next((d.stopped for d in done.values() if d.stopped), ""), min(ramps, default=0),
                  behind_s=max(d.behind_s for d in done.values()), sent=sum(d.sent for d in done.values()),
                  warmup_note=next((d.warmup_note for d in done.values() if d.warmup_note), ""))
    late = [d.start_late_ns / 1e6 for d in done.values() if d.start_late_ns is not None]
    return run, parts, max(late, default=None)


def merge_parts(parts: Sequence[ClientPart | None], workers: int) -> ClientPart | None:
    """The cell's client figure: `health.merge_client` of the workers' parts; when the workers measured no
    loop lag (parts of only `nodes` and `clock_error_ms`), those summed (and the bound's worst) alone."""
    got = [p for p in parts if p is not None]
    if not got:
        return None
    if all(p.loop_lag_ms is not None for p in got):
        return merge_client(got)
    return add_placement(ClientPart(workers=workers), got)


# --- local processes ----------------------------------------------------------------------------------------


def _child(conn: Connection[WorkerMsg, DriverMsg], share: Share, opts: ClientOptions, seed: int) -> None:
    """A spawned worker process: its share, driven over `conn`. Ctrl-C is the parent's to handle (it drains or
    stops the workers); the parent gone (the pipe closed) stops the cell. Nothing it prints reaches the
    terminal (the app may be drawing there): what it has to say goes over `conn`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    devnull = os.open(os.devnull, os.O_WRONLY)
    for fd in (1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)
    wlock = threading.Lock()

    def send(msg: WorkerMsg) -> None:
        with wlock, contextlib.suppress(OSError, ValueError):
            conn.send(msg)

    worker = WorkerLoop(share, opts, seed, send)

    def read() -> None:
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                worker.deliver(Stop("the driving process went away"))
                return
            worker.deliver(msg)

    threading.Thread(target=read, daemon=True).start()
    worker.run()
    with contextlib.suppress(OSError):
        conn.close()


class _Pipe:
    def __init__(self, k: int, conn: Connection[DriverMsg, WorkerMsg], proc: BaseProcess) -> None:
        self.label = f"pid {proc.pid}"
        self.conn = conn
        self.proc = proc
        self.k = k

    def send(self, msg: DriverMsg) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(msg)


def _reader(pipe: _Pipe, loop: asyncio.AbstractEventLoop, inbox: asyncio.Queue[tuple[int, WorkerMsg]]) -> None:
    """Worker -> driver messages, until the pipe closes; a close before `Done` reports the worker dead."""
    finished = False
    while True:
        try:
            msg = pipe.conn.recv()
        except (EOFError, OSError):
            break
        except Exception as e:  # a message that does not unpickle
            msg = Failed(f"a message did not arrive intact ({error_text(e)})")
        if isinstance(msg, (Done, Failed)):
            finished = True
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(inbox.put_nowait, (pipe.k, msg))
        if finished:
            return
    pipe.proc.join(2.0)
    code = pipe.proc.exitcode
    why = f"exit code {code}" if code is not None and code >= 0 else \
        f"killed by signal {-code}" if code is not None else "its pipe closed"
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(inbox.put_nowait, (pipe.k, Dead(why)))


async def _reap(pipes: Sequence[_Pipe], grace_s: float = 5.0) -> None:
    """Every worker process ended and joined: a grace period, then SIGTERM, then SIGKILL."""
    try:
        for _ in range(int(grace_s / 0.02)):
            if not any(p.proc.is_alive() for p in pipes):
                break
            await asyncio.sleep(0.02)
    finally:
        for p in pipes:
            if p.proc.is_alive():
                p.proc.terminate()
        for p in pipes:
            p.proc.join(2.0)
            if p.proc.is_alive():
                p.proc.kill()
                p.proc.join()
            with contextlib.suppress(OSError):
                p.conn.close()


def _context() -> ForkServerContext | SpawnContext:
    """Fresh interpreters for the workers, never a fork of this one (its threads, the app, open sockets):
    "forkserver" where there is one, with this module preloaded, so a cell's workers start in milliseconds
    after the first (and the program's own __main__ is never run again in them); else "spawn"."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload([__name__])
        return ctx
    return multiprocessing.get_context("spawn")  # pragma: no cover (no forkserver: macOS uses spawn anyway)


async def run_cell_workers(
    opts: ClientOptions,
    specs: Sequence[RequestSpec],
    load: Load,
    limits: Limits,
    on_record: Callable[[RequestRecord], None] | None = None,
    control: CellControl | None = None,
    seed: int = 0,
    before_measured: Callable[[], Awaitable[None]] | None = None,
    workers: int = 1,
) -> CellRun:
    """`core.load.run_cell` over `workers` processes (1, or a cell that cannot be split: `run_cell` itself)."""
    control = control or CellControl()
    shares = split_cell(specs, load, limits, local_workers(workers), seed)
    if len(shares) <= 1:
        return await run_cell(opts, specs, load, limits, on_record, control, seed=seed,
                              before_measured=before_measured)
    ctx = _context()
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue[tuple[int, WorkerMsg]] = asyncio.Queue()
    pipes: list[_Pipe] = []
    try:
        for s in shares:
            ours, theirs = ctx.Pipe(duplex=True)
            proc = ctx.Process(target=_child, args=(theirs, s, opts, seed), name=f"servescope-load-{s.k + 1}",
                               daemon=True)
            proc.start()
            theirs.close()
            pipe = _Pipe(s.k, ours, proc)
            pipes.append(pipe)
            threading.Thread(target=_reader, args=(pipe, loop, inbox), daemon=True,
                             name=f"servescope-load-{s.k + 1}-reader").start()
        run, parts, skew_ms = await drive(shares, pipes, inbox, on_record, control, before_measured)
    except BaseException:
        for p in pipes:
            p.send(Stop("the cell was interrupted"))
        raise
    finally:
        await _reap(pipes)
    client = merge_parts(parts, len(shares))
    if client is not None:
        # the latest worker's measured part began this long after t0
        run.client = msgspec.structs.replace(client, start_skew_ms=skew_ms) if skew_ms is not None else client
    return run
