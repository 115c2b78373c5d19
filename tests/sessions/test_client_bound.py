"""Cells whose client was bound (core/health.py) are marked in reports and comparisons, call no winner, and
are left out of capacity, knee and peak (named, with the reason) unless `--include-bound`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from servescope.core.health import ClientPart, judge_client
from servescope.core.results import LoopLag
from servescope.reports.compare_doc import comparison_markdown
from servescope.reports.report import render_report
from servescope.sessions.answers import capacity, derive, knee, peak
from servescope.sessions.compare import cell_views, compare_sessions
from servescope.sessions.store import load_session
from tests.integration.helpers import servescope

from .conftest import CellSpec, SessionSpec, build_session
from .mdcheck import tables

SLOS = {"ttft_ms": 100000.0}  # every cell meets them: capacity is the highest level that counts


def _client(cpu: float) -> dict[str, Any]:
    c = judge_client(ClientPart(loop_lag_ms=LoopLag(p50=0.3, p99=1.0, max=3.0), cpu_s=cpu * 5, wall_s=5.0,
                                cpu_util=cpu, cpu_wait_share=0.0, workers=1), bunched_share=0.01)
    assert c is not None
    return c.to_dict()


def _session(base: Path, name: str, bound_at: int | None, tpot_ms: float = 6.0) -> Any:
    cells = [CellSpec("sharegpt", c, tpot_ms=tpot_ms, client=_client(0.96 if c == bound_at else 0.2))
             for c in (1, 4, 16)]
    return load_session(build_session(base, SessionSpec(name, cells, tags={"run": name}, slos=SLOS)))


def test_answers_leave_bound_cells_out_and_name_them(tmp_path: Path) -> None:
    s = _session(tmp_path, "a", bound_at=16)
    views = cell_views(s)
    assert [v.summary.client_bound for v in views] == [False, False, True]
    cap = capacity(views)
    assert cap.level == 4 and cap.not_reached  # c=16 does not count: it measured the client
    assert capacity(views, include_bound=True).level == 16
    assert knee(views).concurrency != 16 and knee(views, include_bound=True).levels == 3
    assert peak(views)[1] != "c=16"
    (a,) = derive("a", views)
    assert a.bound == ["c=16 (CPU 96% of a core (bound above 90%))"]
    assert "--include-bound counts them" in a.left_out_text() and "c=16" in a.left_out_text()
    (inc,) = derive("a", views, include_bound=True)
    assert inc.bound == [] and inc.include_bound and inc.left_out_text() == ""


def test_report_marks_bound_cells(tmp_path: Path) -> None:
    s = _session(tmp_path, "a", bound_at=16)
    md = render_report(s)
    tables(md)  # still well-formed Markdown tables
    assert "| client |" in md  # the definitions row, with the thresholds
    assert "**BOUND** 96% / 1.00 ms" in md and "ok 20% / 1.00 ms" in md
    assert "Left out of these answers** (client bound" in md and "c=16 (CPU 96% of a core (bound above 90%))" in md
    assert "sharegpt c=16: client BOUND (CPU 96% of a core (bound above 90%)): the client, not the server" in md
    doc = json.loads(render_report(s, fmt="json"))
    (ans,) = doc["report"]["answers"]
    assert ans["capacity"] == 4 and ans["left_out_client_bound"] and ans["include_bound"] is False
    assert doc["report"]["cells"][2]["summary"]["client"]["verdict"] == "bound"
    with_bound = json.loads(render_report(s, fmt="json", include_bound=True))
    assert with_bound["report"]["answers"][0]["capacity"] == 16


def test_no_winner_from_a_bound_cell(tmp_path: Path) -> None:
    a, b = _session(tmp_path, "a", bound_at=16), _session(tmp_path, "b", bound_at=None, tpot_ms=4.0)
    comp = compare_sessions([a, b], label_key="run")
    by = {c.load: c for c in comp.cells}
    assert by["c=16"].client == ["bound", "ok"] and by["c=16"].bound_in == [0]
    assert all(w is None for w in by["c=16"].winners.values())
    assert by["c=16"].no_winner["output_tok_s"] == "client bound"
    assert by["c=1"].bound_in == [] and by["c=1"].winners["output_tok_s"] == 1  # b is faster: a winner elsewhere
    d = comp.to_dict()
    cells = {c["load"]: c for c in d["cells"]}
    assert cells["c=16"]["client_bound"] == ["a"] and cells["c=16"]["client"] == {"a": "bound", "b": "ok"}
    assert cells["c=4"]["client_bound"] == []
    md = comparison_markdown(comp, level=2)
    assert "c=16 ⚠ client bound: a" in md and "**Client bound**" in md


def test_cli_include_bound(tmp_path: Path) -> None:
    a, b = _session(tmp_path, "a", bound_at=16), _session(tmp_path, "b", bound_at=None)
    r = servescope("report", str(a.path), "--format", "json", "--include-bound")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["report"]["answers"][0]["capacity"] == 16
    r = servescope("compare", str(a.path), str(b.path), "--json")
    assert r.returncode == 0, r.stderr
    ans = {x["session"]: x for x in json.loads(r.stdout)["answers"]}
    assert ans["a"]["capacity"] == 4 and ans["b"]["capacity"] == 16
