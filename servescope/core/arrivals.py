"""When the open loop sends: a steady arrival process (constant, Poisson or gamma gaps at the target rate),
bent in time to follow the shape of the cell's rate: a linear ramp from 0 and a step pattern of rate
multipliers (`"1x for 20s, 4x for 5s, 1x"`).

The shape is a multiplier m(t) of the target rate, t seconds into the cell. The steady process is drawn at
the full rate, then each arrival at s seconds of it is sent at the t where M(t) = s (M is the integral of
m): where m is 1 the gaps are the steady ones, where it is 4 they are a quarter as long, and a Poisson
process stays a Poisson process of rate m(t) x rate (a gamma one keeps its burstiness in the bent time).
Everything derives from the seeded `random.Random` it is given: the same seed sends at the same times."""

from __future__ import annotations

import bisect
import math
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from servescope.core.errors import ServescopeError

BURSTINESS_MAX = 1000.0  # gaps then vary by 3%: constant arrivals for any purpose (and gammavariate stays exact)
PATTERN_EXAMPLE = '"1x for 20s, 4x for 5s, 1x"'
_PATTERN_HOW = f"e.g. {PATTERN_EXAMPLE} (a rate multiplier and how long it lasts; the last step holds)"
_NUM = r"(\d+(?:\.\d+)?(?:e[+-]?\d+)?)"
_STEP = re.compile(_NUM + r"\s*x(?:\s+for\s+(.*))?", re.I)
_DURATION = re.compile(_NUM + r"\s*(ms|s|m|h)?", re.I)


@dataclass(frozen=True)
class Step:
    """One step of a pattern: the target rate times `multiplier`, for `duration_s` (None: until the end)."""

    multiplier: float
    duration_s: float | None = None

    @property
    def text(self) -> str:
        m = f"{_num(self.multiplier)}x"
        return m if self.duration_s is None else f"{m} for {_num(self.duration_s)}s"


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:.12g}"  # reads back as written (exponent and all)


def pattern_text(steps: Sequence[Step]) -> str:
    """The pattern as written in a sweep file: "1x for 20s, 4x for 5s, 1x"."""
    return ", ".join(s.text for s in steps)


def pattern_label(steps: Sequence[Step]) -> str:
    """The pattern, short, for a cell's label: "1x:20s 4x:5s 1x"."""
    return " ".join(f"{_num(s.multiplier)}x" + (f":{_num(s.duration_s)}s" if s.duration_s is not None else "")
                    for s in steps)


MAX_RAMP_S = 86_400.0


def parse_seconds(raw: object, where: str) -> float:
    """A ramp's length: "10s", "500ms", "2m", or a number of seconds; above 0, at most a day. One line."""
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        v = float(raw)
    else:
        d = _DURATION.fullmatch(str(raw).strip())
        if not d:
            raise ServescopeError(f"{where}: bad duration {str(raw)[:40]!r}; use e.g. \"10s\", \"500ms\" or 2.5")
        unit = (d.group(2) or "s").lower()
        v = float(d.group(1)) / 1000 if unit == "ms" else float(d.group(1)) * {"s": 1, "m": 60, "h": 3600}[unit]
    if not (0 < v <= MAX_RAMP_S):
        raise ServescopeError(f"{where}: must be above 0 and at most a day (got {raw!r})")
    return v


def parse_pattern(raw: str | Sequence[str], where: str) -> tuple[Step, ...]:
    """"1x for 20s, 4x for 5s, 1x" (or the steps as a list) -> steps. Every step but the last has a
    duration; the last has none (it holds until the cell ends) and a multiplier above 0. One-line errors."""
    parts = [p.strip() for p in raw.split(",")] if isinstance(raw, str) else [str(p).strip() for p in raw]
    parts = [p for p in parts if p]
    if not parts:
        raise ServescopeError(f"{where}: empty pattern; {_PATTERN_HOW}")
    steps: list[Step] = []
    for n, part in enumerate(parts, 1):
        m = _STEP.fullmatch(part)
        if not m:
            raise ServescopeError(f"{where}: bad step {part!r}; {_PATTERN_HOW}")
        mult = float(m.group(1))
        dur: float | None = None
        if m.group(2) is not None:
            d = _DURATION.fullmatch(m.group(2).strip())
            if not d:
                raise ServescopeError(f"{where}: bad duration {m.group(2).strip()!r} in step {part!r}; {_PATTERN_HOW}")
            unit = (d.group(2) or "s").lower()
            dur = float(d.group(1)) / 1000 if unit == "ms" else float(d.group(1)) * {"s": 1, "m": 60, "h": 3600}[unit]
            if not 0 < dur < math.inf:
                raise ServescopeError(f"{where}: step {part!r} must last more than 0s; {_PATTERN_HOW}")
        if not math.isfinite(mult):
            raise ServescopeError(f"{where}: step {part!r}: the multiplier is too large; {_PATTERN_HOW}")
        last = n == len(parts)
        if last and dur is not None:
            raise ServescopeError(f"{where}: the last step {part!r} holds until the cell ends: drop its "
                                  f"'for ...'; {_PATTERN_HOW}")
        if not last and dur is None:
            raise ServescopeError(f"{where}: step {n} {part!r} needs a duration ('{part} for 10s'): only the last "
                                  f"step holds; {_PATTERN_HOW}")
        if last and mult <= 0:
            raise ServescopeError(f"{where}: the last step {part!r} must be above 0x (the rate would stay at 0); "
                                  f"{_PATTERN_HOW}")
        steps.append(Step(mult, dur))
    return tuple(steps)


@dataclass(frozen=True)
class _Piece:
    start_s: float
    m0: float  # M(start_s): the integral of the multiplier up to this piece
    a: float  # multiplier at start_s
    b: float  # its slope (per second) within the piece


class RateShape:
    """The multiplier m(t) of the target rate, t seconds into a cell: a linear ramp from 0 to 1 over `ramp_s`
    (none when None or 0) times the multiplier of the pattern step at t (1 without a pattern)."""

    def __init__(self, ramp_s: float | None = None, pattern: Sequence[Step] = ()) -> None:
        self.ramp_s = ramp_s or 0.0
        steps = list(pattern) or [Step(1.0)]
        bounds: list[tuple[float, float]] = []  # (start of a step, its multiplier)
        t = 0.0
        for s in steps:
            bounds.append((t, s.multiplier))
            t += s.duration_s or 0.0
        cuts = sorted({b for b, _ in bounds} | ({self.ramp_s} if self.ramp_s else set()))
        self._pieces: list[_Piece] = []
        m0 = 0.0
        for i, t0 in enumerate(cuts):
            mult = next(m for b, m in reversed(bounds) if b <= t0)
            if t0 < self.ramp_s:
                a, b = mult * t0 / self.ramp_s, mult / self.ramp_s
            else:
                a, b = mult, 0.0
            self._pieces.append(_Piece(t0, m0, a, b))
            if i + 1 < len(cuts):
                w = cuts[i + 1] - t0
                m0 += a * w + b * w * w / 2
        self._starts = cuts
        self._m0s = [p.m0 for p in self._pieces]

    @property
    def steady(self) -> bool:
        """No ramp and no pattern other than 1x: the steady process is sent as drawn."""
        return len(self._pieces) == 1 and self._pieces[0].a == 1.0

    @property
    def peak(self) -> float:
        """The largest multiplier (a pattern's spike): a ramping piece peaks at its end."""
        ends = [*self._starts[1:], self._starts[-1]]  # the last piece holds its start's multiplier
        return max(p.a + p.b * (end - p.start_s) for p, end in zip(self._pieces, ends, strict=True))

    def multiplier(self, t: float) -> float:
        p = self._pieces[max(0, bisect.bisect_right(self._starts, t) - 1)]
        return p.a + p.b * (t - p.start_s)

    def warp(self, s: float) -> float:
        """The time t with M(t) = s: when the arrival at s seconds of the steady process is sent."""
        p = self._pieces[max(0, bisect.bisect_right(self._m0s, s) - 1)]
        d = s - p.m0
        if d <= 0:
            return p.start_s
        den = p.a + math.sqrt(p.a * p.a + 2 * p.b * d)  # the root of a*x + b*x^2/2 = d, without cancellation
        return p.start_s + (2 * d / den if den > 0 else 0.0)


def steady_gaps(arrival: str, rate: float, burstiness: float, rng: random.Random) -> Iterator[float]:
    """Gaps (seconds) of the steady process at `rate`: constant 1/rate, exponential (Poisson), or gamma with
    shape `burstiness` and scale 1/(rate x burstiness), as `vllm bench serve --burstiness` draws them: the
    mean stays 1/rate and the coefficient of variation is 1/sqrt(burstiness)."""
    if arrival == "poisson":
        while True:
            yield rng.expovariate(rate)
    elif arrival == "gamma":
        scale = 1.0 / (rate * burstiness)
        while True:
            yield rng.gammavariate(burstiness, scale)
    else:
        while True:
            yield 1.0 / rate


def send_times(arrival: str, rate: float, burstiness: float, shape: RateShape, rng: random.Random
               ) -> Iterator[float]:
    """Send times in seconds from the cell's start: the first at the start (or when the shape's rate first
    rises above 0), then the steady gaps bent by the shape."""
    s = 0.0
    steady = shape.steady
    for k, gap in enumerate(steady_gaps(arrival, rate, burstiness, rng)):
        yield s if steady else shape.warp(s)
        s = (k + 1) / rate if arrival == "constant" else s + gap  # k/rate: no drift over a long cell
