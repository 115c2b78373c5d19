"""`--workers`: how many processes send a cell's load. A count from 1, or "auto" (chosen per cell by
`core.workers.auto_workers` from its load). Parsed in one place (`engine.fields.workers`: the flag, the TOML, the
Compose form), with one default for the sweep's option and every Target. This module imports only `os`, so the
CLI's parser can name the type without loading the client.

A hard cap: at most `WORKERS_PER_CORE` processes per core of this machine (`max_workers`); more only share the
same cores and cost memory (100 idle workers hold about 2.5 GB). A cell also never runs more workers than its
load has users (or open-loop cap slots): `core.workers.split_cell`."""

from __future__ import annotations

import os
from typing import Literal

Workers = int | Literal["auto"]
DEFAULT_WORKERS: Workers = "auto"
WORKERS_PER_CORE = 4


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover (not Linux)
        return os.cpu_count() or 1


def max_workers() -> int:
    """The most worker processes a cell may run on this machine: its cores x `WORKERS_PER_CORE`."""
    return max(1, cores() * WORKERS_PER_CORE)


def too_many_workers(n: int, where: str = "--workers") -> str | None:
    """The one-line refusal of `n` worker processes above `max_workers`, None when they fit."""
    cap = max_workers()
    if n <= cap:
        return None
    return (f"{where}: {n} processes is more than this machine runs usefully; give at most {cap} "
            f"({cores()} cores x {WORKERS_PER_CORE}), or auto")
