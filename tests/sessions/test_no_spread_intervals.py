"""A difference whose 95% interval has no width at the precision shown (a deterministic server gives the same
figure in every bootstrap replicate) reads as no spread wherever an interval is written: the gate's line and its
Markdown, not `[+42.3, +42.3]` (issue 44, item 5; the app and the compare page use interval_pct, tested beside it)."""

from __future__ import annotations

from servescope.reports.gate_doc import gate_markdown
from servescope.sessions.gate import GateResult, GateRow, Threshold
from servescope.sessions.stats import Judgement


def _row(ci: tuple[float, float]) -> GateRow:
    return GateRow("sharegpt", "c=4", Threshold("output_tok_s", -5.0), 100.0, 142.3,
                   Judgement(42.3, ci, "better"), failed=False)


def _result(row: GateRow) -> GateResult:
    return GateResult("base", "cand", [row.threshold], [row], min_effect=1.0, interval="request-level")


def test_a_zero_width_interval_reads_as_no_spread_in_the_gate_line_and_markdown() -> None:
    row = _row((42.3, 42.3))
    assert "no spread: deterministic server" in row.text() and "[+42.3, +42.3]" not in row.text()
    md = gate_markdown(_result(row))
    assert "no spread: deterministic server" in md and "+42.3 .. +42.3" not in md


def test_an_interval_with_width_is_still_written_as_one() -> None:
    row = _row((38.0, 46.5))
    assert "[+38.0, +46.5]" in row.text()
    assert "+38.0 .. +46.5%" in gate_markdown(_result(row))
