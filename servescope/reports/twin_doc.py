"""The report's section on a session's capacity twin (servescope.sessions.twin reads it): how it was fitted, its
residuals and measured range, and its track record (predictions later run for real)."""

from __future__ import annotations

import math

from servescope.core.textsafe import clean_text
from servescope.reports.document import Block, Code, Column, Num, cols, heading, para, row, table
from servescope.sessions.twin import TwinRecord, as_list, as_table

__all__ = ["FIGURE_LABELS", "FIT_LABELS", "twin_blocks"]

FIGURE_LABELS = {"output_tok_s": "output tok/s", "ttft_ms.p50": "TTFT p50 ms", "tpot_ms.p50": "TPOT p50 ms"}
FIT_LABELS = {**FIGURE_LABELS, "ttft_ms.mean": "TTFT mean ms", "tpot_ms.mean": "TPOT mean ms"}
TRACK_COLUMNS = (*cols("when", "workload", "load", "settings", "figure"), Column("predicted", unit="the figure's"),
                 Column("measured", unit="the figure's"), Column("error", unit="%", stat="predicted / measured - 1"))


def _pct(v: object) -> str:
    return f"{v:+.1%}" if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def _num(v: object) -> str:
    return f"{v:,.4g}" if isinstance(v, (int, float)) and math.isfinite(v) else "-"


def twin_blocks(rec: TwinRecord, level: int = 2) -> list[Block]:
    """The report's section on the twin: how it was fitted and its track record."""
    f = rec.fit
    fitted = ", ".join(f"{k} {_num(rec.efficiency.get(str(k)))}" for k in as_list(f.get("fitted")))
    out: list[Block] = [
        heading(level, "Capacity twin"),
        para("A simulator fitted to this session (", Code("servescope twin fit"), "): the model's shape from "
             f"{clean_text(str(f.get('shape_from', '?')))}; the KV cache from {clean_text(str(f.get('kv_from', '?')))}; "
             f"limits from {clean_text(str(f.get('limits_from', '?')))}. Fitted: {fitted}.")]
    res = as_table(f.get("residual_rms_ln"))
    if res:
        out.append(para("Fit residual (root mean square of ln(twin / measured) over the fitted cells): "
                        + ", ".join(f"{FIT_LABELS.get(k, str(k))} {v:.1%}" for k, v in res.items()
                                    if isinstance(v, (int, float))) + "."))
    out += [para(f"Warning: {clean_text(str(w))}") for w in as_list(f.get("warnings"))]
    rng = as_table(f.get("range"))
    if rng:
        out.append(para("Measured range (predictions outside it are extrapolations): "
                        + ", ".join(f"{str(k).replace('_', ' ')} {_num(v[0])}-{_num(v[1])}" for k, v in rng.items()
                                    if isinstance(v, list) and len(v) == 2) + "."))
    if rec.confirmations:
        rows = []
        for r in rec.confirmations:
            load = f"c={r.get('concurrency')}" if r.get("concurrency") else f"{r.get('rate')} req/s"
            for k, label in FIGURE_LABELS.items():
                p, m, e = (as_table(r.get(x)).get(k) for x in ("predicted", "measured", "error"))
                rows.append(row(str(r.get("at", "")), clean_text(str(r.get("workload", ""))), load,
                                clean_text(str(r.get("settings", ""))), label, Num(_num(p)), Num(_num(m)),
                                Num(_pct(e))))
        out += [heading(level + 1, "Track record: predictions later run for real (", Code("whatif --confirm"), ")"),
                table(TRACK_COLUMNS, rows)]
        errs = sorted(abs(e) for r in rec.confirmations for e in as_table(r.get("error")).values()
                      if isinstance(e, (int, float)) and math.isfinite(e))
        if errs:
            out.append(para(f"Error = predicted / measured - 1; median |error| {errs[len(errs) // 2]:.1%}, largest "
                            f"{errs[-1]:.1%} over {len(errs)} figures."))
    return out
