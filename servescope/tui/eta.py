"""How long a running sweep has left: each cell still to run (and the rest of the running one) from what its
plan asks (requests at a concurrency, requests at a rate, a duration) and how long a request takes at that load.

The Run screen once took the sweep's elapsed time over the share of cells done, as if every cell took as long:
a closed loop at c=1 sends its 100 requests one after another, at c=16 sixteen at a time, so after a slow first
cell the estimate was far too long, and where later cells were the slow ones (higher loads queueing, a longer
workload) far too short. Here a closed-loop cell of n requests at concurrency c takes n / c request times (a
request's time at that load: the E2E p50 measured there, the running cell's own as it goes, else the nearest
measured load's, growing with the load past it as the measured ones did), an open-loop cell n / rate plus one
request, a timed cell its duration plus one request; each cell also costs the time the finished ones spent
around their requests (building prompts, warmup, the server's telemetry). A workload with nothing measured yet
takes the finished cells' mean time. Pure functions of the plan and what was measured: the tests give it
recorded progress."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from servescope.engine.wire import CellInfo

DEFAULT_REQUESTS = 100  # a cell that names neither requests nor a duration runs its workload's own (most: 100)


@dataclass(frozen=True)
class Measured:
    """A finished cell: its plan, its wall time (from its start to its end, as the app saw them) and the E2E
    p50 of its requests (seconds; None when none finished)."""

    cell: CellInfo
    wall_s: float
    e2e_s: float | None


Live = tuple[CellInfo, float]  # the running cell and its requests' E2E p50 so far (seconds)


def request_seconds(cell: CellInfo, measured: Sequence[Measured], live: Live | None = None) -> float | None:
    """A request's time (E2E) at `cell`'s load, from the finished cells of its series (and the running one's so
    far): the same load's, else between the two loads around it, else past the highest (or under the lowest)
    measured load, growing with the load as it grew between the two highest ones (never less than the nearest's);
    None without any."""
    seen = [(m.cell, m.e2e_s) for m in measured if m.e2e_s is not None] + ([live] if live is not None else [])
    pts = sorted({c.x: e for c, e in seen if c.series == cell.series and (c.rate is None) == (cell.rate is None)
                  }.items())
    if not pts:
        return None
    x = cell.x
    for px, e in pts:
        if px == x:
            return e
    below = [(px, e) for px, e in pts if px < x]
    above = [(px, e) for px, e in pts if px > x]
    if below and above:
        (x0, e0), (x1, e1) = below[-1], above[0]
        return e0 + (e1 - e0) * (x - x0) / (x1 - x0)
    if above:
        return above[0][1]
    if len(below) >= 2:
        (x0, e0), (x1, e1) = below[-2], below[-1]
        slope = max(0.0, (e1 - e0) / (x1 - x0))
        return e1 + slope * (x - x1)
    return below[-1][1]


def work_seconds(cell: CellInfo, e2e_s: float) -> float:
    """The time `cell`'s requests take at e2e_s a request: n / c rounds of a closed loop, n / rate (plus the
    last request) of an open one, a duration (plus the requests in flight at its end)."""
    n = cell.requests
    timed = cell.duration_s + e2e_s if cell.duration_s else None
    if n is None and timed is not None:
        return timed
    n = n or DEFAULT_REQUESTS
    if cell.rate:
        t = n / cell.rate + e2e_s
    else:
        t = math.ceil(n / max(1, cell.concurrency or 1)) * e2e_s
    return min(t, timed) if timed is not None else t


def overhead_seconds(measured: Sequence[Measured]) -> float:
    """The finished cells' mean time around their requests (wall time less the requests' own)."""
    extra = [max(0.0, m.wall_s - work_seconds(m.cell, m.e2e_s)) for m in measured if m.e2e_s is not None]
    return sum(extra) / len(extra) if extra else 0.0


def cell_seconds(cell: CellInfo, measured: Sequence[Measured], live: Live | None = None) -> float | None:
    """A planned cell's wall time: its requests' time at its load and the finished cells' overhead; the finished
    cells' mean wall time for a workload with nothing measured; None before any cell finished."""
    e2e = request_seconds(cell, measured, live)
    if e2e is not None:
        return work_seconds(cell, e2e) + overhead_seconds(measured)
    if measured:
        return sum(m.wall_s for m in measured) / len(measured)
    return None


def running_left(cell: CellInfo, elapsed_s: float, done: int, e2e_s: float | None,
                 measured: Sequence[Measured]) -> float | None:
    """What the running cell has left: its requests still to finish at its own E2E so far (or the one predicted
    for its load), a timed cell its duration less the time gone, and half the time the finished cells spent
    around their requests (the rest went before its first request); None when nothing tells yet."""
    e2e = e2e_s if e2e_s is not None else request_seconds(cell, measured)
    after = overhead_seconds(measured) / 2
    if cell.duration_s and cell.requests is None:
        return max(0.0, cell.duration_s - elapsed_s) + (e2e or 0.0) + after
    if e2e is None:
        whole = cell_seconds(cell, measured)
        return max(0.0, whole - elapsed_s) if whole is not None else None
    n = cell.requests or DEFAULT_REQUESTS
    left = work_seconds(CellInfo(cell.index, cell.workload, cell.load_label, cell.concurrency, cell.rate,
                                 max(0, n - done), None, cell.shape, cell.variant), e2e) if n > done else 0.0
    if cell.duration_s:
        left = min(left, max(0.0, cell.duration_s - elapsed_s) + e2e)
    return left + after


def sweep_eta(cells: Sequence[CellInfo], measured: Sequence[Measured], current: CellInfo | None,
              elapsed_s: float, done: int, e2e_s: float | None, finished: set[int]) -> float | None:
    """Seconds the sweep has left: the running cell's rest and every cell not yet finished (nor running);
    None while nothing measured tells how long a cell takes."""
    total = 0.0
    live = (current, e2e_s) if current is not None and e2e_s is not None else None
    if current is not None:
        left = running_left(current, elapsed_s, done, e2e_s, measured)
        if left is None:
            return None
        total += left
    for c in cells:
        if c.index in finished or (current is not None and c.index == current.index):
            continue
        t = cell_seconds(c, measured, live)
        if t is None:
            return None
        total += t
    return total
