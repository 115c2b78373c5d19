"""`servescope tune`'s search: the best server settings (and load) for an objective at the SLOs, in few cells.

The space is every server setting (the product of the `--search` flags' values) at every load level
(closed-loop concurrency). A cell's value is the objective measured there: goodput (requests per second that
met every SLO) or capacity (the cell's concurrency when at least 90% of its requests met the SLOs, else 0); a
setting's objective is its best cell's, and the search looks for the best cell.

The loop (`Tuner.run`):
1. measure a small design (`design`): the middle setting at two loads, and for each searched flag the setting
   with that flag at its far value, at the highest load; grouped by setting, so each setting is launched once;
2. a model (`Model`: in `servescope tune`, `servescope.engine.tunemodel.TwinModel`, the capacity twin fitted to
   the design with the setting as an input, corrected by each measured cell's residual) predicts every cell: its
   requests' SLO margins (`CellPred.margins`, ln of how far each request is from its tightest SLO) and an error
   `mu +- sigma` (ln units: the cell's latencies are exp(eps) times the prediction, eps ~ N(mu, sigma^2));
3. the next cell is the unmeasured one with the highest chance of beating the best measured value by
   `MIN_GAIN` (`chance_to_beat`), except that one on the running setting is taken when its chance is at
   least `STAY` times the highest (a relaunch saved);
4. it stops when no unmeasured cell has a chance of `P_STOP` or more (the predicted best is measured) and the
   best cell is confirmed: its value was inside the band predicted before it was measured, or a second
   measurement agreed within `CONFIRM_REL`; or when the budget is spent. Goodput: before it stops, a best
   with measured rivals within the run-to-run spread (`spread`) is measured again with them (`rechecks`), and
   the best is chosen on the pooled values: one lucky short cell does not decide the pick.

The model and the measurer are Protocols, so the loop runs with fakes in unit tests."""

from __future__ import annotations

import bisect
import itertools
import math
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from servescope.core.errors import ServescopeError
from servescope.core.textsafe import clean_text

Objective = Literal["goodput", "capacity"]
OBJECTIVES: tuple[Objective, ...] = ("goodput", "capacity")
ATTAINMENT = 0.9  # servescope.core.metrics.SLO_ATTAINMENT: a cell meets the SLOs when 90% of its requests do
MIN_GAIN = 0.02  # goodput: beating the best means by 2% or more (less is within a run's noise)
P_STOP = 0.05  # stop when no unmeasured cell has this chance of beating the best
STAY = 0.7  # take a cell on the running setting when its chance is at least this share of the best chance
CONFIRM_REL = 0.10  # a second measurement of the best cell confirms it within this relative difference
BAND_Z = 2.0  # a band is mu +- 2 sigma (about 95%)
SPREAD_PRIOR = 0.25  # goodput's run-to-run spread (relative) until a cell measured twice says what it is here
MAX_RIVALS = 1  # measured rivals within the spread of the best that are measured again beside it (the closest)
MAX_VALUES = 12  # values of one searched flag at most


# ---- the search space --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Dim:
    """One searched server flag and its values, in order (as text, as they go on the command line)."""

    flag: str  # "--max-num-seqs"
    values: tuple[str, ...]
    log_scale: bool = False  # a range: values from a doubling grid

    def position(self, i: int) -> float:
        """Where value i lies on this flag's axis, 0..1 (log of the value for numbers, else its rank)."""
        if len(self.values) < 2:
            return 0.0
        nums = [_num(v) for v in self.values]
        if all(n is not None and n > 0 for n in nums):
            lo, hi = math.log(min(nums)), math.log(max(nums))  # type: ignore[type-var,arg-type]
            if hi > lo:
                return (math.log(nums[i]) - lo) / (hi - lo)  # type: ignore[arg-type]
        return i / (len(self.values) - 1)


def _num(text: str) -> float | None:
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def parse_search(text: str) -> Dim:
    """`max-num-seqs=16..512` (a range: doubling from 16, 512 included) or `max-num-batched-tokens=2048|8192`
    (a list, as given); the flag with or without its leading dashes. Bad syntax -> one-line ServescopeError."""
    where = f"--search {clean_text(text)!r}"
    name, sep, spec = text.partition("=")
    name, spec = name.strip(), spec.strip()
    if not sep or not name or not spec:
        raise ServescopeError(f"{where}: give FLAG=LOW..HIGH (a range, log scale) or FLAG=A|B|C (a list), e.g. "
                              "--search \"max-num-seqs=16..512\"")
    flag = "--" + name.lstrip("-")
    if not all(ch.isalnum() or ch in "-_" for ch in flag[2:]) or not flag[2:]:
        raise ServescopeError(f"{where}: {clean_text(name)!r} is not a flag name; e.g. max-num-seqs")
    if ".." in spec:
        lo_s, _, hi_s = spec.partition("..")
        lo, hi = _num(lo_s.strip()), _num(hi_s.strip())
        if lo is None or hi is None or lo <= 0 or hi <= lo:
            raise ServescopeError(f"{where}: a range is LOW..HIGH with 0 < LOW < HIGH, e.g. 16..512")
        ints = lo.is_integer() and hi.is_integer() and "." not in lo_s + hi_s
        vals: list[float] = []
        v = lo
        while v < hi * (1 - 1e-9):
            vals.append(v)
            v *= 2
        vals.append(hi)
        if len(vals) > MAX_VALUES:
            raise ServescopeError(f"{where}: {len(vals)} values (doubling from {lo:g} to {hi:g}); at most "
                                  f"{MAX_VALUES}: narrow the range or give a list A|B|C")
        text_vals = [str(int(round(x))) if ints else f"{x:.4g}" for x in vals]
        return Dim(flag, tuple(dict.fromkeys(text_vals)), log_scale=True)
    items = [x.strip() for x in spec.split("|")]
    if any(not x for x in items):
        raise ServescopeError(f"{where}: an empty value in the list; give A|B|C, e.g. 2048|8192|16384")
    if len(set(items)) != len(items):
        raise ServescopeError(f"{where}: a value is listed twice; give each once")
    if len(items) > MAX_VALUES:
        raise ServescopeError(f"{where}: {len(items)} values; at most {MAX_VALUES}")
    return Dim(flag, tuple(items))


def check_dims(dims: Sequence[Dim], known: Callable[[str], bool] | None) -> None:
    """Each flag searched once, and known to the server (`known(flag)`; None: anything goes)."""
    seen: set[str] = set()
    for d in dims:
        if d.flag in seen:
            raise ServescopeError(f"--search: {d.flag} is searched twice; give it once (a list A|B|C or a range)")
        seen.add(d.flag)
        if known is not None and not known(d.flag):
            raise ServescopeError(f"--search: the server takes no {d.flag} flag; search one of its flags, e.g. "
                                  "max-num-seqs=16..512")


@dataclass(frozen=True)
class Setting:
    """One server setting: a value for each searched flag."""

    args: tuple[tuple[str, str], ...]

    @property
    def text(self) -> str:
        """`--max-num-seqs 64 --max-num-batched-tokens 8192` ("" when nothing is searched)."""
        return " ".join(f"{f} {shlex.quote(v)}" for f, v in self.args)

    @property
    def label(self) -> str:
        return self.text or "as launched"

    def value(self, flag: str) -> str | None:
        return next((v for f, v in self.args if f == flag), None)


@dataclass(frozen=True)
class Space:
    dims: tuple[Dim, ...]
    loads: tuple[int, ...]  # concurrency levels, ascending

    @property
    def settings(self) -> list[Setting]:
        if not self.dims:
            return [Setting(())]
        return [Setting(tuple(zip((d.flag for d in self.dims), combo, strict=True)))
                for combo in itertools.product(*(d.values for d in self.dims))]

    @property
    def cells(self) -> int:
        return len(self.settings) * len(self.loads)

    def point(self, setting: int, load: int) -> list[float]:
        """The cell's coordinates, each 0..1: each flag's position, then the load's (log scale)."""
        s = self.settings[setting]
        out = [d.position(d.values.index(s.value(d.flag) or d.values[0])) for d in self.dims]
        lo, hi = math.log(self.loads[0]), math.log(self.loads[-1])
        out.append((math.log(self.loads[load]) - lo) / (hi - lo) if hi > lo else 0.0)
        return out

    def distance(self, a: tuple[int, int], b: tuple[int, int]) -> float:
        pa, pb = self.point(*a), self.point(*b)
        return math.sqrt(sum((x - y) ** 2 for x, y in zip(pa, pb, strict=True)))


def parse_loads(text: str) -> tuple[int, ...]:
    """`-c 4,8,16` or a range `4..128` (doubling). Ascending, each at least 1."""
    where = f"--concurrency {clean_text(text)!r}"
    text = text.strip()
    if ".." in text:
        d = parse_search(f"c={text}")
        vals = [int(float(v)) for v in d.values]
    else:
        try:
            vals = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise ServescopeError(f"{where}: give levels like 4,8,16 or a range 4..128") from None
    if not vals or any(v < 1 for v in vals):
        raise ServescopeError(f"{where}: give levels of 1 or more, like 4,8,16 or a range 4..128")
    return tuple(sorted(set(vals)))


def design(space: Space) -> list[tuple[int, int]]:
    """The first cells: the middle setting at two loads (a third and two thirds up the load range), then for
    each searched flag the middle setting with that flag at its largest value, at the highest load (the twin then
    interpolates the largest batches instead of extrapolating to them). Grouped by setting: each is launched
    once."""
    settings = space.settings
    nl = len(space.loads)
    mid_vals = {d.flag: d.values[(len(d.values) - 1) // 2] for d in space.dims}

    def index_of(vals: dict[str, str]) -> int:
        return next(i for i, s in enumerate(settings) if all(s.value(f) == v for f, v in vals.items()))

    center = index_of(mid_vals)
    loads = sorted({nl // 3, (2 * nl) // 3} if nl > 2 else set(range(nl)))
    cells = [(center, ld) for ld in loads]
    for d in space.dims:
        if len(d.values) < 2:
            continue
        far = d.values[-1] if mid_vals[d.flag] != d.values[-1] else d.values[0]
        s = index_of({**mid_vals, d.flag: far})
        cell = (s, nl - 1)
        if cell not in cells:
            cells.append(cell)
    return cells


# ---- predictions and the chance of beating the best ----------------------------------------------------
def _phi(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2.0))


@dataclass
class CellPred:
    """The model's cell: its requests' SLO margins (ln units, sorted ascending: a request meets every SLO when
    its margin is >= 0, and a margin m survives latencies exp(eps) times longer while eps <= m), the cell's wall
    time, and the error of the whole cell: eps ~ N(mu, sigma^2)."""

    setting: int
    load: int
    concurrency: int
    margins: list[float]
    wall_s: float
    mu: float = 0.0
    sigma: float = 0.1
    notes: tuple[str, ...] = ()

    def value(self, eps: float, objective: Objective) -> float:
        """The objective if the cell's latencies were exp(eps) times the prediction (its wall time too)."""
        n = len(self.margins)
        if n == 0:
            return 0.0
        good = n - bisect.bisect_left(self.margins, eps)
        if objective == "capacity":
            return float(self.concurrency) if good >= ATTAINMENT * n - 1e-9 else 0.0
        return good / (max(self.wall_s, 1e-9) * math.exp(eps))

    def expected(self, objective: Objective) -> float:
        return self.value(self.mu, objective)

    def band(self, objective: Objective) -> tuple[float, float]:
        return (self.value(self.mu + BAND_Z * self.sigma, objective),
                self.value(self.mu - BAND_Z * self.sigma, objective))

    def eps_to_beat(self, best: float, objective: Objective) -> float:
        """The largest error eps at which the cell's value still beats `best` (-inf: never)."""
        n = len(self.margins)
        if n == 0:
            return -math.inf
        if objective == "capacity":
            if self.concurrency <= best:
                return -math.inf
            need = math.ceil(ATTAINMENT * n - 1e-9)  # requests that must meet the SLOs
            return self.margins[n - need] if need > 0 else math.inf
        target = best * (1 + MIN_GAIN) if best > 0 else 0.0
        out = -math.inf
        for k in range(1, n + 1):  # k requests meet: eps <= the k-th largest margin, and k / (wall e^eps) > target
            cap = math.log(k / (max(self.wall_s, 1e-9) * target)) if target > 0 else math.inf
            out = max(out, min(self.margins[n - k], cap))
        return out

    def chance_to_beat(self, best: float, objective: Objective) -> float:
        e = self.eps_to_beat(best, objective)
        if e == -math.inf:
            return 0.0
        if e == math.inf:
            return 1.0
        return _phi((e - self.mu) / max(self.sigma, 1e-6))


def margins_of(rows: Sequence[dict[str, float | None]], slos: dict[str, float],
               higher_is_better: set[str]) -> list[float]:
    """Each request's margin (sorted): min over the SLOs of ln(limit / value) (ln(value / limit) for a figure
    where higher is better); a failed request (None figures) has -inf. Without SLOs every request meets them."""
    out = []
    for r in rows:
        m = math.inf
        for k, limit in slos.items():
            if k == "itl_ms":  # as core.metrics.slo_mask: a pooled ITL has no request
                continue
            v = r.get("ttft_ms" if k == "ttfo_ms" and r.get(k) is None else k)
            if v is None or not math.isfinite(v):
                m = -math.inf
                break
            if k in higher_is_better:
                m = min(m, math.log(v / limit) if v > 0 else -math.inf)
            else:
                m = min(m, math.log(limit / v) if v > 0 else math.inf)
        if r.get("failed"):
            m = -math.inf
        out.append(m if m != math.inf else 50.0)
    return sorted(out)


def value_residual(pred: CellPred, measured: float, objective: Objective) -> float | None:
    """The error eps at which the predicted cell's value is the measured one (goodput: the middle of the eps range
    that gives it, found by bisection); None where no eps gives it (a measured 0, or more than the cell can
    reach) or for capacity, whose value is a step."""
    if objective != "goodput" or measured <= 0 or not pred.margins:
        return None
    lo, hi = -2.0, 2.0
    if not pred.value(lo, objective) >= measured >= pred.value(hi, objective):
        return None

    def edge(strict: bool) -> float:  # the largest eps whose value is >= (strict: >) measured
        a, b = lo, hi
        for _ in range(40):
            mid = (a + b) / 2
            v = pred.value(mid, objective)
            if v > measured or (not strict and v >= measured * (1 - 1e-9)):
                a = mid
            else:
                b = mid
        return a

    return (edge(True) + edge(False)) / 2


def residual(pred: Sequence[float], measured: Sequence[float]) -> float | None:
    """The error eps that turns the predicted margins into the measured ones: the mean shift of their 10th, 25th
    and 50th percentiles (finite ones; None when there are none)."""
    def q(xs: Sequence[float], p: float) -> float:
        return xs[min(len(xs) - 1, int(p * (len(xs) - 1)))]

    if not pred or not measured:
        return None
    shifts = [q(pred, p) - q(measured, p) for p in (0.1, 0.25, 0.5)]
    shifts = [s for s in shifts if math.isfinite(s)]
    return sum(shifts) / len(shifts) if shifts else None


# ---- the loop --------------------------------------------------------------------------------------------
@dataclass
class Measured:
    """A measured cell: its objective value and what the model learns from (its requests' margins)."""

    value: float
    margins: list[float]
    wall_s: float
    meets: bool
    goodput: float | None = None
    attainment: float | None = None
    session: str = ""  # where its requests are stored
    ci: tuple[float, float] | None = None  # the value's 95% interval
    skipped: bool = False  # the user skipped the cell (the app's `s` on it): no value, not counted as data


class Measurer(Protocol):
    def measure(self, setting: Setting, concurrency: int) -> Measured:
        """Run the cell (launching the setting's server first when it is not the one running)."""
        ...

    @property
    def relaunches(self) -> int:
        """Server launches after the first."""
        ...


class Model(Protocol):
    def update(self, observed: dict[tuple[int, int], Measured]) -> None:
        """Learn from the cells measured so far."""
        ...

    def predict(self, setting: int, load: int) -> CellPred: ...


@dataclass
class Step:
    """One measurement of the search, as the path shows it."""

    n: int
    setting: int
    load: int
    concurrency: int
    why: str  # "design" | "chance 62% to beat ..." | "confirm the best"
    value: float
    band: tuple[float, float] | None  # the band predicted before it was measured (None: design)
    chance: float | None
    relaunch: bool
    session: str = ""
    skipped: bool = False  # the user skipped it: its value is not data, and the search does not ask for it again


@dataclass
class TuneResult:
    objective: Objective
    space: Space
    best: tuple[int, int] | None
    best_value: float
    best_ci: tuple[float, float] | None
    runner_up: tuple[int, int] | None
    runner_up_value: float | None
    runner_up_measured: bool
    runner_up_why: str
    confirmed: bool
    stop_reason: str
    steps: list[Step]
    relaunches: int
    budget: int
    predictions: dict[tuple[int, int], tuple[float, float, float]] = field(default_factory=dict)  # lo, mid, hi

    @property
    def cells_measured(self) -> int:
        return len(self.steps)

    @property
    def best_setting(self) -> Setting | None:
        return self.space.settings[self.best[0]] if self.best is not None else None


class Tuner:
    def __init__(self, space: Space, objective: Objective, budget: int, model: Model, measurer: Measurer,
                 on_step: Callable[[Step], None] | None = None, on_note: Callable[[str], None] | None = None) -> None:
        self.space = space
        self.objective = objective
        self.budget = budget
        self.model = model
        self.measurer = measurer
        self.on_step = on_step
        self.on_note = on_note
        self.observed: dict[tuple[int, int], Measured] = {}
        self.steps: list[Step] = []
        self.prior_band: dict[tuple[int, int], tuple[float, float]] = {}
        self.current: int | None = None  # the setting running now
        self.confirmed_cells: set[tuple[int, int]] = set()  # cells measured a second time to confirm them
        self.values: dict[tuple[int, int], list[float]] = {}  # each measurement of a cell measured more than once
        self.skipped: set[tuple[int, int]] = set()  # cells the user skipped: never data, never asked for again

    # -- measuring
    def _measure(self, cell: tuple[int, int], why: str, band: tuple[float, float] | None,
                 chance: float | None) -> Measured:
        s, ld = cell
        relaunch = self.current is not None and self.current != s
        m = self.measurer.measure(self.space.settings[s], self.space.loads[ld])
        self.current = s
        if m.skipped:
            self.skipped.add(cell)
            why += " (skipped by the user: not counted)"
        step = Step(len(self.steps) + 1, s, ld, self.space.loads[ld], why, m.value, band, chance, relaunch,
                    m.session, m.skipped)
        self.steps.append(step)
        if self.on_step is not None:
            self.on_step(step)
        return m

    def _note(self, text: str) -> None:
        if self.on_note is not None:
            self.on_note(text)

    def best(self) -> tuple[tuple[int, int] | None, float]:
        """The best measured cell; ties go to the lower load, then the earlier setting."""
        if not self.observed:
            return None, 0.0
        cell = best_cell({c: m.value for c, m in self.observed.items()})
        return cell, self.observed[cell].value

    def candidates(self) -> list[tuple[tuple[int, int], CellPred, float]]:
        """Every unmeasured cell with its prediction and its chance of beating the best measured value."""
        _, best = self.best()
        out = []
        for s in range(len(self.space.settings)):
            for ld in range(len(self.space.loads)):
                if (s, ld) in self.observed or (s, ld) in self.skipped:
                    continue
                p = self.model.predict(s, ld)
                out.append(((s, ld), p, p.chance_to_beat(best, self.objective)))
        return out

    def choose(self, cands: Sequence[tuple[tuple[int, int], CellPred, float]]
               ) -> tuple[tuple[int, int], CellPred, float] | None:
        """The cell to measure next: the highest chance; one on the running setting when its chance is at least
        STAY times that (a relaunch saved); ties to the lower load (shorter, cheaper)."""
        live = [c for c in cands if c[2] >= P_STOP]
        if not live:
            return None
        top = max(live, key=lambda c: (c[2], -c[0][1]))
        if self.current is not None and top[0][0] != self.current:
            here = [c for c in live if c[0][0] == self.current and c[2] >= STAY * top[2]]
            if here:
                return max(here, key=lambda c: (c[2], -c[0][1]))
        return top

    def run(self) -> TuneResult:
        first = relaunch_order(design(self.space))
        if self.budget < len(first) + 1:
            raise ServescopeError(f"--budget {self.budget}: the first design alone takes {len(first)} cells; give "
                                  f"--budget {len(first) + 1} or more (the full grid is {self.space.cells} cells)")
        for cell in first:
            m = self._measure(cell, "design", None, None)
            if not m.skipped:
                self.observed[cell] = m
        if not self.observed:
            return self._result("every cell of the first design was skipped")
        self.model.update(self.observed)
        stop = ""
        while True:
            used = len(self.steps)
            if used >= self.budget:
                stop = f"budget spent ({self.budget} cells)" + self._unconfirmed()
                break
            pick = self.choose(self.candidates())
            if pick is None:
                top, best_now = self.best()
                assert top is not None
                again = self.rechecks()
                if again:  # the best and its rivals lie within the noise: measure each again, decide on the pooled
                    spread = self.spread()
                    for cell in relaunch_order(again[:self.budget - used], self.current):
                        self.confirmed_cells.add(cell)
                        why = ("measure again: the best" if cell == top else
                               f"measure again: within {spread:.0%} of the best {_fmt(best_now)}")
                        m = self._measure(cell, why, self._band_of(cell), None)
                        if not m.skipped:
                            self.observed[cell] = _merged(self.observed[cell], m, self.values.setdefault(cell, []),
                                                          self.objective)
                    self.model.update(self.observed)
                    continue
                if self._confirmed() or top in self.confirmed_cells:
                    stop = "no unmeasured cell has a chance of beating the best"
                    break
                self.confirmed_cells.add(top)  # measured again once: a second look at a surprise
                m = self._measure(top, "confirm the best", self._band_of(top), None)
                if not m.skipped:
                    self.observed[top] = _merged(self.observed[top], m, self.values.setdefault(top, []),
                                                 self.objective)
                self.model.update(self.observed)
                continue
            cell, pred, chance = pick
            band = pred.band(self.objective)
            self.prior_band[cell] = band
            _, best = self.best()
            m = self._measure(cell, f"chance {chance:.0%} to beat {_fmt(best)}", band, chance)
            if m.skipped:
                continue
            self.observed[cell] = m
            self.model.update(self.observed)
        return self._result(stop)

    def spread(self) -> float:
        """The run-to-run spread of a cell's value (relative): the largest difference between two measurements
        of a cell measured more than once, over the larger (at least CONFIRM_REL); SPREAD_PRIOR before any was."""
        diffs = [(max(v) - min(v)) / max(v) for v in self.values.values() if len(v) > 1 and max(v) > 0]
        return max(CONFIRM_REL, max(diffs)) if diffs else SPREAD_PRIOR

    def rechecks(self) -> list[tuple[int, int]]:
        """Goodput: when measured cells lie within the run-to-run spread below the best, one lucky measurement may
        have picked the best. The best and its closest rival (MAX_RIVALS), those not measured again yet,
        best first: each is measured once more and the best is chosen on the pooled values (their means)."""
        top, best = self.best()
        if self.objective != "goodput" or top is None or best <= 0:
            return []
        floor = best * (1 - self.spread())
        rivals = sorted((c for c, m in self.observed.items() if c != top and m.value >= floor),
                        key=lambda c: (-self.observed[c].value, c[1], c[0]))[:MAX_RIVALS]
        if not rivals:
            return []
        return [c for c in (top, *rivals) if c not in self.confirmed_cells]

    def _unconfirmed(self) -> str:
        """Why the best is not confirmed when the budget ran out before a close call was measured again (goodput:
        `rechecks`), as the end of the stop reason; "" when none was pending."""
        again = self.rechecks()
        top, best = self.best()
        if not again or top is None:
            return ""
        rival = next((c for c in again if c != top), None)
        if rival is None:  # the rival was measured again, the best not yet
            rival = max((c for c, m in self.observed.items() if c != top and m.value >= best * (1 - self.spread())),
                        key=lambda c: self.observed[c].value, default=None)
        if rival is None:
            return ""
        unit = _unit(self.objective)
        who = "both were" if top in again and rival in again else "the best was" if top in again else "it was"
        return (f"; the best is not confirmed: {self.space.settings[rival[0]].label} at c={self.space.loads[rival[1]]} "
                f"measured {_fmt(self.observed[rival].value)} {unit}, within the run-to-run spread "
                f"({self.spread():.0%}) of the best {_fmt(best)} {unit}, and the budget ran out before {who} "
                "measured again")

    def _band_of(self, cell: tuple[int, int]) -> tuple[float, float] | None:
        return self.prior_band.get(cell)

    def _confirmed(self) -> bool:
        """The best cell's value lay inside the band predicted before it was measured, or a second measurement
        agreed with the first within CONFIRM_REL; never while a close call waits to be measured again (`rechecks`:
        the budget ran out before it was)."""
        cell, value = self.best()
        if cell is None or self.rechecks():
            return False
        vals = self.values.get(cell, [])
        if cell in self.confirmed_cells and len(vals) > 1:  # (a second measurement the user skipped: not one)
            lo, hi = min(vals), max(vals)
            # its measurements agree, or it still leads on the pooled values once every rival within the
            # run-to-run spread was measured again too
            return hi <= 0 or (hi - lo) / hi <= CONFIRM_REL or not self.rechecks()
        band = self.prior_band.get(cell)
        first = next((s.value for s in self.steps if (s.setting, s.load) == cell and not s.skipped), value)
        return band is not None and band[0] * (1 - 1e-9) <= first <= band[1] * (1 + 1e-9)

    def _result(self, stop: str) -> TuneResult:
        best_cell, best_value = self.best()
        preds: dict[tuple[int, int], tuple[float, float, float]] = {}
        for s in range(len(self.space.settings)):
            for ld in range(len(self.space.loads)):
                if (s, ld) in self.observed:
                    v = self.observed[(s, ld)].value
                    preds[(s, ld)] = (v, v, v)
                else:
                    p = self.model.predict(s, ld)
                    lo, hi = p.band(self.objective)
                    preds[(s, ld)] = (lo, p.expected(self.objective), hi)
        runner, rv, rmeasured, why = self._runner_up(best_cell, best_value, preds)
        ci = self.observed[best_cell].ci if best_cell is not None else None
        if best_cell is not None and self.objective == "capacity":
            ci = self._capacity_ci(best_cell)
        return TuneResult(self.objective, self.space, best_cell, best_value, ci, runner, rv, rmeasured, why,
                          self._confirmed(), stop, self.steps, self.measurer.relaunches, self.budget, preds)

    def _capacity_ci(self, cell: tuple[int, int]) -> tuple[float, float]:
        """Capacity lies from the best level met up to (not including) the next level of that setting measured
        to miss, else the next level of the grid (the highest level when it was met)."""
        s, ld = cell
        loads = self.space.loads
        higher = [i for i in range(ld + 1, len(loads)) if (s, i) in self.observed and not self.observed[(s, i)].meets]
        nxt = higher[0] if higher else min(ld + 1, len(loads) - 1)
        return float(loads[ld]), float(loads[nxt])

    def _runner_up(self, best_cell: tuple[int, int] | None, best_value: float,
                   preds: dict[tuple[int, int], tuple[float, float, float]]
                   ) -> tuple[tuple[int, int] | None, float | None, bool, str]:
        """The best cell of another setting (measured first, else predicted), and why it lost."""
        if best_cell is None:
            return None, None, False, ""
        unit = _unit(self.objective)
        others = [(c, m.value) for c, m in self.observed.items() if c[0] != best_cell[0]]
        if others:
            cell, v = max(others, key=lambda x: (x[1], -x[0][1]))
            gap = (best_value - v) / best_value if best_value > 0 else 0.0
            why = (f"measured {_fmt(v)} {unit} at c={self.space.loads[cell[1]]}, {gap:.0%} below the best"
                   if gap > 0 else f"measured {_fmt(v)} {unit}, level with the best (the best came first)")
            pred_other = [(c, p) for c, p in preds.items() if c[0] != best_cell[0] and c not in self.observed]
            if pred_other:
                c2, p2 = max(pred_other, key=lambda x: x[1][1])
                if p2[1] > v:
                    chance = self.model.predict(*c2).chance_to_beat(best_value, self.objective)
                    return (c2, p2[1], False, f"predicted {_fmt(p2[1])} {unit} [{_fmt(p2[0])}, {_fmt(p2[2])}] at "
                            f"c={self.space.loads[c2[1]]}, not measured: {chance:.0%} chance of beating the best")
            return cell, v, True, why
        pred_other = [(c, p) for c, p in preds.items() if c[0] != best_cell[0]]
        if not pred_other:
            return None, None, False, "no other setting was searched"
        c2, p2 = max(pred_other, key=lambda x: x[1][1])
        chance = self.model.predict(*c2).chance_to_beat(best_value, self.objective)
        return (c2, p2[1], False, f"predicted {_fmt(p2[1])} {unit} [{_fmt(p2[0])}, {_fmt(p2[2])}] at "
                f"c={self.space.loads[c2[1]]}, not measured: {chance:.0%} chance of beating the best")


def pooled_value(values: Sequence[float], objective: Objective) -> float:
    """A cell measured more than once: goodput, the mean of its values (met or not); capacity, the lowest (a
    capacity value is the load when the cell met the SLOs, else 0: met once and missed once is not met)."""
    return min(values) if objective == "capacity" else sum(values) / len(values)


def best_cell(values: dict[tuple[int, int], float]) -> tuple[int, int]:
    """The cell with the highest value; ties go to the lower load, then the earlier setting."""
    return max(values, key=lambda c: (values[c], -c[1], -c[0]))


def _merged(first: Measured, again: Measured, values: list[float], objective: Objective = "goodput") -> Measured:
    """A cell measured twice: the mean of its values (goodput) or met when both met (capacity), its interval
    covering both; `values` collects each measurement."""
    if not values:
        values.append(first.value)
    values.append(again.value)
    value = pooled_value(values, objective)
    lows = [x for x in (first.ci[0] if first.ci else None, again.ci[0] if again.ci else None, *values) if x is not None]
    highs = [x for x in (first.ci[1] if first.ci else None, again.ci[1] if again.ci else None, *values) if x is not None]
    return Measured(value, sorted(first.margins + again.margins), (first.wall_s + again.wall_s) / 2,
                    first.meets and again.meets, first.goodput, first.attainment, first.session,
                    (min(lows), max(highs)))


def _unit(objective: Objective) -> str:
    return "req/s" if objective == "goodput" else "users"


def _fmt(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def relaunch_order(cells: Sequence[tuple[int, int]], current: int | None = None) -> list[tuple[int, int]]:
    """`cells` grouped by setting, the running setting's first, then in the order each setting first appears;
    within a setting, by load: one launch per setting."""
    order: list[int] = []
    if current is not None and any(c[0] == current for c in cells):
        order.append(current)
    for s, _ in cells:
        if s not in order:
            order.append(s)
    return sorted(cells, key=lambda c: (order.index(c[0]), c[1]))


def count_relaunches(settings: Sequence[int]) -> int:
    """Launches after the first for measuring settings in this order."""
    return sum(1 for a, b in itertools.pairwise(settings) if a != b)
