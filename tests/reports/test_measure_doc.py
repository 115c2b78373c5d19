"""A report says how each cell was measured (issue 47): under a workload's results, a table with each cell's window,
the precision it reached (`imprecise` where its ceiling came first), its saturation mark, its probes' TTFT and E2E,
and the loads the sweep skipped with why; the results table marks the cells; the knee and capacity sentences use the
saturation mark. The session is written by the store, as the engine writes one."""

from __future__ import annotations

from pathlib import Path

from markdown_it import MarkdownIt

from servescope.core.results import CellPrecision, CellProbes, CellResult, CellWindow, Dist, Saturation
from servescope.reports.render_html import render_html
from servescope.reports.report import build, render_report, report_document
from servescope.sessions.store import SessionWriter, load_session
from servescope.workloads.spec import PRESETS
from tests.support.meta import meta_of
from tests.tui.fixtures import summary_for

LOADS = (1, 4, 16, 32)
SAT = "saturated: the server's queue never emptied (a request waiting in every sample of the window)"
SKIP = ("skipped after saturation (--stop-after-saturation): the load 16 users was saturated (the server's queue never "
        "emptied) and 32 users was run past it")


def _measured(c: int) -> dict[str, object]:
    s = CellResult(
        window=CellWindow(kind="steady", start_s=1.5, end_s=20.0, requests=50, requests_ok=50, ramp_requests=10,
                          basis="once the last user started to the last send"),
        precision=CellPrecision(target=0.02, reached=0.035 if c == 16 else 0.015, requests=60, figure="output_tok_s",
                                imprecise=c == 16, ceiling="60 requests"),
        saturation=Saturation(saturated=c == 16, reason=SAT if c == 16 else "", basis="server waiting"),
        probes=CellProbes(rate=0.5, input_tokens=64, output_tokens=16, sent=8, ok=8,
                          ttft_ms=Dist(p50=41.0, p90=80.0), e2e_ms=Dist(p50=310.0, p90=420.0)))
    d = s.to_dict()
    return {k: d[k] for k in ("window", "precision", "saturation", "probes")}


def _session(base: Path, skip_32: bool) -> Path:
    """c=1, 4, 16 done (16 saturated and imprecise) and c=32 done or skipped after saturation."""
    path = base / "20261207-100000-sat"
    meta = {"name": "sat", "target": {"url": "sim://tiny", "version": "0.32.0-sim", "metrics": True},
            "model": "tiny", "workloads": [PRESETS["sharegpt"].to_dict()], "slos": {"ttft_ms": 5000.0}, "tags": {},
            "cells": [{"index": i, "workload": "sharegpt", "concurrency": c, "load_label": f"c={c}",
                       "status": "planned"} for i, c in enumerate(LOADS)]}
    w = SessionWriter.create(path, meta_of(**meta))
    for i, c in enumerate(LOADS):
        row = {"index": i, "workload": "sharegpt", "api": "chat", "concurrency": c, "rate": None, "arrival": None,
               "max_concurrency": None, "requests_planned": 60, "duration_s_planned": None, "warmup": 0,
               "load_label": f"c={c}", "status": "done", "reason": ""}
        if c == 32 and skip_32:
            w.write_cell({**row, "status": "skipped", "reason": SKIP}, None, None)
            continue
        df, s = summary_for(c, slos={"ttft_ms": 5000.0})
        s.update(_measured(c))
        w.write_cell(row, df, CellResult.from_dict(s))
    w.finish("completed")
    return path


def _table_after(md: str, title: str) -> list[list[str]]:
    """The rows (cells' text) of the first table after the paragraph starting with `title`."""
    tokens = MarkdownIt().enable("table").parse(md)
    at = next(i for i, t in enumerate(tokens) if t.type == "inline" and t.content.startswith(title))
    rows: list[list[str]] = []
    cur: list[str] = []
    for t in tokens[at + 1:]:
        if t.type == "tr_open":
            cur = []
        elif t.type == "inline" and cur is not None:
            cur.append(t.content)
        elif t.type == "tr_close":
            rows.append(cur)
        elif t.type == "table_close":
            break
    return rows


def test_the_report_says_each_cells_window_precision_saturation_probes_and_the_skipped_loads(tmp_path: Path) -> None:
    md = render_report(load_session(_session(tmp_path, skip_32=True)))
    header, *rows = _table_after(md, "**How each cell was measured.**")
    assert header == ["load", "window", "precision reached", "saturated", "probe TTFT ms p50 / p90",
                      "probe E2E ms p50 / p90"]
    by = {r[0]: r for r in rows}
    assert by["c=1"][1] == "steady, 1.5-20.0 s: 50 of 60 requests" and by["c=1"][2] == "+-1.5% (target 2%, 60 requests)"
    assert by["c=1"][3] == "no" and by["c=1"][4] == "41.0 / 80.0" and by["c=1"][5] == "310.0 / 420.0"
    assert by["c=16"][2] == "**imprecise** +-3.5% (target 2%, 60 requests)"
    assert by["c=16"][3].startswith("**saturated**: the server's queue never emptied")
    assert by["c=32 **skipped**"][1] == SKIP
    assert "over each cell's steady window" in md
    # the results table marks the cells
    assert "| c=16 **imprecise** **saturated** |" in md
    # the knee and capacity sentences use the mark
    assert "**Knee:** c=" in md and "the server saturated at c=16" in md
    assert "not reached: the highest concurrency measured" not in md


def test_the_html_report_carries_the_same_table(tmp_path: Path) -> None:
    rep = build(load_session(_session(tmp_path, skip_32=True)))
    page = render_html(report_document(rep))
    assert "How each cell was measured." in page and "<strong>saturated</strong>" in page
    assert "skipped after saturation (--stop-after-saturation)" in page


def test_capacity_at_the_highest_load_says_the_server_saturated_below_it(tmp_path: Path) -> None:
    rep = build(load_session(_session(tmp_path, skip_32=False)))
    [ans] = rep.answers
    assert ans.capacity.level == 32 and ans.capacity.saturated_at == "c=16"
    assert ans.capacity.text() == ("c=32 (the highest level measured still meets them; the server saturated at c=16, "
                                   "so more load adds queueing, not throughput)")
    assert ans.knee.saturated_at == "c=16" and not ans.knee.not_reached
