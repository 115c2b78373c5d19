"""Where one server configuration stops beating another as the load grows: the crossover load. Speculative decoding
is the case it was made for (it lowers TPOT at low load, where a step is memory-bound and verifying drafts is
nearly free, and raises it at high load, where every drafted row is paid for), so a report can say "speculation
lowers TPOT up to c=8, raises it from c=16". Pure functions over figures: no session is read here."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from servescope.core.results import CellResult


@dataclass(frozen=True)
class Crossover:
    """How `b` compares with `a` on a lower-is-better metric over the loads both were measured at (ascending):
    `lower_up_to` is the highest load of the first run of loads where `b` is lower, `higher_from` the load where `b`
    first stops being lower after it (None: `b` never is lower, or never stops being lower). `points` are
    (load, a, b) for every common load."""

    lower_up_to: float | None
    higher_from: float | None
    points: tuple[tuple[float, float, float], ...]

    @property
    def crosses(self) -> bool:
        return self.lower_up_to is not None and self.higher_from is not None


def crossover(a: Mapping[float, float], b: Mapping[float, float], tolerance: float = 0.0) -> Crossover | None:
    """The crossover of `b` against `a` ({load: value}, lower is better): `b` is lower at a load when
    b < a x (1 - tolerance), and no longer lower when b >= a x (1 - tolerance). None without a common load."""
    loads = sorted(set(a) & set(b))
    if not loads:
        return None
    points = tuple((x, a[x], b[x]) for x in loads)
    lower = [vb < va * (1.0 - tolerance) for _, va, vb in points]
    if not lower[0]:
        return Crossover(None, loads[0], points)
    k = 0
    while k < len(loads) and lower[k]:
        k += 1
    return Crossover(loads[k - 1], loads[k] if k < len(loads) else None, points)


def load_text(load: float, unit: str = "c=") -> str:
    """"c=8" for a concurrency, "4 req/s" for a rate (`unit` "req/s")."""
    shown = f"{load:g}"
    return f"{unit}{shown}" if unit.endswith("=") else f"{shown} {unit}"


def crossover_sentence(c: Crossover, what: str = "speculation", metric: str = "TPOT", unit: str = "c=") -> str:
    """"speculation lowers TPOT up to c=8, raises it from c=16" (or that it lowers / does not lower it at every
    load measured)."""
    if c.lower_up_to is None:
        return f"{what} does not lower {metric} at any load measured (from {load_text(c.points[0][0], unit)})"
    if c.higher_from is None:
        return f"{what} lowers {metric} at every load measured (up to {load_text(c.points[-1][0], unit)})"
    return f"{what} lowers {metric} up to {load_text(c.lower_up_to, unit)}, raises it from {load_text(c.higher_from, unit)}"


def speculation_crossover(cells: Iterable[tuple[float, CellResult]], metric: str = "tpot_ms.p50",
                          tolerance: float = 0.0) -> Crossover | None:
    """The crossover of the cells with speculative decoding (their `spec_decode` set) against those without, on
    `metric` (lower is better), from (load, summary) pairs: each load's median over its cells (repeats). None
    unless both kinds were measured at a common load."""
    on: dict[float, list[float]] = {}
    off: dict[float, list[float]] = {}
    for load, s in cells:
        v = s.value(metric)
        if v is not None:
            (on if s.spec_decode is not None else off).setdefault(float(load), []).append(v)
    return crossover({k: statistics.median(v) for k, v in off.items()},
                     {k: statistics.median(v) for k, v in on.items()}, tolerance)
