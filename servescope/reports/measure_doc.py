"""A workload's "How each cell was measured" table in a report: the window its figures are over (steady or whole),
--precision's outcome (`imprecise` with the precision reached), the saturation mark, --probe-rate's interference
probes, and the loads the sweep skipped with why. The words are sessions/measurement.py's, as the CLI and the app
say them; report_sections.workload_blocks places the table under the results."""

from __future__ import annotations

from collections.abc import Sequence

from servescope.core.results import CellResult, Dist
from servescope.core.textsafe import clean_text
from servescope.reports.document import (
    Block,
    Code,
    Column,
    Content,
    Num,
    Strong,
    content,
    para,
    right,
    row,
    table,
)
from servescope.sessions.measurement import marks, precision_short, window_label
from servescope.sessions.views import CellView, fmt_num

__all__ = ["mark_parts", "measured_anyhow", "measurement_blocks"]


def measured_anyhow(s: CellResult) -> bool:
    """The cell carries something the table says: a window, --precision's outcome, a saturation mark, probes."""
    return s.window is not None or s.precision is not None or s.saturation is not None or s.probes is not None


def _pair(d: Dist) -> Num:
    return Num(f"{fmt_num(d.p50)} / {fmt_num(d.p90)}")


def _window_cell(s: CellResult) -> Content:
    w = s.window
    if w is None:
        return content("whole (before windows)")
    if w.kind != "steady":
        return content("whole")
    total = w.requests + w.ramp_requests + w.drain_requests
    return content(f"steady, {w.start_s or 0:.1f}-{w.end_s or 0:.1f} s: {w.requests:,} of {total:,} requests")


def _precision_cell(s: CellResult) -> Content:
    pr = s.precision
    if pr is None:
        return content("-")
    of = f" (target {(pr.target or 0) * 100:g}%, {pr.requests:,} requests)"
    if pr.imprecise:
        return content(Strong("imprecise"), " ", precision_short(pr).removeprefix("imprecise "), of)
    return content(Num(precision_short(pr)), of)


def mark_parts(s: CellResult) -> Content:
    """What a results table's load cell adds after the load: ` **imprecise**`, ` **saturated**`."""
    return tuple(p for m in marks(s) for p in (" ", Strong(m)))


def measurement_blocks(views: Sequence[CellView], skipped: Sequence[CellView]) -> list[Block]:
    """The table (one row per cell of the workload, skipped loads included with their reason) and what it means;
    [] when no cell of it was measured with a window, a precision, a saturation mark or probes (an older session)."""
    ran = [v for v in views if v.has_summary]
    if not any(measured_anyhow(v.summary) for v in ran):
        return []
    precision = any(v.summary.precision is not None for v in ran)
    probes = any(v.summary.probes is not None for v in ran)
    columns: list[Column] = [Column("load"), Column("window", unit="s of the cell, requests"),
                             *([right("precision reached", "+- share of the figure, 95%")] if precision else []),
                             Column("saturated"),
                             *([right("probe TTFT ms p50 / p90", "ms", "p50 / p90"),
                                right("probe E2E ms p50 / p90", "ms", "p50 / p90")] if probes else [])]
    rows = []
    for v in sorted([*ran, *skipped], key=lambda v: v.index):
        if not v.has_summary:  # a load the sweep did not run (--stop-after-saturation, or skipped by the user)
            why = clean_text(v.reason) or "skipped"
            rows.append(row(content(v.load, " ", Strong(v.status or "skipped")), why,
                            *([None] if precision else []), None, *([None, None] if probes else [])))
            continue
        s = v.summary
        sat = s.saturation
        sat_cell = (content(Strong("saturated"), ": ", clean_text(sat.reason).removeprefix("saturated: "))
                    if sat is not None and sat.saturated else content("no" if sat is not None else "-"))
        prec = _precision_cell(s)
        p = s.probes
        rows.append(row(v.load, _window_cell(s), *([prec] if precision else []), sat_cell,
                        *([_pair(p.ttft_ms), _pair(p.e2e_ms)] if probes and p is not None else
                          [None, None] if probes else [])))
    kinds = {window_label(v.summary) for v in ran}
    said = ("steady window (sent while the load was at its target: after the ramp, before the drain)"
            if kinds == {"steady"} else "whole cell" if kinds == {"whole"} else "window the table names")
    out: list[Block] = [
        para(Strong("How each cell was measured."), f" The results above are over each cell's {said}; the request "
             "counts are always the whole cell's, whose figures the session keeps beside the window's (",
             Code("whole"), " in ", Code("--json"), "). A cell is ", Strong("saturated"), " when its server's queue "
             "stood or grew through its steady window and its throughput no longer rose with the load; ",
             *((Strong("imprecise"), " when its ceiling (", Code("-n"), "/", Code("--duration"), ") came before its ",
                Code("--precision"), " target; ") if precision else ()),
             *(("the probes are small requests sent on their own schedule beside the load (", Code("--probe-rate"),
                "): what the load does to a newcomer; ") if probes else ()),
             "a load the sweep skipped says why (docs/measuring.md)."),
        table(columns, rows),
    ]
    return out
