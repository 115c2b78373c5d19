"""Quality results as document blocks: a session's Quality section (the probe's figures, each with its unit and how
it was computed, its task table, its divergence from the reference), a workload's table of quality under load, and
the Quality block of a comparison (servescope.sessions.quality computes what they show).

`probe_table()` and `load_table()` give the same rows as plain text for the app's quality panes
(servescope.tui.widgets.quality), so the app and `servescope report` cannot disagree."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servescope.core.quality import Divergence, QualityResult
from servescope.core.results import finite
from servescope.core.textsafe import clean_text
from servescope.reports.document import (
    Block,
    Code,
    Column,
    Content,
    Num,
    Strong,
    bullets,
    cols,
    content,
    heading,
    para,
    plain_text,
    right,
    row,
    table,
)
from servescope.sessions.quality import (
    ACCURACY_DEFINITION,
    JUDGE_DEFINITION,
    KL_DEFINITION,
    NOT_JUDGED,
    PERPLEXITY_DEFINITION,
    QualityComparison,
    interval_text,
    kl_text,
    load_quality,
    load_text,
    pct,
    ppl_text,
    recorded_ci,
    row_name,
    sane,
    settings_text,
    split_task,
    synthetic_note,
)
from servescope.sessions.store import Session
from servescope.sessions.views import CellView, fmt_num

__all__ = ["ProbeTable", "load_quality_blocks", "load_table", "probe_table", "quality_blocks",
           "quality_comparison_blocks"]

Row = tuple[str, ...]


# ---- quality under load ------------------------------------------------------------------------------------
LOAD_COLUMNS = (Column("load"), right("accuracy under load", "share of questions"), right("95% interval", "share"),
                Column("per task"), right("KL vs idle, mean (nats)", "nats", "mean"),
                right("top-1 agreement vs idle", "share of positions"), right("failed probes", "requests"))


def load_table(views: Sequence[CellView]) -> list[Row]:
    """Each cell's quality under load (`--quality-share`) as plain cells: (load, accuracy, 95% interval, per task,
    KL vs idle, top-1 agreement, failed probes); [] when no cell had probe requests."""
    out: list[Row] = []
    for v in views:
        lq = load_quality(v.summary)
        if lq is None:
            continue
        s = lq.score
        per = ", ".join(f"{clean_text(k)} {t.correct}/{t.n}" for k, t in lq.tasks.items()) or "-"
        interval = interval_text(s.lo, s.hi) if lq.n else "-"
        kl = f"{kl_text(lq.kl_mean)} over {lq.positions} positions" if lq.positions else "-"
        out.append((clean_text(v.load), load_text(lq), interval, per, kl,
                    pct(lq.top1_agreement) if lq.positions else "-", str(lq.failed)))
    return out


def load_quality_blocks(views: Sequence[CellView]) -> list[Block]:
    """The report's short table of a workload's quality under load ([] when no cell had probe requests)."""
    rows = load_table(views)
    if not rows:
        return []
    return [para(Strong("Quality under load"), " (probe questions mixed into the cell's load with ",
                 Code("--quality-share"), ", not counted in its speed figures; accuracy = " + ACCURACY_DEFINITION
                 + "; KL and top-1 agreement against the same greedy prompts at idle before the first cell):"),
            table(LOAD_COLUMNS, [row(load, Num(acc), Num(iv), per, Num(kl), Num(top1), Num(failed))
                                 for load, acc, iv, per, kl, top1, failed in rows])]


# ---- one session: the report's Quality section ----------------------------------------------------------------
@dataclass(frozen=True)
class ProbeTable:
    """A session's probe (quality.json) as the Quality section shows it, in plain cells: its settings, its figures
    (figure, value with its unit, how it was computed), its tasks (task, context, accuracy, n, 95% interval) and
    the notes under them."""

    settings: str
    figures: tuple[tuple[str, str, str], ...]
    tasks: tuple[Row, ...]
    accuracy: str  # what accuracy is ("" without tasks)
    reference: Content  # no reference given / no divergence measured ("" when a reference was)
    events: tuple[str, ...]  # the probe's own notes

    @property
    def notes(self) -> tuple[str, ...]:
        """The notes under the tables as plain lines: what accuracy is, the reference, the probe's own notes."""
        out = [n for n in (self.accuracy, plain_text(self.reference)) if n]
        if self.events:
            out += ["Probe notes:", *(f"· {e}" for e in self.events)]
        return tuple(out)


def _divergence_rows(r: Divergence, ref: str | None) -> list[tuple[str, str, str]]:
    ci = recorded_ci(r, "kl_ci")
    kl_ci = f" (95% interval {kl_text(ci[0])}-{kl_text(ci[1])} over prompts)" if ci is not None else ""
    return [
        ("reference session", clean_text(ref or "") or "?",
         "the session whose greedy traces (same prompts) are the reference"),
        ("KL mean", f"{kl_text(r.kl_mean)} nats{kl_ci}", f"mean over the compared positions of {KL_DEFINITION}"),
        ("KL p99", f"{kl_text(r.kl_p99)} nats", "99th percentile of that per-position KL"),
        ("top-1 agreement", pct(r.top1_agreement),
         "share of compared positions where this run's most likely token is the reference's"),
        ("first divergence", f"token {fmt_num(finite(r.first_divergence_mean))} (mean)",
         "index of the first generated token where the greedy outputs differ (the output's length when they never "
         "do), mean over prompts"),
        ("positions compared", f"{r.positions:,} of {r.prompts} prompts",
         f"positions where both generations share their context ({clean_text(r.method)})"),
    ]


def probe_table(session: Session, result: QualityResult) -> ProbeTable:
    figures: list[tuple[str, str, str]] = []
    if result.perplexity is not None:
        ci = recorded_ci(result, "perplexity_ci")
        within = f" (95% interval {ppl_text(ci[0])}-{ppl_text(ci[1])})" if ci is not None else ""
        figures.append(("perplexity", f"{ppl_text(result.perplexity)}{within} over {result.perplexity_tokens:,} tokens",
                        PERPLEXITY_DEFINITION))
    else:
        figures.append(("perplexity", "not measured", clean_text(result.perplexity_note) or "not run"))
    r = result.reference
    if r is not None:
        figures += _divergence_rows(r, result.reference_session)
    tasks: list[Row] = []
    for name, raw in result.tasks.items():
        task, ctx = split_task(name)
        s = sane(raw)
        figs = (pct(s.accuracy), str(s.n), interval_text(s.lo, s.hi)) if s is not None else ("-", str(raw.n), "-")
        tasks.append((clean_text(task), f"{clean_text(ctx)} tokens" if ctx else "-", *figs))
    accuracy = (f"Accuracy: {ACCURACY_DEFINITION}; the context is the prompt's length (K = 1,024 tokens)."
                if result.tasks else "")
    reference: Content = ()
    if r is None:
        reference = (content(f"No reference was given: this session's {len(result.traces)} greedy traces can serve "
                             "as one (", Code("servescope quality --reference"), " with this session).")
                     if result.traces else
                     content("No divergence was measured (the server returned no log-probabilities, or it was not "
                             "run)."))
    events = tuple(e for e in (clean_text(e.text) for e in session.info.events if e.kind == "quality") if e)
    return ProbeTable(settings_text(session.info.quality), tuple(figures), tuple(tasks), accuracy, reference, events)


TASK_COLUMNS = (Column("task"), Column("context"), right("accuracy", "share of questions"), right("n", "questions"),
                right("95% interval (Wilson)", "share"))


def quality_blocks(session: Session, result: QualityResult, level: int = 2) -> list[Block]:
    """The report's Quality section: perplexity, the task table, divergence from the reference: every figure
    with its unit and how it was computed."""
    p = probe_table(session, result)
    out: list[Block] = [heading(level, "Quality")]
    if synthetic := synthetic_note(session.info.target.url):
        out.append(para(Strong(synthetic[0].upper() + synthetic[1:] + ".")))
    out.append(para(f"Probe settings: {p.settings}."))
    out.append(table(cols("figure", "value", "how it was computed"), [row(f, v, how) for f, v, how in p.figures]))
    if p.tasks:
        out += [heading(level + 1, "Task accuracy"),
                table(TASK_COLUMNS, [row(task, ctx, Num(acc), Num(n), Num(iv)) for task, ctx, acc, n, iv in p.tasks]),
                para(p.accuracy)]
    if p.reference:
        out.append(para(p.reference))
    if p.events:
        out += [para("Probe notes:"), bullets(p.events)]
    return out


# ---- two or more sessions -------------------------------------------------------------------------------------
def _definitions(q: QualityComparison) -> str:
    """How the block's figures were computed and judged, for the figures it holds."""
    keys = {r.key.partition(":")[0] for r in q.rows}
    parts = [f"Accuracy: {ACCURACY_DEFINITION}; {JUDGE_DEFINITION}."]
    if "load" in keys:
        parts.append("Accuracy under load: the probe questions mixed into that cell's load (--quality-share).")
    if "perplexity" in keys:
        parts.append(f"Perplexity: {PERPLEXITY_DEFINITION}.")
    if keys & {"kl_mean", "baseline.kl_mean"}:
        parts.append(f"KL: {KL_DEFINITION}; lower is closer (against the baseline's traces: the baseline's "
                     "greedy generations of the same prompts are the reference).")
    if keys & {"perplexity", "kl_mean", "kl_p99", "top1_agreement", "first_divergence_mean"}:
        parts.append(f"Values are each session's; {NOT_JUDGED}.")
    return " ".join(parts)


def quality_comparison_blocks(q: QualityComparison, level: int) -> list[Block]:
    """The Quality block of a comparison: each figure per session, its delta against the first session and the
    verdict, the best session when it is beyond noise; how they were computed; who holds no quality results."""
    out: list[Block] = [heading(level, "Quality")]
    labels = q.labels
    if q.rows:
        columns = (Column("figure"), *(right(lb) for lb in labels), *(right(f"Δ {lb}") for lb in labels[1:]),
                   Column("best"))
        rows = []
        for r in q.rows:
            vals = [Strong(t) if i == r.best else t for i, t in enumerate(r.texts)]
            best = labels[r.best] if r.best is not None else r.no_best
            rows.append(row(row_name(r), *vals, *(r.delta_text(i) for i in range(1, len(labels))), best))
        out += [table(columns, rows), para(_definitions(q))]
    if q.missing or q.notes:
        out.append(bullets([*(content(lb, " holds no quality results: run ", Code("servescope quality --save"),
                                      " with its session directory against its server to add them.")
                              for lb in q.missing), *q.notes]))
    return out
