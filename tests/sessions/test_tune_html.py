"""The HTML report of a `servescope tune` session: its tune section (best with its interval, serve line,
runner-up, cost, search path table) and a figure of the search (the objective of each measured cell in order,
the best cell's measurements marked, each point's value in its SVG <title>), placed in that section."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from servescope.reports.figures import session_figures
from servescope.reports.htmlreport import report_html, report_parts
from servescope.reports.report import build
from servescope.sessions.store import load_session
from tests.sessions.tune_synth import write_tune_session

pytest.importorskip("matplotlib")


def test_tune_figure_is_the_search_in_order_with_the_best_marked(tmp_path: Path) -> None:
    s = load_session(write_tune_session(tmp_path / "t"))
    (fig,) = [f for f in session_figures(build(s)) if f.kind == "tune"]
    (panel,) = fig.panels
    assert panel.x_label == "search step" and panel.y_label == "goodput req/s"
    measured, best = panel.series
    assert [(p.x, p.y) for p in measured.points] == [(1, 11.4), (2, 21.25), (3, 0.0)]
    assert [(p.x, p.y) for p in best.points] == [(4, 26.0), (5, 23.0)]  # the best cell, measured twice
    assert best.points[0].tip == ("step 4: --max-num-seqs 32 at c=8: goodput 26 req/s; predicted before 15-29.5 "
                                  "req/s (chance 62% to beat 21.2)")


def test_html_report_of_a_tune_session_has_its_section_and_figure(tmp_path: Path) -> None:
    page = report_html(report_parts(load_session(write_tune_session(tmp_path / "t"))))
    body = page[page.index('<h2 id="tune-the-best-server-setting">'):]
    assert "Best: <code>--max-num-seqs 32</code> at c=8: goodput 24.5 req/s (95% interval 18-30.9 req/s)" in body
    assert "Serve it: <code>servescope sim --profile tiny --max-num-seqs 32</code>" in body
    assert "Runner-up: <code>--max-num-seqs 16</code>: measured 21.2 req/s at c=8, 13% below the best" in body
    assert "5 cells measured of 12 in the grid (budget 6), 2 relaunches" in body
    # the figure sits in the tune section, after the answer and before the path table
    fig, path = body.index('<figure id="fig-tune-search">'), body.index('<h3 id="search-path">')
    assert body.index("Cost: 5 cells") < fig < path
    assert re.search(r"<th[^>]*>predicted before req/s</th>", body)
    rows = re.findall(r"<tr><td class=\"num nw\">(\d+)</td>", body[path:])
    assert rows == ["1", "2", "3", "4", "5"]
    titles = re.findall(r"<title>(.*?)</title>", body[fig:path])
    assert titles[0] == "tune: the search"
    assert "step 5: --max-num-seqs 32 at c=8: goodput 23 req/s (measure again: the best)" in titles
    assert len([t for t in titles if t.startswith("step ")]) == 5
    assert "<h2 id=\"figures\">" not in page  # nothing left over for a figures section


def test_unfinished_tune_session_has_no_tune_figure(tmp_path: Path) -> None:
    s = load_session(write_tune_session(tmp_path / "t", status="interrupted"))
    assert [f for f in session_figures(build(s)) if f.kind == "tune"] == []
