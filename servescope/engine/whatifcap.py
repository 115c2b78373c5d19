"""The most concurrency a what-if may ask of the twin: its server runs at most `max_num_seqs` requests at once
(as measured or inferred, or as `--max-num-seqs` sets it) and queues the rest, so the twin predicts up to
`WHATIF_QUEUE_FACTOR` x that (the top of `engine.whatif.capacity_row`'s search): beyond it only the queue grows,
while the virtual cell's requests (4 per user) grow without bound (`whatif -c 99999999999999` took ~143 MB/s until
the kernel stopped it). Checked before any virtual cell runs, by the CLI's `whatif` and the app's What-if screen."""

from __future__ import annotations

from collections.abc import Sequence

from servescope.core.errors import ServescopeError
from servescope.engine.twin import Twin
from servescope.engine.twinpredict import Load
from servescope.engine.twinshape import AS_MEASURED, Knobs

WHATIF_QUEUE_FACTOR = 2
WHATIF_MIN_CAP = 8  # a server of very few sequences still gets c=1..8 (capacity_row's smallest top)

__all__ = ["WHATIF_QUEUE_FACTOR", "check_whatif_loads", "whatif_cap"]


def whatif_cap(twin: Twin, knobs: Knobs = AS_MEASURED) -> tuple[int, int]:
    """(the twin's max_num_seqs with the knobs applied, the largest concurrency a what-if may ask)."""
    seqs = knobs.max_num_seqs if knobs.max_num_seqs is not None else twin.profile.engine.max_num_seqs
    seqs = max(1, int(seqs))
    return seqs, max(WHATIF_MIN_CAP, WHATIF_QUEUE_FACTOR * seqs)


def check_whatif_loads(twin: Twin, loads: Sequence[Load], knobs: Knobs = AS_MEASURED,
                       where: str = "--concurrency") -> None:
    """One-line ServescopeError when a load asks for more users than `whatif_cap` allows; nothing otherwise."""
    seqs, cap = whatif_cap(twin, knobs)
    over = [ld.concurrency for ld in loads if ld.concurrency is not None and ld.concurrency > cap]
    if over:
        raise ServescopeError(
            f"{where} {max(over):,}: the twin's server runs at most {seqs:,} requests at once (max_num_seqs) and "
            f"queues the rest; it predicts up to c={cap:,} ({WHATIF_QUEUE_FACTOR} x max_num_seqs): give at most {cap:,}")
