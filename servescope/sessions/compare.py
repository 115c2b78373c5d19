"""Compare saved sessions side by side, and the derived answers a session gives on its own.

Pure functions over `Session` objects: the CLI (`servescope compare`), the Markdown report and the TUI's
Compare screen all call `compare_sessions()` / `derive()` and render the result their own way.

Definitions (also in docs/reports.md and in every report):

- Cells are aligned by (workload name, load label), e.g. ("sharegpt", "c=4"). In a server-config sweep the
  server variant is part of the workload name ("sharegpt [--max-num-seqs 4]"): each variant gets its own
  table, curve, capacity and knee, and two sessions align variant by variant.
- Delta: signed relative change of a session's value against the first session's,
  (value - first) / first, in percent. No delta where the first value is missing or zero.
- Winner: the best value among the sessions, knowing the metric's direction (lower TTFT/TPOT/ITL/E2E wins,
  higher tok/s and goodput win). No winner when fewer than two sessions have a value, for neutral metrics
  (token counts), or when the best two are within TIE_REL (0.1%) of each other.
- Capacity at the SLOs: the highest load level (concurrency; request rate for open-loop workloads) whose
  cell meets the SLOs, i.e. at least 90% of its requests succeeded within every SLO (`meets_slos`).
  "Not reached" when the highest measured level still meets them.
- Knee: among the closed-loop cells of a workload, the concurrency that maximises
  aggregate output tok/s x mean per-user tok/s (Kleinrock's "power", throughput / delay). Going from one
  level to the next raises that product exactly when the relative gain in aggregate throughput outweighs
  the relative loss in per-user speed, (1 + gain) x (1 - loss) > 1; past the knee extra aggregate
  throughput costs more per-user speed than it gains. "Not reached" when the maximum is the highest
  concurrency measured (the knee lies at or beyond it). Needs at least two concurrency levels.
- Peak aggregate throughput: the highest output tok/s among the workload's cells, with its load.
- Thinking cost: for two workloads of one session with the same api and input shape (prompt lengths,
  prefix, dataset), one with thinking on and one without, the ratio on/off of E2E p50 and TTFO p50 at each
  load level they share, and the ratio of their capacities.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from servescope.core.errors import ServescopeError
from servescope.core.metrics import SLO_ATTAINMENT, per_request, slo_mask
from servescope.core.textsafe import clean_text, md_escape
from servescope.sessions import series_name
from servescope.sessions.store import Session

TIE_REL = 0.001
# "usable" in the field reports (seed 004): TTFT < 3 s and > 20 tok/s per user. Used when no SLOs were set.
DEFAULT_SLOS: dict[str, float] = {"ttft_ms": 3000.0, "per_user_tok_s": 20.0}


@dataclass(frozen=True)
class MetricSpec:
    key: str  # "output_tok_s" or "ttft_ms.p50"
    label: str
    better: str  # "higher" | "lower" | "neutral"

    def value(self, summary: Mapping[str, Any]) -> float | None:
        return metric_value(summary, self.key)


COMPARE_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("output_tok_s", "output tok/s (aggregate)", "higher"),
    MetricSpec("per_user_tok_s.mean", "per-user tok/s (mean)", "higher"),
    MetricSpec("ttft_ms.p50", "TTFT p50 ms", "lower"),
    MetricSpec("ttft_ms.p99", "TTFT p99 ms", "lower"),
    MetricSpec("ttfo_ms.p50", "TTFO p50 ms", "lower"),
    MetricSpec("tpot_ms.p50", "TPOT p50 ms", "lower"),
    MetricSpec("itl_ms.p99", "ITL p99 ms", "lower"),
    MetricSpec("e2e_ms.p50", "E2E p50 ms", "lower"),
    MetricSpec("goodput_req_s", "goodput req/s", "higher"),
    MetricSpec("input_tokens_mean", "input tokens (mean)", "neutral"),
    MetricSpec("output_tokens_mean", "output tokens (mean)", "neutral"),
)


def metric_value(summary: Mapping[str, Any], key: str) -> float | None:
    head, _, sub = key.partition(".")
    v: Any = summary.get(head)
    if sub:
        v = v.get(sub) if isinstance(v, Mapping) else None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return None if math.isnan(f) or math.isinf(f) else f


def fmt_num(v: float | None) -> str:
    """Numbers as a person writes them in a table: 3,373 / 183.7 / 6.12 / 0.052."""
    if v is None:
        return "-"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 1 or a == 0:
        return f"{v:.2f}"
    return f"{v:.3g}"


def fmt_pct(v: float | None) -> str:
    if v is None:
        return "-"
    return f"{v:+.1f}%"


def winner(values: Sequence[float | None], better: str, tie_rel: float = TIE_REL) -> int | None:
    """Index of the best value, or None (neutral metric, fewer than two values, or a tie)."""
    if better not in ("higher", "lower"):
        return None
    present = [(v, i) for i, v in enumerate(values) if v is not None]
    if len(present) < 2:
        return None
    ranked = sorted(present, key=lambda t: t[0], reverse=(better == "higher"))
    (best, bi), (second, _) = ranked[0], ranked[1]
    scale = max(abs(best), abs(second))
    if scale == 0 or abs(best - second) <= tie_rel * scale:
        return None
    return bi


def delta_pct(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base == 0:
        return None
    return (value - base) / abs(base) * 100.0


# ---- one session's cells ---------------------------------------------------------------------------
@dataclass
class CellView:
    index: int
    workload: str
    load: str
    concurrency: int | None
    rate: float | None
    status: str
    reason: str
    summary: dict[str, Any]
    base: str = ""  # the workload's own name (without the server variant)
    variant: str = ""  # the server variant's arguments ("" when the server was not relaunched per variant)

    def __post_init__(self) -> None:
        if not self.base:
            self.base = self.workload

    @property
    def key(self) -> tuple[str, str]:
        return (self.workload, self.load)

    @property
    def x(self) -> float | None:
        return float(self.concurrency) if self.concurrency is not None else self.rate


def _opt_int(v: Any) -> int | None:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v) else None


def _opt_float(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v) else None


def workload_order(session: Session) -> list[str]:
    names = [str(w.get("name")) for w in session.meta.get("workloads", []) if isinstance(w, dict)]
    for c in session.meta.get("cells", []):
        if isinstance(c, dict) and str(c.get("workload")) not in names:
            names.append(str(c.get("workload")))
    return names


def cell_views(session: Session, include_skipped: bool = False) -> list[CellView]:
    """The session's cells in plan order (workload order, then load), with their summaries."""
    rows = session.cells.to_dicts() if session.cells.height else []
    summaries = session.summaries()
    views: list[CellView] = []
    for row, summ in zip(rows, summaries or [{}] * len(rows), strict=False):
        status = str(row.get("status") or "done")
        if not summ and not include_skipped:
            continue
        conc = _opt_int(row.get("concurrency"))
        rate = _opt_float(row.get("rate"))
        label = row.get("load_label") or (f"c={conc}" if conc is not None else f"rate {rate:g}/s")
        base = str(row.get("workload"))
        variant = clean_text(str(row.get("server_variant") or ""))
        views.append(CellView(int(row.get("index", len(views))), series_name(base, variant),
                              str(label), conc, rate, status, clean_text(str(row.get("reason") or "")),
                              dict(summ or {}), base, variant))
    order = {w: i for i, w in enumerate(workload_order(session))}
    vorder: dict[str, int] = {}
    for v in sorted(views, key=lambda v: v.index):
        vorder.setdefault(v.variant, len(vorder))
    views.sort(key=lambda v: (order.get(v.base, len(order)), vorder[v.variant], v.rate is not None, v.x or 0.0,
                              v.index))
    return views


def session_slos(session: Session) -> dict[str, float]:
    raw = session.meta.get("slos") or {}
    return {str(k): float(v) for k, v in raw.items() if isinstance(v, (int, float))}


def choose_slos(sessions: Sequence[Session], slos: Mapping[str, float] | None) -> tuple[dict[str, float], str]:
    """The SLOs a report or comparison judges by, and where they came from."""
    if slos:
        return dict(slos), "given on the command line"
    first = session_slos(sessions[0]) if sessions else {}
    if first:
        return first, "recorded with the session" if len(sessions) == 1 else "recorded with the first session"
    return dict(DEFAULT_SLOS), "the default, as no SLOs were recorded: usable = TTFT under 3 s and 20 tok/s per user"


def apply_slos(session: Session, views: list[CellView], slos: Mapping[str, float]) -> None:
    """Re-judge each cell against `slos` from its raw requests (slo_met_fraction, goodput_req_s).

    Cells without per-request data keep their recorded values when the SLOs are the session's own, and
    lose them otherwise (marked `slo_unknown`)."""
    own = session_slos(session) == dict(slos)
    for v in views:
        df = session.requests(v.index)
        if df.height == 0 or "sent_ns" not in df.columns:
            if not own:
                v.summary["slo_met_fraction"] = None
                v.summary["goodput_req_s"] = None
                v.summary["slo_unknown"] = True
            continue
        if "warmup" in df.columns:
            df = df.filter(~pl.col("warmup"))
        pr = per_request(df)
        good = pr.filter(slo_mask(pr, slos)).height
        wall = metric_value(v.summary, "wall_s") or 0.0
        v.summary["slo_met_fraction"] = good / pr.height if pr.height else None
        v.summary["goodput_req_s"] = good / wall if wall > 0 else None


# ---- derived answers --------------------------------------------------------------------------------
@dataclass
class Capacity:
    level: float | None  # highest load level meeting the SLOs; None when no cell meets them
    unit: str  # "concurrency" | "req/s"
    not_reached: bool  # the highest measured level still meets the SLOs
    unknown: bool = False  # no cell could be judged

    def text(self) -> str:
        if self.unknown:
            return "unknown (no per-request data for these SLOs)"
        if self.level is None:
            return "none: even the lowest load misses the SLOs"
        lv = _level_text(self.level, self.unit)
        return f"{lv} (not reached: the highest level measured still meets them)" if self.not_reached else lv


@dataclass
class Knee:
    concurrency: int | None
    not_reached: bool
    aggregate_tok_s: float | None = None
    per_user_tok_s: float | None = None

    def text(self) -> str:
        if self.concurrency is None:
            return "needs at least two concurrency levels"
        s = (f"c={self.concurrency} ({fmt_num(self.aggregate_tok_s)} tok/s aggregate, "
             f"{fmt_num(self.per_user_tok_s)} tok/s per user)")
        return s + ", not reached: the highest concurrency measured" if self.not_reached else s


@dataclass
class WorkloadAnswers:
    session: str  # label
    workload: str
    capacity: Capacity
    knee: Knee
    peak_output_tok_s: float | None
    peak_load: str


@dataclass
class ThinkingCost:
    session: str
    thinking_on: str
    thinking_off: str
    loads: list[str]
    e2e_ratio: list[float | None]
    ttfo_ratio: list[float | None]
    capacity_on: Capacity
    capacity_off: Capacity
    visible_output_on: float | None
    visible_output_off: float | None
    reasoning_tokens_on: float | None

    @property
    def e2e_ratio_median(self) -> float | None:
        vals = [v for v in self.e2e_ratio if v is not None]
        return statistics.median(vals) if vals else None

    @property
    def capacity_ratio(self) -> float | None:
        a, b = self.capacity_on.level, self.capacity_off.level
        if a is None or b is None or b == 0:
            return None
        return a / b


def _level_text(level: float, unit: str) -> str:
    return f"c={int(level)}" if unit == "concurrency" else f"{level:g} req/s"


def capacity(views: Sequence[CellView]) -> Capacity:
    closed = [v for v in views if v.concurrency is not None]
    pts = closed or [v for v in views if v.rate is not None]
    unit = "concurrency" if closed else "req/s"
    judged = [(v.x, v.summary.get("slo_met_fraction")) for v in pts if v.x is not None]
    known = [(x, f) for x, f in judged if f is not None]
    if not known:
        return Capacity(None, unit, False, unknown=True)
    ok = [x for x, f in known if f >= SLO_ATTAINMENT]
    if not ok:
        return Capacity(None, unit, False)
    best = max(ok)
    return Capacity(best, unit, best == max(x for x, _ in known))


def knee(views: Sequence[CellView]) -> Knee:
    pts = []
    for v in views:
        if v.concurrency is None:
            continue
        a, u = metric_value(v.summary, "output_tok_s"), metric_value(v.summary, "per_user_tok_s.mean")
        if a is not None and u is not None:
            pts.append((v.concurrency, a, u))
    pts.sort()
    if len(pts) < 2:
        return Knee(None, False)
    best = max(pts, key=lambda p: (p[1] * p[2], -p[0]))
    return Knee(best[0], best[0] == pts[-1][0], best[1], best[2])


def peak(views: Sequence[CellView]) -> tuple[float | None, str]:
    best: tuple[float | None, str] = (None, "")
    for v in views:
        a = metric_value(v.summary, "output_tok_s")
        if a is not None and (best[0] is None or a > best[0]):
            best = (a, v.load)
    return best


def derive(label: str, views: Sequence[CellView]) -> list[WorkloadAnswers]:
    out = []
    for w in dict.fromkeys(v.workload for v in views):
        wv = [v for v in views if v.workload == w]
        pk, pl_ = peak(wv)
        out.append(WorkloadAnswers(label, w, capacity(wv), knee(wv), pk, pl_))
    return out


def _shape_key(w: Mapping[str, Any]) -> tuple[Any, ...]:
    return (w.get("api"), repr(w.get("input_tokens")), w.get("prefix_tokens", 0), w.get("dataset", ""))


def thinking_costs(label: str, session: Session, views: Sequence[CellView]) -> list[ThinkingCost]:
    wls = [w for w in session.meta.get("workloads", []) if isinstance(w, dict)]
    present = {v.base for v in views}
    out = []
    for on in wls:
        if on.get("thinking") is not True or on.get("name") not in present:
            continue
        offs = [w for w in wls if w.get("thinking") is not True and w.get("name") in present
                and _shape_key(w) == _shape_key(on)]
        if not offs:
            continue
        offs.sort(key=lambda w: (w.get("output_tokens") != on.get("output_tokens"), w.get("thinking") is not False))
        off = offs[0]
        # the same load of the same server variant, thinking on vs off
        von = {series_name(v.load, v.variant): v for v in views if v.base == on["name"]}
        voff = {series_name(v.load, v.variant): v for v in views if v.base == off["name"]}
        loads = [ld for ld in von if ld in voff]

        def ratio(a: float | None, b: float | None) -> float | None:
            return a / b if a is not None and b else None

        def visible(vs: Mapping[str, CellView]) -> float | None:
            vals = []
            for v in vs.values():
                o, r = metric_value(v.summary, "output_tokens_mean"), metric_value(v.summary, "reasoning_tokens_mean")
                if o is not None:
                    vals.append(o - (r or 0.0))
            return statistics.fmean(vals) if vals else None

        reasoning = [metric_value(v.summary, "reasoning_tokens_mean") for v in von.values()]
        rs = [r for r in reasoning if r is not None]
        out.append(ThinkingCost(
            label, str(on["name"]), str(off["name"]), loads,
            [ratio(metric_value(von[ld].summary, "e2e_ms.p50"), metric_value(voff[ld].summary, "e2e_ms.p50"))
             for ld in loads],
            [ratio(metric_value(von[ld].summary, "ttfo_ms.p50"), metric_value(voff[ld].summary, "ttfo_ms.p50"))
             for ld in loads],
            capacity(list(von.values())), capacity(list(voff.values())),
            visible(von), visible(voff), statistics.fmean(rs) if rs else None,
        ))
    return out


# ---- the comparison ---------------------------------------------------------------------------------
def session_label(session: Session, label_key: str | None = None) -> str:
    if label_key:
        tags = session.meta.get("tags") or {}
        if label_key in tags:
            return clean_text(str(tags[label_key])) or session.path.name
    name = session.meta.get("name")
    return clean_text(str(name)) if name else session.path.name


def _unique(labels: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for lb in labels:
        n = seen.get(lb, 0) + 1
        seen[lb] = n
        out.append(lb if n == 1 else f"{lb} #{n}")
    return out


@dataclass
class SessionRef:
    label: str
    path: str
    model: str
    target: str
    tags: dict[str, str]


@dataclass
class ComparedCell:
    workload: str
    load: str
    concurrency: int | None
    rate: float | None
    values: dict[str, list[float | None]]  # metric key -> one value per session
    deltas: dict[str, list[float | None]]  # metric key -> delta vs the first session, per session (first: None)
    winners: dict[str, int | None]  # metric key -> index of the winning session


@dataclass
class Comparison:
    sessions: list[SessionRef]
    metrics: tuple[MetricSpec, ...]
    cells: list[ComparedCell]
    only_in: list[tuple[str, str, list[str]]]  # (workload, load, labels of the sessions that have it)
    answers: list[WorkloadAnswers]
    thinking: list[ThinkingCost]
    slos: dict[str, float]
    slos_source: str
    notes: list[str] = field(default_factory=list)

    @property
    def labels(self) -> list[str]:
        return [s.label for s in self.sessions]

    # -- tabular form (for the TUI and csv) --
    def to_rows(self) -> list[dict[str, Any]]:
        """One row per (common cell, metric): values per session, deltas vs the first, and the winner."""
        rows = []
        for c in self.cells:
            for m in self.metrics:
                row: dict[str, Any] = {"workload": c.workload, "load": c.load, "concurrency": c.concurrency,
                                       "rate": c.rate, "metric": m.key, "metric_label": m.label, "better": m.better}
                for lb, v in zip(self.labels, c.values[m.key], strict=True):
                    row[lb] = v
                for lb, d in list(zip(self.labels, c.deltas[m.key], strict=True))[1:]:
                    row[f"delta_pct {lb}"] = d
                w = c.winners[m.key]
                row["winner"] = self.labels[w] if w is not None else None
                rows.append(row)
        return rows

    def to_frame(self) -> pl.DataFrame:
        schema: dict[str, Any] = {"workload": pl.Utf8, "load": pl.Utf8, "concurrency": pl.Int64, "rate": pl.Float64,
                                  "metric": pl.Utf8, "metric_label": pl.Utf8, "better": pl.Utf8}
        for lb in self.labels:
            schema[lb] = pl.Float64
        for lb in self.labels[1:]:
            schema[f"delta_pct {lb}"] = pl.Float64
        schema["winner"] = pl.Utf8
        return pl.DataFrame(self.to_rows(), schema=schema)

    def curves(self, metric: str) -> dict[str, dict[str, list[tuple[float, float]]]]:
        """workload -> session label -> [(concurrency or rate, value)] over the common cells (for overlays)."""
        out: dict[str, dict[str, list[tuple[float, float]]]] = {}
        for c in self.cells:
            x = float(c.concurrency) if c.concurrency is not None else c.rate
            if x is None:
                continue
            for lb, v in zip(self.labels, c.values.get(metric, []), strict=False):
                if v is not None:
                    out.setdefault(c.workload, {}).setdefault(lb, []).append((x, v))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "sessions": [s.__dict__ for s in self.sessions],
            "slos": self.slos,
            "slos_source": self.slos_source,
            "metrics": [m.__dict__ for m in self.metrics],
            "cells": [
                {"workload": c.workload, "load": c.load, "concurrency": c.concurrency, "rate": c.rate,
                 "metrics": {m.key: {"values": c.values[m.key], "delta_pct": c.deltas[m.key],
                                     "winner": self.labels[w] if (w := c.winners[m.key]) is not None else None}
                             for m in self.metrics}}
                for c in self.cells
            ],
            "only_in": [{"workload": w, "load": ld, "present_in": s} for w, ld, s in self.only_in],
            "answers": [
                {"session": a.session, "workload": a.workload,
                 "capacity": a.capacity.level, "capacity_unit": a.capacity.unit,
                 "capacity_not_reached": a.capacity.not_reached, "capacity_unknown": a.capacity.unknown,
                 "knee_concurrency": a.knee.concurrency, "knee_not_reached": a.knee.not_reached,
                 "peak_output_tok_s": a.peak_output_tok_s, "peak_load": a.peak_load}
                for a in self.answers
            ],
            "thinking": [
                {"session": t.session, "thinking_on": t.thinking_on, "thinking_off": t.thinking_off,
                 "loads": t.loads, "e2e_ratio": t.e2e_ratio, "ttfo_ratio": t.ttfo_ratio,
                 "e2e_ratio_median": t.e2e_ratio_median, "capacity_on": t.capacity_on.level,
                 "capacity_off": t.capacity_off.level, "capacity_ratio": t.capacity_ratio,
                 "visible_output_on": t.visible_output_on, "visible_output_off": t.visible_output_off,
                 "reasoning_tokens_on": t.reasoning_tokens_on}
                for t in self.thinking
            ],
            "notes": self.notes,
        }

    def headline(self) -> list[str]:
        """'FP8 vs GPTQ-Int4: output tok/s -12.0%, TPOT p50 +9.1% (median over 4 common cells)'."""
        lines = []
        base = self.labels[0]
        keys = ("output_tok_s", "per_user_tok_s.mean", "ttft_ms.p50", "tpot_ms.p50", "e2e_ms.p50")
        specs = {m.key: m for m in self.metrics}
        for i, lb in enumerate(self.labels[1:], start=1):
            parts = []
            for k in keys:
                if k not in specs:
                    continue
                ds = [d for c in self.cells if (d := c.deltas[k][i]) is not None]
                if ds:
                    parts.append(f"{specs[k].label} {fmt_pct(statistics.median(ds))}")
            if parts:
                lines.append(f"{lb} vs {base}: " + ", ".join(parts) + f" (median over {len(self.cells)} common cells)")
        return lines

    def to_markdown(self, level: int = 2) -> str:
        h = "#" * level
        L = self.labels
        esc = [md_escape(lb) for lb in L]
        out = [f"{h} Comparison: {' vs '.join(esc)}", ""]
        out += ["| label | session | model | target | tags |", "|---|---|---|---|---|"]
        for s in self.sessions:
            tags = ", ".join(f"{k}={v}" for k, v in s.tags.items())
            out.append(f"| {md_escape(s.label)} | {md_escape(s.path)} | {md_escape(s.model)} | "
                       f"{md_escape(s.target)} | {md_escape(tags) or '-'} |")
        out.append("")
        for line in self.headline():
            out.append(f"- {md_escape(line)}")
        out += ["", f"Deltas are against **{esc[0]}**; the best value of each row is in bold "
                    f"(lower is better for latencies, higher for tok/s and goodput; token counts are not judged). "
                    f"SLOs: {slo_text(self.slos)} ({md_escape(self.slos_source)}).", ""]
        for w in dict.fromkeys(c.workload for c in self.cells):
            out += [f"{h}# {md_escape(w)}", ""]
            head = ["load", "metric", *esc, *[f"Δ {e}" for e in esc[1:]], "best"]
            out.append("| " + " | ".join(head) + " |")
            out.append("|" + "|".join(["---", "---", *["---:"] * (len(L) + len(L) - 1), "---"]) + "|")
            for c in (c for c in self.cells if c.workload == w):
                for j, m in enumerate(self.metrics):
                    wi = c.winners[m.key]
                    vals = [f"**{fmt_num(v)}**" if i == wi else fmt_num(v) for i, v in enumerate(c.values[m.key])]
                    deltas = [fmt_pct(d) for d in c.deltas[m.key][1:]]
                    load = md_escape(c.load) if j == 0 else ""
                    best = esc[wi] if wi is not None else ("-" if m.better == "neutral" else "tie")
                    out.append("| " + " | ".join([load, md_escape(m.label), *vals, *deltas, best]) + " |")
            out.append("")
        if self.only_in:
            out += [f"{h}# Cells present in only some sessions", "", "| workload | load | present in | missing from |",
                    "|---|---|---|---|"]
            for w, ld, have in self.only_in:
                miss = [lb for lb in L if lb not in have]
                out.append(f"| {md_escape(w)} | {md_escape(ld)} | {', '.join(md_escape(x) for x in have)} | "
                           f"{', '.join(md_escape(x) for x in miss)} |")
            out.append("")
        out += answers_markdown(self.answers, self.thinking, level + 1, self.slos)
        for n in self.notes:
            out.append(f"- {md_escape(n)}")
        if self.notes:
            out.append("")
        return "\n".join(out).rstrip() + "\n"


def slo_text(slos: Mapping[str, float]) -> str:
    if not slos:
        return "none"
    parts = []
    for k, v in slos.items():
        op = ">=" if k == "per_user_tok_s" else "<="
        parts.append(f"{k} {op} {v:g}")
    return ", ".join(parts) + f" for at least {SLO_ATTAINMENT:.0%} of requests"


def answers_markdown(answers: Sequence[WorkloadAnswers], thinking: Sequence[ThinkingCost], level: int,
                     slos: Mapping[str, float], with_session: bool = True) -> list[str]:
    h = "#" * level
    out = [f"{h} Capacity, knee and peak", ""]
    head = (["session"] if with_session else []) + ["workload", "capacity at the SLOs", "knee", "peak output tok/s"]
    out += ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
    for a in answers:
        cells = ([md_escape(a.session)] if with_session else []) + [
            md_escape(a.workload), md_escape(a.capacity.text()), md_escape(a.knee.text()),
            f"{fmt_num(a.peak_output_tok_s)} at {md_escape(a.peak_load)}" if a.peak_output_tok_s is not None else "-"]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", f"Capacity: the highest load whose cell meets the SLOs ({md_escape(slo_text(slos))}). "
                "Knee: the concurrency that maximises aggregate x per-user tok/s; past it, extra aggregate "
                "throughput costs more per-user speed than it gains.", ""]
    return out + thinking_markdown(thinking, level)


def thinking_markdown(thinking: Sequence[ThinkingCost], level: int) -> list[str]:
    h = "#" * level
    out: list[str] = []
    if thinking:
        out += [f"{h} Thinking mode cost", "",
                "| session | thinking on | thinking off | E2E p50 on/off | TTFO p50 on/off | capacity on / off | "
                "visible output tokens on / off | reasoning tokens |",
                "|---|---|---|---:|---:|---|---|---:|"]
        for t in thinking:
            e2e = ", ".join(f"{md_escape(ld)}: {r:.2f}x" for ld, r in zip(t.loads, t.e2e_ratio, strict=True)
                            if r is not None) or "-"
            tt = ", ".join(f"{md_escape(ld)}: {r:.2f}x" for ld, r in zip(t.loads, t.ttfo_ratio, strict=True)
                           if r is not None) or "-"
            cr = t.capacity_ratio
            cap = (f"{md_escape(t.capacity_on.text())} / {md_escape(t.capacity_off.text())}"
                   + (f" ({cr:.2f}x)" if cr is not None else ""))
            out.append(f"| {md_escape(t.session)} | {md_escape(t.thinking_on)} | {md_escape(t.thinking_off)} | "
                       f"{e2e} | {tt} | {cap} | {fmt_num(t.visible_output_on)} / {fmt_num(t.visible_output_off)} | "
                       f"{fmt_num(t.reasoning_tokens_on)} |")
        out.append("")
    return out


def compare_sessions(sessions: Sequence[Session], label_key: str | None = None,
                     slos: Mapping[str, float] | None = None,
                     metrics: tuple[MetricSpec, ...] = COMPARE_METRICS) -> Comparison:
    """Align the sessions' cells by workload and load and compare them metric by metric.

    Raises ServescopeError when fewer than two sessions are given or when they share no cell."""
    if len(sessions) < 2:
        raise ServescopeError("compare needs at least two sessions; see `servescope sessions` for their ids")
    labels = _unique([session_label(s, label_key) for s in sessions])
    notes: list[str] = []
    if label_key and any(label_key not in (s.meta.get("tags") or {}) for s in sessions):
        miss = [lb for s, lb in zip(sessions, labels, strict=True) if label_key not in (s.meta.get("tags") or {})]
        notes.append(f"tag {label_key!r} is missing from {', '.join(miss)}: labelled by session name")
    used, source = choose_slos(sessions, slos)
    if not slos and len({tuple(sorted(session_slos(s).items())) for s in sessions}) > 1:
        notes.append("the sessions were recorded with different SLOs; all are judged by the first session's")
    views = []
    for s in sessions:
        v = cell_views(s)
        apply_slos(s, v, used)
        views.append(v)
    by_key = [{c.key: c for c in v} for v in views]
    order: list[tuple[str, str]] = []
    for v in views:
        for c in v:
            if c.key not in order:
                order.append(c.key)
    common = [k for k in order if all(k in m for m in by_key)]
    if not common:
        desc = "; ".join(f"{lb}: {', '.join(sorted({w for w, _ in m})) or 'no finished cells'}"
                         for lb, m in zip(labels, by_key, strict=True))
        raise ServescopeError(f"the sessions share no cell (same workload and load): {desc}; "
                              "compare sessions that ran the same workloads and concurrencies")
    # keep each session's natural order: sort the common keys by the first session's order
    pos = {k: i for i, k in enumerate(order)}
    cells = []
    for k in sorted(common, key=lambda k: pos[k]):
        cs = [m[k] for m in by_key]
        values = {m.key: [m.value(c.summary) for c in cs] for m in metrics}
        deltas = {key: [None, *[delta_pct(v, vals[0]) for v in vals[1:]]] for key, vals in values.items()}
        wins = {m.key: winner(values[m.key], m.better) for m in metrics}
        cells.append(ComparedCell(k[0], k[1], cs[0].concurrency, cs[0].rate, values, deltas, wins))
    only = [(k[0], k[1], [lb for lb, m in zip(labels, by_key, strict=True) if k in m]) for k in order if k not in common]
    answers = []
    thinking = []
    for s, lb, v in zip(sessions, labels, views, strict=True):
        answers += derive(lb, v)
        thinking += thinking_costs(lb, s, v)
    refs = [SessionRef(lb, s.path.name, clean_text(str(s.meta.get("model", "?"))),
                       clean_text(str((s.meta.get("target") or {}).get("url", "?"))),
                       {str(k): clean_text(str(x)) for k, x in (s.meta.get("tags") or {}).items()})
            for s, lb in zip(sessions, labels, strict=True)]
    return Comparison(refs, metrics, cells, only, answers, thinking, used, source, notes)
