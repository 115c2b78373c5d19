"""Quality results in sessions: a cell's quality under load, and the quality of two or more sessions side by side.
Pure functions over `Session` objects and `core.quality.QualityResult`s: `compare`, the report
(servescope.reports.quality_doc) and the TUI's Compare screen render what `compare_quality()` returns, each their
own way.

Where the figures come from (core/quality.py computes them; engine/quality.py runs the probe):
    quality.json       a session's probe (`servescope quality`): perplexity, task accuracies, divergence from a
                       reference session, and the greedy traces that let it be a reference itself
    a cell's summary   `quality` (`--quality-share`): probe questions answered during that cell's load, and its
                       greedy prompts compared with the same prompts at idle

Definitions (also printed under every table):
- Accuracy: correct / n of greedy (temperature 0) exact-answer questions, with a 95% Wilson score interval.
  Deltas are in percentage points; a difference is beyond noise when a pooled two-proportion z-test at 95%
  says so (`core.quality.accuracies_differ`): `better` / `worse`, else `within noise`.
- Perplexity: exp of the mean negative log-likelihood (natural log) of the corpus's tokens, lower is better; per
  token of each model's own tokenizer, so it compares quantisations of one model, not different models.
- KL: KL(reference || session) in nats over top-k log-probabilities (the rest of the mass as one outcome), at the
  positions where both greedy generations still share their context; lower is closer. Top-1 agreement: the
  share of those positions whose most likely token is the reference's. First divergence: the first generated
  token where the greedy outputs differ, averaged over prompts.
- Perplexity and mean KL are judged when both sessions recorded their 95% intervals (perplexity over tokens, KL
  over prompts): beyond noise when the intervals do not overlap (`core.quality.intervals_apart`, conservative),
  else within noise; without intervals they are not judged. Top-1 agreement and first divergence are not judged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from servescope.core.quality import (
    Divergence,
    QualityResult,
    TaskScore,
    accuracies_differ,
    divergence,
    intervals_apart,
    wilson,
)
from servescope.core.results import CellResult, TaskTally, finite
from servescope.core.textsafe import clean_text
from servescope.sessions.store import Session
from servescope.sessions.views import CellView, fmt_num, fmt_pct

__all__ = ["ACCURACY_DEFINITION", "LoadQuality", "QualityComparison", "QualityRow", "compare_quality", "interval_text",
           "kl_text", "load_quality", "load_text", "pct", "ppl_text", "quality_brief", "recorded_ci", "result_dict",
           "row_name", "sane", "settings_text", "split_task"]

ACCURACY_DEFINITION = ("correct / n of greedy (temperature 0) exact-answer questions, with a 95% Wilson score "
                       "interval")
JUDGE_DEFINITION = ("deltas of accuracy are in percentage points, judged by a pooled two-proportion z-test at 95%: "
                    "better or worse beyond noise, else within noise")
PERPLEXITY_DEFINITION = ("exp of the mean negative log-likelihood (natural log) of the shipped corpus's tokens after "
                         "the first, from the server's prompt log-probabilities; lower is better; per token of the "
                         "model's own tokenizer, so it compares quantisations of one model, not different models")
KL_DEFINITION = ("KL(reference || this) in nats over the top-k log-probabilities (the rest of the mass as one "
                 "outcome), at each position where both greedy generations still share their context")
NOT_JUDGED = ("perplexity and mean KL are beyond noise when their 95% intervals (over tokens, over prompts) do not "
              "overlap, and not judged without intervals; top-1 agreement and first divergence are not judged")
HEADLINE_TASKS = 3  # task accuracies a headline names (those beyond noise first)

_CONTEXT = re.compile(r"^(?P<task>.+)@(?P<ctx>\d+(?:\.\d+)?K|\d+)$")


# ---- formats ----------------------------------------------------------------------------------------------
def pct(v: float | None) -> str:
    """A share as a percentage, whole when it is: 1.0 -> `100%`, 0.917 -> `91.7%`."""
    f = finite(v)
    if f is None:
        return "-"
    x = f * 100
    return f"{x:.0f}%" if abs(x - round(x)) < 0.05 else f"{x:.1f}%"


def interval_text(lo: float, hi: float) -> str:
    """A 95% interval of a share: `85.0-95.9%`."""
    return f"{lo * 100:.1f}-{hi * 100:.1f}%"


def kl_text(v: float | None) -> str:
    f = finite(v)
    if f is None:
        return "-"
    return "0" if abs(f) < 5e-7 else f"{f:.3g}"  # float noise of identical traces reads as 0


def ppl_text(v: float | None) -> str:
    f = finite(v)
    return "-" if f is None else f"{f:,.3f}"


def split_task(name: str) -> tuple[str, str]:
    """`retrieval@16K` -> ("retrieval", "16K"); a short task (or a user's) -> (name, "")."""
    m = _CONTEXT.match(name)
    return (m.group("task"), m.group("ctx")) if m else (name, "")


def sane(s: TaskScore | None) -> TaskScore | None:
    """The score rebuilt from its counts (accuracy and interval recomputed), None when they are not counts
    (n <= 0, correct outside 0..n): a hand-edited or foreign quality.json never breaks a comparison."""
    if s is None or isinstance(s.n, bool) or not isinstance(s.n, int) or not isinstance(s.correct, int):
        return None
    if s.n <= 0 or not 0 <= s.correct <= s.n:
        return None
    lo, hi = wilson(s.correct, s.n)
    return TaskScore(accuracy=s.correct / s.n, n=s.n, correct=s.correct, lo=lo, hi=hi)


def _score(s: TaskScore) -> str:
    return f"{pct(s.accuracy)} ({s.correct}/{s.n})"


# ---- quality under load (a cell's summary) ------------------------------------------------------------------
@dataclass(frozen=True)
class LoadQuality:
    """A cell's probe figures (`--quality-share`) as reports judge them: its CellQuality's counts checked, each
    accuracy with its Wilson interval."""

    n: int
    correct: int
    tasks: dict[str, TaskScore]
    kl_mean: float | None = None
    kl_p99: float | None = None
    top1_agreement: float | None = None
    first_divergence_mean: float | None = None
    positions: int = 0
    failed: int = 0

    @property
    def score(self) -> TaskScore:
        lo, hi = wilson(self.correct, self.n)
        return TaskScore(accuracy=self.correct / self.n if self.n else 0.0, n=self.n, correct=self.correct,
                         lo=lo, hi=hi)


MAX_COUNT = 2**53  # a float counts exactly up to here; a stored count past it is damage, not a count


def _count(v: object) -> int:
    f = finite(v)
    return int(f) if f is not None and 0 <= f <= MAX_COUNT and f == int(f) else 0


def _task(t: TaskTally) -> TaskScore | None:
    n = _count(t.n)
    c = min(_count(t.correct), n)
    if not n:
        return None
    lo, hi = wilson(c, n)
    return TaskScore(accuracy=c / n, n=n, correct=c, lo=lo, hi=hi)


def load_quality(summary: CellResult) -> LoadQuality | None:
    """The cell's quality under load with its intervals, None when the cell had no probe request. Counts that
    are not counts read as 0; accuracy is recomputed from them (correct / n)."""
    q = summary.quality
    if q is None:
        return None
    n = _count(q.n)
    tasks = {clean_text(k): sc for k, t in q.tasks.items() if (sc := _task(t)) is not None}
    out = LoadQuality(n=n, correct=min(_count(q.correct), n), tasks=tasks, kl_mean=finite(q.kl_mean),
                      kl_p99=finite(q.kl_p99), top1_agreement=finite(q.top1_agreement),
                      first_divergence_mean=finite(q.first_divergence_mean), positions=_count(q.positions),
                      failed=_count(q.failed))
    return out if out.n or out.positions or out.failed else None


def load_text(lq: LoadQuality) -> str:
    return f"{pct(lq.score.accuracy)} ({lq.correct}/{lq.n})" if lq.n else "-"


SYNTHETIC_QUALITY = "synthetic: the simulator (sim://) makes these quality figures up; they measure no model"


def synthetic_note(url: str) -> str:
    """For a simulator target (`sim://`): the line that says its quality figures are synthetic; else ""."""
    return SYNTHETIC_QUALITY if url.startswith("sim://") else ""


# ---- one session: the report's Quality section --------------------------------------------------------------
def settings_text(settings: Mapping[str, object] | None) -> str:
    """The probe's settings as session.toml records them, in one line."""
    if not settings:
        return "not recorded"
    parts = []
    for key, what in (("tasks", "tasks"), ("contexts", "contexts"), ("n", "questions per task"),
                      ("top_k", "top-k"), ("seed", "seed"), ("reference", "reference"),
                      ("user_sets", "task files"), ("measured_at", "measured")):
        v = settings.get(key)
        if v is None or v == []:
            continue
        text = ", ".join(clean_text(str(x)) for x in v) if isinstance(v, list) else clean_text(str(v))
        parts.append(f"{what} {text}")
    return "; ".join(parts) or "not recorded"


def result_dict(r: QualityResult) -> dict[str, object]:
    """A session's quality results for JSON, without the traces and answers (their counts instead)."""
    ci = recorded_ci(r, "perplexity_ci")
    return {"perplexity": finite(r.perplexity), "perplexity_ci": list(ci) if ci is not None else None,
            "perplexity_tokens": r.perplexity_tokens,
            "perplexity_note": clean_text(r.perplexity_note) or None,
            "tasks": {clean_text(k): {"accuracy": s.accuracy, "n": s.n, "correct": s.correct, "lo": s.lo, "hi": s.hi}
                      for k, s in r.tasks.items()},
            "reference": ({k: getattr(r.reference, k) for k in r.reference.__struct_fields__}
                          if r.reference is not None else None),
            "reference_session": clean_text(r.reference_session) if r.reference_session else None,
            "traces": len(r.traces), "answers": len(r.answers)}


def quality_brief(result: QualityResult) -> str:
    """A session's quality in a few words (lists): `ppl 6.12, 4 tasks 96%, KL 0.012`."""
    parts = []
    if result.perplexity is not None:
        parts.append(f"ppl {fmt_num(finite(result.perplexity))}")
    if result.tasks:
        scores = [x for s in result.tasks.values() if (x := sane(s)) is not None]
        n = sum(s.n for s in scores)
        c = sum(s.correct for s in scores)
        parts.append(f"{len(result.tasks)} task{'s' if len(result.tasks) != 1 else ''} "
                     f"{pct(c / n) if n else '-'}")
    if result.reference is not None:
        parts.append(f"KL {kl_text(result.reference.kl_mean)}")
    return ", ".join(parts) or "no figures"


# ---- two or more sessions --------------------------------------------------------------------------------
@dataclass
class QualityRow:
    """One figure of the quality block: its value per session (as a number and as shown), its delta against the
    first session and the verdict (accuracies only; None: not judged), and the best session when called."""

    section: str  # "probe", "reference", "vs baseline", or "under load: WORKLOAD"
    where: str  # the task's context ("16K"), the cell's load ("c=4"), or ""
    label: str  # "retrieval accuracy", "perplexity", "KL vs reference, mean"
    unit: str  # "share", "perplexity", "nats", "tokens", "text"
    better: str  # "higher" | "lower" | "neutral"
    values: list[float | None]
    texts: list[str]
    deltas: list[float | None]  # per session (first: None): points for shares, percent for perplexity, else units
    verdicts: list[str | None]  # per session (first: None): better / worse / within noise; None when not judged
    best: int | None = None
    no_best: str = "-"  # why no best: "within noise", "no interval", "-"
    # what the row is: "perplexity", "task:NAME", "reference", "kl_mean", "kl_p99", "top1_agreement",
    # "first_divergence_mean", "baseline.kl_mean", "baseline.top1_agreement", "load:WORKLOAD:LOAD"
    key: str = ""
    short: str = ""  # the figure's name in a narrow table (the TUI): `retrieval`, `KL mean (nats)`

    def delta_text(self, i: int) -> str:
        d = self.deltas[i]
        if d is None:
            return "-"
        if self.unit == "share":
            txt = f"{d * 100:+.1f} pts"
        elif self.unit == "perplexity":
            txt = fmt_pct(d)
        elif self.unit == "nats":
            txt = f"{d:+.3g} nats"
        else:
            txt = f"{d:+.1f} {self.unit}"
        v = self.verdicts[i]
        return f"{txt} {v}" if v else f"{txt} (no interval)"


@dataclass
class QualityComparison:
    labels: list[str]
    results: list[QualityResult | None]  # quality.json per session (None: holds none)
    rows: list[QualityRow]
    notes: list[str] = field(default_factory=list)

    @property
    def missing(self) -> list[str]:
        """The sessions holding no quality results (quality.json), when some other does."""
        if not any(r is not None for r in self.results):
            return []
        return [lb for lb, r in zip(self.labels, self.results, strict=True) if r is None]

    def headline(self, i: int) -> str:
        """Session i's quality against the first, in the issue's style, each figure as `this session vs the
        first`: `quality: KL 0.031 vs 0.012, retrieval@16K 92% vs 100% (worse, beyond noise)`; "" when there is
        nothing to say."""
        a, b = self.results[0], self.results[i]
        lb, base = self.labels[i], self.labels[0]
        parts: list[str] = []
        if (a is None) != (b is None):
            parts.append(f"only {base if b is None else lb} holds quality results")
        elif a is not None and b is not None:
            rows = {r.key: r for r in self.rows}
            kl, direct, ppl = rows.get("kl_mean"), rows.get("baseline.kl_mean"), rows.get("perplexity")
            if kl is not None and kl.values[0] is not None and kl.values[i] is not None:
                parts.append(f"KL {kl.texts[i]} vs {kl.texts[0]}{_why(kl.verdicts[i], judged_only=True)}")
            elif direct is not None and direct.values[i] is not None:
                parts.append(f"KL vs {base} {direct.texts[i]}")
            if ppl is not None and ppl.values[0] is not None and ppl.values[i] is not None:
                parts.append(f"perplexity {ppl.texts[i]} vs {ppl.texts[0]}{_why(ppl.verdicts[i], judged_only=True)}")
        shares = [r for r in self.rows if r.key.startswith(("task:", "load:"))
                  and r.values[0] is not None and r.values[i] is not None]
        ranked = sorted(shares, key=lambda r: r.verdicts[i] in (None, "within noise"))  # beyond noise first
        for r in ranked[:HEADLINE_TASKS]:
            parts.append(f"{row_name(r)} {pct(r.values[i])} vs {pct(r.values[0])}{_why(r.verdicts[i])}")
        if len(ranked) > HEADLINE_TASKS:
            rest = ranked[HEADLINE_TASKS:]
            beyond = sum(1 for r in rest if r.verdicts[i] not in (None, "within noise"))
            parts.append(f"{len(rest)} more accuracies ({beyond} beyond noise)")
        return ("quality: " + ", ".join(parts)) if parts else ""

    def to_dict(self) -> dict[str, object]:
        sessions = [{"session": lb, "quality": result_dict(r) if r is not None else None}
                    for lb, r in zip(self.labels, self.results, strict=True)]
        rows = [{"key": r.key, "section": r.section, "where": r.where, "figure": r.label, "unit": r.unit, "better": r.better,
                 "values": r.values, "texts": r.texts,
                 "best": self.labels[r.best] if r.best is not None else None,
                 "deltas": [{"session": self.labels[i], "delta": r.deltas[i], "verdict": r.verdicts[i]}
                            for i in range(1, len(self.labels))]} for r in self.rows]
        return {"sessions": sessions, "missing": self.missing, "rows": rows,
                "definitions": {"accuracy": ACCURACY_DEFINITION, "judged": JUDGE_DEFINITION,
                                "perplexity": PERPLEXITY_DEFINITION, "kl": KL_DEFINITION, "not_judged": NOT_JUDGED},
                "notes": self.notes}

def _why(verdict: str | None, judged_only: bool = False) -> str:
    """` (worse, beyond noise)`, ` (within noise)`; "" for a figure not judged when `judged_only`."""
    if verdict is None:
        return "" if judged_only else " (within noise)"
    return " (within noise)" if verdict == "within noise" else f" ({verdict}, beyond noise)"


def row_name(r: QualityRow) -> str:
    """`retrieval@16K`, `perplexity`, `chat c=4 accuracy under load`."""
    if r.section == "probe" and r.unit == "share":
        return f"{r.label.removesuffix(' accuracy')}@{r.where}" if r.where else r.label.removesuffix(" accuracy")
    if r.section.startswith("under load"):
        return f"{r.section.removeprefix('under load: ')} {r.where} accuracy under load"
    return r.label


def _share_row(section: str, where: str, label: str, scores: Sequence[TaskScore | None]) -> QualityRow:
    """An accuracy row: deltas in points, each judged against the first session by the two-proportion test; the
    best session only when it beats the runner-up beyond noise. A score whose counts are not counts is left out."""
    scores = [sane(s) for s in scores]
    vals = [s.accuracy if s is not None else None for s in scores]
    base = scores[0]
    deltas: list[float | None] = [None]
    verdicts: list[str | None] = [None]
    for s in scores[1:]:
        if s is None or base is None:
            deltas.append(None)
            verdicts.append(None)
            continue
        deltas.append(s.accuracy - base.accuracy)
        verdicts.append(("better" if s.accuracy > base.accuracy else "worse") if accuracies_differ(base, s)
                        else "within noise")
    row = QualityRow(section, where, label, "share", "higher", vals,
                     [_score(s) if s is not None else "-" for s in scores], deltas, verdicts)
    present = sorted((i for i, s in enumerate(scores) if s is not None),
                     key=lambda i: -(scores[i].accuracy if scores[i] is not None else 0.0))  # type: ignore[union-attr]
    if len(present) >= 2:
        top, second = scores[present[0]], scores[present[1]]
        assert top is not None and second is not None
        if top.accuracy > second.accuracy and accuracies_differ(top, second):
            row.best = present[0]
        else:
            row.no_best = "within noise"
    return row


Interval = tuple[float, float] | None


def _plain_row(section: str, label: str, unit: str, better: str, vals: Sequence[float | None],
               texts: Sequence[str], relative: bool = False,
               intervals: Sequence[Interval] | None = None) -> QualityRow:
    """A figure judged by its 95% intervals when both sessions have one (apart: better or worse beyond noise, else
    within noise; `core.quality.intervals_apart`), else not judged; deltas in percent when `relative`."""
    base = vals[0]
    ivs: list[Interval] = list(intervals) if intervals is not None else [None] * len(vals)
    deltas: list[float | None] = [None]
    verdicts: list[str | None] = [None]
    for v, iv in zip(vals[1:], ivs[1:], strict=True):
        if v is None or base is None:
            deltas.append(None)
            verdicts.append(None)
            continue
        deltas.append(((v - base) / abs(base) * 100.0 if base else None) if relative else v - base)
        if ivs[0] is None or iv is None or better not in ("higher", "lower"):
            verdicts.append(None)
        elif intervals_apart(ivs[0], iv):
            verdicts.append("better" if (v > base) == (better == "higher") else "worse")
        else:
            verdicts.append("within noise")
    row = QualityRow(section, "", label, unit, better, list(vals), list(texts), deltas, verdicts)
    present = sorted((i for i, v in enumerate(vals) if v is not None),
                     key=lambda i: vals[i] or 0.0, reverse=better == "higher")
    if len(present) < 2 or better not in ("higher", "lower"):
        return row
    top, second = present[0], present[1]
    if ivs[top] is None or ivs[second] is None:
        row.no_best = "no interval"
    elif vals[top] != vals[second] and intervals_apart(ivs[top], ivs[second]):
        row.best = top
    else:
        row.no_best = "within noise"
    return row


def recorded_ci(obj: object, name: str) -> Interval:
    """A recorded 95% interval (`perplexity_ci`, `kl_ci`), None when absent or not two finite numbers."""
    v = getattr(obj, name, None) if obj is not None else None
    if not isinstance(v, (tuple, list)) or len(v) != 2:
        return None
    lo, hi = finite(v[0]), finite(v[1])
    return (lo, hi) if lo is not None and hi is not None and lo <= hi else None


def _direct(base: QualityResult | None, other: QualityResult | None) -> Divergence | None:
    """Session `other`'s greedy traces against the baseline's (the same prompts), when both kept them."""
    if base is None or other is None or not base.traces or not other.traces:
        return None
    try:
        return divergence(base.traces, other.traces)
    except (ValueError, ArithmeticError):  # no prompt in common; log-probabilities out of range (a foreign file)
        return None


def compare_quality(labels: Sequence[str], sessions: Sequence[Session],
                    cells: Sequence[tuple[str, str, Sequence[Sequence[CellView]]]] = ()) -> QualityComparison | None:
    """The sessions' quality side by side, None when none holds quality results (quality.json) and no common cell
    has quality under load (`cells`: each common cell as (workload, load, per session its repeats)). Raises the
    store's damaged-file ServescopeError for a quality.json that cannot be read."""
    results = [s.quality() for s in sessions]
    load_rows = _load_rows(cells)
    if not any(r is not None for r in results) and not load_rows:
        return None
    rows: list[QualityRow] = []
    notes: list[str] = []
    present = [r for r in results if r is not None]
    if present:
        ppl = [finite(r.perplexity) if r is not None else None for r in results]
        if any(v is not None for v in ppl):
            texts = [ppl_text(v) if v is not None else ("none" if r is None else "not measured")
                     for v, r in zip(ppl, results, strict=True)]
            rows.append(_plain_row("probe", "perplexity", "perplexity", "lower", ppl, texts, relative=True,
                                   intervals=[recorded_ci(r, "perplexity_ci") for r in results]))
            rows[-1].key, rows[-1].short = "perplexity", "perplexity"
        names = list(dict.fromkeys(k for r in present for k in r.tasks))
        for name in names:
            task, ctx = split_task(name)
            rows.append(_share_row("probe", ctx, f"{clean_text(task)} accuracy",
                                   [r.tasks.get(name) if r is not None else None for r in results]))
            rows[-1].key, rows[-1].short = f"task:{clean_text(name)}", clean_text(task)
        refs = [r.reference if r is not None else None for r in results]
        if any(d is not None for d in refs):
            names_ref = [clean_text(r.reference_session or "?") if r is not None and r.reference is not None else "-"
                         for r in results]
            rows.append(QualityRow("reference", "", "reference", "text", "neutral", [None] * len(results),
                                   names_ref, [None] * len(results), [None] * len(results), key="reference",
                                   short="reference"))
            for key, label, short, unit, better, fmt in (
                    ("kl_mean", "KL vs reference, mean (nats)", "KL mean (nats)", "nats", "lower", kl_text),
                    ("kl_p99", "KL vs reference, p99 (nats)", "KL p99 (nats)", "nats", "lower", kl_text),
                    ("top1_agreement", "top-1 agreement with the reference", "top-1 agreement", "share", "higher",
                     pct),
                    ("first_divergence_mean", "first divergence from the reference (token, mean)",
                     "1st divergence", "tokens", "higher", lambda v: fmt_num(finite(v)))):
                vals = [finite(getattr(d, key)) if d is not None else None for d in refs]
                ivs = [recorded_ci(d, "kl_ci") for d in refs] if key == "kl_mean" else None
                rows.append(_plain_row("reference", label, unit, better, vals, [fmt(v) for v in vals],
                                       intervals=ivs))
                rows[-1].key, rows[-1].short = key, short
            known = {n for n in names_ref if n != "-"}
            if len(known) > 1:
                notes.append("the sessions' divergence was measured against different references "
                             f"({', '.join(sorted(known))}): their KL figures do not compare")
        direct = [None, *[_direct(results[0], r) for r in results[1:]]]
        if any(d is not None for d in direct):
            base = labels[0]
            for key, label, short, unit, better, fmt in (
                    ("kl_mean", f"KL vs {base}'s greedy traces, mean (nats)", f"KL vs {base}", "nats", "lower",
                     kl_text),
                    ("top1_agreement", f"top-1 agreement with {base}", f"top-1 vs {base}", "share", "higher", pct)):
                vals = [finite(getattr(d, key)) if d is not None else None for d in direct]
                texts = ["(reference)", *[fmt(v) for v in vals[1:]]]
                rows.append(QualityRow("vs baseline", "", label, unit, better, vals, texts, [None] * len(vals),
                                       [None] * len(vals), key=f"baseline.{key}", short=short))
    rows += load_rows
    sims = [lb for lb, s in zip(labels, sessions, strict=True) if synthetic_note(s.info.target.url)]
    if sims:
        notes.append(f"{', '.join(sims)}: {SYNTHETIC_QUALITY}")
    return QualityComparison(list(labels), results, rows, notes)


def _load_rows(cells: Sequence[tuple[str, str, Sequence[Sequence[CellView]]]]) -> list[QualityRow]:
    """Accuracy under load in each common cell where some session had probe requests (its repeats' counts summed).
    `cells`: (workload, load, per session the cell's repeats)."""
    rows = []
    for workload, load, per_session in cells:
        scores: list[TaskScore | None] = []
        for views in per_session:
            qs = [lq for v in views if (lq := load_quality(v.summary)) is not None and lq.n]
            n = sum(q.n for q in qs)
            c = sum(q.correct for q in qs)
            lo, hi = wilson(c, n)
            scores.append(TaskScore(accuracy=c / n, n=n, correct=c, lo=lo, hi=hi) if n else None)
        if any(s is not None for s in scores):
            rows.append(_share_row(f"under load: {workload}", load, "accuracy under load", scores))
            rows[-1].key, rows[-1].short = f"load:{workload}:{load}", "accuracy"
    return rows
