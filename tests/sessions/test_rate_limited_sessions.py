"""Rate-limited requests (HTTP 429) in the report's cell table and in compare, on sessions written by the real
writer: the table's "ok / failed" column becomes "ok / failed / 429" (with its meaning under the table) only when
some cell of the workload got a 429, and compare gains a "requests rate-limited (HTTP 429)" row only when some
compared cell did; sessions without 429s read exactly as before."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servescope.core.metrics import records_frame, summarize
from servescope.core.records import RequestRecord
from servescope.core.results import CellResult
from servescope.reports.compare_doc import comparison_markdown
from servescope.reports.report import render_report
from servescope.sessions.compare import RATE_LIMITED_METRIC, compare_sessions
from servescope.sessions.store import load_session
from servescope.workloads.spec import PRESETS
from tests.sessions.conftest import CellSpec, _records
from tests.sessions.synth import plan, sweep_session

SLOS = {"ttft_ms": 600.0}


def _session(base: Path, name: str, limited: dict[int, int]) -> Any:
    """A sharegpt session at c=1, 4 and 16 (20 requests each); `limited` {concurrency: n}: the first n requests of
    that cell were answered HTTP 429 (Retry-After 2 s) rather than served."""
    path = base / f"20261201-120000-{name}"
    cells = [CellSpec("sharegpt", c) for c in (1, 4, 16)]
    planned = plan([(PRESETS[c.workload], c.concurrency, c.requests) for c in cells])
    w, ran = sweep_session(path, name, planned, model=f"model-{name}", max_model_len=32768,
                           tokenizer="server /tokenize", slos=SLOS)
    for cell, c in zip(planned, cells, strict=True):
        recs, wall = _records(c)
        for i, r in enumerate(recs[:limited.get(c.concurrency, 0)]):
            recs[i] = RequestRecord(index=r.index, user=r.user, warmup=False, input_tokens_requested=c.in_tokens,
                                    output_tokens_requested=c.out_tokens, scheduled_ns=r.sent_ns, sent_ns=r.sent_ns,
                                    status="rate_limited", http_status=429, error="HTTP 429: rate limit",
                                    retry_after_s=2.0, end_ns=r.sent_ns + 5_000_000)
        df = records_frame(recs)
        w.write_cell({**cell.row(), **ran, "status": "done", "reason": ""}, df,
                     CellResult.from_dict(summarize(df, wall, SLOS).to_dict()))
    w.finish("completed")
    return load_session(path)


def _table(md: str) -> list[str]:
    """The first results table of a report: its header, separator and rows."""
    lines = md.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("## Results: "))
    rows = []
    for ln in lines[start + 2:]:
        if not ln.startswith("|"):
            break
        rows.append(ln)
    return rows


def test_the_report_table_counts_429s_apart_when_a_cell_has_any(tmp_path: Path) -> None:
    s = _session(tmp_path, "api", {4: 3, 16: 12})
    assert [v.summary.requests_rate_limited for v in _views(s)] == [0, 3, 12]
    md = render_report(s)
    head, _, c1, c4, c16 = _table(md)
    assert head.startswith("| load | ok / failed / 429 | TTFT ms p50 / p90 / p99 |")
    assert c1.startswith("| c=1 | 20 / 0 / 0 |")
    assert c4.startswith("| c=4 | 17 / 0 / 3 |")
    assert c16.startswith("| c=16 | 8 / 0 / 12 |")
    assert ("ok / failed / 429: the cell's requests that succeeded, that failed, and that the server refused by its "
            "rate limit (HTTP 429: counted apart from the failed ones, and measured in no latency figure).") in md


def test_the_report_table_is_unchanged_without_429s(tmp_path: Path) -> None:
    md = render_report(_session(tmp_path, "gpu", {}))
    head, _, c1, *_ = _table(md)
    assert head.startswith("| load | ok / failed | TTFT ms p50 / p90 / p99 |")
    assert c1.startswith("| c=1 | 20 / 0 |")
    assert "429" not in md


def _views(s: Any) -> list[Any]:
    from servescope.sessions.views import cell_views
    return cell_views(s)


def test_compare_gains_a_rate_limited_row_when_a_compared_cell_has_429s(tmp_path: Path) -> None:
    gpu = _session(tmp_path, "gpu", {})
    api = _session(tmp_path, "api", {16: 12})
    comp = compare_sessions([gpu, api])
    assert RATE_LIMITED_METRIC in comp.metrics
    by_load = {c.load: c for c in comp.cells}
    assert by_load["c=16"].values[RATE_LIMITED_METRIC.key] == [0, 12]
    assert by_load["c=1"].values[RATE_LIMITED_METRIC.key] == [0, 0]
    assert by_load["c=16"].winners[RATE_LIMITED_METRIC.key] is None  # a count of refusals: not judged
    md = comparison_markdown(comp, level=2)
    assert "|  | requests rate-limited (HTTP 429) | 0 | 12 | - | - |" in md  # no delta from 0, no winner
    assert "Requests rate-limited (HTTP 429): the cell's requests the server refused by its rate limit" in md
    cell16 = next(c for c in comp.to_dict()["cells"] if c["load"] == "c=16")  # type: ignore[union-attr]
    assert cell16["metrics"]["requests_rate_limited"]["values"] == [0, 12]
    rows = [r for r in comp.to_rows() if r["metric"] == "requests_rate_limited"]
    assert len(rows) == 3 and rows[2]["api"] == 12


def test_compare_has_no_rate_limited_row_without_429s(tmp_path: Path) -> None:
    comp = compare_sessions([_session(tmp_path, "a", {}), _session(tmp_path, "b", {})])
    assert RATE_LIMITED_METRIC not in comp.metrics
    md = comparison_markdown(comp, level=2)
    assert "rate-limited" not in md and "429" not in md
    assert "requests_rate_limited" not in comp.to_dict()["cells"][0]["metrics"]  # type: ignore[index]
