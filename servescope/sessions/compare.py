"""Compare saved sessions side by side, and the derived answers a session gives on its own.

Pure functions over `Session` objects: the CLI (`servescope compare`), the reports (servescope.reports.compare_doc)
and the TUI's Compare screen all call `compare_sessions()` / `derive()` and render the result their own way.

Definitions (also in docs/compare.md and in every report):

- Cells are aligned by (workload name, load label), e.g. ("sharegpt", "c=4"). In a server-config sweep the
  server variant is part of the workload name ("sharegpt [--max-num-seqs 4]"): each variant gets its own
  table, curve, capacity and knee, and two sessions align variant by variant.
- Delta: signed relative change of a session's value against the first session's,
  (value - first) / first, in percent. No delta where the first value is missing or zero.
- Interval and verdict of each delta (servescope.sessions.stats): a seeded 95% bootstrap interval of the
  delta, from the cells' requests (and repeats), and `better` / `worse` / `within noise` (the interval
  includes 0, or |delta| is below the minimum effect, 2% by default).
- Winner: the best value among the sessions, knowing the metric's direction (lower TTFT/TPOT/ITL/E2E wins,
  higher tok/s and goodput win). No winner when fewer than two sessions have a value, for neutral metrics
  (token counts), when the best two are within TIE_REL (0.1%) of each other, when the best is not better
  than the runner-up beyond noise (or either lacks per-request data to tell), or when the sessions are not
  comparable.
- Not comparable: sessions that differ in what was measured (the mean measured input or output tokens of a
  workload by more than 2%, servescope version, warmup, max model length, tokenizer, client host) get no
  winner; the comparison says which facts differ, and each delta's verdict reads `not comparable (...)`. A
  session whose input lengths were calibrated on its server's usage (a hosted API, without /tokenize) is
  not held to the tokenizer: its measured lengths are compared instead, so a GPU session and an API session
  of the same workload compare as they are (their models and servers differ: the configuration diff says so).
- Measured by another tool (servescope.sessions.comparability): a session imported from GuideLLM, AIPerf,
  inference-perf, an llm-d report or `vllm bench serve` may define some figures differently (its token counts, its
  TTFT, ITL, TPOT, E2E, percentile and throughput definitions, streaming, ignore_eos). Each difference names the
  figures it touches; those are shown but not judged (`ComparedCell.figure_why`, their verdict `not comparable
  (...)`), the others are judged as usual. An imported session's servescope version, tokenizer and client host are
  its tool's, not facts above; its warmup is what its files say.
- Cost (core/cost.py): the cells' USD per 1M output tokens, a row when some session was given a price
  (`--price` for an API, `--gpu-hour` for a GPU); no interval, so no winner is called from it. With a GPU
  session and an API session, "Cost at capacity" puts the GPU's cost at its capacity at the SLOs beside the
  API's at the same load (servescope.sessions.answers.cost_at_capacity).
- Configuration diff: the recorded server arguments (and model, server version, launch command) that differ
  between the sessions head the comparison.
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
- Client bound: a cell whose load generator was `bound` (core/health.py: its CPU, event-loop lag, send
  lateness or token bunching past the second threshold) measured the client, not the server. It is marked in
  the comparison, no winner is called from it, and capacity, knee and peak leave it out (naming it) unless
  `include_bound`.
- Quality (servescope.sessions.quality): when a session holds quality results (quality.json, or cells with
  quality under load), a Quality block puts perplexity, each task's accuracy (delta in points, judged by a
  two-proportion test), KL from the reference and accuracy under load side by side, and the headline names
  them next to speed. Sessions holding quality results compare even when they share no speed cell.
- Thinking cost: for two workloads of one session with the same api and input shape (prompt lengths,
  prefix, dataset), one with thinking on and one without, the ratio on/off of E2E p50 and TTFO p50 at each
  load level they share, and the ratio of their capacities.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import polars as pl

from servescope.core.errors import ServescopeError
from servescope.core.jsontypes import JsonObject
from servescope.core.results import Figure, figure
from servescope.core.secrets import redact_command
from servescope.core.textsafe import clean_text
from servescope.sessions.answers import (
    Capacity,
    CostAtCapacity,
    Knee,
    ThinkingCost,
    WorkloadAnswers,
    capacity,
    cost_at_capacity,
    derive,
    knee,
    peak,
    thinking_costs,
)
from servescope.sessions.comparability import Comparability, comparability
from servescope.sessions.provenance import measured_by
from servescope.sessions.quality import QualityComparison, compare_quality
from servescope.sessions.stats import (
    CONFIDENCE,
    MIN_EFFECT_PCT,
    RESAMPLES,
    Boot,
    Judgement,
    bootstrap,
    figure_problem,
    interval_label,
    judge,
    measured,
    seed_for,
)
from servescope.sessions.store import Session
from servescope.sessions.tunes import compare_refusal
from servescope.sessions.views import (
    DEFAULT_SLOS,
    CellView,
    LoadPlan,
    ReadsPlan,
    apply_slos,
    cell_views,
    choose_slos,
    fmt_num,
    fmt_pct,
    planned_load,
    session_label,
    session_slos,
    slo_text,
    workload_order,
)

CellKey = tuple[str, LoadPlan]  # a cell as comparisons join it: (workload with its variant, planned load)

__all__ = [
    "COMPARE_METRICS", "COST_METRIC", "DEFAULT_SLOS", "ENERGY_METRIC", "RATE_LIMITED_METRIC", "MIN_EFFECT_PCT", "TIE_REL", "Capacity", "CellView",
    "ComparedCell", "Comparison", "CostAtCapacity", "Figure", "Judgement", "Knee", "SessionRef", "ThinkingCost",
    "WorkloadAnswers", "apply_slos", "capacity", "cell_views", "choose_slos", "compare_sessions",
    "config_diff", "delta_pct", "delta_text", "derive", "interval_pct", "fmt_num", "fmt_pct", "knee", "mismatches", "peak",
    "session_label", "session_slos", "slo_text", "thinking_costs", "winner", "workload_order",
]

TIE_REL = 0.001


COMPARE_METRICS: tuple[Figure, ...] = tuple(figure(k) for k in (
    "output_tok_s", "per_user_tok_s.mean", "ttft_ms.p50", "ttft_ms.p99", "ttfo_ms.p50", "tpot_ms.p50", "itl_ms.p99",
    "e2e_ms.p50", "goodput_req_s", "prefix_cache_hit_rate", "input_tokens_mean", "output_tokens_mean",
))
# what a million output tokens cost (core/cost.py): with the default figures, a row when some session has it
COST_METRIC = figure("cost.usd_per_1m_output_tokens")
# the GPUs' energy per output token (NVML; core/energy.py), beside the cost: a row only when some session measured it
ENERGY_METRIC = figure("energy.j_per_output_token")
# the requests a server refused by its rate limit (HTTP 429; a count per cell, the median over its repeats): a row
# only when some compared cell has any, not judged (a count of refusals, no interval)
RATE_LIMITED_METRIC = figure("requests_rate_limited")


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


def delta_text(c: ComparedCell, m: Figure, i: int) -> str:
    """A delta as tables show it, with its 95% interval as an interval (bootstrap intervals are seldom symmetric):
    `+6.4% [+5.5, +33.9] worse`, `-0.4% [-2.3, +1.5] within noise`, `+3.1% [+2.3, +3.9] not comparable (warmup)`;
    an interval of no width (every resample gave the same figure: a deterministic server, the simulator) says so,
    `+42.3% (no spread: deterministic server) better`; a neutral metric's delta alone; `(no interval)` without
    per-request data."""
    d = c.deltas[m.key][i]
    if d is None:
        return "-"
    j = (c.judgements.get(m.key) or [None] * (i + 1))[i]
    if m.better not in ("higher", "lower"):
        return fmt_pct(d)
    if j is None or j.ci is None:
        return f"{fmt_pct(d)} (no interval)"
    return f"{fmt_pct(d)} {interval_pct(j.ci)} {c.verdict(m.key, i)}"


def interval_pct(ci: tuple[float, float]) -> str:
    """An interval of percent deltas: `[+5.5, +33.9]`; one of no width at this precision is no interval to show:
    `(no spread: deterministic server)`."""
    low, high = f"{ci[0]:+.1f}", f"{ci[1]:+.1f}"
    if low == high:
        return "(no spread: deterministic server)"
    return f"[{low}, {high}]"


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
class ComparedCell(ReadsPlan):
    """One cell the sessions share, as compared: each session's saved cells (its repeats) and what the comparison
    computed from them. Its workload, load and client verdicts are read from those cells, not copied."""

    cells: list[list[CellView]]  # per session: its repeats of this cell (same workload and planned load)
    values: dict[str, list[float | None]]  # metric key -> one value per session (the mean over its repeats)
    deltas: dict[str, list[float | None]]  # metric key -> delta vs the first session, per session (first: None)
    winners: dict[str, int | None]  # metric key -> index of the winning session
    # metric key -> the delta's interval and verdict vs the first session, per session (first: None)
    judgements: dict[str, list[Judgement | None]] = field(default_factory=dict)
    no_winner: dict[str, str] = field(default_factory=dict)  # metric key -> why no winner ("within noise")
    repeats: list[int] = field(default_factory=list)  # repeats per session (0: no per-request data)
    not_comparable: str = ""  # why no verdict is called for this cell ("" when comparable)
    # metric key -> why that figure gets no verdict beyond the cell's reason: a definition that differs between the
    # sessions' tools (sessions.comparability); absent when the figure is judged
    figure_why: dict[str, str] = field(default_factory=dict)

    @property
    def workload(self) -> str:
        return self.cells[0][0].workload

    @property
    def load(self) -> str:
        """The load as the first session labelled it."""
        return self.cells[0][0].load

    @property
    def plan(self) -> LoadPlan:  # type: ignore[override]  # read from the first session's cell, not stored
        return self.cells[0][0].plan

    @property
    def client(self) -> list[str | None]:
        """Per session: the worst client verdict of its repeats (None: not measured)."""
        return [_client_verdict(rviews) for rviews in self.cells]

    @property
    def bound_in(self) -> list[int]:
        """The sessions whose client was bound in this cell (their figures measure the load generator)."""
        return [i for i, v in enumerate(self.client) if v == "bound"]

    def why(self, key: str) -> str:
        """Why figure `key` of this cell gets no verdict: the cell's reason and the figure's ("" when judged)."""
        return ", ".join(x for x in (self.not_comparable, self.figure_why.get(key, "")) if x)

    def verdict(self, key: str, i: int) -> str | None:
        """`better` / `worse` / `within noise`, `not comparable (...)`, or None (not judged, no interval)."""
        j = (self.judgements.get(key) or [None] * (i + 1))[i]
        if j is None or j.verdict is None:
            return None
        why = self.why(key)
        return f"not comparable ({why})" if why else j.verdict


@dataclass
class Comparison:
    sessions: list[SessionRef]
    metrics: tuple[Figure, ...]
    cells: list[ComparedCell]
    only_in: list[tuple[str, str, list[str]]]  # (workload, load, labels of the sessions that have it)
    answers: list[WorkloadAnswers]
    thinking: list[ThinkingCost]
    slos: dict[str, float]
    slos_source: str
    notes: list[str] = field(default_factory=list)
    min_effect: float = MIN_EFFECT_PCT
    resamples: int = RESAMPLES
    interval: str = ""  # "request-level interval (1 repeat)" or the hierarchical one
    mismatches: list[str] = field(default_factory=list)  # what was measured differently, one line each
    config: list[tuple[str, list[str]]] = field(default_factory=list)  # (what, value per session) that differ
    config_note: str = ""  # when no argument was recorded, or all are equal
    quality: QualityComparison | None = None  # when some session holds quality results
    no_common: str = ""  # why there is no speed table: the sessions share no cell (compared for quality only)
    costs: list[CostAtCapacity] = field(default_factory=list)  # a GPU session's cost at capacity vs an API's
    # each session's tool and the definitions that differ between them (sessions.comparability)
    comparability: Comparability | None = None

    @property
    def labels(self) -> list[str]:
        return [s.label for s in self.sessions]

    # -- tabular form (for the TUI and csv) --
    def to_rows(self) -> list[dict[str, str | float | None]]:
        """One row per (common cell, metric): values per session, deltas vs the first, and the winner."""
        rows = []
        for c in self.cells:
            for m in self.metrics:
                row: dict[str, str | float | None] = {"workload": c.workload, "load": c.load, "concurrency": c.concurrency,
                                       "rate": c.rate, "metric": m.key, "metric_label": m.label, "better": m.better}
                for lb, v in zip(self.labels, c.values[m.key], strict=True):
                    row[lb] = v
                js = c.judgements.get(m.key) or [None] * len(self.labels)
                for i, (lb, d) in list(enumerate(zip(self.labels, c.deltas[m.key], strict=True)))[1:]:
                    row[f"delta_pct {lb}"] = d
                    ji = js[i]
                    ci = ji.ci if ji is not None else None
                    row[f"ci_lo {lb}"], row[f"ci_hi {lb}"] = ci if ci is not None else (None, None)
                    row[f"verdict {lb}"] = c.verdict(m.key, i)
                w = c.winners[m.key]
                row["winner"] = self.labels[w] if w is not None else None
                rows.append(row)
        return rows

    def to_frame(self) -> pl.DataFrame:
        schema: dict[str, type[pl.DataType]] = {"workload": pl.Utf8, "load": pl.Utf8, "concurrency": pl.Int64, "rate": pl.Float64,
                                  "metric": pl.Utf8, "metric_label": pl.Utf8, "better": pl.Utf8}
        for lb in self.labels:
            schema[lb] = pl.Float64
        for lb in self.labels[1:]:
            schema[f"delta_pct {lb}"] = pl.Float64
            schema[f"ci_lo {lb}"] = pl.Float64
            schema[f"ci_hi {lb}"] = pl.Float64
            schema[f"verdict {lb}"] = pl.Utf8
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

    def to_dict(self) -> JsonObject:
        """`servescope compare --json`."""
        return {
            "sessions": [s.__dict__ for s in self.sessions],
            "slos": self.slos,
            "slos_source": self.slos_source,
            "metrics": [{"key": m.key, "label": m.label, "better": m.better, "unit": m.unit} for m in self.metrics],
            "significance": {"confidence": CONFIDENCE, "resamples": self.resamples, "min_effect_pct": self.min_effect,
                             "interval": self.interval},
            "mismatches": self.mismatches,
            "comparability": (self.comparability.to_dict(self.labels) if self.comparability is not None else
                              {"tools": [], "shown": False, "differences": [], "not_judged": {}}),
            "config_diff": [{"what": w, "values": v} for w, v in self.config],
            "cells": [
                {"workload": c.workload, "load": c.load, "concurrency": c.concurrency, "rate": c.rate,
                 "repeats": c.repeats, "comparable": not c.not_comparable,
                 "not_comparable": c.not_comparable or None,
                 "client": dict(zip(self.labels, c.client, strict=True)) if c.client else None,
                 "client_bound": [self.labels[i] for i in c.bound_in],
                 "metrics": {m.key: {"values": c.values[m.key], "delta_pct": c.deltas[m.key],
                                     "winner": self.labels[w] if (w := c.winners[m.key]) is not None else None,
                                     "deltas": [self._delta_dict(c, m, i) for i in range(1, len(self.labels))]}
                             for m in self.metrics}}
                for c in self.cells
            ],
            "only_in": [{"workload": w, "load": ld, "present_in": s} for w, ld, s in self.only_in],
            "answers": [
                {"session": a.session, "workload": a.workload,
                 "capacity": a.capacity.level, "capacity_unit": a.capacity.unit,
                 "capacity_not_reached": a.capacity.not_reached, "capacity_unknown": a.capacity.unknown,
                 "knee_concurrency": a.knee.concurrency, "knee_not_reached": a.knee.not_reached,
                 "peak_output_tok_s": a.peak_output_tok_s, "peak_load": a.peak_load,
                 "left_out_client_bound": a.bound, "include_bound": a.include_bound}
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
            **({"cost_at_capacity": [
                {"workload": c.workload, "gpu": c.gpu, "api": c.api, "capacity": c.capacity.level,
                 "capacity_unit": c.capacity.unit, "capacity_not_reached": c.capacity.not_reached,
                 "gpu_usd_per_1m_output_tokens": c.gpu_usd, "api_usd_per_1m_output_tokens": c.api_usd,
                 "gpu_usd_per_1m_total_tokens": c.gpu_usd_total, "api_usd_per_1m_total_tokens": c.api_usd_total,
                 "api_same_load": c.api_same_load, "api_slo_met": c.api_slo_met, "text": c.text(self.slos)}
                for c in self.costs
            ]} if self.costs else {}),  # a GPU session and an API session, both priced
            "notes": self.notes,
            **({"no_common_cells": self.no_common} if self.no_common else {}),
            **({"quality": self.quality.to_dict()} if self.quality is not None else {}),
        }

    def _delta_dict(self, c: ComparedCell, m: Figure, i: int) -> JsonObject:
        """One delta of the JSON, a session's figure against the first session's: `session`, `delta_pct`, `ci` (its
        interval, percent; null without one), `verdict`, `comparable` and `not_comparable` (why not)."""
        j = (c.judgements.get(m.key) or [None] * len(self.labels))[i]
        ci = j.ci if j is not None else None
        v = j.verdict if j is not None else None
        return {"session": self.labels[i], "delta_pct": c.deltas[m.key][i],
                "ci": [ci[0], ci[1]] if ci is not None else None,
                "verdict": v, "comparable": not c.why(m.key), "not_comparable": c.why(m.key) or None}

def _client_verdict(views: Sequence[CellView]) -> str | None:
    """The worst client verdict among a cell's repeats (None: not measured)."""
    got = [c.verdict for v in views if (c := v.summary.client) is not None and c.verdict]
    for worst in ("bound", "strained", "ok"):
        if worst in got:
            return worst
    return None


def _facts(session: Session) -> dict[str, str]:
    """What a session measured with, beyond its workloads: the facts two sessions must share to be judged."""
    i = session.info
    src = measured_by(i)
    if src.imported:  # another tool measured it: its tool, token counts and definitions are sessions.comparability's
        warm = {"none": "0", "unknown": ""}.get(src.warmup, src.warmup.removesuffix(" requests"))
        return {"servescope version": "", "warmup": clean_text(warm), "max model length":
                str(i.max_model_len) if i.max_model_len is not None else "", "tokenizer": "", "client host": ""}
    tokenizer = clean_text(i.target.tokenizer or "")
    if tokenizer.startswith(CALIBRATED):
        # sized on its own server's counts (a hosted API: no /tokenize), its prompts hit the lengths asked in that
        # server's tokens, as a /tokenize session's do in its own: the measured lengths are compared instead
        # (LENGTH_TOLERANCE), so a GPU session and an API session compare with no special flag
        tokenizer = ""
    return {"servescope version": clean_text(i.servescope_version),
            "warmup": ", ".join(map(str, planned_load(session).warmups)) or "0",
            "max model length": str(i.max_model_len) if i.max_model_len is not None else "",
            "tokenizer": tokenizer,
            "client host": clean_text(i.host if i.host != "?" else "")}


def _lengths(groups: Sequence[Sequence[CellView]]) -> tuple[float | None, float | None]:
    """Mean measured input and output tokens over some cells, weighted by their successful requests."""
    out: list[float | None] = []
    for key in ("input_tokens_mean", "output_tokens_mean"):
        num = den = 0.0
        for g in groups:
            for v in g:
                x = v.summary.value(key)
                if x is not None and v.summary.requests_ok:
                    num += x * v.summary.requests_ok
                    den += v.summary.requests_ok
        out.append(num / den if den else None)
    return out[0], out[1]


LENGTH_TOLERANCE = 0.02
CALIBRATED = "calibrated"  # how the tokenizer of a session whose lengths were calibrated on its server's usage starts


def mismatches(sessions: Sequence[Session], labels: Sequence[str],
               groups: Sequence[Mapping[CellKey, list[CellView]]],
               common: Sequence[CellKey]) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """What the sessions measured differently: (lines for the report, {fact: short why} for every cell,
    {workload: short why} for the cells of one workload). A fact unknown in a session is not a mismatch."""
    lines: list[str] = []
    every: dict[str, str] = {}
    facts = [_facts(s) for s in sessions]
    for k in facts[0]:
        vals = [f[k] for f in facts]
        known = {v for v in vals if v}
        if len(known) > 1:
            every[k] = k
            lines.append(f"{k}: " + ", ".join(f"{lb} {v or '?'}" for lb, v in zip(labels, vals, strict=True)))
    per_wl: dict[str, str] = {}
    for w in dict.fromkeys(k[0] for k in common):
        keys = [k for k in common if k[0] == w]
        lens = [_lengths([g[k] for k in keys]) for g in groups]
        for n, what in ((0, "input"), (1, "output")):
            means = [ln[n] for ln in lens]
            got = [x for x in means if x is not None]
            if len(got) > 1 and max(got) > 0 and (max(got) - min(got)) / max(got) > LENGTH_TOLERANCE:
                per_wl[w] = ", ".join(x for x in (per_wl.get(w), f"{what} tokens") if x)
                lines.append(f"{w}: mean measured {what} tokens differ by more than {LENGTH_TOLERANCE:.0%}: "
                             + ", ".join(f"{lb} {fmt_num(x)}" for lb, x in zip(labels, means, strict=True)))
    return lines, every, per_wl


def _args_dict(args: object) -> dict[str, str]:
    """`--max-num-seqs 4 --enforce-eager` -> {"--max-num-seqs": "4", "--enforce-eager": ""} (positionals by
    position, `pos 1`); arguments recorded as text are split as a shell would."""
    import shlex

    if args is None:
        return {}
    if isinstance(args, str):
        try:
            toks = shlex.split(args)
        except ValueError:
            toks = args.split()
    elif isinstance(args, list):
        toks = [str(a) for a in args]
    else:
        return {}
    out: dict[str, str] = {}
    i = 0
    npos = 0
    while i < len(toks):
        t = toks[i]
        if t.startswith("-"):
            flag, eq, val = t.partition("=")
            if not eq and i + 1 < len(toks) and not toks[i + 1].startswith("-"):
                val = toks[i + 1]
                i += 1
            out[flag] = val
        else:
            npos += 1
            out[f"pos {npos}"] = t
        i += 1
    return out


def config_diff(sessions: Sequence[Session]) -> tuple[list[tuple[str, list[str]]], str]:
    """The recorded configuration that differs between the sessions, (what, value per session), and a note
    when some session recorded no server arguments (servescope did not launch its server)."""
    infos = [s.info for s in sessions]
    rows: list[tuple[str, list[str]]] = []

    def add(what: str, vals: list[str]) -> None:
        if len(set(vals)) > 1:
            rows.append((what, vals))

    add("model", [clean_text(i.model) for i in infos])
    add("server version", [clean_text(i.target.version or "not reported") for i in infos])
    add("launch command", [redact_command(clean_text(i.server.launch or "")) if i.server else "" for i in infos])
    args = [_args_dict(i.server.args) if i.server else {} for i in infos]
    for flag in dict.fromkeys(f for a in args for f in a):
        add(flag, [redact_command(clean_text(a[flag])) or "(set)" if flag in a else "(not set)"
                          for a in args])
    missing = [s.path.name for s, i in zip(sessions, infos, strict=True) if not (i.server and i.server.args)]
    note = ""
    if len(missing) == len(sessions):
        note = ("No server arguments were recorded (servescope did not launch the servers): compare their "
                "configuration by hand.")
    elif missing:
        note = f"No server arguments recorded for {', '.join(missing)} (servescope did not launch its server)."
    elif not rows:
        note = "The recorded server arguments are the same."
    return rows, note


def compare_sessions(sessions: Sequence[Session], label_key: str | None = None,
                     slos: Mapping[str, float] | None = None,
                     metrics: tuple[Figure, ...] = COMPARE_METRICS, min_effect: float = MIN_EFFECT_PCT,
                     resamples: int = RESAMPLES, seed: int = 0, include_bound: bool = False) -> Comparison:
    """Align the sessions' cells by workload and load and compare them metric by metric, each delta with its
    bootstrap interval and verdict (servescope.sessions.stats). A cell whose client was bound in some session
    calls no winner; the answers leave such cells out unless `include_bound`.

    Raises ServescopeError when fewer than two sessions are given or when they share no cell, unless some session
    holds quality results (then `no_common` says why there is no speed table and only quality is compared)."""
    if len(sessions) < 2:
        raise ServescopeError("compare needs at least two sessions; see `servescope sessions` for their ids")
    if (why := compare_refusal(sessions)) is not None:  # a tune session: compare its best cell
        raise ServescopeError(why)
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
    # the repeats of each cell, joined across sessions on (workload, planned load); shown by the first's label
    groups: list[dict[CellKey, list[CellView]]] = []
    for v in views:
        g: dict[CellKey, list[CellView]] = {}
        for c in v:
            g.setdefault(c.key, []).append(c)
        groups.append(g)
    order: list[CellKey] = []
    load_of: dict[CellKey, str] = {}
    for v in views:
        for c in v:
            if c.key not in order:
                order.append(c.key)
                load_of[c.key] = c.load
    common = [k for k in order if all(k in m for m in groups)]
    # keep each session's natural order: sort the common keys by the first session's order
    pos = {k: i for i, k in enumerate(order)}
    common.sort(key=lambda k: pos[k])
    quality = compare_quality(labels, sessions, [(k[0], load_of[k], [g[k] for g in groups]) for k in common])
    no_common = ""
    if not common:
        desc = "; ".join(f"{lb}: {', '.join(sorted({w for w, _ in m})) or 'no finished cells'}"
                         for lb, m in zip(labels, groups, strict=True))
        if quality is None:
            raise ServescopeError(f"the sessions share no cell (same workload and load): {desc}; "
                                  "compare sessions that ran the same workloads and concurrencies")
        no_common = (f"No speed figures to compare: the sessions share no cell (same workload and load): {desc}. "
                     "Only their quality is compared.")
    lines, every, per_wl = mismatches(sessions, labels, groups, common) if common else ([], {}, {})
    if metrics == COMPARE_METRICS:
        metrics = (*metrics, COST_METRIC, ENERGY_METRIC, RATE_LIMITED_METRIC)
    # a descriptive figure no session measured (the prefix-cache hit rate of a server without it) is left out, and
    # so is the cost when no session was given a price, and the 429s when no compared cell got any
    def shown(m: Figure) -> bool:
        got = [m.value(rv.summary) for g in groups for k in common for rv in g[k]]
        if m.key == RATE_LIMITED_METRIC.key:
            return any(got)
        return ((m.better != "neutral" and not m.key.startswith(("cost.", "energy."))) or m.key.endswith("tokens_mean")
                or any(x is not None for x in got))

    metrics = tuple(m for m in metrics if shown(m))
    judged = tuple(m.key for m in metrics if figure_problem(m.key) is None)
    measured_with = comparability(sessions, [m.key for m in metrics])
    cells = []
    max_repeats = 1
    for k in common:
        reps = [m[k] for m in groups]
        values = {m.key: [_mean([m.value(rv.summary) for rv in rviews]) for rviews in reps] for m in metrics}
        deltas = {key: [None, *[delta_pct(v, vals[0]) for v in vals[1:]]] for key, vals in values.items()}
        boots: list[Boot | None] = []
        for i, (sess, rviews) in enumerate(zip(sessions, reps, strict=True)):
            boots.append(_cell_boot(sess, rviews, used, judged, resamples, seed_for(seed, i, k[0], load_of[k])))
        max_repeats = max([max_repeats, *(b.repeats for b in boots if b is not None)])
        why = ", ".join(x for x in (*every.values(), per_wl.get(k[0], "")) if x)
        client = [_client_verdict(rviews) for rviews in reps]
        judgements: dict[str, list[Judgement | None]] = {}
        wins: dict[str, int | None] = {}
        no_win: dict[str, str] = {}
        for m in metrics:
            vals = values[m.key]
            judgements[m.key] = [None, *[judge(boots[0], boots[i], m.key, m.better, min_effect,
                                               observed=(vals[0], vals[i])) for i in range(1, len(vals))]]
            w = winner(vals, m.better)
            if m.better not in ("higher", "lower"):
                no_win[m.key] = "-"
            elif w is None:
                no_win[m.key] = "tie" if sum(v is not None for v in vals) > 1 else "-"
            else:
                ranked = sorted((i for i, v in enumerate(vals) if v is not None and i != w),
                                key=lambda i: vals[i] or 0.0, reverse=(m.better == "higher"))
                r = ranked[0]
                pair = judge(boots[r], boots[w], m.key, m.better, min_effect, observed=(vals[r], vals[w]))
                if why or measured_with.why(m.key):
                    w, no_win[m.key] = None, "not comparable"
                elif "bound" in client:
                    w, no_win[m.key] = None, "client bound"
                elif pair.verdict is None:
                    w, no_win[m.key] = None, "no interval"
                elif pair.verdict != "better":
                    w, no_win[m.key] = None, "within noise"
            wins[m.key] = w
        cells.append(ComparedCell(reps, values, deltas, wins, judgements, no_win,
                                  [b.repeats if b is not None else 0 for b in boots], why,
                                  {m.key: fw for m in metrics if (fw := measured_with.why(m.key))}))
    only = [(k[0], load_of[k], [lb for lb, m in zip(labels, groups, strict=True) if k in m])
            for k in order if k not in common]
    answers = []
    thinking = []
    for s, lb, v in zip(sessions, labels, views, strict=True):
        answers += derive(lb, v, include_bound)
        thinking += thinking_costs(lb, s, v)
    refs = [SessionRef(lb, s.path.name, clean_text(i.model), clean_text(i.target.url),
                       {str(k): clean_text(str(x)) for k, x in i.tags.items()})
            for s, i, lb in zip(sessions, infos, labels, strict=True)]
    if any(r == 0 for c in cells for r in c.repeats):
        notes.append("some cells have no per-request data (an import of another tool's aggregates): their deltas "
                     "have no interval and no winner")
    config, config_note = config_diff(sessions)
    costs = cost_at_capacity(labels, views, include_bound) if common else []
    return Comparison(refs, metrics, cells, only, answers, thinking, used, source, notes, min_effect, resamples,
                      interval_label(max_repeats), lines, config, config_note, quality, no_common, costs,
                      measured_with)


# a session, its request files' (name, mtime, size), the SLOs, the figures, resamples, seed, closed-loop users
_BootKey = tuple[str, tuple[tuple[str, int, int], ...], tuple[tuple[str, float], ...], tuple[str, ...], int, int,
                 int | None]
_BOOTS: dict[_BootKey, Boot | None] = {}  # the Compare screen recompares on every relabel: keep the work


def _cell_boot(session: Session, views: Sequence[CellView], slos: Mapping[str, float], keys: tuple[str, ...],
               resamples: int, seed: int) -> Boot | None:
    """One session's cell (its repeats), bootstrapped; remembered while its request files are unchanged."""
    files = [session.path / "requests" / f"cell-{v.index:04d}.parquet" for v in views]
    try:
        stamp = tuple((f.name, f.stat().st_mtime_ns, f.stat().st_size) for f in files if f.exists())
    except OSError:
        stamp = ()
    closed = views[0].concurrency if views[0].rate is None else None
    key = (str(session.path.resolve()), stamp, tuple(sorted(slos.items())), keys, resamples, seed, closed)
    if key in _BOOTS:
        return _BOOTS[key]
    frames = [fr for v in views if (fr := measured(session.requests(v.index), slos)) is not None]
    boot = bootstrap(frames, keys, resamples, seed, users=closed) if frames else None
    if len(_BOOTS) >= 512:
        _BOOTS.pop(next(iter(_BOOTS)))
    _BOOTS[key] = boot
    return boot


def _mean(vals: Sequence[float | None]) -> float | None:
    """A cell's figure over its repeats: their median (one repeat: its own value)."""
    got = [v for v in vals if v is not None]
    if len(got) != len(vals) or not got:
        return None
    return got[0] if len(got) == 1 else statistics.median(got)
