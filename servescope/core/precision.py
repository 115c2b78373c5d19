"""How precise a cell's figures are, accounting for requests that are not independent, and the stop rule that ends a
cell once they are precise enough (`run --precision`).

Requests inside one cell are not independent: they share the server's batches, so a slow stretch slows every
request in flight together. A plain interval over requests (or a bootstrap that resamples them one by one) is then
too narrow. The interval here is made from **batch means over time**: the cell's window is cut into K equal spans of
time (each at least `BATCH_E2E` times the window's median E2E long, so requests sharing batches mostly fall in one
span), and each figure is computed per span. The spans' figures are close to independent, so their spread gives the
figure's standard error with K - 1 degrees of freedom:

- a rate (`output_tok_s`, `total_tok_s`, `request_s`, `goodput_req_s`) counts what happened in a span: the output
  tokens that arrived in it (`total_tok_s` adds a request's prompt tokens at its first token), the requests that
  ended in it (`goodput_req_s`: those within every SLO), over the span's length. The figure is the spans' mean (the
  window's total over its length), the interval `mean +- t(0.975, K-1) x sd / sqrt(K)`. Counting events inside the
  window keeps a short window's rate unbiased: its N sends span N-1 gaps;
- a per-request figure takes the requests *sent* in the window, each in the span it was sent in:
  a mean (`ttft_ms.mean`, `slo_met_fraction`) is a ratio of per-span sums (sum of values / count), with
  the ratio estimator's variance `sum((y_k - R n_k)^2) / (K (K-1) nbar^2)`;
  a percentile (`ttft_ms.p50`) has Woodruff's interval with that variance: the share of requests at or below the
  percentile is a ratio of per-span counts, its interval is found as above, and the interval of the percentile is
  the empirical quantiles at the two ends of it.

`reached` is the worst of the named figures' half-widths over their values (0.05 for +-5%). `PrecisionRule` decides,
as requests finish, whether a cell may stop: its figures are precise enough once the window has at least
`MIN_BATCHES` spans of `BATCH_E2E` median E2Es each, at least `MIN_REQUESTS` requests and every named figure within
its share at `CONFIRM_LOOKS` looks in a row; it looks at geometrically spaced request counts (each look `LOOK_STEP`
more than the last): every look is a chance to stop on an interval that is narrow by luck (its spans' spread
happened to be small), and a second look with more requests takes most of those chances back. Only requests whose outcome is known count: a span still holding a
request in flight is left for a later look.

Pure: no polars, no I/O; the live cell (engine/cell.py), the summary and benchmarks/precision.py all call it."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from servescope.core.errors import ServescopeError
from servescope.core.records import RequestRecord

__all__ = ["BATCH_E2E", "FIGURES", "MIN_BATCHES", "MIN_REQUESTS", "RATES", "Interval", "PrecisionRule", "Precision",
           "RequestPoint", "default_figures", "events", "intervals", "parse_precision", "point_of", "t_quantile",
           "window_rates"]

BATCH_E2E = 2.0  # a span is at least this many median E2Es long: requests sharing batches fall mostly in one
MIN_BATCHES = 10  # spans at least: fewer give an interval too unsure of its own width to stop on
MAX_BATCHES = 30  # spans at most: more spans, each shorter, are less independent of their neighbours
MIN_REQUESTS = 30  # requests in the window at least before a cell may stop on its precision
MAX_RHO = 0.8  # the spans' lag-1 correlation is taken at most this high (a widening of 3x in the standard error)
LOOK_STEP = 1.1  # the rule looks again once 10% more requests finished (and at least one round of users more)
CONFIRM_LOOKS = 2  # a cell stops once its figures were precise enough at this many looks in a row

RATES = ("output_tok_s", "total_tok_s", "request_s", "goodput_req_s")
RATIOS = ("slo_met_fraction",)
PER_REQUEST = ("ttft_ms", "ttfo_ms", "tpot_ms", "e2e_ms", "per_user_tok_s", "prefill_tok_s")
STATS = ("mean", "p50", "p90", "p95", "p99")
FIGURES: tuple[str, ...] = (*RATES, *RATIOS, *(f"{m}.{s}" for m in PER_REQUEST for s in STATS))


@dataclass(frozen=True)
class Precision:
    """`--precision`: a share for the default figures (`5%`), or a share per named figure
    (`output_tok_s:2%,ttft_ms.p50:5%`)."""

    share: float | None = None  # the default figures' share
    figures: tuple[tuple[str, float], ...] = ()  # (figure, share), as given

    def targets(self, slos: Mapping[str, float]) -> tuple[tuple[str, float], ...]:
        """The figures the cell is held to and each one's share."""
        if self.figures:
            return self.figures
        return tuple((f, self.share or 0.05) for f in default_figures(slos))

    def text(self) -> str:
        if self.figures:
            return ",".join(f"{f}:{_pct(s)}" for f, s in self.figures)
        return _pct(self.share or 0.05)


def default_figures(slos: Mapping[str, float]) -> tuple[str, ...]:
    """Aggregate output tok/s, and the median of each metric an SLO is set on (TTFT's when none is)."""
    picked = [f"{k}.p50" for k in slos if k in PER_REQUEST]
    return ("output_tok_s", *(picked or ["ttft_ms.p50"]))


def _pct(share: float) -> str:
    return f"{share * 100:g}%"


def _share(text: str, where: str) -> float:
    t = text.strip()
    try:
        v = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise ServescopeError(f"{where}: {t!r} is not a share; give e.g. 5% or 0.05") from None
    if not (0 < v < 1) or not math.isfinite(v):
        raise ServescopeError(f"{where}: {t!r} must be between 0% and 100%, e.g. 2%")
    return v


def parse_precision(raw: object, where: str) -> Precision | None:
    """`5%` (the default figures), `0.05`, or `output_tok_s:2%,ttft_ms.p50:5%`; "" or "off": None."""
    import difflib

    if raw is None or isinstance(raw, bool):
        if raw is None:
            return None
        raise ServescopeError(f"{where}: give a share like 5%, or FIGURE:SHARE,... (e.g. output_tok_s:2%)")
    if isinstance(raw, (int, float)):
        return Precision(share=_share(str(raw), where))
    if not isinstance(raw, str):
        raise ServescopeError(f"{where}: give a share like 5%, or FIGURE:SHARE,... (e.g. output_tok_s:2%)")
    text = raw.strip()
    if text.lower() in ("", "off", "none"):
        return None
    if ":" not in text:
        return Precision(share=_share(text, where))
    out: list[tuple[str, float]] = []
    for part in text.split(","):
        name, sep, share = part.partition(":")
        name = name.strip()
        if not sep or not name:
            raise ServescopeError(f"{where}: {part.strip()!r}: give FIGURE:SHARE, e.g. output_tok_s:2%")
        if name not in FIGURES:
            close = difflib.get_close_matches(name, FIGURES, n=1)
            hint = f"; did you mean {close[0]}?" if close else "; e.g. output_tok_s, ttft_ms.p50, tpot_ms.p90"
            raise ServescopeError(f"{where}: no figure {name!r} has an interval{hint}")
        if any(f == name for f, _ in out):
            raise ServescopeError(f"{where}: {name} is named twice; give each figure once")
        out.append((name, _share(share, f"{where} {name}")))
    return Precision(figures=tuple(out))


def dump_precision(p: Precision) -> str:
    return p.text()


# --------------------------------------------------------------------------------------------------------
# the requests, reduced to what the intervals need
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestPoint:
    """One measured request as the intervals see it: when it was sent, got its first token and ended (ns), whether
    it succeeded, its tokens (`tokens`: when each output token arrived, as (stamp, tokens) pairs), and its
    per-request figures (None where it has none)."""

    sent_ns: int
    ok: bool
    output_tokens: int
    input_tokens: int
    values: Mapping[str, float | None] = field(default_factory=dict)
    counted: bool = True  # False: cancelled by a stop (judged against no SLO, as summarize leaves it out)
    first_ns: int = 0
    end_ns: int = 0
    tokens: tuple[tuple[int, float], ...] = ()


def point_of(r: RequestRecord) -> RequestPoint:
    """A record's point, its figures computed as core.metrics.per_request computes them."""
    ok = r.status == "ok"
    has_tok = r.first_token_ns > 0
    sent = r.sent_ns or r.scheduled_ns
    ttft = (r.first_token_ns - r.sent_ns) * 1e-6 if has_tok and r.sent_ns else None
    ttfo = (r.first_content_ns - r.sent_ns) * 1e-6 if r.first_content_ns > 0 and r.sent_ns else None
    e2e = (r.end_ns - r.sent_ns) * 1e-6 if r.end_ns > 0 and r.sent_ns else None
    tpot = (e2e - ttft) / (r.output_tokens - 1) if ok and r.output_tokens > 1 and ttft is not None \
        and e2e is not None else None
    per_user = r.output_tokens / (e2e / 1000) if ok and e2e is not None and e2e > 0 else None
    prefill = r.prompt_tokens / (ttft / 1000) if ok and ttft is not None and ttft > 0 and r.prompt_tokens > 0 \
        else None
    values = {"ttft_ms": ttft, "ttfo_ms": ttfo, "tpot_ms": tpot, "e2e_ms": e2e, "per_user_tok_s": per_user,
              "prefill_tok_s": prefill}
    tokens: tuple[tuple[int, float], ...] = ()
    if ok and r.output_tokens > 0:
        counted = sum(r.chunk_tokens)
        if counted > 0 and len(r.chunk_ns) == len(r.chunk_tokens):  # the usage's count, spread as the chunks came
            scale = r.output_tokens / counted
            tokens = tuple((t, n * scale) for t, n in zip(r.chunk_ns, r.chunk_tokens, strict=True))
        else:
            tokens = ((r.end_ns or r.first_token_ns, float(r.output_tokens)),)
    return RequestPoint(sent, ok, r.output_tokens if ok else 0, max(r.prompt_tokens, 0) if ok else 0, values,
                        r.status != "cancelled", r.first_token_ns, r.end_ns, tokens)


def events(p: RequestPoint, fig: str, slos: Mapping[str, float]) -> list[tuple[int, float]]:
    """What a request adds to a rate, and when: output tokens as they arrived (`output_tok_s`; `total_tok_s` adds
    its prompt's tokens at its first token), or one request when it ended (`request_s`: a success, `goodput_req_s`:
    one within every SLO). A rate over a window counts what happened inside it."""
    if not p.ok:
        return []
    if fig == "output_tok_s":
        return list(p.tokens)
    if fig == "total_tok_s":
        return [*p.tokens, *([(p.first_ns, float(p.input_tokens))] if p.input_tokens and p.first_ns else [])]
    if fig == "request_s" or (fig == "goodput_req_s" and _good(p, slos)):
        return [(p.end_ns, 1.0)] if p.end_ns else []
    return []


def window_rates(points: Sequence[RequestPoint], start_ns: int, end_ns: int, slos: Mapping[str, float]
                 ) -> dict[str, float]:
    """Each rate over [start_ns, end_ns): what happened inside it (tokens arrived, requests ended) over its length."""
    span_s = (end_ns - start_ns) / 1e9
    if span_s <= 0:
        return {}
    return {fig: sum(n for p in points for t, n in events(p, fig, slos) if start_ns <= t < end_ns) / span_s
            for fig in RATES}


def _good(p: RequestPoint, slos: Mapping[str, float]) -> bool:
    """Within every SLO, as core.metrics.slo_mask judges it."""
    if not p.ok:
        return False
    for k, v in slos.items():
        if k == "itl_ms":
            continue
        x = p.values.get(k)
        if k == "per_user_tok_s":
            if (x if x is not None else 0.0) < v:
                return False
        elif (x if x is not None else math.inf) > v:
            return False
    return True


# --------------------------------------------------------------------------------------------------------
# the intervals
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    """One figure's value over the window and its 95% interval (batch means over `batches` spans of time)."""

    figure: str
    value: float | None
    low: float | None
    high: float | None
    batches: int

    @property
    def reached(self) -> float:
        """Half the interval's width over the value (inf when there is no value, or it is 0)."""
        if self.value is None or self.low is None or self.high is None or self.value == 0:
            return math.inf
        return (self.high - self.low) / 2 / abs(self.value)


def t_quantile(df: int, p: float = 0.975) -> float:
    """Student's t quantile (Cornish-Fisher expansion about the normal's; within 0.1% of the exact value for
    df >= 3, which is all the batches here ever give)."""
    z = _z(p)
    if df <= 0:
        return math.inf
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        a = 4 * p * (1 - p)
        return (2 * p - 1) * math.sqrt(2 / a)
    v = float(df)
    return (z + (z ** 3 + z) / (4 * v) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * v ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * v ** 3)
            + (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / (92160 * v ** 4))


def _z(p: float) -> float:
    """The standard normal quantile (Acklam's rational approximation, relative error under 1.2e-9)."""
    a = (-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02, 1.383577518672690e+02,
         -3.066479806614716e+01, 2.506628277459239e+00)
    b = (-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02, 6.680131188771972e+01,
         -1.328068155288572e+01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00, -2.549732539343734e+00,
         4.374664141464968e+00, 2.938163982698783e+00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00, 3.754408661907416e+00)
    lo = 0.02425
    if p < lo:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / \
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    if p > 1 - lo:
        return -_z(1 - p)
    q = p - 0.5
    r = q * q
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / \
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)


def _quantile(sorted_vals: Sequence[float], q: float) -> float:
    """Linear interpolation, as polars' quantile(interpolation="linear") (core.metrics.describe)."""
    n = len(sorted_vals)
    pos = (n - 1) * min(1.0, max(0.0, q))
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def _ar1(resid: Sequence[float]) -> float:
    """The variance factor (1 + rho) / (1 - rho) of a series whose neighbours are correlated by rho (the lag-1
    autocorrelation of `resid`, deviations from the mean; taken as 0 when negative, at most `MAX_RHO`): spans that
    are not quite independent make the plain batch-means variance too small by about this factor."""
    den = sum(e * e for e in resid)
    if len(resid) < 3 or den <= 0:
        return 1.0
    rho = min(MAX_RHO, max(0.0, sum(a * b for a, b in zip(resid, resid[1:], strict=False)) / den))
    return (1 + rho) / (1 - rho)


def _ratio_se(ys: Sequence[float], ns: Sequence[float]) -> tuple[float, float] | None:
    """(ratio, its standard error) of per-span sums sum(y)/sum(n) by the ratio estimator, widened by the spans'
    lag-1 correlation (`_ar1`); None without data."""
    k = len(ys)
    tot_n = sum(ns)
    if k < 2 or tot_n <= 0:
        return None
    r = sum(ys) / tot_n
    nbar = tot_n / k
    resid = [y - r * n for y, n in zip(ys, ns, strict=True)]
    var = sum(e * e for e in resid) / (k * (k - 1) * nbar ** 2) * _ar1(resid)
    return r, math.sqrt(max(var, 0.0))


def batch_count(window_s: float, e2e_p50_s: float) -> int:
    """How many spans the window is cut into: as many as fit `BATCH_E2E` median E2Es each, at most `MAX_BATCHES`."""
    if window_s <= 0:
        return 0
    span = max(BATCH_E2E * e2e_p50_s, 1e-9)
    return int(min(MAX_BATCHES, window_s // span))


def intervals(points: Sequence[RequestPoint], start_ns: int, end_ns: int, figures: Iterable[str],
              slos: Mapping[str, float] | None = None, batches: int | None = None) -> list[Interval]:
    """Each figure's interval over the requests sent in [start_ns, end_ns] (batch means; see the module's text).
    With fewer than 2 spans (a window shorter than two spans' time) the intervals have no bounds."""
    slos = dict(slos or {})
    inside = [p for p in points if start_ns <= p.sent_ns <= end_ns]
    window_s = max(0.0, (end_ns - start_ns) / 1e9)
    e2es = sorted(v for p in inside if p.ok and (v := p.values.get("e2e_ms")) is not None)
    k = batches if batches is not None else batch_count(window_s, _quantile(e2es, 0.5) / 1e3 if e2es else window_s)
    k = max(k, 1)
    span_ns = (end_ns - start_ns) / k

    def span_of(p: RequestPoint) -> int:
        return min(k - 1, int((p.sent_ns - start_ns) / span_ns)) if span_ns > 0 else 0

    spans = [span_of(p) for p in inside]
    out: list[Interval] = []
    t = t_quantile(k - 1) if k >= 2 else math.inf
    for fig in figures:
        out.append(_interval(fig, inside, spans, k, window_s, slos, t, points, start_ns, end_ns))
    return out


def _interval(fig: str, inside: Sequence[RequestPoint], spans: Sequence[int], k: int, window_s: float,
              slos: Mapping[str, float], t: float, everyone: Sequence[RequestPoint], start_ns: int,
              end_ns: int) -> Interval:
    if fig in RATES:
        per = [0.0] * k
        span_ns = window_s * 1e9 / k
        for p in everyone:
            for at, n in events(p, fig, slos):
                if start_ns <= at < end_ns:
                    per[min(k - 1, int((at - start_ns) / span_ns)) if span_ns > 0 else 0] += n
        value = sum(per) / window_s if window_s > 0 else None
        if k < 2 or value is None:
            return Interval(fig, value, None, None, max(k, 0))
        span_s = window_s / k
        rates = [x / span_s for x in per]
        mean = sum(rates) / k
        sd = math.sqrt(sum((x - mean) ** 2 for x in rates) / (k - 1) * _ar1([x - mean for x in rates]))
        half = t * sd / math.sqrt(k)
        return Interval(fig, value, max(0.0, value - half), value + half, k)
    if fig == "slo_met_fraction":
        judged = [(p, s) for p, s in zip(inside, spans, strict=True) if p.counted]
        if not judged:
            return Interval(fig, None, None, None, k)
        value = sum(1 for p, _ in judged if _good(p, slos)) / len(judged)
        if k < 2:
            return Interval(fig, value, None, None, k)
        ys, ns = [0.0] * k, [0.0] * k
        for p, s in judged:
            ns[s] += 1
            ys[s] += 1.0 if _good(p, slos) else 0.0
        got = _ratio_se(ys, ns)
        if got is None:
            return Interval(fig, value, None, None, k)
        half = t * got[1]
        return Interval(fig, value, max(0.0, value - half), min(1.0, value + half), k)
    metric, _, stat = fig.partition(".")
    pairs = [(v, s) for p, s in zip(inside, spans, strict=True)
             if p.ok and (v := p.values.get(metric)) is not None and math.isfinite(v)]
    if not pairs:
        return Interval(fig, None, None, None, k)
    vals = sorted(v for v, _ in pairs)
    if stat == "mean":
        value = sum(vals) / len(vals)
        if k < 2:
            return Interval(fig, value, None, None, k)
        ys, ns = [0.0] * k, [0.0] * k
        for v, s in pairs:
            ys[s] += v
            ns[s] += 1
        got = _ratio_se(ys, ns)
        if got is None:
            return Interval(fig, value, None, None, k)
        return Interval(fig, value, value - t * got[1], value + t * got[1], k)
    q = int(stat[1:]) / 100
    value = _quantile(vals, q)
    if k < 2:
        return Interval(fig, value, None, None, k)
    # Woodruff: the share of requests at or below the percentile, its interval from the spans, mapped back
    ys, ns = [0.0] * k, [0.0] * k
    for v, s in pairs:
        ns[s] += 1
        ys[s] += 1.0 if v <= value else 0.0
    got = _ratio_se(ys, ns)
    if got is None:
        return Interval(fig, value, None, None, k)
    n = len(vals)
    half = t * max(got[1], 0.5 / n)  # at least half a request's share: a figure on a few requests is never exact
    lo_q, hi_q = q - half, q + half
    return Interval(fig, value, _quantile(vals, lo_q), _quantile(vals, hi_q), k)


# --------------------------------------------------------------------------------------------------------
# the stop rule
# --------------------------------------------------------------------------------------------------------


class PrecisionRule:
    """Decides, as a cell's requests finish, whether its named figures are precise enough to stop sending.

    `add(record)` takes each finished measured request; `check(now_ns)` looks (at the spaced request counts only)
    and returns the intervals when every figure reached its share, else None. The window starts at `start_ns`
    (known once the load's ramp is over: `begin(start_ns)`); it ends, at each look, at the send of the last
    request whose every predecessor has finished (requests are numbered in the order they are sent)."""

    def __init__(self, targets: Sequence[tuple[str, float]], slos: Mapping[str, float] | None = None,
                 users: int = 1) -> None:
        self.targets = tuple(targets)
        self.slos = dict(slos or {})
        self.users = max(1, users)
        self.points: list[RequestPoint] = []
        self.done: set[int] = set()
        self.sent: dict[int, int] = {}
        self.start_ns: int | None = None
        self.next_look = 0
        self.first_open = 0  # the lowest request index not yet finished
        self.last: list[Interval] = []
        self.streak = 0  # looks in a row at which every figure was within its share

    def begin(self, start_ns: int) -> None:
        self.start_ns = start_ns

    def add(self, r: RequestRecord) -> None:
        if r.warmup or r.index < 0:
            return
        self.points.append(point_of(r))
        self.done.add(r.index)
        self.sent[r.index] = r.sent_ns or r.scheduled_ns
        while self.first_open in self.done:
            self.first_open += 1

    def complete_until(self) -> int | None:
        """The send stamp of the last request before the first one still in flight (None: none yet)."""
        if self.first_open == 0:
            return None
        return self.sent.get(self.first_open - 1)

    def check(self) -> list[Interval] | None:
        """The intervals once every named figure is within its share (the floor met), else None."""
        n = len(self.points)
        if n < self.next_look or self.start_ns is None:
            return None
        self.next_look = max(n + self.users, math.ceil(n * LOOK_STEP))
        end = self.complete_until()
        if end is None or end <= self.start_ns:
            return None
        # every request sent after `end` is still out or came later: what happened up to `end` is all known
        got = intervals(self.points, self.start_ns, end, [f for f, _ in self.targets], self.slos)
        self.last = got
        inside = sum(1 for p in self.points if self.start_ns <= p.sent_ns <= end)
        if not got or got[0].batches < MIN_BATCHES or inside < MIN_REQUESTS:
            return None
        shares = dict(self.targets)
        self.streak = self.streak + 1 if all(iv.reached <= shares[iv.figure] for iv in got) else 0
        return got if self.streak >= CONFIRM_LOOKS else None
