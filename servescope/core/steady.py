"""A cell's steady-state window: the part of it in which its load was at its target.

A cell starts and ends off its target load: a closed loop's users start one by one over the ramp (or together, in
lockstep), and once the last request is sent the ones in flight finish with fewer and fewer beside them (the drain).
The window leaves both out:

- closed loop: from the moment the last user has started (the ramp's end; with no ramp, the cell's start: every user
  starts at once) to the last send;
- open loop: from the end of the ramp (with no ramp, the cell's start) to the last send;
- a trace replays its own times: its window is the whole cell.

A request belongs to the window when it was *sent* inside it (its scheduled send when it never went out); a rate
counts what happened inside it (tokens arrived, requests ended: core/precision.py `window_rates`) over its length.
A window shorter than the median E2E of its requests, or holding fewer than two, is no steady state: the cell's
figures are then the whole cell's, and say so. `--window whole` gives the figures over every measured request
and the cell's wall time (first scheduled send to last end), as servescope computed them before windows.

With `--precision` the window ends where the stop rule judged the figures precise (core/precision.py): the
requests sent after that look and before the drain began are measured and counted, but not in the window.

Pure: no polars, no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servescope.core.load import Load
from servescope.core.records import RequestRecord

__all__ = ["WindowSpan", "long_enough", "ramp_from_probe", "sent_at", "steady_offset", "steady_span"]


def ramp_from_probe(e2e_s: float) -> float:
    """A closed loop's ramp from one request sent alone (its E2E in s), rounded as the session shows it.

    A cell's users start one by one over about one request's time, not all at once: users started together stay
    in lockstep round after round (every request of a round is admitted, prefilled and decoded with the others),
    so where an SLO cuts through a round, whether a round's last requests meet it decides many at once, and the
    same cell measured again gave 28, 60 and 56 of 64 requests within the SLOs (the KV-limited profile of
    docs/tune.md, 16 users); started apart, their requests find the server in every state of a round, and the
    same cell gave 5 of 64 three times of three. Over the unloaded E2E, since it is known before the cell: a
    loaded request takes longer, so the users start in the first part of a round, still apart."""
    return max(0.1, round(e2e_s, 1))


def sent_at(r: RequestRecord) -> int:
    """When a request went out (its scheduled send when it never did)."""
    return r.sent_ns or r.scheduled_ns


@dataclass(frozen=True)
class WindowSpan:
    """The steady window of one cell, in perf_counter_ns, and one line saying where it starts and ends."""

    start_ns: int
    end_ns: int
    basis: str


def steady_offset(load: Load, requests: int | None) -> tuple[int, str]:
    """How long after the cell's first scheduled send its steady window starts (ns), and one line saying why."""
    ramp_ns = int(load.ramp_s * 1e9) if load.ramp_s else 0
    if load.rate is not None:
        return ramp_ns, f"after the ramp ({load.ramp_s:g} s)" if ramp_ns else "from the first send (no ramp)"
    users = int(load.concurrency or 1)
    if requests is not None:
        users = max(1, min(users, requests))
    if users <= 1:
        return 0, "from the first send"
    if not ramp_ns:
        return 0, f"from the first send ({users} users started together)"
    return ramp_ns * (users - 1) // users, f"once the last of {users} users started (ramp {load.ramp_s:g} s)"


def steady_span(records: Sequence[RequestRecord], load: Load, requests: int | None,
                precise_end_ns: int | None = None) -> WindowSpan | None:
    """The cell's steady window (see the module's text); None when it has none: a trace, or a cell with no
    request sent after its ramp."""
    measured = [r for r in records if not r.warmup]
    if not measured or load.arrival == "trace":
        return None
    first = min(r.scheduled_ns for r in measured)
    offset, head = steady_offset(load, requests)
    start = first + offset
    if precise_end_ns is not None:
        end = precise_end_ns
        tail = "to the send after which its figures were precise enough"
    else:
        end = max(sent_at(r) for r in measured)
        tail = "to the last send (the drain after it left out)"
    if end <= start:
        return None
    if precise_end_ns is None and not long_enough(measured, start, end):
        return None
    return WindowSpan(start, end, f"{head} {tail}")


def long_enough(records: Sequence[RequestRecord], start_ns: int, end_ns: int) -> bool:
    """A steady window means something once it holds two requests or more and lasts at least the median E2E of
    the requests sent in it (a closed loop of 16 users and 16 requests has none: its last user's first send is its
    last send)."""
    inside = [r for r in records if start_ns <= sent_at(r) <= end_ns]
    e2e = sorted(r.end_ns - r.sent_ns for r in inside if r.status == "ok" and r.end_ns > r.sent_ns > 0)
    return len(inside) >= 2 and bool(e2e) and end_ns - start_ns >= e2e[len(e2e) // 2]
