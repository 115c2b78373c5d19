"""How a cell was measured, in words every view shares (the CLI's table, the report, the app's Run and Results
panes): the window its figures are over (steady or whole), --precision's outcome (`imprecise` with the precision
reached), the saturation mark and --probe-rate's interference probes. The figures themselves are made in the engine
(engine/measure.py, engine/saturation.py, engine/interference.py); this module only says them."""

from __future__ import annotations

from servescope.core.results import CellPrecision, CellProbes, CellResult, CellWindow
from servescope.core.textsafe import clean_text

__all__ = ["MARKS", "marks", "measure_lines", "precision_short", "precision_text", "probes_short", "probes_text", "saturation_text",
           "window_label", "window_text"]


def _f(v: float | None, nd: int = 1) -> str:
    return "-" if v is None else f"{v:,.{nd}f}"


def window_label(s: CellResult) -> str:
    """`steady` or `whole`: the window the cell's figures are over ("whole" for a cell written before windows)."""
    return s.window.kind if s.window is not None else "whole"


def window_text(w: CellWindow | None) -> str:
    """`steady window, 2.5-19.0 s of the cell: 41 of 48 requests (7 in the ramp, 0 in the drain left out)`, or
    `whole cell (why)`."""
    if w is None:
        return "whole cell (measured before steady windows)"
    if w.kind != "steady":
        return f"whole cell ({clean_text(w.basis)})" if w.basis else "whole cell"
    total = w.requests + w.ramp_requests + w.drain_requests
    return (f"steady window, {_f(w.start_s)}-{_f(w.end_s)} s of the cell: {w.requests:,} of {total:,} requests "
            f"({w.ramp_requests:,} in the ramp, {w.drain_requests:,} in the drain left out)")


def _pct(v: float | None) -> str:
    return "no interval" if v is None else f"+-{v * 100:.1f}%"


def precision_text(p: CellPrecision) -> str:
    """`precise, +-1.8% on output_tok_s (target 2%) over 312 requests`, or `imprecise, +-3.1% ...: the ceiling
    (2,000 requests) came first`."""
    head = "imprecise" if p.imprecise else "precise"
    tail = f": the ceiling ({clean_text(p.ceiling)}) came first" if p.imprecise and p.ceiling else ""
    return (f"{head}, {_pct(p.reached)} on {clean_text(p.figure) or 'its figures'} (target "
            f"{(p.target or 0) * 100:g}%) over {p.requests:,} requests{tail}")


def precision_short(p: CellPrecision | None) -> str:
    """`+-1.8%` or `imprecise +-3.1%` (the reached precision, for a table's cell); "" without --precision."""
    if p is None:
        return ""
    return ("imprecise " if p.imprecise else "") + _pct(p.reached)


def saturation_text(s: CellResult) -> str:
    """The saturation mark's sentence (`saturated: ...`); "" for a cell not saturated or not judged."""
    sat = s.saturation
    return clean_text(sat.reason) if sat is not None and sat.saturated else ""


def probes_text(p: CellProbes) -> str:
    """--probe-rate's probes in one line."""
    failed = f", {p.failed} failed" if p.failed else ""
    return (f"interference probes ({p.rate or 0:g}/s, {p.input_tokens} in / {p.output_tokens} out): {p.sent} sent"
            f"{failed}; TTFT p50 {_f(p.ttft_ms.p50, 2)} ms, p90 {_f(p.ttft_ms.p90, 2)} ms; E2E p50 "
            f"{_f(p.e2e_ms.p50, 2)} ms, p90 {_f(p.e2e_ms.p90, 2)} ms")


def probes_short(p: CellProbes | None) -> str:
    """`probes TTFT p50 41 ms, E2E p50 310 ms` (for a pane's line); "" without probes."""
    if p is None:
        return ""
    return f"probes TTFT p50 {_f(p.ttft_ms.p50, 0)} ms, E2E p50 {_f(p.e2e_ms.p50, 0)} ms"


MARKS = ("imprecise", "saturated")


def marks(s: CellResult) -> list[str]:
    """The words a cell's status gains: `imprecise` (its ceiling came before its --precision target), `saturated`."""
    out = []
    if s.precision is not None and s.precision.imprecise:
        out.append("imprecise")
    if s.saturation is not None and s.saturation.saturated:
        out.append("saturated")
    return out


def measure_lines(s: CellResult, before_windows: bool = True) -> list[tuple[str, str]]:
    """(level, line) for each thing said about how the cell was measured: its window, its precision (a `warning`
    when imprecise), its saturation mark (a `warning`), its probes; what the app's Run log and Results pane show.
    `before_windows` False: nothing is said of the window of a cell that has none (measured before windows)."""
    out = [("info", window_text(s.window))] if s.window is not None or before_windows else []
    if s.precision is not None:
        out.append(("warning" if s.precision.imprecise else "info", precision_text(s.precision)))
    if sat := saturation_text(s):
        out.append(("warning", sat))
    if s.probes is not None:
        out.append(("info", probes_text(s.probes)))
    return out
