"""One cell's load from Ray actors across a cluster's nodes (`--ray ADDRESS|auto`, the `ray` extra).

The cell is split exactly as for local worker processes (`core.workers.split_cell`); each share runs in a Ray
actor (`WorkerLoop`, its own event loop on a thread of the actor), placed on the nodes `--ray-nodes` names (node
IPs or node IDs, given out round robin; NodeAffinitySchedulingStrategy) or spread over the cluster (SPREAD).
The driver (this process) polls each actor every `BATCH_S` for what it finished, and `core.workers.drive`
runs the cell from those messages as it does for processes.

Clocks: a node's perf_counter_ns has an origin of its own. Before the cell each actor's offset to the driver
is measured NTP-style over Ray calls (driver t_send, actor now, driver t_recv: offset = now - (t_send+t_recv)/2,
error bound rtt/2; the exchange with the smallest rtt of `CLOCK_EXCHANGES`); the common start t0 reaches each
actor in its own clock, and every stamp an actor took comes back converted into the driver's. The cell's
client part says how far it can be off (`clock_error_ms`, the worst actor's bound) and where the requests came
from (`nodes`: node -> measured requests)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from array import array
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import ModuleType
from typing import Protocol, TypeVar

import msgspec

from servescope.core.client import ClientOptions, RequestSpec
from servescope.core.errors import ServescopeError, error_text
from servescope.core.health import ClientPart
from servescope.core.load import CellControl, CellRun, Limits, Load
from servescope.core.records import RequestRecord
from servescope.core.workers import (
    BATCH_S,
    Dead,
    Done,
    DriverMsg,
    Failed,
    Go,
    Recs,
    Share,
    WorkerLoop,
    WorkerMsg,
    drive,
    merge_parts,
    split_cell,
)

__all__ = ["RAY_INSTALL", "clock_offset", "node_keys", "pick_nodes", "run_cell_ray", "shift_record"]

RAY_INSTALL = "--ray needs Ray, an optional extra: pip install 'servescope[ray]'"
CLOCK_EXCHANGES = 8
PLACE_TIMEOUT_S = 120.0  # an actor not placed by then (no node with a free CPU): the cell fails, one line

_perf = time.perf_counter_ns

T_co = TypeVar("T_co", covariant=True)


class _Method(Protocol[T_co]):
    """An actor's method as Ray hands it to the driver: `.remote(...)` gives an awaitable of its result."""

    def remote(self, *args: object) -> Awaitable[T_co]: ...


class _Actor(Protocol):
    """The driver's handle of a `LoadActor` (Ray types neither the handle's methods nor `.remote`)."""

    @property
    def where(self) -> _Method[tuple[str, str]]: ...
    @property
    def now(self) -> _Method[int]: ...
    @property
    def start(self) -> _Method[None]: ...
    @property
    def tell(self) -> _Method[None]: ...
    @property
    def poll(self) -> _Method[list[WorkerMsg]]: ...


def _import_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise ServescopeError(RAY_INSTALL) from None
    return ray


def clock_offset(exchanges: Sequence[tuple[int, int, int]]) -> tuple[int, int]:
    """(offset_ns, error_bound_ns) from (t_send, remote_now, t_recv) exchanges: the one with the smallest round
    trip; offset = remote_now - (t_send + t_recv) / 2 (remote = driver + offset), bound = rtt / 2."""
    t_send, remote, t_recv = min(exchanges, key=lambda e: e[2] - e[0])
    return remote - (t_send + t_recv) // 2, (t_recv - t_send + 1) // 2


def shift_record(rec: RequestRecord, offset_ns: int) -> RequestRecord:
    """An actor's record in the driver's clock (in place): every stamp less the actor's offset (0: not taken)."""
    for name in ("scheduled_ns", "sent_ns", "first_token_ns", "first_content_ns", "end_ns"):
        v = getattr(rec, name)
        if v:
            setattr(rec, name, v - offset_ns)
    if len(rec.chunk_ns):
        rec.chunk_ns = array("q", (x - offset_ns for x in rec.chunk_ns))
    return rec


def pick_nodes(alive: Sequence[Mapping[str, object]], wanted: Sequence[str]) -> list[str]:
    """Node IDs for `--ray-nodes` (IPs or node IDs, a unique prefix of an ID will do), in the order given; an
    IP several nodes share names all of them. One-line error naming the cluster's nodes for one not found.
    `alive`: `ray.nodes()`'s entries of live nodes."""
    nodes = [(str(n["NodeID"]), n.get("NodeManagerAddress")) for n in alive]
    out: list[str] = []
    for w in (x.strip() for x in wanted):
        if not w:
            continue
        ids = [nid for nid, ip in nodes if nid == w or ip == w]
        if not ids:
            ids = [nid for nid, _ in nodes if len(w) >= 6 and nid.startswith(w)]
            if len(ids) > 1:
                raise ServescopeError(f"--ray-nodes: {w!r} is the start of several node IDs; give more of it")
        if not ids:
            have = ", ".join(f"{ip} ({nid[:12]})" for nid, ip in nodes) or "none"
            raise ServescopeError(f"--ray-nodes: no live node {w!r} in the Ray cluster; its nodes: {have}")
        out.extend(i for i in ids if i not in out)
    return out


def node_keys(nodes: Sequence[tuple[str, str]]) -> dict[str, str]:
    """node ID -> the name a cell's `nodes` uses for it: its IP, or IP/ID prefix where nodes share an IP."""
    ips: dict[str, set[str]] = {}
    for nid, ip in nodes:
        ips.setdefault(ip, set()).add(nid)
    return {nid: ip if len(ips[ip]) == 1 else f"{ip}/{nid[:8]}" for nid, ip in nodes}


class LoadActor:
    """The actor's body (wrapped with `ray.remote` when used): one share's `WorkerLoop` on a thread of its
    own; `poll` hands over the messages it sent since the last call."""

    def __init__(self, share: Share, opts: ClientOptions, seed: int) -> None:
        self.lock = threading.Lock()
        self.out: list[WorkerMsg] = []
        self.worker = WorkerLoop(share, opts, seed, self._send)
        self.thread: threading.Thread | None = None

    def _send(self, msg: WorkerMsg) -> None:
        with self.lock:
            self.out.append(msg)

    def where(self) -> tuple[str, str]:
        import ray

        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]

    def now(self) -> int:
        return _perf()

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True, name="servescope-load")
        self.thread.start()

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as e:  # the driver hears of it as this worker's failure
            self._send(Failed(error_text(e)))

    def tell(self, msg: DriverMsg) -> None:
        self.worker.deliver(msg)

    def poll(self) -> list[WorkerMsg]:
        with self.lock:
            out, self.out = self.out, []
        return out


class _ActorChannel:
    def __init__(self, k: int, actor: _Actor, node: str, offset_ns: int, error_ns: int) -> None:
        self.k = k
        self.actor = actor
        self.label = f"Ray node {node}"
        self.node = node
        self.offset_ns = offset_ns
        self.error_ns = error_ns
        self.finished = False

    def send(self, msg: DriverMsg) -> None:
        if isinstance(msg, Go):
            msg = Go(msg.t0_ns + self.offset_ns)  # the driver's t0 in the actor's clock
        with contextlib.suppress(Exception):
            self.actor.tell.remote(msg)

    def inward(self, msg: WorkerMsg) -> WorkerMsg:
        """An actor's message with its stamps in the driver's clock."""
        if isinstance(msg, Recs):
            return Recs([shift_record(r, self.offset_ns) for r in msg.records])
        if isinstance(msg, Done):

            def shift(ns: int) -> int:
                return ns - self.offset_ns if ns else ns  # 0: not taken

            return dataclasses.replace(msg, start_ns=shift(msg.start_ns), end_ns=shift(msg.end_ns),
                                       ramp_end_ns=shift(msg.ramp_end_ns))
        return msg


async def _poll(channels: Sequence[_ActorChannel], inbox: asyncio.Queue[tuple[int, WorkerMsg]]) -> None:
    """Every BATCH_S, each actor's messages into the inbox; an actor that cannot be reached is dead."""
    while not all(ch.finished for ch in channels):
        for ch in channels:
            if ch.finished:
                continue
            try:
                msgs = await ch.actor.poll.remote()
            except Exception as e:
                ch.finished = True
                inbox.put_nowait((ch.k, Dead(error_text(e))))
                continue
            for m in msgs:
                if isinstance(m, (Done, Failed)):
                    ch.finished = True
                inbox.put_nowait((ch.k, ch.inward(m)))
        await asyncio.sleep(BATCH_S)


async def _measure_clock(actor: _Actor) -> tuple[int, int]:
    exchanges = []
    for _ in range(CLOCK_EXCHANGES):
        t_send = _perf()
        remote = await actor.now.remote()
        exchanges.append((t_send, int(remote), _perf()))
    return clock_offset(exchanges)


def _connect(ray: ModuleType, address: str) -> None:
    if ray.is_initialized():
        return
    try:
        ray.init(address=address, log_to_driver=False, configure_logging=False)
    except Exception as e:
        first = (str(e).strip().splitlines() or [error_text(e)])[0]
        raise ServescopeError(f"--ray {address}: could not connect to the Ray cluster: {first}") from None


async def run_cell_ray(
    opts: ClientOptions,
    specs: Sequence[RequestSpec],
    load: Load,
    limits: Limits,
    on_record: Callable[[RequestRecord], None] | None = None,
    control: CellControl | None = None,
    seed: int = 0,
    before_measured: Callable[[], Awaitable[None]] | None = None,
    address: str = "auto",
    nodes: Sequence[str] = (),
    workers: int = 1,
    num_cpus: float = 1.0,
) -> CellRun:
    """`core.load.run_cell` over Ray actors: `workers` of them when above 1, else one per pinned node (or per
    live node of the cluster). `address` as `ray.init` takes it ("auto": the cluster this host belongs to).
    Each actor asks for `num_cpus` (a load worker keeps a core busy)."""
    ray = _import_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    control = control or CellControl()
    _connect(ray, address)
    alive = [n for n in ray.nodes() if n.get("Alive")]
    pinned = pick_nodes(alive, nodes) if nodes else []
    n = workers if workers > 1 else len(pinned) or len(alive) or 1
    shares = split_cell(specs, load, limits, n, seed)
    remote_cls = ray.remote(LoadActor)
    actors: list[_Actor] = []
    for s in shares:
        strategy: NodeAffinitySchedulingStrategy | str = NodeAffinitySchedulingStrategy(pinned[s.k % len(pinned)], soft=False) if pinned else "SPREAD"
        actors.append(remote_cls.options(num_cpus=num_cpus, max_concurrency=4, scheduling_strategy=strategy,
                                         name=None).remote(s, opts, seed))
    poller: asyncio.Task[None] | None = None
    try:
        try:
            wheres = await asyncio.wait_for(asyncio.gather(*(a.where.remote() for a in actors)), PLACE_TIMEOUT_S)
        except TimeoutError:
            raise ServescopeError(f"Ray placed only some of the {len(actors)} load workers within "
                                  f"{PLACE_TIMEOUT_S:g}s: each needs {num_cpus:g} CPU on a node "
                                  f"({'the nodes named by --ray-nodes' if pinned else 'any node'})") from None
        except Exception as e:  # the actor could not start there (servescope not installed on that node, ...)
            first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), error_text(e))
            raise ServescopeError(f"Ray could not start a load worker ({first[:300]}); servescope must be "
                                  "installed, at this version, on every node the workers run on") from None
        keys = node_keys([(nid, ip) for nid, ip in wheres])
        clocks = [await _measure_clock(a) for a in actors]
        channels = [_ActorChannel(k, a, keys[wheres[k][0]], *clocks[k]) for k, a in enumerate(actors)]
        counts: dict[int, int] = dict.fromkeys(range(len(actors)), 0)

        def on_batch(k: int, batch: list[RequestRecord]) -> None:
            counts[k] += len(batch)

        inbox: asyncio.Queue[tuple[int, WorkerMsg]] = asyncio.Queue()
        await asyncio.gather(*(a.start.remote() for a in actors))
        poller = asyncio.create_task(_poll(channels, inbox))
        worst_rtt_s = max(2 * e for _, e in clocks) / 1e9
        run, parts, skew_ms = await drive(shares, channels, inbox, on_record, control, before_measured,
                                 margin_s=max(0.25, 4 * worst_rtt_s + 2 * BATCH_S), on_batch=on_batch)
    finally:
        if poller is not None:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)
        for a in actors:
            with contextlib.suppress(Exception):
                ray.kill(a)
    out: list[ClientPart | None] = []
    for k, part in enumerate(parts):
        ch = channels[k]
        out.append(msgspec.structs.replace(part or ClientPart(), nodes={ch.node: counts[k]},
                                           clock_error_ms=ch.error_ns / 1e6))
    client = merge_parts(out, len(shares))
    if client is not None:
        # the latest actor's measured part began this long after t0
        run.client = msgspec.structs.replace(client, start_skew_ms=skew_ms) if skew_ms is not None else client
    return run
