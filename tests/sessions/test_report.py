"""Reports: golden files on fixed sessions, and the Markdown checked structurally (markdown-it-py)."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

import pytest

from servescope import __version__
from servescope.core.errors import ServescopeError
from servescope.reports.compare_doc import comparison_markdown
from servescope.reports.report import render_report
from servescope.sessions.compare import compare_sessions
from servescope.sessions.store import load_session

from .conftest import GOLDEN, CellSpec, SessionSpec, build_session
from .mdcheck import mermaid_charts, tables

UPDATE = os.environ.get("SERVESCOPE_UPDATE_GOLDEN") == "1"


def golden(name: str, text: str) -> None:
    """Compare with tests/sessions/golden/NAME; SERVESCOPE_UPDATE_GOLDEN=1 rewrites it."""
    text = text.replace(f"servescope {__version__}.", "servescope VERSION.")
    path = GOLDEN / name
    if UPDATE or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        if not UPDATE:
            pytest.fail(f"golden file {path} did not exist: written, check it in")
    assert text == path.read_text(encoding="utf-8"), f"{name} differs; SERVESCOPE_UPDATE_GOLDEN=1 to accept"


def test_report_golden(fixed_pair) -> None:
    a, _ = fixed_pair
    golden("report-gptq.md", render_report(a, label_key="quant"))


def test_report_with_compare_golden(fixed_pair) -> None:
    a, b = fixed_pair
    golden("report-gptq-vs-fp8.md", render_report(a, [b], label_key="quant"))


def test_comparison_golden(fixed_pair) -> None:
    a, b = fixed_pair
    golden("compare-gptq-vs-fp8.md", comparison_markdown(compare_sessions([a, b], label_key="quant")))


def test_report_markdown_is_well_formed(fixed_pair) -> None:
    a, b = fixed_pair
    md = render_report(a, [b], label_key="quant")
    tbls = tables(md)
    heads = [t.header for t in tbls]
    assert ["metric", "definition"] in heads
    results = [t for t in tbls if t.header[:2] == ["load", "ok / failed"]]
    assert len(results) == 2  # sharegpt, sharegpt-think
    assert [r[0] for r in results[0].rows] == ["c=1", "c=4", "c=16"]
    charts = mermaid_charts(md)
    titles = [c.title for c in charts]
    assert "sharegpt: aggregate output tok/s vs concurrency" in titles
    assert "sharegpt: per-user tok/s (mean) vs concurrency" in titles
    assert "sharegpt: TTFT p99 ms vs concurrency" in titles
    share = next(c for c in charts if c.title.startswith("sharegpt: aggregate"))
    # overlaid with --compare: one line per session over the cells both have
    assert share.categories == ["1", "4"] and len(share.series) == 2
    assert "Lines in each chart, in order: line 1: GPTQ-Int4, line 2: FP8." in md


def test_every_formula_is_stated(fixed_pair) -> None:
    from servescope.core.metrics import FORMULAS

    md = render_report(fixed_pair[0])
    defs = next(t for t in tables(md) if t.header == ["metric", "definition"])
    keys = {r[0].strip("`") for r in defs.rows}
    assert set(FORMULAS) <= keys and {"capacity", "knee"} <= keys


def test_notes_flag_the_abnormal(fixed_pair) -> None:
    md = render_report(fixed_pair[0])
    notes = md.split("## Notes", 1)[1]
    assert "sharegpt c=16: 2 of 20 requests failed: error x2 (HTTP 500: engine dead)" in notes
    assert "preempted 37 requests" in notes
    assert "KV tokens, above the server's KV cache of 6,000 tokens" in notes
    assert "waited 900 ms on average in the server's queue" in notes
    assert "prompts differ from the requested length by up to 12 tokens" in notes
    assert "longin c=1: skipped (input 8192 + output 256 tokens exceed" in notes


def test_clean_session_has_nothing_abnormal(tmp_path: Path) -> None:
    s = load_session(build_session(tmp_path, SessionSpec("ok", [CellSpec("sharegpt", 1), CellSpec("sharegpt", 2)])))
    md = render_report(s)
    assert "Nothing abnormal" in md
    tables(md)
    mermaid_charts(md)


def test_hostile_names_do_not_break_tables(tmp_path: Path) -> None:
    spec = SessionSpec("a|b", [CellSpec("sharegpt", 1), CellSpec("sharegpt", 2)], model="evil|model\x1b[31m`x`",
                       tags={"quant": "q|<b>"})
    s = load_session(build_session(tmp_path, spec, dirname="20261201-120000-evil"))
    md = render_report(s, [s], label_key="quant")
    tables(md)
    mermaid_charts(md)
    assert "\x1b" not in md


def test_interrupted_session_is_noted(tmp_path: Path) -> None:
    spec = SessionSpec("cut", [CellSpec("sharegpt", 1)], status="failed",
                       message="http://127.0.0.1:8000 stopped answering during cell 2")
    md = render_report(load_session(build_session(tmp_path, spec)))
    assert "the sweep did not complete (status failed): http://127.0.0.1:8000 stopped answering" in md
    assert "needs at least two completed concurrency levels" in md
    assert mermaid_charts(md) == []  # one point is no curve


def test_a_stopped_cell_is_marked_in_its_row_and_the_gpu_row_reads_as_prose(tmp_path: Path) -> None:
    """A stopped cell's figures are partial: its row says so where its figures are, not only in a note below;
    a machine without GPU telemetry is said in words, not as `available False, reason ...`."""
    spec = SessionSpec("s", [CellSpec("sharegpt", 1), CellSpec("sharegpt", 2, stopped="stopped by the user")])
    p = build_session(tmp_path, spec)
    import tomllib

    import tomli_w

    meta = tomllib.loads((p / "session.toml").read_text())
    meta["gpu"] = {"available": False, "reason": "NVML is not available: no NVIDIA driver or GPU here?"}
    (p / "session.toml").write_text(tomli_w.dumps(meta))
    md = render_report(load_session(p))
    assert tables(md)
    load_rows = [ln for ln in md.splitlines() if ln.startswith("| c=")]
    assert any(ln.startswith("| c=2 **stopped** |") for ln in load_rows), load_rows
    assert any(ln.startswith("| c=1 |") for ln in load_rows), load_rows
    assert "| GPU | no GPU telemetry: NVML is not available: no NVIDIA driver or GPU here? |" in md
    assert "available False" not in md


def test_csv_and_json(fixed_pair) -> None:
    a, b = fixed_pair
    text = render_report(a, [b], fmt="csv", label_key="quant")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert {r["session"] for r in rows} == {"GPTQ-Int4", "FP8"}
    assert {"workload", "load_label", "ttft_ms.p50", "output_tok_s"} <= set(rows[0])
    assert len(rows) == 6 + 3  # skipped cell included, with its status
    doc = json.loads(render_report(a, [b], fmt="json", label_key="quant"))
    assert doc["report"]["label"] == "GPTQ-Int4"
    assert doc["comparison"]["cells"][0]["metrics"]["tpot_ms.p50"]["winner"] == "GPTQ-Int4"
    ans = {x["workload"]: x for x in doc["report"]["answers"]}
    assert ans["sharegpt"]["capacity"] == 4
    with pytest.raises(ServescopeError, match="unknown report format"):
        render_report(a, fmt="html")
