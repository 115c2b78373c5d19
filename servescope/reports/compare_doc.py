"""A comparison (servescope.sessions.compare.Comparison) as document blocks: the sessions, the configuration that
differs, how sessions measured by other tools were measured (the comparability table), what was measured
differently, the headline, the quality block, one delta table per workload (each delta
with its interval and verdict), the cells only some sessions have, capacity, knee and peak per session, the cost of
thinking mode, the cost at capacity of a GPU against an API, and the notes.

`comparison_document()` is the compare page (`servescope compare`); `comparison_blocks()` the same at a lower
level, for a report that embeds it (`servescope report --compare`)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from servescope.reports.document import (
    Block,
    Code,
    Column,
    Content,
    Document,
    FigureGroup,
    Num,
    Strong,
    bullets,
    cols,
    content,
    heading,
    para,
    right,
    row,
    table,
)
from servescope.reports.quality_doc import quality_comparison_blocks
from servescope.reports.render_md import render_markdown
from servescope.reports.serving_doc import speculation_compare_blocks
from servescope.sessions.answers import CostAtCapacity, ThinkingCost, WorkloadAnswers
from servescope.sessions.comparability import Comparability
from servescope.sessions.compare import (
    COST_METRIC,
    ENERGY_METRIC,
    RATE_LIMITED_METRIC,
    ComparedCell,
    Comparison,
    MetricSpec,
    delta_text,
)
from servescope.sessions.stats import interval_label
from servescope.sessions.views import fmt_num, fmt_pct, slo_text

__all__ = ["answers_blocks", "comparability_blocks", "comparison_blocks", "comparison_document", "comparison_markdown",
           "config_blocks", "cost_blocks", "headline", "thinking_blocks"]


# ---- the headline -------------------------------------------------------------------------------------------
def headline(comp: Comparison) -> list[str]:
    """'FP8 vs GPTQ-Int4: output tok/s -12.0%, TPOT p50 +9.1% (median over 4 common cells)', and when the
    sessions hold quality results '...; quality: KL 0.031 vs 0.012, retrieval@16K 92% vs 100% (worse, beyond
    noise)' (each quality figure as this session's vs the first's)."""
    lines = []
    base = comp.labels[0]
    keys = ("output_tok_s", "per_user_tok_s.mean", "ttft_ms.p50", "tpot_ms.p50", "e2e_ms.p50", COST_METRIC.key, ENERGY_METRIC.key)
    specs = {m.key: m for m in comp.metrics}
    for i, lb in enumerate(comp.labels[1:], start=1):
        parts = []
        for k in keys:
            if k not in specs:
                continue
            ds = [d for c in comp.cells if (d := c.deltas[k][i]) is not None]
            if ds:
                parts.append(f"{specs[k].label} {fmt_pct(statistics.median(ds))}")
        speed = ", ".join(parts) + f" (median over {len(comp.cells)} common cells)" if parts else ""
        if speed and comp.comparability is not None and (unjudged := _unjudged(comp)):
            speed += f"; measured differently, so not judged: {unjudged}"
        quality = comp.quality.headline(i) if comp.quality is not None else ""
        if quality and not speed:
            speed = "no speed cells in common" if not comp.cells else ""
        if speed or quality:
            lines.append(f"{lb} vs {base}: " + "; ".join(x for x in (speed, quality) if x))
    return lines


def _unjudged(comp: Comparison) -> str:
    """The compared figures a differing definition leaves unjudged, by their labels, each with the definitions that
    differ: `ITL p99 ms (ITL definition)` ("" when none)."""
    c = comp.comparability
    if c is None:
        return ""
    return ", ".join(f"{m.label} ({c.why(m.key)})" for m in comp.metrics if c.why(m.key))


# ---- sections -----------------------------------------------------------------------------------------------
def comparability_blocks(comp: Comparison, level: int) -> list[Block]:
    """How the sessions were measured, when another tool measured some of them: each session's tool, where its
    figures come from, the facts that differ and the figures each difference changes ([] when all were measured
    alike by servescope)."""
    c: Comparability | None = comp.comparability
    if c is None or not c.shown:
        return []
    labels = comp.labels
    names = {m.key: m.label for m in comp.metrics}
    rows = [row("figures from", *("per-request records (servescope's formulas)" if r else "the tool's aggregates"
                                  for r in c.rebuilt), "-")]
    for r in c.rows:
        figs = ", ".join(names.get(f, f) for f in r.figures)
        rows.append(row(r.fact.label, *(v or "not stated" for v in r.values),
                        figs or r.fact.note or ("nothing" if not r.fact.figures and not r.fact.percentiles else "-")))
    out: list[Block] = [
        heading(level, "How the sessions were measured"),
        table((Column("measured with"), *cols(*labels), Column("changes the meaning of")), rows),
    ]
    unjudged = _unjudged(comp)
    if unjudged:
        out.append(para(Strong("Measured differently:"), f" these figures are shown but not judged (no verdict, no "
                        f"winner): {unjudged}."))
    else:
        out.append(para("Every definition the compared figures depend on agrees: each figure is judged."))
    out.append(para("Where records were rebuilt, every figure is computed with servescope's formulas from the tool's "
                    "own timestamps; a definition still differs where the tool stamped another event or kept no "
                    "per-chunk times (docs/imports.md)."))
    return out



def config_blocks(comp: Comparison, level: int) -> list[Block]:
    """The server configuration that differs between the sessions (it heads every comparison)."""
    out: list[Block] = [heading(level, "Configuration diff")]
    if not comp.config:
        return out + [para(comp.config_note or "The recorded configuration is the same.")]
    out.append(table((Column(""), *cols(*comp.labels)), [row(w, *v) for w, v in comp.config], empty=""))
    if comp.config_note:
        out.append(para(comp.config_note))
    return out


def _value_text(m: MetricSpec, v: float | None) -> str:
    """A compared figure as the tables show it; a count of requests as a whole number (a median over an even number
    of repeats may end in .5)."""
    if m.key == RATE_LIMITED_METRIC.key and v is not None:
        return f"{v:g}"
    return fmt_num(v)


def _speed_blocks(comp: Comparison, level: int) -> list[Block]:
    """The deltas' definition, one table per workload, the client-bound cells and the cells of some sessions."""
    labels = comp.labels
    rate_limited = any(m.key == RATE_LIMITED_METRIC.key for m in comp.metrics)
    out: list[Block] = [para(
        "Deltas are against ", Strong(labels[0]), ", each with its 95% bootstrap interval ", Code("[low, high]"),
        f" (in percent; {comp.interval or interval_label(1)}, {comp.resamples} resamples) and a verdict: better or "
        "worse beyond noise, or within noise (the interval includes 0, or the change is under "
        f"{comp.min_effect:g}%). The best value of a row is in bold only when it beats the runner-up beyond noise "
        "(lower is better for latencies, higher for tok/s and goodput; token counts are not judged). "
        + ("Requests rate-limited (HTTP 429): the cell's requests the server refused by its rate limit (a count, the "
           "median over repeats; counted apart from the failed ones and not judged). " if rate_limited else "")
        + f"SLOs: {slo_text(comp.slos)} ({comp.slos_source}).")]
    columns = (Column("load"), Column("metric"), *(right(lb) for lb in labels),
               *(right(f"Δ {lb}", "%", "95% interval") for lb in labels[1:]), Column("best"))
    for w in dict.fromkeys(c.workload for c in comp.cells):
        rows = []
        for c in (c for c in comp.cells if c.workload == w):
            for j, m in enumerate(comp.metrics):
                wi = c.winners[m.key]
                vals: list[Content] = [(Strong(_value_text(m, v)),) if i == wi else (Num(_value_text(m, v)),)
                                       for i, v in enumerate(c.values[m.key])]
                deltas = [Num(delta_text(c, m, i)) for i in range(1, len(labels))]  # numbers and fixed words only
                load = content(c.load, _bound_mark(c, labels)) if j == 0 else ()
                best = labels[wi] if wi is not None else c.no_winner.get(m.key, "-")
                rows.append(row(load, m.label, *vals, *deltas, best))
        out += [heading(level + 1, w), table(columns, rows, empty="")]
    bound = [(c, [labels[i] for i in c.bound_in]) for c in comp.cells if c.bound_in]
    if bound:
        out += [para(Strong("Client bound"), " (marked ⚠ above): in these cells the load generator, not the server, "
                     "limited the figures of the sessions named; no winner is called from them:"),
                bullets(f"{c.workload} {c.load}: {', '.join(who)}" for c, who in bound)]
    if comp.only_in:
        rows = [row(w, ld, ", ".join(have), ", ".join(lb for lb in labels if lb not in have))
                for w, ld, have in comp.only_in]
        out += [heading(level + 1, "Cells present in only some sessions"),
                table(cols("workload", "load", "present in", "missing from"), rows)]
    return out


def _bound_mark(c: ComparedCell, labels: Sequence[str]) -> str:
    return f" ⚠ client bound: {', '.join(labels[i] for i in c.bound_in)}" if c.bound_in else ""


def answers_blocks(answers: Sequence[WorkloadAnswers], thinking: Sequence[ThinkingCost], level: int,
                   slos: Mapping[str, float]) -> list[Block]:
    """Capacity, knee and peak of each session's workloads, what they leave out, and the cost of thinking mode."""
    rows = [row(a.session, a.workload, a.capacity.text(), a.knee.text(),
                content(Num(fmt_num(a.peak_output_tok_s)), f" at {a.peak_load}") if a.peak_output_tok_s is not None
                else Num("-"))
            for a in answers]
    out: list[Block] = [
        heading(level, "Capacity, knee and peak"),
        table((Column("session"), Column("workload"), Column("capacity at the SLOs", stat="highest load meeting them"),
               Column("knee", unit="users"), Column("peak output tok/s", unit="tok/s", stat="highest aggregate")), rows),
        para(f"Capacity: the highest load whose cell meets the SLOs ({slo_text(slos)}). Knee: the concurrency that "
             "maximises aggregate x per-user tok/s; past it, extra aggregate throughput costs more per-user speed than "
             "it gains. Only completed cells count"
             + (", client-bound ones included (--include-bound)." if any(a.include_bound for a in answers) else
                (", and not those whose client was bound." if any(a.bound for a in answers) else ".")))]
    gaps = [f"{a.session}, {a.workload}: {a.left_out_text()}" for a in answers if a.left_out or a.bound]
    if gaps:
        out.append(bullets(gaps))
    return out + thinking_blocks(thinking, level)


THINKING_COLUMNS = (Column("session"), Column("thinking on"), Column("thinking off"),
                    right("E2E p50 on/off", "ratio", "p50"), right("TTFO p50 on/off", "ratio", "p50"),
                    Column("capacity on / off"), Column("visible output tokens on / off", "left", "tokens", "mean"),
                    right("reasoning tokens", "tokens", "mean"))


def thinking_blocks(thinking: Sequence[ThinkingCost], level: int) -> list[Block]:
    if not thinking:
        return []
    rows = []
    for t in thinking:
        e2e = ", ".join(f"{ld}: {r:.2f}x" for ld, r in zip(t.loads, t.e2e_ratio, strict=True) if r is not None) or "-"
        tt = ", ".join(f"{ld}: {r:.2f}x" for ld, r in zip(t.loads, t.ttfo_ratio, strict=True) if r is not None) or "-"
        cr = t.capacity_ratio
        cap = f"{t.capacity_on.text()} / {t.capacity_off.text()}" + (f" ({cr:.2f}x)" if cr is not None else "")
        rows.append(row(t.session, t.thinking_on, t.thinking_off, e2e, tt, cap,
                        Num(f"{fmt_num(t.visible_output_on)} / {fmt_num(t.visible_output_off)}"),
                        Num(fmt_num(t.reasoning_tokens_on))))
    return [heading(level, "Thinking mode cost"), table(THINKING_COLUMNS, rows)]


def cost_blocks(costs: Sequence[CostAtCapacity], level: int, slos: Mapping[str, float]) -> list[Block]:
    """The cost-at-capacity sentences, one per workload and pair of sessions ([] when none)."""
    if not costs:
        return []
    return [heading(level, "Cost at capacity: GPU vs API"), bullets(f"{c.workload}: {c.text(slos)}" for c in costs),
            para("Cost per 1M output tokens: on the GPU, its hourly price over the cell's measured output tok/s (plus "
                 "energy where measured); on the API, its list price over the cell's measured input and output tokens "
                 "(docs/hosted.md).")]


# ---- the whole comparison --------------------------------------------------------------------------------------
def comparison_blocks(comp: Comparison, level: int = 2, figures: Sequence[str] = ()) -> list[Block]:
    """The comparison under a heading of `level`; `figures` (the keys of the comparison's figures) in a section of
    their own after the delta tables."""
    labels = comp.labels
    out: list[Block] = [heading(level, f"Comparison: {' vs '.join(labels)}")]
    c = comp.comparability
    if c is not None and c.shown:  # sessions of other tools: each session's tool named
        out.append(table(cols("label", "session", "tool", "model", "target", "tags"),
                         [row(s.label, s.path, tool, s.model, s.target, ", ".join(f"{k}={v}" for k, v in s.tags.items()))
                          for s, tool in zip(comp.sessions, c.tools, strict=True)]))
    else:
        out.append(table(cols("label", "session", "model", "target", "tags"),
                         [row(s.label, s.path, s.model, s.target, ", ".join(f"{k}={v}" for k, v in s.tags.items()))
                          for s in comp.sessions]))
    out += config_blocks(comp, level + 1)
    out += comparability_blocks(comp, level + 1)
    if comp.mismatches:
        out += [para(Strong("Not comparable: no winner is called."), " The sessions differ in what was measured:"),
                bullets(comp.mismatches)]
    if lines := headline(comp):
        out.append(bullets(lines))
    if comp.quality is not None:
        out += quality_comparison_blocks(comp.quality, level + 1)
    if comp.no_common:
        out += [heading(level + 1, "Speed"), para(comp.no_common)]
    else:
        out += _speed_blocks(comp, level)
        out += speculation_compare_blocks(labels, [(c.workload, c.cells) for c in comp.cells], level + 1)
    if figures:
        out.append(FigureGroup(level + 1, "Figures", tuple(figures)))
    if comp.answers or comp.thinking or not comp.no_common:
        out += answers_blocks(comp.answers, comp.thinking, level + 1, comp.slos)
    out += cost_blocks(comp.costs, level + 1, comp.slos)
    if comp.notes:
        out.append(bullets(comp.notes))
    return out


def comparison_document(comp: Comparison, figures: Sequence[str] = ()) -> Document:
    """The compare page (`servescope compare`)."""
    return Document(f"servescope comparison: {' vs '.join(comp.labels)}", comparison_blocks(comp, 1, figures))


def comparison_markdown(comp: Comparison, level: int = 1) -> str:
    """The comparison as Markdown (with its Mermaid-free tables: a comparison draws no chart)."""
    return render_markdown(Document("", comparison_blocks(comp, level)))
