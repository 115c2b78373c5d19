"""Results of GuideLLM, AIPerf and inference-perf, and llm-d benchmark reports, imported as sessions (issue 48), from
the stored files of data/peers/ and data/llmd/ (each folder's SOURCE.md says what wrote them): the cells and requests
each file holds, every rebuilt figure equal to the tool's own per-request numbers, what an aggregates-only file keeps
and lacks, the comparability table between tools, the gate's refusal of a figure defined differently, and the llm-d
export: valid against the published schema for a sweep, a repeat and an import, and an import's export importing back
to the same figures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import polars as pl
import pytest

from servescope.__main__ import main
from servescope.core.errors import ServescopeError
from servescope.reports.compare_doc import comparison_markdown
from servescope.sessions.compare import compare_sessions
from servescope.sessions.gate import gate, parse_fail_on
from servescope.sessions.importers import import_files
from servescope.sessions.llmd import export_reports
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
SCHEMA = json.loads((LLMD / "br_v0_2_json_schema.json").read_text())


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


def test_servescope_sessions_show_nothing_new(tmp_path: Path) -> None:
    a = load_session(write_session(tmp_path, "a", [{"seed": 1}]))
    b = load_session(write_session(tmp_path, "b", [{"seed": 2}]))
    comp = compare_sessions([a, b])
    assert comp.comparability is not None and not comp.comparability.shown and not comp.comparability.rows
    md = comparison_markdown(comp)
    assert "How the sessions were measured" not in md and "| tool |" not in md


# ---- llm-d export -------------------------------------------------------------------------------------------
def _valid(files: list[Path]) -> list[dict[str, Any]]:
    v = jsonschema.Draft202012Validator(SCHEMA)
    out = []
    for f in files:
        doc = json.loads(f.read_text())
        errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(doc)]
        assert not errors, f"{f.name}: {errors}"
        assert {"version", "scenario", "results"} <= set(doc) and doc["version"] == "0.2"
        out.append(doc)
    return out


@pytest.mark.parametrize("kind", ["sweep", "repeat", "import"])
def test_export_validates_against_the_published_schema(tmp_path: Path, kind: str) -> None:
    if kind == "sweep":
        s = load_session(write_session(tmp_path, "sweep", [{"seed": 1, "c": 1}, {"seed": 2, "c": 4}]))
    elif kind == "repeat":
        s = load_session(write_session(tmp_path, "rep", [{"seed": 1, "c": 4}, {"seed": 2, "c": 4}]))
    else:
        s = _imp(tmp_path, GUIDELLM)
    files = export_reports(s, tmp_path / "out")
    docs = _valid(files)
    assert [f.name for f in files] == [f"cell-{i:04d}.json" for i in range(s.cells.height)]
    for doc, summ in zip(docs, s.summaries(), strict=True):
        assert summ is not None
        agg = doc["results"]["request_performance"]["aggregate"]
        assert agg["throughput"]["output_token_rate"]["mean"] == summ.output_tok_s
        assert agg["latency"]["time_to_first_token"] == {
            "units": "ms", "mean": summ.ttft_ms.mean, "stddev": summ.ttft_ms.std, "min": summ.ttft_ms.min,
            "p50": summ.ttft_ms.p50, "p90": summ.ttft_ms.p90, "p95": summ.ttft_ms.p95, "p99": summ.ttft_ms.p99,
            "max": summ.ttft_ms.max}


@pytest.mark.parametrize("source", ["guidellm", "repeat"])
def test_an_export_imports_back_to_the_same_figures(tmp_path: Path, source: str) -> None:
    s = _imp(tmp_path, GUIDELLM) if source == "guidellm" else \
        load_session(write_session(tmp_path, "rep", [{"seed": 1, "c": 4}, {"seed": 2, "c": 4}]))
    out = tmp_path / "out"
    assert main(["export", str(s.path), "--format", "llmd-report", "-o", str(out)]) == 0
    back = _imp(tmp_path, out)
    src = back.info.source
    assert src is not None and src.tool == "llmd-report"
    assert src.definitions == measured_definitions(s)  # the definitions the figures were made with travel along
    assert back.cells["workload"].to_list() == s.cells["workload"].to_list()
    assert back.cells["load_label"].to_list() == s.cells["load_label"].to_list()
    keys = ("output_tok_s", "total_tok_s", "request_s", "input_tokens_mean", "output_tokens_mean", "requests_ok",
            "requests_failed", "wall_s", *(f"{d}.{st}" for d in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
                                           for st in ("mean", "std", "min", "max", "p50", "p90", "p95", "p99")))
    for ours, theirs in zip(s.summaries(), back.summaries(), strict=True):
        assert ours is not None and theirs is not None
        for k in keys:
            assert theirs.value(k) == pytest.approx(ours.value(k), rel=1e-12), k
    if source == "repeat":
        assert [c.repeat for c in back.info.cells] == [1, 2]


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
    assert main(["import", str(AIPERF), "--from", "guidellm", "--sessions-dir", str(tmp_path / "s2")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("servescope import: error: ") and err.count("\n") == 1
    assert not (tmp_path / "s2").exists()


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
    import tomli_w

    from servescope.reports.report import render_report
    from servescope.sessions.store import read_meta

    s = _imp(tmp_path, DATA / "vllm-bench-c1-detailed.json", name="old")
    meta = read_meta(s.path / "session.toml")
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
