"""Compare saved sessions side by side, and the derived answers a session gives on its own.

Pure functions over `Session` objects: the CLI (`servescope compare`), the Markdown report and the TUI's
Compare screen all call `compare_sessions()` / `derive()` and render the result their own way.

Definitions (also in the README's "Reports and comparisons" and in every report):

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

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from servescope.core.errors import ServescopeError
from servescope.core.results import CellSummary, metric_better, metric_label
from servescope.core.textsafe import clean_text, md_escape
from servescope.sessions.answers import (
    Capacity,
    Knee,
    ThinkingCost,
    WorkloadAnswers,
    answers_markdown,
    capacity,
    derive,
    knee,
    peak,
    thinking_costs,
    thinking_markdown,
)
from servescope.sessions.store import Session
from servescope.sessions.views import (
    DEFAULT_SLOS,
    CellView,
    apply_slos,
    cell_views,
    choose_slos,
    fmt_num,
    fmt_pct,
    session_label,
    session_slos,
    slo_text,
    workload_order,
)

__all__ = [
    "COMPARE_METRICS", "DEFAULT_SLOS", "TIE_REL", "Capacity", "CellView", "ComparedCell", "Comparison", "Knee",
    "MetricSpec", "SessionRef", "ThinkingCost", "WorkloadAnswers", "answers_markdown", "apply_slos", "capacity",
    "cell_views", "choose_slos", "compare_sessions", "delta_pct", "derive", "fmt_num", "fmt_pct", "knee", "peak",
    "session_label", "session_slos", "slo_text", "thinking_costs", "thinking_markdown", "winner", "workload_order",
]

TIE_REL = 0.001


@dataclass(frozen=True)
class MetricSpec:
    key: str  # "output_tok_s" or "ttft_ms.p50"
    label: str
    better: str  # "higher" | "lower" | "neutral"

    @classmethod
    def of(cls, key: str) -> MetricSpec:
        """The compare column for `key`, its label and direction from the METRICS table."""
        return cls(key, metric_label(key), metric_better(key) or "neutral")

    def value(self, summary: CellSummary) -> float | None:
        return summary.value(self.key)


COMPARE_METRICS: tuple[MetricSpec, ...] = tuple(MetricSpec.of(k) for k in (
    "output_tok_s", "per_user_tok_s.mean", "ttft_ms.p50", "ttft_ms.p99", "ttfo_ms.p50", "tpot_ms.p50", "itl_ms.p99",
    "e2e_ms.p50", "goodput_req_s", "input_tokens_mean", "output_tokens_mean",
))


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


# ---- the comparison ---------------------------------------------------------------------------------
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


def compare_sessions(sessions: Sequence[Session], label_key: str | None = None,
                     slos: Mapping[str, float] | None = None,
                     metrics: tuple[MetricSpec, ...] = COMPARE_METRICS) -> Comparison:
    """Align the sessions' cells by workload and load and compare them metric by metric.

    Raises ServescopeError when fewer than two sessions are given or when they share no cell."""
    if len(sessions) < 2:
        raise ServescopeError("compare needs at least two sessions; see `servescope sessions` for their ids")
    labels = _unique([session_label(s, label_key) for s in sessions])
    notes: list[str] = []
    infos = [s.info for s in sessions]
    if label_key and any(label_key not in i.tags for i in infos):
        miss = [lb for i, lb in zip(infos, labels, strict=True) if label_key not in i.tags]
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
    refs = [SessionRef(lb, s.path.name, clean_text(i.model), clean_text(i.target.url),
                       {str(k): clean_text(str(x)) for k, x in i.tags.items()})
            for s, i, lb in zip(sessions, infos, labels, strict=True)]
    return Comparison(refs, metrics, cells, only, answers, thinking, used, source, notes)
