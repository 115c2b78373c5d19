"""Figures and the HTML report: every point a figure draws carries the session's own number (read back from the
SVG's `<title>` tooltips and data attributes), client-bound points are marked apart from the data, the HTML is one
file that loads nothing and escapes what servers and users named, and `--figures` writes files the Markdown links."""

from __future__ import annotations

import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from servescope.core.errors import ServescopeError
from servescope.reports.figures import FigureSpec, comparison_figures, session_figures
from servescope.reports.figures_svg import SVG_NS, render
from servescope.reports.htmlreport import (
    CSP,
    compare_html,
    compare_parts,
    report_html,
    report_markdown,
    report_parts,
)
from servescope.reports.report import build
from servescope.sessions.answers import completed
from servescope.sessions.store import load_session
from servescope.sessions.views import fmt_num
from tests.integration.helpers import servescope

from .conftest import CellSpec, SessionSpec, build_session
from .test_client_bound import _client

pytest.importorskip("matplotlib")

Q = f"{{{SVG_NS}}}"


def points_of(svg: str) -> list[tuple[float, float, str]]:
    """Every data point of a figure's SVG: (data-x, data-y, its <title>), in drawing order."""
    root = ET.fromstring(svg)
    out = []
    for u in root.iter(f"{Q}use"):
        if "pt" not in (u.get("class") or "").split():
            continue
        title = u.find(f"{Q}title")
        assert title is not None and title.text, "a point without its tooltip"
        out.append((float(u.get("data-x", "nan")), float(u.get("data-y", "nan")), title.text))
    return out


def titles_of(svg: str) -> list[str]:
    return [t.text or "" for t in ET.fromstring(svg).iter(f"{Q}title")]


def _by_name(specs: list[FigureSpec]) -> dict[str, FigureSpec]:
    return {s.name: s for s in specs}


def two_workloads(base: Path, name: str = "two", model: str = "Qwen/Qwen3.5-35B-A3B", bound_at: int | None = None,
                  repeats: int = 1, tpot_ms: float = 6.0, loads: tuple[int, ...] = (1, 2, 4, 8, 16),
                  workloads: tuple[str, ...] = ("sharegpt", "longin")) -> Any:
    cells = [CellSpec(w, c, in_tokens=300 if w == "sharegpt" else 3000, tpot_ms=tpot_ms, requests=12,
                      client=_client(0.96 if c == bound_at else 0.2))
             for w in workloads for c in loads for _ in range(repeats)]
    return load_session(build_session(base, SessionSpec(name, cells, tags={"quant": name}, model=model,
                                                        slos={"ttft_ms": 1000.0, "per_user_tok_s": 20.0})))


def test_each_point_carries_the_tables_number(tmp_path: Path) -> None:
    """The figure-data check: parse the SVG's point tooltips and data attributes and compare them with the
    session's own figures (what the report's tables print): a figure cannot drift from its table."""
    s = two_workloads(tmp_path)
    rep = build(s)
    specs = _by_name(session_figures(rep))
    assert {"sharegpt-throughput", "sharegpt-tradeoff", "sharegpt-latency", "sharegpt-histograms",
            "longin-throughput", "ttft-vs-context"} <= set(specs)
    for w in ("sharegpt", "longin"):
        views = completed([v for v in rep.views if v.workload == w])
        for fig, keys in ((f"{w}-throughput", ("output_tok_s", "per_user_tok_s.mean")),
                          (f"{w}-latency", ("ttft_ms.p50", "ttft_ms.p99", "tpot_ms.p50", "tpot_ms.p99"))):
            pts = points_of(render(specs[fig]).svg)
            want = [(float(v.concurrency or 0), v.summary.value(k)) for k in keys for v in views]
            assert len(pts) == len(want)
            for (x, y, title), (wx, wy) in zip(pts, want, strict=True):
                assert wy is not None
                assert (x, y) == (wx, wy)  # the exact stored figure, not a rounded copy
                assert title.startswith(f"{w}, c={int(wx)}: ") and f"= {fmt_num(wy)} " in title  # as the table prints it
    # the context figure: TTFT p50 against each workload's measured input length
    pts = points_of(render(specs["ttft-vs-context"]).svg)
    by_cell = {(v.workload, v.load): v for v in rep.views}
    assert len(pts) == len(rep.views)
    for x, y, title in pts:
        v = by_cell[(title.split(", ")[0], title.split(", ")[1].split(":")[0])]
        assert (x, y) == (v.summary.value("input_tokens_mean"), v.summary.value("ttft_ms.p50"))


def test_reference_lines_and_histograms_name_their_values(tmp_path: Path) -> None:
    s = two_workloads(tmp_path)
    rep = build(s)
    specs = _by_name(session_figures(rep))
    lat = titles_of(render(specs["sharegpt-latency"]).svg)
    assert "SLO: ttft_ms <= 1,000 ms" in lat
    ans = next(a for a in rep.answers if a.workload == "sharegpt")
    assert any(t.startswith("capacity at the SLOs: " + ans.capacity.text()) for t in lat)
    assert any(t.startswith("knee: c=") for t in lat)
    hist = titles_of(render(specs["sharegpt-histograms"]).svg)
    v = completed([v for v in rep.views if v.workload == "sharegpt"])[0]
    for stat in ("p50", "p90", "p99"):
        got = v.summary.value("ttft_ms", stat)
        assert got is not None and f"sharegpt, c=1: TTFT {stat} = {fmt_num(got)} ms" in hist
    bars = [t for t in hist if t.startswith("sharegpt, c=1: TTFT ") and t.endswith("requests")]
    assert sum(int(re.search(r": (\d+) requests$", t)[1]) for t in bars) == v.summary.requests_ok  # type: ignore[index]


def test_client_bound_points_are_marked_not_drawn_as_data(tmp_path: Path) -> None:
    s = two_workloads(tmp_path, bound_at=16)
    specs = _by_name(session_figures(build(s)))
    svg = render(specs["sharegpt-throughput"]).svg
    root = ET.fromstring(svg)
    bound = [u for u in root.iter(f"{Q}use") if "bound" in (u.get("class") or "").split()]
    assert len(bound) == 2  # aggregate and per-user at c=16
    assert all(float(u.get("data-x", "0")) == 16 for u in bound)
    assert all("client bound" in (u.findtext(f"{Q}title") or "") for u in bound)
    line_pts = [p for p in specs["sharegpt-throughput"].panels[0].series[0].points if not p.bound]
    assert [p.x for p in line_pts] == [1, 2, 4, 8]  # the line runs through the server's figures only


@pytest.mark.slow
def test_comparison_overlays_repeats_as_bands_and_verdicts(tmp_path: Path) -> None:
    a = two_workloads(tmp_path, "GPTQ", repeats=3, workloads=("sharegpt",))
    b = two_workloads(tmp_path, "FP8", repeats=3, tpot_ms=7.5, workloads=("sharegpt",))
    comp, reps = compare_parts([a, b], label_key="quant")
    specs = _by_name(comparison_figures(comp, reps))
    spec = specs["sharegpt-compare"]
    tpot = next(p for p in spec.panels if p.title.startswith("TPOT p50"))
    gptq, fp8 = tpot.series[0], tpot.series[1]
    assert gptq.band is not None and len(gptq.band.xs) == 5  # the range of each point's 3 repeats
    cells = [c for c in comp.cells if c.workload == "sharegpt"]
    assert [p.y for p in fp8.points] == [c.values["tpot_ms.p50"][1] for c in cells]
    assert all(p.verdict == "worse" for p in fp8.points)  # 7.5 ms against 6 ms per token, well beyond noise
    pts = points_of(render(spec).svg)
    fp8_tpot = [t for _, _, t in pts if t.startswith("FP8, ") and ": TPOT p50 = " in t]
    assert len(fp8_tpot) == 5 and all("vs GPTQ: +" in t and " worse" in t and "repeats " in t for t in fp8_tpot)


@pytest.mark.slow
def test_html_is_one_file_that_loads_nothing_and_escapes_names(tmp_path: Path) -> None:
    evil = '<script>alert("x")</script><img src="http://example.com/x.png">'
    s = two_workloads(tmp_path, "evil", model=evil, loads=(1, 4), workloads=("sharegpt", "longin"))
    doc = report_html(report_parts(s))
    assert doc.startswith("<!DOCTYPE html>") and CSP in doc
    assert "<script" not in doc.lower() and "&lt;script&gt;" in doc
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", doc, re.I)  # nothing fetched
    assert "<link" not in doc and "@import" not in doc and "url(http" not in doc
    assert doc.count('<figure id="fig-') == len(session_figures(build(s)))
    assert "```mermaid" not in doc and "xychart-beta" not in doc
    ids = re.findall(r'\sid="([^"]+)"', doc)
    assert len(ids) == len(set(ids))  # several figures on one page: no id is used twice


def test_compare_html_has_the_comparison_and_its_figures(tmp_path: Path) -> None:
    a = two_workloads(tmp_path, "GPTQ", loads=(1, 4), workloads=("sharegpt",))
    b = two_workloads(tmp_path, "FP8", tpot_ms=7.5, loads=(1, 4), workloads=("sharegpt",))
    comp, reps = compare_parts([a, b], label_key="quant")
    doc = compare_html(comp, reps)
    assert "Comparison: GPTQ vs FP8" in doc and '<figure id="fig-sharegpt-compare">' in doc
    assert '<table>' in doc and CSP in doc


def test_the_html_renderer_escapes_once_and_keeps_tables_code_and_lists() -> None:
    """The page is rendered from the document's blocks, not from Markdown: text is escaped once (a name holding
    Markdown or HTML is shown as typed), figures align right, a Mermaid block is left out."""
    from servescope.reports.document import (
        Chart,
        Code,
        Document,
        Mermaid,
        Num,
        Strong,
        bullets,
        heading,
        para,
        right,
        row,
        table,
    )
    from servescope.reports.render_html import render_html

    doc = Document("T", [heading(1, "T"), para("Text with ", Code("a|b"), " and ", Strong("bold"), " and <b> and a | "
                                               "pipe and a \\* star."),
                         table((right("h1"), right("h2", "ms", "p50")), [row("x | y", Num("1.5"))]),
                         bullets(["one", "two more"]), Mermaid((Chart("c", "x", ("1",), "y", ((1.0,),)),))])
    out = render_html(doc)
    assert '<h1 id="t">T</h1>' in out
    assert "<code>a|b</code>" in out and "<strong>bold</strong>" in out and "&lt;b&gt;" in out
    assert "a \\* star" in out  # as typed: no Markdown escape was added, none was read
    assert '<th class="num" title="ms, p50">h2</th>' in out
    assert '<td class="num nw">x | y</td><td class="num nw">1.5</td>' in out
    assert "<li>one</li><li>two more</li>" in out
    assert "xychart" not in out and "mermaid" not in out


@pytest.mark.slow
def test_figures_dir_writes_files_the_markdown_links(tmp_path: Path) -> None:
    s = two_workloads(tmp_path, loads=(1, 4), workloads=("sharegpt",))
    out = tmp_path / "out" / "report.md"
    figs = tmp_path / "out" / "figs"
    md = report_markdown(report_parts(s), figs, out)
    links = re.findall(r"\]\(([^)]+\.(?:svg|png))\)", md)
    assert links and all(not Path(x).is_absolute() for x in links)
    for x in links:
        assert (out.parent / x).is_file(), x
    assert "```mermaid" not in md and "figs/sharegpt-throughput.svg" in md
    assert (figs / "sharegpt-throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_cli_formats_and_figures(tmp_path: Path) -> None:
    a = two_workloads(tmp_path / "s", "GPTQ", loads=(1, 4), workloads=("sharegpt",))
    b = two_workloads(tmp_path / "s", "FP8", loads=(1, 4), workloads=("sharegpt",))
    r = servescope("report", str(a.path), "--format", "html", "-o", str(tmp_path / "r.html"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "r.html").read_text().count("<svg") >= 4
    r = servescope("compare", str(a.path), str(b.path), "--label", "quant", "--figures", str(tmp_path / "cf"),
                   "-o", str(tmp_path / "c.md"))
    assert r.returncode == 0, r.stderr
    assert "](cf/sharegpt-compare.svg)" in (tmp_path / "c.md").read_text()
    r = servescope("report", str(a.path), "--format", "csv", "--figures", str(tmp_path / "x"))
    assert r.returncode == 2 and "--figures writes figure files for a Markdown report" in r.stderr


def test_without_matplotlib_one_line_says_how_to_install(tmp_path: Path) -> None:
    s = two_workloads(tmp_path, loads=(1,), workloads=("sharegpt",))
    code = ("import sys; sys.modules['matplotlib'] = None; from servescope.__main__ import main; "
            f"sys.exit(main(['report', {str(s.path)!r}, '--format', 'html']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'servescope[plots]'" in lines[0]


def test_matplotlib_stays_off_the_start_up_path() -> None:
    code = ("import sys; import servescope.cli.compare, servescope.cli.run, servescope.tui.app, "
            "servescope.reports.htmlreport; print('matplotlib' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr


def test_a_broken_marker_count_is_an_error_not_a_wrong_tooltip(tmp_path: Path) -> None:
    from servescope.reports.figures_svg import _annotate, _Tips

    svg = ('<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink"><g id="pts1">'
           '<use xlink:href="#m"/></g></svg>')
    from servescope.reports.figures import Point

    tips = _Tips(points={"pts1": [Point(1, 2, "a"), Point(2, 3, "b")]})
    with pytest.raises(ServescopeError, match="1 markers drawn for 2 points"):
        _annotate(svg, tips, "f", "F")


def test_telemetry_timeline_draws_kv_running_waiting_and_gpu_power(tmp_path: Path) -> None:
    """telemetry.parquet and gpu.parquet as the engine writes them (core/telemetry.py, core/gpu.py frames): every
    sample on the timeline, the cells as spans."""
    import polars as pl

    s = two_workloads(tmp_path, loads=(1, 4), workloads=("sharegpt",))
    t0 = min(int(s.requests(v.index)["sent_ns"].min()) for v in build(s).views)
    ts = [t0 + i * 500_000_000 for i in range(6)]
    pl.DataFrame({"t_ns": ts, "kv_cache_usage_perc": [0.0, 0.1, 0.25, 0.5, 0.2, 0.0],
                  "num_requests_running": [0.0, 1.0, 4.0, 4.0, 2.0, 0.0],
                  "num_requests_waiting": [0.0, 0.0, 0.0, 3.0, 0.0, 0.0]}).write_parquet(s.path / "telemetry.parquet")
    pl.DataFrame({"t_ns": ts * 2, "gpu": [0] * 6 + [1] * 6, "gpu_index": [0] * 6 + [1] * 6, "name": ["H100"] * 12,
                  "power_w": [100.0, 300.0, 450.0, 500.0, 320.0, 90.0] * 2}).write_parquet(s.path / "gpu.parquet")
    spec = _by_name(session_figures(build(s)))["server-telemetry"]
    assert [p.title for p in spec.panels] == ["server KV cache in use (/metrics)",
                                              "server requests running and waiting (/metrics)", "GPU power (NVML)"]
    pts = points_of(render(spec).svg)
    kv = [(x, y) for x, y, t in pts if "KV cache used" in t]
    assert kv == [(i * 0.5, v) for i, v in enumerate([0.0, 10.0, 25.0, 50.0, 20.0, 0.0])]  # percent of the cache
    assert [t for _, _, t in pts if "waiting" in t][3] == "t = 1.5 s: waiting = 3.00 requests"
    assert len([t for _, _, t in pts if "GPU 1 power" in t]) == 6
    assert len(spec.panels[0].spans) == 2  # the two cells


def test_a_twin_is_drawn_dashed_with_its_band(tmp_path: Path) -> None:
    """SESSION/twin/profile.toml's [fit] as servescope.engine.twin.FitResult.to_toml_dict writes it: each fitted
    cell's [measured, twin] per figure (repeats of a load: their median), the band 2x the larger of the residual
    and the cell's own error."""
    import math

    import tomli_w

    s = two_workloads(tmp_path, loads=(1, 4), workloads=("sharegpt",), repeats=2)
    cells = [{"cell": i, "label": f"sharegpt c={c}", "workload": "sharegpt", "requests": 12, "concurrency": c,
              "output_tok_s": [100.0 * c, t], "tpot_ms.p50": [6.0, 6.1]}
             for i, (c, t) in enumerate([(1, 110.0), (1, 100.0), (4, 380.0), (4, 400.0)])]
    (s.path / "twin").mkdir()
    (s.path / "twin" / "profile.toml").write_text(tomli_w.dumps(
        {"fit": {"shape_from": "test", "fitted": [], "residual_rms_ln": {"output_tok_s": 0.02}, "cells": cells}}))
    rep = build(s)
    thr = _by_name(session_figures(rep))["sharegpt-throughput"]
    twin = next(x for x in thr.panels[0].series if x.dashed)
    assert [(p.x, p.y) for p in twin.points] == [(1, 105.0), (4, 390.0)]
    assert twin.band is not None
    rel = 2 * abs(math.log(110 / 100))  # c=1's own error (10%) is above the residual (2%)
    assert twin.band.hi[0] == pytest.approx(105.0 * math.exp(rel))
    titles = [t for _, _, t in points_of(render(thr).svg) if t.startswith("twin, ")]
    assert titles[0].startswith("twin, sharegpt c=1: aggregate output tok/s = 105.0 tok/s (band ")
