"""`vllm bench serve --save-result` JSON imported as sessions. The stored files in data/ were written by the
real `vllm bench serve` (vLLM 0.32.0, CPU) against the tiny dense model; the `vllm` test makes fresh ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servescope.core.errors import ServescopeError
from servescope.reports.report import render_report
from servescope.sessions.compare import compare_sessions
from servescope.sessions.importers import import_files
from servescope.sessions.store import load_session

from .conftest import DATA
from .mdcheck import mermaid_charts, tables

DETAILED = [DATA / "vllm-bench-c1-detailed.json", DATA / "vllm-bench-c4-detailed.json"]
DETAIL_KEYS = ("input_lens", "output_lens", "ttfts", "itls", "latencies", "start_times", "queue_times",
               "generated_texts", "errors")


def _agrees_with_vllm(session_path: Path, files: list[Path]) -> None:
    s = load_session(session_path)
    by_c = {}
    for row, summ in zip(s.cells.to_dicts(), s.summaries(), strict=True):
        by_c[row["concurrency"]] = summ
    for f in files:
        d = json.loads(f.read_text())
        summ = by_c[d["max_concurrency"]]
        assert summ is not None
        # recomputed from the per-request data with servescope's formulas: the same numbers as vLLM's
        assert summ.output_tok_s == pytest.approx(d["output_throughput"], rel=1e-6)
        assert summ.ttft_ms.mean == pytest.approx(d["mean_ttft_ms"], rel=1e-6)
        assert summ.ttft_ms.p50 == pytest.approx(d["median_ttft_ms"], rel=1e-6)
        assert summ.tpot_ms.mean == pytest.approx(d["mean_tpot_ms"], rel=1e-6)
        assert summ.tpot_ms.p99 == pytest.approx(d["p99_tpot_ms"], rel=1e-6)
        assert summ.itl_ms.mean == pytest.approx(d["mean_itl_ms"], rel=1e-6)
        assert summ.requests_ok == d["completed"]


def test_import_detailed(tmp_path: Path) -> None:
    path = import_files(DETAILED, sessions_dir=tmp_path)
    _agrees_with_vllm(path, DETAILED)
    s = load_session(path)
    assert s.info.source is not None and s.info.source.rebuilt is True and s.info.source.tool == "vllm-bench"
    assert s.cells["load_label"].to_list() == ["c=1", "c=4"]
    assert s.requests(0).height == 12
    md = render_report(s)
    tables(md)
    assert len(mermaid_charts(md)) == 3
    assert "imported from vllm bench serve with per-request data (every figure computed with servescope's formulas " \
        "from its timestamps); it lacks: ttfo\\_ms" in md


def test_import_aggregate_only(tmp_path: Path) -> None:
    d = json.loads(DETAILED[0].read_text())
    for k in DETAIL_KEYS:
        d.pop(k)
    f = tmp_path / "agg.json"
    f.write_text(json.dumps(d))
    path = import_files([f], sessions_dir=tmp_path / "s", workload="random128")
    s = load_session(path)
    (summ,) = s.summaries()
    assert summ is not None
    assert summ.ttft_ms.mean == pytest.approx(d["mean_ttft_ms"])
    assert summ.ttft_ms.p99 == pytest.approx(d["p99_ttft_ms"])
    assert summ.ttft_ms.min is None and summ.per_user_tok_s.mean is None
    assert s.info.source is not None and s.info.source.rebuilt is False
    assert "per_user_tok_s" in s.info.source.lacks
    assert s.cells["workload"].to_list() == ["random128"]
    md = render_report(s)
    tables(md)
    assert "without per-request data (the tool's aggregates: --save-detailed was not used)" in md
    assert "unknown (no per-request data for these SLOs)" in md


def test_imported_compares_with_imported(tmp_path: Path) -> None:
    a = load_session(import_files(DETAILED, sessions_dir=tmp_path, name="a"))
    b = load_session(import_files(DETAILED[:1], sessions_dir=tmp_path, name="b"))
    comp = compare_sessions([a, b])
    assert [c.load for c in comp.cells] == ["c=1"]
    assert comp.only_in == [("vllm-bench-in128-out32", "c=4", ["a"])]


@pytest.mark.parametrize(("content", "needle"), [
    (None, "no such file"),
    ("not json at all", "not JSON: Expecting value at line 1, column 1"),
    ('{"foo": 1}', "unknown import format"),
    ("[1, 2, 3]", "unknown import format"),
])
def test_bad_import_files(tmp_path: Path, content: str | None, needle: str) -> None:
    f = tmp_path / "in.json"
    if content is not None:
        f.write_text(content)
    with pytest.raises(ServescopeError) as e:
        import_files([f], sessions_dir=tmp_path / "s")
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "s").exists()


def test_duplicate_cells_refused(tmp_path: Path) -> None:
    with pytest.raises(ServescopeError, match="vllm-bench-c1-detailed.json is given twice"):
        import_files([DETAILED[0], DETAILED[0]], sessions_dir=tmp_path)


@pytest.mark.vllm
def test_import_real_vllm_bench(vllm_bench_files, tmp_path: Path) -> None:
    """Fresh `vllm bench serve` files from the real CPU vLLM: detailed ones agree with vLLM's own numbers,
    the aggregate-only one imports with its gaps stated, and a servescope sweep of the same shape on the same
    server lines up with the import cell by cell."""
    path = import_files(vllm_bench_files.detailed, sessions_dir=tmp_path, workload="random128", name="bench")
    _agrees_with_vllm(path, vllm_bench_files.detailed)
    agg = load_session(import_files([vllm_bench_files.aggregate], sessions_dir=tmp_path, name="agg"))
    (summ,) = agg.summaries()
    assert summ is not None
    d = json.loads(vllm_bench_files.aggregate.read_text())
    assert summ.e2e_ms.p90 == pytest.approx(d["p90_e2el_ms"])
    assert summ.tpot_ms.p50 == pytest.approx(d["median_tpot_ms"])

    import subprocess
    import sys

    wl = tmp_path / "random128.toml"
    wl.write_text('[workload]\nname = "random128"\napi = "completions"\ninput_tokens = 128\noutput_tokens = 32\n')
    srv = vllm_bench_files.server
    r = subprocess.run([sys.executable, "-m", "servescope", "run", "--url", srv.url, "-w", str(wl), "-c", "1,4",
                        "-n", "12", "--sessions-dir", str(tmp_path / "ss"), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    ours = load_session(json.loads(r.stdout)["session"])
    comp = compare_sessions([ours, load_session(path)])
    assert [c.load for c in comp.cells] == ["c=1", "c=4"]
    md = render_report(ours, [load_session(path)])
    tables(md)
    mermaid_charts(md)
