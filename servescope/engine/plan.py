"""A sweep's cells: server variant x workload x load level, in the order they run, and the per-cell sizes
(prompt pool, whether a workload fits the model at all)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from servescope.core.arrivals import pattern_text
from servescope.core.load import Load, warm_prompts
from servescope.core.secrets import redact_command
from servescope.engine.spec import DEFAULT_REQUESTS, PRECISION_CEILING, SweepSpec
from servescope.workloads.spec import Workload
from servescope.workloads.traces import workload_trace

DEFAULT_CONCURRENCY: tuple[int, ...] = (1, 4, 16)  # when neither the sweep nor the workload says

__all__ = ["DEFAULT_CONCURRENCY", "DEFAULT_REQUESTS", "POOL_MAX", "PRECISION_CEILING", "Cell", "CellRow", "fits",
           "plan_cells", "pool_cap", "pool_size", "prompts_to_build"]


class CellRow(TypedDict):
    """A cell's planned settings as its row in the session holds them (session.toml `cells`, cells.parquet)."""

    index: int
    server_variant: str
    workload: str
    api: str
    concurrency: int | None
    rate: float | None
    arrival: str | None
    max_concurrency: int | None
    burstiness: float | None
    ramp_s: float | None
    pattern: str | None
    requests_planned: int | None
    duration_s_planned: float | None
    warmup: int
    load_label: str
    repeat: int


@dataclass
class Cell:
    index: int
    workload: Workload
    load: Load
    requests: int | None
    duration_s: float | None
    warmup: int
    variant: int = 0
    variant_args: str = ""
    sweep_seed: int = 0
    repeat: int = 1  # which run of its point (--repeat K: 1..K, interleaved across the sweep)
    repeats: int = 1

    @property
    def seed(self) -> int:
        """The seed of this cell's arrivals and lengths: its index, offset by the sweep's seed."""
        return self.index + self.sweep_seed * 1_000_003

    @property
    def prompt_key(self) -> str:
        """The key this cell's prompts derive from (distinct per cell, so no cell hits another's prefix cache)."""
        return f"cell{self.index}" if not self.sweep_seed else f"seed{self.sweep_seed}-cell{self.index}"

    def row(self) -> CellRow:
        """The cell's row in the session (session.toml `cells`, cells.parquet)."""
        return {
            "index": self.index,
            "server_variant": self.variant_args,
            "workload": self.workload.name,
            "api": self.workload.api,
            "concurrency": self.load.concurrency,
            "rate": self.load.rate,
            "arrival": self.load.arrival if self.load.rate is not None else None,
            "max_concurrency": self.load.max_concurrency,
            "burstiness": self.load.burstiness if self.load.rate is not None and self.load.arrival == "gamma" else None,
            "ramp_s": self.load.ramp_s,
            "pattern": pattern_text(self.load.pattern) if self.load.pattern else None,
            "requests_planned": self.requests,
            "duration_s_planned": self.duration_s,
            "warmup": self.warmup,
            "load_label": self.load.label,
            "repeat": self.repeat,
        }

    @property
    def label(self) -> str:
        v = f" [{self.variant_args}]" if self.variant_args else ""
        r = f" #{self.repeat}/{self.repeats}" if self.repeats > 1 else ""
        return f"{self.workload.name} {self.load.label}{v}{r}"


def plan_cells(spec: SweepSpec) -> list[Cell]:
    """Every cell of the sweep: for each server variant (one when there are none), each workload at each
    load level; with `repeat` K, that whole round K times within each variant (interleaved: c=1,4,16, c=1,4,16,
    not c=1,1,1), so drift hits every point alike. Indices run across variants and repeats."""
    cells: list[Cell] = []
    variants = list(enumerate(spec.variants)) or [(0, "")]
    k = max(1, int(spec.repeat))
    for v, vargs in variants:
        for r in range(1, k + 1):
            for c in _workload_cells(spec, len(cells), v, redact_command(vargs)):  # shown and stored: no secret
                c.repeat, c.repeats = r, k
                cells.append(c)
    return cells


def _workload_cells(spec: SweepSpec, first: int, variant: int, vargs: str) -> list[Cell]:
    cells: list[Cell] = []
    for w in spec.workloads:
        if w.kind == "trace":  # one cell: the trace says when each request goes
            cells.append(_trace_cell(spec, w, first + len(cells), variant, vargs))
            continue
        ramp = _ramp(spec, w)
        if spec.rates:
            loads = [Load(rate=r, arrival=spec.arrival, max_concurrency=spec.max_concurrency,
                          burstiness=spec.burstiness or 1.0, ramp_s=ramp, pattern=spec.pattern or ())
                     for r in spec.rates]
        else:
            conc = spec.concurrency or w.default_concurrency or DEFAULT_CONCURRENCY
            loads = [Load(concurrency=c, ramp_s=ramp) for c in conc]
        for ld in loads:
            req = spec.requests
            if req is None and spec.duration_s is None:
                req = PRECISION_CEILING if spec.precision is not None else w.default_requests or DEFAULT_REQUESTS
            cells.append(Cell(first + len(cells), w, ld, req, spec.duration_s, spec.warmup, variant, vargs,
                              spec.seed))
    return cells


def _trace_cell(spec: SweepSpec, w: Workload, index: int, variant: int, vargs: str) -> Cell:
    """A trace replays its requests at its own times (scaled by `time_scale`): the sweep's load levels do not
    apply; `--requests` takes its first N, `--duration` stops sending at that time. No warmup: the trace's
    first requests are its own."""
    trace = workload_trace(w).scaled(w.time_scale)
    t0 = trace.requests[0].t_s if trace.requests else 0.0
    times = tuple(r.t_s - t0 for r in trace.requests)
    n = len(times) if spec.requests is None else min(spec.requests, len(times))
    load = Load(rate=round(trace.mean_rate, 6) or 1.0, arrival="trace", times=times)
    return Cell(index, w, load, n, spec.duration_s, 0, variant, vargs, spec.seed)


def _ramp(spec: SweepSpec, w: Workload) -> float | None:
    """The cell's ramp: the sweep's (`--ramp 10s`, `[load] ramp`), else the workload's own `ramp`, if it has one;
    else none (`--ramp 0`), or, with `--ramp auto` (the default), one the runner measures before a closed loop's
    first cell (engine/runner.py `_auto_ramp`)."""
    if spec.ramp_s:
        return spec.ramp_s
    return w.ramp_s  # the workload's own `ramp`, if it has one


POOL_MAX = 16384  # distinct measured prompts a cell with a request count has at most (more with more users)


def pool_size(cell: Cell) -> int:
    """How many distinct measured prompts a cell gets; a cell that sends more cycles through them. A multi-turn
    cell's are turns: a conversation's worth more, for the one its warmup may have begun.

    Bounded by the load, never by `--requests`: a count up to `pool_cap` gets one prompt per request (as always:
    the same prompts for the same seed); a larger count cycles `pool_cap` of them, or, when a duration also limits
    the cell, the pool of a duration-only cell (`-c 4 -n 100000000 --duration 1s` once built 10**8 prompts first:
    3.1 GB and 77 s, then the server refused the corpus with HTTP 413)."""
    if cell.workload.kind == "trace":
        return len(cell.load.times)
    extra = cell.workload.rounds.upper if cell.workload.multi_turn and cell.warmup else 0
    cap = pool_cap(cell)
    if cell.requests is not None and (cell.requests <= cap or cell.duration_s is None):
        return min(cell.requests, cap) + extra
    return max(64, min(1024, _users(cell) * 16)) + extra


def _users(cell: Cell) -> int:
    """The cell's concurrent requests: a closed loop's users, an open loop's 4 s at its peak rate."""
    return cell.load.concurrency or max(1, int((cell.load.peak_rate or 1) * 4))


def pool_cap(cell: Cell) -> int:
    """The most distinct measured prompts a cell builds: `POOL_MAX`, or 4 per concurrent request when that is
    more."""
    return max(POOL_MAX, 4 * _users(cell))


def prompts_to_build(cell: Cell) -> int:
    """How many prompts the cell is built with: its warmup's (`core.load.warm_prompts`: at most 1,024, cycled by a
    longer warmup), then `pool_size`'s. Bounded by the load, never by `--requests` or `--warmup`."""
    if cell.workload.kind == "trace":
        return pool_size(cell)
    return warm_prompts(cell.warmup) + pool_size(cell)


def fits(w: Workload, max_len: int | None) -> str | None:
    """Why the workload's longest request cannot fit the model's context, or None when it can (or when
    that is unknown: no max length, or a dataset whose lengths are only known per prompt). A conversation's
    longest request is its last turn: the shared start, then every turn's message and reply."""
    if not max_len or w.dataset:
        return None
    if w.kind == "trace":
        return workload_trace(w).check_fits(max_len)
    if w.multi_turn:
        n, first, later, out = w.rounds.upper, w.input_tokens.upper, w.later_tokens.upper, w.output_tokens.upper
        need = w.max_request_tokens
        if need > max_len:
            what = "an agent session of up to" if w.kind == "agent" else "a conversation of up to"
            unit = "calls" if w.kind == "agent" else "turns"
            shared = f"{w.shared_tokens} shared + " if w.shared_tokens else ""
            parts = (f"{shared}{n} x (in {first} + out {out})" if first == later else
                     f"{shared}in {first} + {n - 1} x in {later} + {n} x out {out}")
            return f"{what} {n} {unit} needs up to {need} tokens ({parts}), more than the model's max length {max_len}"
        return None
    need = w.input_tokens.upper + w.output_tokens.upper
    if need > max_len:
        return (f"input {w.input_tokens.upper} + output {w.output_tokens.upper} tokens exceed the model's "
                f"max length {max_len}")
    return None
