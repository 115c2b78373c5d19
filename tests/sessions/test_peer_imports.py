"""Results of GuideLLM, AIPerf and inference-perf, and llm-d benchmark reports, imported as sessions (issue 48), from
the stored files of data/peers/ and data/llmd/ (each folder's SOURCE.md says what wrote them): the cells and requests
each file holds, every rebuilt figure equal to the tool's own per-request numbers, what an aggregates-only file keeps
and lacks, the comparability table between tools, the gate's refusal of a figure defined differently, and the llm-d
export: valid against the published schema (0.1 by default, and 0.2) for a sweep, a repeat and an import, its figures
in the schema's fields and units, and an import's export importing back to the same figures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import polars as pl
import pytest

from servescope.__main__ import main
from servescope.core.errors import ServescopeError
from servescope.reports.compare_doc import comparison_markdown
from servescope.sessions.comparability import WINDOW_STEADY, WINDOW_WHOLE
from servescope.sessions.compare import compare_sessions
from servescope.sessions.gate import gate, parse_fail_on
from servescope.sessions.importers import import_files
from servescope.sessions.llmd import export_reports
from servescope.sessions.measurement import window_label
from servescope.sessions.provenance import ITL_MEAN_GAP, ITL_POOLED, SERVER_USAGE, TTFT_CONTENT
from servescope.sessions.store import Session, load_session

from .mdcheck import tables
from .synth import write_session

DATA = Path(__file__).parent / "data"
PEERS = DATA / "peers"
GUIDELLM = PEERS / "guidellm-0.8.1" / "benchmarks.json"
AIPERF = PEERS / "aiperf-0.13.0"
INFPERF = PEERS / "inference-perf"
LLMD = DATA / "llmd"
SCHEMAS = {v: json.loads((LLMD / f"br_v{v.replace('.', '_')}_json_schema.json").read_text()) for v in ("0.1", "0.2")}
# the top-level keys of each schema version (0.1's are the export contract's: version, scenario, metrics)
TOP = {"0.1": {"version", "scenario", "metrics"}, "0.2": {"version", "run", "scenario", "results"}}


def _imp(tmp_path: Path, *files: Path | str, **kw: Any) -> Session:
    return load_session(import_files(list(files), sessions_dir=tmp_path / "s", **kw))


def _ms(df: pl.DataFrame, a: str, b: str) -> list[float]:
    return ((df[b] - df[a]) / 1e6).to_list()


# ---- GuideLLM -----------------------------------------------------------------------------------------------
def test_guidellm_every_benchmark_a_cell_with_its_requests(tmp_path: Path) -> None:
    s = _imp(tmp_path, GUIDELLM)
    doc = json.loads(GUIDELLM.read_text())
    src = s.info.source
    assert src is not None and src.tool == "guidellm" and src.tool_version == "0.8.1" and src.rebuilt
    assert src.token_basis == SERVER_USAGE and src.warmup == "none" and src.ramp == "none"
    assert src.definitions["itl"] == ITL_MEAN_GAP  # no per-chunk times: said, and the comparability check uses it
    assert s.cells["load_label"].to_list() == ["c=1", "c=2"]
    assert s.cells["workload"].to_list() == ["guidellm-in32-out8"] * 2
    for i, bench in enumerate(doc["benchmarks"]):
        reqs = bench["requests"]["successful"]
        df = s.requests(i).sort("sent_ns")
        assert df.height == len(reqs) == 4
        # each request's TTFT and E2E are GuideLLM's own stamps' differences (to the rounding of a nanosecond)
        ours = sorted(zip(_ms(df, "sent_ns", "first_token_ns"), _ms(df, "sent_ns", "end_ns"), strict=True))
        theirs = sorted((r["time_to_first_token_ms"], r["request_latency"] * 1000) for r in reqs)
        for (a, b), (c, d) in zip(ours, theirs, strict=True):
            assert a == pytest.approx(c, abs=1e-5) and b == pytest.approx(d, abs=1e-5)
        assert df["output_tokens"].to_list() == [r["output_tokens"] for r in reqs]  # the server's usage
        assert [len(c) for c in df["chunk_ns"].to_list()] == [r["info"]["timings"]["token_iterations"] for r in reqs]


# ---- AIPerf -------------------------------------------------------------------------------------------------
def test_aiperf_folder_each_run_a_cell_from_its_records(tmp_path: Path) -> None:
    s = _imp(tmp_path, AIPERF, workload="chat32")
    src = s.info.source
    assert src is not None and src.tool == "aiperf" and src.tool_version == "0.13.0" and src.rebuilt
    assert src.token_basis == SERVER_USAGE and src.tool_token_basis == "client tokenizer"
    assert src.definitions["itl"] == ITL_POOLED and src.ignore_eos is True and src.streaming is True
    assert s.cells["load_label"].to_list() == ["c=1", "c=2"] and s.cells["workload"].to_list() == ["chat32"] * 2
    for i, c in enumerate((1, 2)):
        recs = [json.loads(x) for x in (AIPERF / f"concurrency_{c}" / "profile_export.jsonl").read_text().splitlines()]
        df = s.requests(i).sort("sent_ns")
        assert df.height == len(recs) == 4
        recs.sort(key=lambda r: r["metadata"]["request_start_ns"])
        for row, r in zip(df.iter_rows(named=True), recs, strict=True):
            m = r["metrics"]
            assert (row["first_token_ns"] - row["sent_ns"]) / 1e6 == pytest.approx(m["time_to_first_token"]["value"],
                                                                                   abs=1e-5)
            gaps = [(b - a) / 1e6 for a, b in zip(row["chunk_ns"], row["chunk_ns"][1:], strict=False)]
            assert gaps == pytest.approx(m["inter_chunk_latency"]["value"], abs=1e-5)
            assert row["output_tokens"] == m["usage_completion_tokens"]["value"]  # usage, not AIPerf's tokenizer


def test_aiperf_aggregates_alone_are_kept_with_what_they_lack(tmp_path: Path) -> None:
    lone = tmp_path / "run"
    lone.mkdir()
    shutil.copy(AIPERF / "concurrency_2" / "profile_export_aiperf.json", lone)
    s = _imp(tmp_path, lone / "profile_export_aiperf.json")
    agg = json.loads((lone / "profile_export_aiperf.json").read_text())
    (summ,) = s.summaries()
    assert summ is not None and not s.requests().height
    src = s.info.source
    assert src is not None and not src.rebuilt and "per_request" in src.lacks
    assert src.token_basis == "client tokenizer"  # AIPerf's own counts: no --use-server-token-count
    assert summ.output_tok_s == pytest.approx(agg["output_token_throughput"]["avg"])
    assert summ.ttft_ms.p50 == pytest.approx(agg["time_to_first_token"]["p50"])
    assert summ.tpot_ms.mean == pytest.approx(agg["inter_token_latency"]["avg"])  # AIPerf's ITL is a TPOT
    assert s.cells["load_label"].to_list() == ["c=2"]


# ---- inference-perf -----------------------------------------------------------------------------------------
def test_inference_perf_stages_rebuilt_from_the_per_request_file(tmp_path: Path) -> None:
    s = _imp(tmp_path, INFPERF)
    src = s.info.source
    assert src is not None and src.tool == "inference-perf" and src.rebuilt and src.token_basis == SERVER_USAGE
    assert src.definitions["ttft"] == TTFT_CONTENT  # its clock stops at the first content chunk
    assert s.cells["load_label"].to_list() == ["rate 5/s constant", "rate 10/s constant"]
    for i in (0, 1):
        stage = json.loads((INFPERF / f"stage_{i}_lifecycle_metrics.json").read_text())
        summ = s.summaries()[i]
        assert summ is not None and summ.requests_ok == stage["successes"]["count"] == 12
        # the same formula on the same stamps: servescope's throughput is the stage's own
        assert summ.output_tok_s == pytest.approx(stage["successes"]["throughput"]["output_tokens_per_sec"])
        assert summ.ttft_ms.p50 == pytest.approx(stage["successes"]["latency"]["time_to_first_token"]["median"] * 1000)


def test_inference_perf_stage_files_alone_keep_the_aggregates(tmp_path: Path) -> None:
    d = tmp_path / "reports"
    d.mkdir()
    for f in ("stage_0_lifecycle_metrics.json", "stage_1_lifecycle_metrics.json", "config.yaml"):
        shutil.copy(INFPERF / f, d)
    s = _imp(tmp_path, d)
    src = s.info.source
    assert src is not None and not src.rebuilt and "per_request" in src.lacks
    assert src.definitions["tpot"].startswith("per request (last token - first token)")
    stage = json.loads((INFPERF / "stage_1_lifecycle_metrics.json").read_text())
    summ = s.summaries()[1]
    assert summ is not None
    assert summ.tpot_ms.p50 == pytest.approx(stage["successes"]["latency"]["time_per_output_token"]["median"] * 1000)
    assert summ.output_tok_s == pytest.approx(stage["successes"]["throughput"]["output_tokens_per_sec"])


# ---- llm-d reports ------------------------------------------------------------------------------------------
def test_llmd_example_report_imports_as_its_harness_measured_it(tmp_path: Path) -> None:
    s = _imp(tmp_path, LLMD / "br_v0_2_example.yaml")
    src = s.info.source
    assert src is not None and src.tool == "llmd-report" and src.harness == "inference-perf 0.3.0"
    assert src.tool_name == "llm-d benchmark report (inference-perf 0.3.0)" and not src.rebuilt
    assert s.cells["load_label"].to_list() == ["rate 10/s constant"]  # its native config's load type
    (summ,) = s.summaries()
    assert summ is not None and summ.requests_ok == 500 and summ.requests_failed == 0
    assert summ.ttft_ms.mean == pytest.approx(36.8578234128654)  # 0.0369 s in the report: in ms here
    assert summ.output_tok_s == pytest.approx(2262.448) and s.info.model == "Qwen/Qwen3-0.6B"


def test_llmd_v0_1_example_report_imports_in_its_units(tmp_path: Path) -> None:
    """Schema 0.1 (top-level `metrics`): its throughput is plain numbers per second (`*_per_sec`, read as None
    before), its duration seconds, its ITL in ms/token servescope's ITL per token; the load is its harness's
    (inference-perf's qps_values)."""
    s = _imp(tmp_path, LLMD / "br_v0_1_example.yaml")
    src = s.info.source
    assert src is not None and src.tool == "llmd-report" and src.harness == "inference-perf"
    assert src.format == "llm-d benchmark report (schema 0.1)" and not src.rebuilt
    assert s.cells["load_label"].to_list() == ["rate 1.34/s poisson"] and s.info.model == "deepseek-ai/DeepSeek-R1-0528"
    (summ,) = s.summaries()
    assert summ is not None and summ.requests_ok == 31 and summ.requests_failed == 0  # 32 total, 1 incomplete
    assert summ.output_tok_s == pytest.approx(32.544923821416) and summ.total_tok_s == pytest.approx(676.121568007739)
    assert summ.request_s == pytest.approx(1.0238155253639) and summ.wall_s == pytest.approx(16.531641244888306)
    assert summ.ttft_ms.p50 == pytest.approx(0.203539535985328) and summ.tpot_ms.p90 == pytest.approx(0.152292036800645)
    assert summ.itl_token_ms.mean == pytest.approx(0.0836929455635872) and summ.itl_ms.mean is None
    assert summ.e2e_ms.max == pytest.approx(6.30658466403838)
    assert src.lacks["itl_ms"].startswith("the report's ITL is per token")
    assert src.dates == ["2025-06-10T15:49:43.571451+00:00"]  # metrics.time.start, seconds from the epoch


@pytest.mark.parametrize("version", ["0.1", "0.2"])
@pytest.mark.parametrize("fmt", [None, "llmd-report"])
def test_llmd_reports_of_both_versions_are_recognised_and_forced(tmp_path: Path, version: str,
                                                                 fmt: str | None) -> None:
    f = LLMD / f"br_v{version.replace('.', '_')}_example.yaml"
    s = _imp(tmp_path, f, fmt=fmt)
    assert s.info.source is not None and s.info.source.tool == "llmd-report"
    assert s.info.source.format == f"llm-d benchmark report (schema {version})"
    (summ,) = s.summaries()
    assert summ is not None and summ.output_tok_s is not None and summ.ttft_ms.mean is not None


def test_inference_perf_and_llmd_reports_compare(tmp_path: Path) -> None:
    """The same load (constant 10/s) measured by inference-perf (rebuilt records) and reported by an llm-d report
    of an inference-perf run (aggregates): the table names each tool and every definition that differs."""
    ip = _imp(tmp_path, INFPERF, workload="chat", name="ip")
    ll = _imp(tmp_path, LLMD / "br_v0_2_example.yaml", workload="chat", name="llmd")
    comp = compare_sessions([ip, ll])
    assert [c.load for c in comp.cells] == ["rate 10/s constant"]
    doc = comp.to_dict()["comparability"]
    assert isinstance(doc, dict)
    assert [t["tool"] for t in doc["tools"]] == ["inference-perf", "llm-d benchmark report (inference-perf 0.3.0)"]
    facts = {d["fact"]: d for d in doc["differences"]}
    # its TTFT stops at the first content chunk both ways; percentiles are numpy's linear ones both ways
    assert set(facts) == {"tool", "itl", "tpot", "requests"}  # the report does not say its token counts
    assert facts["tpot"]["figures"] == ["tpot_ms.p50"]
    md = comparison_markdown(comp)
    tables(md)
    assert "## How the sessions were measured" in md and "| TPOT definition |" in md
    assert "| ip | " in md and "inference-perf |" in md  # the sessions' table names each one's tool


# ---- comparability and gate ---------------------------------------------------------------------------------
def _itl_differs(tmp_path: Path) -> tuple[Session, Session]:
    """The inference-perf fixture imported twice, the second as GuideLLM would have measured its ITL (no per-chunk
    times): one definition differs, nothing else."""
    a = _imp(tmp_path, INFPERF, name="a")
    b = _imp(tmp_path, INFPERF, name="b")
    toml = b.path / "session.toml"
    toml.write_text(toml.read_text().replace(f'itl = "{ITL_POOLED}"', f'itl = "{ITL_MEAN_GAP}"'))
    return a, load_session(b.path)


def test_a_definition_that_differs_leaves_its_figures_unjudged(tmp_path: Path) -> None:
    a, b = _itl_differs(tmp_path)
    comp = compare_sessions([a, b])
    c = comp.cells[0]
    assert c.not_comparable == "" and c.why("itl_ms.p99") == "ITL definition"
    assert c.verdict("itl_ms.p99", 1) == "not comparable (ITL definition)" and c.winners["itl_ms.p99"] is None
    assert c.verdict("output_tok_s", 1) == "within noise"  # the same records: judged, and equal
    j = comp.to_dict()
    deltas = j["cells"][0]["metrics"]  # type: ignore[index]
    assert deltas["itl_ms.p99"]["deltas"][0]["comparable"] is False
    assert deltas["output_tok_s"]["deltas"][0]["comparable"] is True
    assert deltas["output_tok_s"]["values"] == [c.values["output_tok_s"][0]] * 2  # the shape scripts read
    md = comparison_markdown(comp)
    assert "measured differently, so not judged: ITL p99 ms" in md


def test_gate_refuses_a_figure_defined_differently_unless_allowed(tmp_path: Path) -> None:
    a, b = _itl_differs(tmp_path)
    with pytest.raises(ServescopeError, match="ITL definition"):
        gate(a, b, parse_fail_on("itl_ms.p99:+10%"))
    assert gate(a, b, parse_fail_on("itl_ms.p99:+10%"), allow={"ITL definition"}).exit_code == 0
    assert gate(a, b, parse_fail_on("output_tok_s:-5%")).exit_code == 0  # a figure the difference does not touch
    assert main(["gate", str(a.path), str(b.path), "--fail-on", "itl_ms.p99:+10%", "--allow-mismatch", "itl"]) == 0


def test_warmup_ramp_and_loop_are_rows_of_the_table_when_they_differ(tmp_path: Path) -> None:
    """The table says how the sessions stand on warmup, ramp and closed or open loop where the tools' files say it
    and they differ (the rows were missing: a warmup that differed showed only as the mismatch below)."""
    a, b = _itl_differs(tmp_path)
    toml = b.path / "session.toml"
    toml.write_text(toml.read_text().replace('warmup = "none"', 'warmup = "10 s"').replace('ramp = "none"',
                                                                                         'ramp = "5 s"'))
    comp = compare_sessions([a, load_session(b.path)])
    assert comp.comparability is not None
    rows = {r.fact.key: r.values for r in comp.comparability.rows}
    assert rows["warmup"] == ["none", "10 s"] and rows["ramp"] == ["none", "5 s"] and "loop" not in rows
    md = comparison_markdown(comp)
    tables(md)
    assert "| warmup | none | 10 s | every figure (no cell is judged) |" in md
    assert "| ramp | none | 5 s | the load (cells of different ramps are not joined) |" in md


def test_gate_names_every_refusal_and_the_names_that_allow_them(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A difference for every figure (warmup) and one for a gated figure's definition: the refusal names both and
    the --allow-mismatch names of each (it named the first alone and suggested host,servescope_version); allowing
    one names the other; what was allowed is listed under the result."""
    a, b = _itl_differs(tmp_path)
    toml = b.path / "session.toml"
    toml.write_text(toml.read_text().replace('warmup = "none"', 'warmup = "8 requests"'))
    b = load_session(b.path)
    gated = parse_fail_on("output_tok_s:-5%,itl_ms.p99:+10%")
    with pytest.raises(ServescopeError) as e:
        gate(a, b, gated)
    assert "warmup: a 0, b 8" in str(e.value) and "itl_ms.p99: not comparable (ITL definition)" in str(e.value)
    assert str(e.value).endswith("pass --allow-mismatch warmup,itl if that is intended")
    with pytest.raises(ServescopeError) as e:
        gate(a, b, gated, allow={"warmup"})
    assert "warmup" not in str(e.value) and str(e.value).endswith("--allow-mismatch itl if that is intended")
    argv = ["gate", str(a.path), str(b.path), "--fail-on", "output_tok_s:-5%,itl_ms.p99:+10%"]
    assert main([*argv, "--allow-mismatch", "itl"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "warmup: a 0, b 8" in err and "ITL definition" not in err
    result = gate(a, b, gated, allow={"warmup", "ITL definition"})
    assert result.exit_code == 0 and result.mismatches == ["warmup: a 0, b 8",
                                                           "itl_ms.p99: not comparable (ITL definition)"]


# ---- the measurement window ----------------------------------------------------------------------------------
RATES = {"output_tok_s", "total_tok_s", "request_s", "goodput_req_s"}


def test_a_steady_window_beside_a_peers_whole_run_leaves_the_rates_unjudged(tmp_path: Path) -> None:
    """servescope's default window (steady: the ramp and the drain left out) beside GuideLLM's whole run: the table
    has a window row naming each, the rates are shown but not judged, the per-request figures are not touched by it."""
    ours = load_session(write_session(tmp_path, "ours", [{"seed": 1, "c": 1}, {"seed": 2, "c": 2}], window="steady"))
    theirs = _imp(tmp_path, GUIDELLM, workload="chat")
    comp = compare_sessions([ours, theirs])
    assert comp.comparability is not None and comp.comparability.shown
    rows = {r.fact.key: r for r in comp.comparability.rows}
    assert rows["window"].values == [WINDOW_STEADY, WINDOW_WHOLE]
    # the rates among the figures compared, and nothing else
    assert {"output_tok_s", "goodput_req_s"} <= set(rows["window"].figures) <= RATES
    for c in comp.cells:
        assert "measurement window" in c.why("output_tok_s") and "measurement window" in c.why("goodput_req_s")
        assert "measurement window" not in c.why("ttft_ms.p50") and "measurement window" not in c.why("e2e_ms.p99")
    doc = comp.to_dict()["comparability"]
    assert isinstance(doc, dict)
    assert {d["fact"]: d["values"] for d in doc["differences"]}["window"] == {
        comp.labels[0]: WINDOW_STEADY, comp.labels[1]: WINDOW_WHOLE}
    md = comparison_markdown(comp)
    tables(md)
    assert f"| measurement window | {WINDOW_STEADY} | {WINDOW_WHOLE} |" in md


def test_servescope_sessions_over_different_windows_show_the_window(tmp_path: Path) -> None:
    """Two servescope sessions, one over steady windows and one over the whole cells (`--window whole`): the table
    shows (it showed nothing: servescope's own sessions), the rates are not judged and the verdict line says so;
    TTFT, over the same kind of requests, is judged; gate refuses a rate unless --allow-mismatch window."""
    a = load_session(write_session(tmp_path, "a", [{"seed": 1, "c": 4}], window="steady"))
    b = load_session(write_session(tmp_path, "b", [{"seed": 2, "c": 4}], window="whole"))
    comp = compare_sessions([a, b])
    assert comp.comparability is not None and comp.comparability.shown
    assert [r.fact.key for r in comp.comparability.rows] == ["tool", "window"]
    (c,) = comp.cells
    assert c.not_comparable == "" and c.verdict("output_tok_s", 1) == "not comparable (measurement window)"
    assert c.winners["output_tok_s"] is None
    assert c.why("ttft_ms.p50") == "" and c.verdict("ttft_ms.p50", 1) in ("better", "worse", "within noise")
    md = comparison_markdown(comp)
    tables(md)
    assert "## How the sessions were measured" in md and "measured differently, so not judged: " in md
    with pytest.raises(ServescopeError, match="measurement window"):
        gate(a, b, parse_fail_on("output_tok_s:-50%"))
    assert gate(a, b, parse_fail_on("output_tok_s:-50%"), allow={"measurement window"}).exit_code == 0
    assert gate(a, b, parse_fail_on("ttft_ms.p50:+500%")).exit_code == 0  # a per-request figure: judged
    assert main(["gate", str(a.path), str(b.path), "--fail-on", "output_tok_s:-50%", "--allow-mismatch",
                 "window"]) == 0


@pytest.mark.parametrize("window", ["steady", "whole", None])
def test_sessions_over_the_same_window_show_nothing_new(tmp_path: Path, window: str | None) -> None:
    """servescope beside servescope over the same window (None: cells written before windows, the whole cell), and
    a `--window whole` session beside a peer's whole run: no window row."""
    a = load_session(write_session(tmp_path, "a", [{"seed": 1, "c": 1}, {"seed": 2, "c": 2}], window=window))
    b = load_session(write_session(tmp_path, "b", [{"seed": 3, "c": 1}, {"seed": 4, "c": 2}], window=window))
    comp = compare_sessions([a, b]).comparability
    assert comp is not None and not comp.shown and not comp.rows
    if window != "steady":
        peer = compare_sessions([a, _imp(tmp_path, GUIDELLM, workload="chat")]).comparability
        assert peer is not None and peer.shown and "window" not in {r.fact.key for r in peer.rows}


def test_the_window_of_an_import_is_its_tools_whole_run_or_unknown(tmp_path: Path) -> None:
    """Each peer reports over its whole run; an llm-d report over its harness's (inference-perf here); a report of a
    harness servescope does not know says nothing, so no difference is claimed."""
    from servescope.sessions.comparability import facts_of

    assert facts_of(_imp(tmp_path, AIPERF))[1]["window"] == WINDOW_WHOLE
    assert facts_of(_imp(tmp_path, INFPERF))[1]["window"] == WINDOW_WHOLE
    assert facts_of(_imp(tmp_path, LLMD / "br_v0_2_example.yaml"))[1]["window"] == WINDOW_WHOLE
    odd = tmp_path / "odd.yaml"
    odd.write_text((LLMD / "br_v0_1_example.yaml").read_text().replace("name: inference-perf", "name: nop"))
    assert facts_of(_imp(tmp_path, odd))[1]["window"] == ""


def test_servescope_sessions_show_nothing_new(tmp_path: Path) -> None:
    a = load_session(write_session(tmp_path, "a", [{"seed": 1}]))
    b = load_session(write_session(tmp_path, "b", [{"seed": 2}]))
    comp = compare_sessions([a, b])
    assert comp.comparability is not None and not comp.comparability.shown and not comp.comparability.rows
    md = comparison_markdown(comp)
    assert "How the sessions were measured" not in md and "| tool |" not in md


# ---- llm-d export -------------------------------------------------------------------------------------------
def _valid(files: list[Path], version: str) -> list[dict[str, Any]]:
    v = jsonschema.Draft202012Validator(SCHEMAS[version])
    out = []
    for f in files:
        doc = json.loads(f.read_text())
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(doc)]
        assert not errors, f"{f.name}: {errors}"
        assert TOP[version] <= set(doc) and doc["version"] == version
        other = "0.2" if version == "0.1" else "0.1"
        assert any(jsonschema.Draft202012Validator(SCHEMAS[other]).iter_errors(doc))  # the versions differ
        out.append(doc)
    return out


def _stats(d: Any, units: str) -> dict[str, Any]:
    return {"units": units, "mean": d.mean, "stddev": d.std, "min": d.min, "p50": d.p50, "p90": d.p90, "p95": d.p95,
            "p99": d.p99, "max": d.max}


@pytest.mark.parametrize("version", ["0.1", "0.2"])
@pytest.mark.parametrize("kind", ["sweep", "repeat", "import"])
def test_export_validates_against_the_published_schema(tmp_path: Path, kind: str, version: str) -> None:
    if kind == "sweep":
        s = load_session(write_session(tmp_path, "sweep", [{"seed": 1, "c": 1}, {"seed": 2, "c": 4}]))
    elif kind == "repeat":
        s = load_session(write_session(tmp_path, "rep", [{"seed": 1, "c": 4}, {"seed": 2, "c": 4}]))
    else:
        s = _imp(tmp_path, GUIDELLM)
    files = export_reports(s, tmp_path / "out", version)
    docs = _valid(files, version)
    assert [f.name for f in files] == [f"cell-{i:04d}.json" for i in range(s.cells.height)]
    for doc, summ in zip(docs, s.summaries(), strict=True):
        assert summ is not None
        if version == "0.2":
            agg = doc["results"]["request_performance"]["aggregate"]
            assert agg["throughput"]["output_token_rate"] == {"units": "tokens/s", "mean": summ.output_tok_s}
            assert agg["latency"]["time_to_first_token"] == _stats(summ.ttft_ms, "ms")
            assert agg["latency"]["inter_token_latency"] == _stats(summ.itl_ms, "ms")
            continue
        m = doc["metrics"]
        assert m["throughput"] == {"output_tokens_per_sec": summ.output_tok_s, "total_tokens_per_sec": summ.total_tok_s,
                                   "input_tokens_per_sec": pytest.approx(summ.total_tok_s - summ.output_tok_s),
                                   "requests_per_sec": summ.request_s}
        assert m["time"] == {"duration": summ.wall_s}
        assert m["requests"] == {"total": summ.requests_ok + summ.requests_failed, "failures": summ.requests_failed,
                                 "input_length": {"units": "count", "mean": summ.input_tokens_mean},
                                 "output_length": {"units": "count", "mean": summ.output_tokens_mean}}
        assert m["latency"] == {"time_to_first_token": _stats(summ.ttft_ms, "ms"),
                                "time_per_output_token": _stats(summ.tpot_ms, "ms/token"),
                                "inter_token_latency": _stats(summ.itl_token_ms, "ms/token"),  # per token
                                "request_latency": _stats(summ.e2e_ms, "ms")}
        load = doc["scenario"]["load"]
        assert load["name"] == ("guidellm" if kind == "import" else "vllm-benchmark")  # the schema's enum
        assert load["metadata"]["tool"] == ("guidellm" if kind == "import" else "servescope")


def test_v0_1_export_puts_known_figures_in_their_fields_and_units(tmp_path: Path) -> None:
    """GuideLLM's own stamps, exported as schema 0.1: TTFT and request latency p50 are GuideLLM's per-request
    figures' medians in ms, the duration is the cell's wall time in seconds and output tokens/s its output tokens
    over it (a rate per second, not per ms; not a Statistics as in 0.2)."""
    s = _imp(tmp_path, GUIDELLM)
    files = export_reports(s, tmp_path / "out")  # the default: schema 0.1
    doc = json.loads(GUIDELLM.read_text())
    for f, bench, i in zip(_valid(files, "0.1"), doc["benchmarks"], range(2), strict=True):
        reqs = bench["requests"]["successful"]
        lat, m = f["metrics"]["latency"], f["metrics"]
        assert lat["time_to_first_token"]["units"] == "ms"
        assert lat["time_to_first_token"]["p50"] == pytest.approx(
            float(np.percentile([r["time_to_first_token_ms"] for r in reqs], 50)), abs=1e-5)
        assert lat["request_latency"]["units"] == "ms"
        assert lat["request_latency"]["p50"] == pytest.approx(
            float(np.percentile([r["request_latency"] * 1000 for r in reqs], 50)), abs=1e-5)
        df = s.requests(i)
        wall = (df["end_ns"].max() - df["scheduled_ns"].min()) / 1e9  # the cell's span, seconds
        assert m["time"]["duration"] == pytest.approx(wall, rel=1e-6)
        out_tokens = sum(r["output_tokens"] for r in reqs)
        assert m["throughput"]["output_tokens_per_sec"] == pytest.approx(out_tokens / wall, rel=1e-6)
        assert m["requests"]["output_length"] == {"units": "count", "mean": out_tokens / len(reqs)}


@pytest.mark.parametrize("version", ["0.1", "0.2"])
@pytest.mark.parametrize("source", ["guidellm", "repeat"])
def test_an_export_imports_back_to_the_same_figures(tmp_path: Path, source: str, version: str) -> None:
    s = _imp(tmp_path, GUIDELLM) if source == "guidellm" else \
        load_session(write_session(tmp_path, "rep", [{"seed": 1, "c": 4}, {"seed": 2, "c": 4}], window="steady"))
    out = tmp_path / "out"
    assert main(["export", str(s.path), "--format", "llmd-report", "--llmd-schema", version, "-o", str(out)]) == 0
    back = _imp(tmp_path, out)
    src = back.info.source
    assert src is not None and src.tool == "llmd-report" and src.format == f"llm-d benchmark report (schema {version})"
    assert src.definitions == measured_definitions(s)  # the definitions the figures were made with travel along
    assert back.cells["workload"].to_list() == s.cells["workload"].to_list()
    assert back.cells["load_label"].to_list() == s.cells["load_label"].to_list()
    itl = "itl_ms" if version == "0.2" else "itl_token_ms"  # 0.1's ITL is per token
    keys = ("output_tok_s", "total_tok_s", "request_s", "input_tokens_mean", "output_tokens_mean", "requests_ok",
            "requests_failed", "wall_s", *(f"{d}.{st}" for d in ("ttft_ms", "tpot_ms", itl, "e2e_ms")
                                           for st in ("mean", "std", "min", "max", "p50", "p90", "p95", "p99")))
    for ours, theirs in zip(s.summaries(), back.summaries(), strict=True):
        assert ours is not None and theirs is not None
        for k in keys:
            assert theirs.value(k) == pytest.approx(ours.value(k), rel=1e-12), k
        assert window_label(theirs) == window_label(ours)  # the window the figures are over travels too
    if source == "repeat":
        assert [c.repeat for c in back.info.cells] == [1, 2]
    comp = compare_sessions([s, back]).comparability
    assert comp is not None and "window" not in {r.fact.key for r in comp.rows}  # measured alike: no window row


def measured_definitions(s: Session) -> dict[str, str]:
    from servescope.sessions.provenance import measured_by

    return measured_by(s.info).definitions


# ---- recognising files, and bad input -----------------------------------------------------------------------
@pytest.mark.parametrize(("files", "fmt", "needle"), [
    ([GUIDELLM, AIPERF], None, "the files come from different tools (AIPerf, GuideLLM)"),
    ([GUIDELLM], "aiperf", "not a AIPerf file (it looks like GuideLLM's)"),
    ([DATA / "vllm-bench-c1-detailed.json"], "guidellm", "not a GuideLLM file (it looks like vllm bench serve's)"),
    ([LLMD], None, "no result file of a known format in it"),
])
def test_files_of_another_tool_are_refused_before_anything_is_written(tmp_path: Path, files: list[Path],
                                                                      fmt: str | None, needle: str) -> None:
    if files == [LLMD]:
        (tmp_path / "empty").mkdir()
        files = [tmp_path / "empty"]
    with pytest.raises(ServescopeError) as e:
        import_files(files, sessions_dir=tmp_path / "s", fmt=fmt)
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(("name", "body", "fmt", "needle"), [
    ("cut.json", b'{"benchmarks": [', None, "cut.json: not JSON: Expecting value at line 1, column 17; the file is "
                                           "damaged or not a result file; servescope imports "),
    ("cut.json", b'{"benchmarks": [', "guidellm", "cut.json: not JSON: Expecting value at line 1, column 17; the "
                                                 "file is damaged or not the benchmarks JSON GuideLLM 0.8 writes"),
    ("profile_export.jsonl", b"{oops\n", "aiperf", "profile_export.jsonl: not JSON Lines (its first record): "
                                                  "Expecting property name enclosed in double quotes at line 1"),
    ("report.yaml", b"a: [\n", None, "report.yaml: not YAML; the file is damaged or not a result file"),
    ("bin.json", b"\xff\xfe\x00", None, "bin.json: not text (not UTF-8); "),
    ("other.json", b'{"foo": 1}', None, "other.json: unknown import format; servescope imports `vllm bench serve"),
    ("other.json", b'{"foo": 1}', "llmd-report", "other.json: unknown import format; the file is damaged or not an "
                                                 "llm-d benchmark report"),
])
def test_a_file_of_no_known_format_is_one_line_naming_it_and_why(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 name: str, body: bytes, fmt: str | None,
                                                                 needle: str) -> None:
    """A damaged file says where it breaks and what to give instead (it read 'unknown import format' whatever the
    cause, and the same with --from naming the tool)."""
    f = tmp_path / name
    f.write_bytes(body)
    argv = ["import", str(f), "--sessions-dir", str(tmp_path / "s"), *(["--from", fmt] if fmt else [])]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"servescope import: error: {f}: ") and err.count("\n") == 1, err
    assert needle in err, err
    assert not (tmp_path / "s").exists()


def test_inference_perf_folder_with_its_partial_llmd_reports(tmp_path: Path) -> None:
    """inference-perf 0.7 writes partial llm-d reports of its stages beside its own reports: the folder imports as
    inference-perf (its per-request file), as with --from (it was refused as files of two tools); a partial report
    alone is one line saying to import the folder instead."""
    partial = PEERS / "inference-perf-0.7.0" / "inference-perf.partial.stage_0.yaml"
    folder = tmp_path / "reports"
    shutil.copytree(INFPERF, folder)
    shutil.copy(partial, folder)
    s = _imp(tmp_path, folder, name="ip")
    alone = _imp(tmp_path, INFPERF, name="alone")
    assert s.info.source is not None and s.info.source.tool == "inference-perf" and s.info.source.rebuilt
    assert s.cells["load_label"].to_list() == alone.cells["load_label"].to_list()
    with pytest.raises(ServescopeError) as e:  # a real llm-d report given beside it is another tool's file
        import_files([folder, LLMD / "br_v0_2_example.yaml"], sessions_dir=tmp_path / "s2")
    assert "different tools" in str(e.value)
    with pytest.raises(ServescopeError) as e:
        import_files([partial], sessions_dir=tmp_path / "s3")
    assert str(e.value).startswith(f"{partial}: a partial report (no scenario") and "import that reports folder" in \
        str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "s2").exists() and not (tmp_path / "s3").exists()


def test_cli_import_from_and_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["import", str(AIPERF), "--from", "aiperf", "--sessions-dir", str(tmp_path / "s"), "--name",
                 "ap"]) == 0
    out = capsys.readouterr().out
    assert "imported 2 cell(s) from AIPerf 0.13.0" in out and "token counts: server usage" in out
    (d,) = (tmp_path / "s").iterdir()
    assert main(["export", d.name, "--sessions-dir", str(tmp_path / "s"), "--format", "llmd-report", "-o",
                 str(tmp_path / "x")]) == 0
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == ["cell-0000.json", "cell-0001.json"]
    assert "2 llm-d benchmark report(s) written to" in capsys.readouterr().err
    # the contract: by default each file has the report's top-level version, scenario and metrics (schema 0.1)
    for f in (tmp_path / "x").iterdir():
        doc = json.loads(f.read_text())
        assert set(doc) == {"version", "scenario", "metrics", "metadata"} and doc["version"] == "0.1"
    assert main(["import", str(AIPERF), "--from", "guidellm", "--sessions-dir", str(tmp_path / "s2")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("servescope import: error: ") and err.count("\n") == 1
    assert not (tmp_path / "s2").exists()


@pytest.mark.parametrize(("argv", "says"), [
    (["--llmd-schema", "0.3"], "servescope export: error: --llmd-schema '0.3': not one of 0.1, 0.2"),
    (["--format", "other", "--llmd-schema", "0.2"],
     "servescope export: error: --llmd-schema applies only to --format llmd-report, not other; leave it out"),
])
def test_export_refuses_a_bad_llmd_schema_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch, argv: list[str],
                                                      says: str) -> None:
    """A schema that is not 0.1 or 0.2, or --llmd-schema with another format (a second format stands in for the
    day there is one): one line, exit 2, nothing written."""
    from servescope.cli import args as cli_args

    monkeypatch.setattr(cli_args, "EXPORT_FORMATS", (*cli_args.EXPORT_FORMATS, "other"))
    s = load_session(write_session(tmp_path, "s", [{"seed": 1, "c": 1}]))
    assert main(["export", str(s.path), *argv, "-o", str(tmp_path / "out")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and err.startswith(says), err
    assert not (tmp_path / "out").exists()


def test_imported_sessions_in_sessions_report_and_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Imported sessions through the commands, as any session: `sessions` names their tool, `report` says where the
    figures come from, and compare's HTML (as its Markdown) heads the results with how the sessions were measured
    and says which figure is not judged and why."""
    a, b = _itl_differs(tmp_path)
    home = ["--sessions-dir", str(tmp_path / "s")]
    assert main(["sessions", *home]) == 0
    listed = capsys.readouterr().out
    assert listed.count("imported from inference-perf") == 2
    assert main(["report", a.path.name, *home]) == 0
    assert "imported from inference-perf with per-request data" in capsys.readouterr().out
    pytest.importorskip("matplotlib")
    html = tmp_path / "c.html"
    assert main(["compare", a.path.name, b.path.name, *home, "--format", "html", "-o", str(html)]) == 0
    text = html.read_text()
    assert "How the sessions were measured" in text and "not comparable (ITL definition)" in text
    assert "so not judged: ITL p99 ms (ITL definition)" in text
    assert main(["compare", a.path.name, b.path.name, *home, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["comparability"]["not_judged"] == {"itl_ms.p99": ["ITL definition"]}


def test_inference_perf_per_request_file_with_its_config_alone(tmp_path: Path) -> None:
    """No stage file: the load is config.yaml's one stage (here the second stage's 10/s, its requests only)."""
    d = tmp_path / "reports"
    d.mkdir()
    reqs = json.loads((INFPERF / "per_request_lifecycle_metrics.json").read_text())
    (d / "per_request_lifecycle_metrics.json").write_text(json.dumps(reqs[12:]))
    cfg = (INFPERF / "config.yaml").read_text()
    (d / "config.yaml").write_text(cfg.replace("  - rate: 5.0\n    duration: 3\n", ""))
    s = _imp(tmp_path, d)
    assert s.cells["load_label"].to_list() == ["rate 10/s constant"] and s.requests(0).height == 12
    (d / "config.yaml").unlink()
    with pytest.raises(ServescopeError, match="the load of its requests is unknown"):
        import_files([d], sessions_dir=tmp_path / "s2")


def test_a_session_imported_before_the_source_table_still_reads(tmp_path: Path) -> None:
    """A `vllm bench serve` import written with the older [import] table (no [source]) reads as vllm bench serve,
    rebuilt, in compare's table and the report's notes."""
    import tomllib

    import tomli_w

    from servescope.reports.report import render_report

    s = _imp(tmp_path, DATA / "vllm-bench-c1-detailed.json", name="old")
    meta = tomllib.loads((s.path / "session.toml").read_text(encoding="utf-8"))  # the file as an older one held it
    src = meta.pop("source")
    assert isinstance(src, dict)
    meta["import"] = {"format": "vllm-bench-serve", "files": src["files"], "detailed": True,
                      "lacks": src["lacks"], "dates": src["dates"]}
    (s.path / "session.toml").write_text(tomli_w.dumps(meta))
    old = load_session(s.path)
    assert old.info.source is None
    comp = compare_sessions([old, _imp(tmp_path, DATA / "vllm-bench-c1-detailed.json", name="new")])
    assert comp.comparability is not None and comp.comparability.tools == ["vllm bench serve"] * 2
    assert not comp.comparability.shown  # one tool, measured alike: nothing new
    assert "imported from vllm bench serve with per-request data" in render_report(old)
