"""`servescope gate --markdown`: the gate's verdict (servescope.sessions.gate.GateResult) as a document for a pull
request comment: the verdict line, the thresholds and how a figure fails, and every judged figure with its delta,
interval and verdict."""

from __future__ import annotations

from servescope.reports.document import (
    Block,
    Code,
    Column,
    Document,
    Note,
    Num,
    Strong,
    content,
    heading,
    para,
    right,
    row,
    table,
)
from servescope.reports.render_md import render_markdown
from servescope.sessions.gate import GateResult
from servescope.sessions.views import fmt_num, fmt_pct

__all__ = ["gate_document", "gate_markdown"]

COLUMNS = (Column("workload"), Column("load"), Column("figure"), right("baseline", "the figure's"),
           right("candidate", "the figure's"), right("Δ", "%"), right("95% interval", "%", "bootstrap"),
           Column("verdict"), right("threshold", "%"), Column("result"))


def gate_document(g: GateResult) -> Document:
    failed = bool(g.failures)
    head = "regression beyond noise" if failed else "no significant regression"
    thresholds = [x for i, t in enumerate(g.thresholds) for x in ((", " if i else ""), Code(t.text))]
    rows = []
    for r in sorted(g.rows, key=lambda r: (not r.failed, r.workload, r.threshold.figure)):
        j = r.judgement
        ci = "-" if j.ci is None else (f"{j.ci[0]:+.1f} .. {j.ci[1]:+.1f}%" if f"{j.ci[0]:+.1f}" != f"{j.ci[1]:+.1f}"
                                        else "no spread: deterministic server")
        rows.append(row(r.workload, r.load, Code(r.threshold.figure), Num(fmt_num(r.baseline)),
                        Num(fmt_num(r.candidate)), Num(fmt_pct(j.delta_pct)), Num(ci), j.verdict or "not judged",
                        Num(f"{r.threshold.limit_pct:+g}%"), Strong("FAIL") if r.failed else "ok"))
    blocks: list[Block] = [
        heading(3, "servescope gate: ", Strong("FAIL") if failed else "pass", f", {head}"),
        para("Candidate ", Strong(g.candidate), " against baseline ", Strong(g.baseline), "; thresholds ",
             content(*thresholds), ". A figure fails when its change is beyond its threshold and its 95% bootstrap "
             f"interval excludes 0 ({g.interval}; minimum effect {g.min_effect:g}%)."),
        Note(content(g.line())),
        table(COLUMNS, rows),
    ]
    if g.mismatches:
        blocks.append(para("Allowed to differ: " + "; ".join(g.mismatches)))
    if g.only_in:
        blocks.append(para("Not gated (in one session only): " + ", ".join(g.only_in)))
    return Document(f"servescope gate: {g.line()}", blocks)


def gate_markdown(g: GateResult) -> str:
    return render_markdown(gate_document(g))
