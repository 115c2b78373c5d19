"""What a sweep keeps across the cells of one series (a workload on one server variant, in one repeat, over its
loads): the cells measured so far (the saturation mark compares a cell with the next lower load), the ramp its
closed-loop cells start their users over (`--ramp auto`), and, with `--stop-after-saturation`, the loads it no longer
runs."""

from __future__ import annotations

from dataclasses import dataclass, field

from servescope.core.results import CellResult
from servescope.engine.plan import Cell

__all__ = ["SweepSeries"]

Key = tuple[int, str, int]


def _key(cell: Cell) -> Key:
    return (cell.variant, cell.workload.name, cell.repeat)


def load_of(cell: Cell) -> float:
    return float(cell.load.concurrency or cell.load.rate or 0)


@dataclass
class SweepSeries:
    stop_after_saturation: bool = False
    measured: dict[Key, list[tuple[float, CellResult]]] = field(default_factory=dict)
    saturated: dict[Key, float] = field(default_factory=dict)  # the first saturated load of the series
    ran_past: dict[Key, float] = field(default_factory=dict)  # the one load run past it
    why: dict[Key, str] = field(default_factory=dict)
    ramps: dict[tuple[int, str], float] = field(default_factory=dict)  # (variant, workload) -> auto ramp (s)
    alone: dict[tuple[int, str], float] = field(default_factory=dict)  # (variant, workload) -> a c=1 cell's E2E p50

    def lower(self, cell: Cell) -> tuple[float, CellResult] | None:
        """The highest load below this cell's measured so far in its series, and its summary."""
        x = load_of(cell)
        below = [m for m in self.measured.get(_key(cell), []) if m[0] < x and m[1].requests_ok > 0]
        return max(below, key=lambda m: m[0]) if below else None

    def record(self, cell: Cell, s: CellResult) -> None:
        key, x = _key(cell), load_of(cell)
        self.measured.setdefault(key, []).append((x, s))
        e2e = (s.whole or s).e2e_ms.p50
        if cell.load.concurrency == 1 and s.requests_ok and e2e:
            self.alone.setdefault((cell.variant, cell.workload.name), e2e / 1e3)
        if key in self.saturated:
            if x > self.saturated[key] and key not in self.ran_past:
                self.ran_past[key] = x
            return
        sat = s.saturation
        if sat is not None and sat.saturated:
            self.saturated[key] = x
            self.why[key] = sat.reason

    def skip_reason(self, cell: Cell) -> str | None:
        """Why `--stop-after-saturation` skips this cell: a load above the one run past the series' first saturated
        load. None: it runs."""
        if not self.stop_after_saturation:
            return None
        key, x = _key(cell), load_of(cell)
        past = self.ran_past.get(key)
        if past is None or x <= past:
            return None
        at = self.saturated[key]
        unit = "users" if cell.load.concurrency else "req/s"
        return (f"skipped after saturation (--stop-after-saturation): the load {at:g} {unit} was saturated "
                f"({self.why[key].removeprefix('saturated: ')}) and {past:g} {unit} was run past it")

    def known_e2e(self, cell: Cell) -> float | None:
        """The E2E p50 (s) of a one-user closed-loop cell of this workload on this variant measured earlier in the
        sweep: a request alone, so the ramp needs no probe."""
        return self.alone.get((cell.variant, cell.workload.name))
