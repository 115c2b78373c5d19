"""Quality results in sessions (issue 17): quality.json beside (or instead of) a sweep's cells, a cell's quality under
load, and how `sessions`, `report`, `compare` and `gate` show them. The probe is faked here: these are
`QualityResult`s built by hand, stored and read through the real SessionWriter and load_session."""

from __future__ import annotations

import json
import math
import tempfile
import tomllib
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servescope.core.errors import ServescopeError
from servescope.core.quality import Divergence, QualityResult, TaskScore, Trace, wilson
from servescope.core.results import CellQuality, CellResult, TaskTally
from servescope.core.textsafe import md_escape
from servescope.reports.compare_doc import comparison_markdown, headline
from servescope.reports.report import render_report
from servescope.sessions.compare import compare_sessions
from servescope.sessions.gate import gate, parse_fail_on
from servescope.sessions.quality import load_quality, pct, split_task
from servescope.sessions.store import SessionWriter, load_session

from .conftest import GOLDEN, CellSpec, SessionSpec, build_session, fp8_spec, gptq_spec
from .mdcheck import tables
from .test_cli_compare import one_line_error, run

SETTINGS = {"tasks": ["arithmetic", "retrieval"], "contexts": [1024, 16384], "n": 100, "top_k": 5, "seed": 0,
            "reference": "/data/sessions/bf16", "user_sets": [], "api_key": "sk-secret"}
TRACE = Trace(prompt="The capital of France is", tokens=[" Paris", "."],
              top=[{" Paris": -0.05, " Lyon": -3.2}, {".": -0.1, ",": -2.5}])


def ts(correct: int, n: int) -> TaskScore:
    lo, hi = wilson(correct, n)
    return TaskScore(accuracy=correct / n, n=n, correct=correct, lo=lo, hi=hi)


def result(tasks: dict[str, TaskScore], kl: float | None = 0.012, ppl: float | None = 6.3, **kw: Any) -> QualityResult:
    ref = None
    if kl is not None:
        ref = Divergence(kl_mean=kl, kl_p99=kl * 5, top1_agreement=0.97, first_divergence_mean=12.5, positions=256,
                         prompts=8, **({"kl_ci": kw.pop("kl_ci")} if "kl_ci" in kw else {}))
    return QualityResult(perplexity=ppl, perplexity_tokens=40960 if ppl is not None else 0, tasks=tasks,
                         reference=ref, reference_session="bf16" if ref is not None else None, traces=[TRACE], **kw)


def quality_session(base: Path, name: str, res: QualityResult, model: str = "Qwen/Qwen3-8B-FP8",
                    settings: dict[str, Any] | None = None, tags: dict[str, str] | None = None) -> Path:
    """A session of kind quality, as the engine writes it: create (no cells), write_quality, finish."""
    meta = {"kind": "quality", "name": name, "model": model, "max_model_len": 32768, "tags": tags or {},
            "target": {"url": "http://127.0.0.1:8000", "version": "0.11.0", "engine": "vllm"}}
    w = SessionWriter.create(base / name, meta)
    w.write_quality(res, settings if settings is not None else SETTINGS)
    w.finish("completed")
    return base / name


def add_quality(path: Path, res: QualityResult) -> None:
    """Quality results into an existing sweep session (`servescope quality --save SESSION`)."""
    w = SessionWriter.open(path)
    w.write_quality(res, SETTINGS)


# ---- storage ---------------------------------------------------------------------------------------------
def test_quality_round_trip_and_settings(tmp_path: Path) -> None:
    res = result({"arithmetic": ts(19, 20), "retrieval@16K": ts(20, 20)})
    p = quality_session(tmp_path, "q", res)
    s = load_session(p)
    assert s.info.kind == "quality" and s.status == "completed" and s.cells.height == 0
    assert s.quality() == res and s.has_quality
    assert s.info.quality is not None and s.info.quality["contexts"] == [1024, 16384]
    toml = tomllib.loads((p / "session.toml").read_text())
    assert toml["kind"] == "quality" and toml["quality"]["reference"] == "/data/sessions/bf16"
    assert "api_key" not in toml["quality"] and "sk-secret" not in (p / "session.toml").read_text()
    assert not list(p.glob("*.tmp"))  # written to a temporary name and renamed


def test_old_sessions_read_as_sweeps_without_quality(fixed_pair: Any) -> None:
    a, _ = fixed_pair
    assert a.info.kind == "sweep" and a.info.quality is None
    assert a.quality() is None and not a.has_quality


def test_a_sweep_session_keeps_its_kind_when_it_gets_quality(tmp_path: Path) -> None:
    p = build_session(tmp_path, gptq_spec())
    add_quality(p, result({"arithmetic": ts(10, 10)}))
    s = load_session(p)
    assert s.info.kind == "sweep" and s.cells.height == 6 and s.quality() is not None
    assert s.info.quality is not None and s.info.quality["n"] == 100


def test_non_finite_figures_round_trip(tmp_path: Path) -> None:
    p = quality_session(tmp_path, "nan", result({}, kl=None, ppl=float("nan")))
    q = load_session(p).quality()
    assert q is not None and q.perplexity is not None and math.isnan(q.perplexity)
    assert "| perplexity | - over 40,960 tokens" in render_report(load_session(p))


@pytest.mark.parametrize("data", [b"{not json", b"[1, 2]", b'{"tasks": {"a": {"accuracy": "x"}}}', b"\xff\xfe",
                                  b""])
def test_damaged_quality_json_is_one_line(tmp_path: Path, data: bytes) -> None:
    p = quality_session(tmp_path, "q", result({"arithmetic": ts(1, 2)}))
    (p / "quality.json").write_bytes(data)
    s = load_session(p)  # the session still opens: its quality is read when shown
    with pytest.raises(ServescopeError) as e:
        s.quality()
    msg = e.value.message
    assert "\n" not in msg and "quality.json" in msg and "cannot be read" in msg and "restore it" in msg
    assert "quality.json" in one_line_error(["report", str(p)])


# ---- the sessions list ------------------------------------------------------------------------------------
def test_sessions_list_shows_quality_sessions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "sessions"
    quality_session(base, "20261202-100000-quality-fp8", result({"arithmetic": ts(19, 20), "json": ts(10, 10)}))
    sweep = build_session(base, gptq_spec(), "20261201-120000-gptq")
    add_quality(sweep, result({"arithmetic": ts(20, 20)}))
    broken = quality_session(base, "20261203-100000-broken", result({}))
    (broken / "quality.json").write_text("{")
    assert run(["sessions", "--sessions-dir", str(base)]) == 0
    out = capsys.readouterr().out
    lines = {x[:15]: x for x in out.splitlines()}
    line = lines["20261202-100000"]
    assert "Qwen3-8B-FP8" in line and " -     quality: ppl 6.30, 2 task…" in line and " completed " in line
    assert "+quality longin,sharegpt," in lines["20261201-120000"]
    assert "quality: damaged" in lines["20261203-100000"]
    assert run(["sessions", "--sessions-dir", str(base), "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    q = rows["20261202-100000-quality-fp8"]
    assert q["kind"] == "quality" and q["cells"] == 0 and q["workloads"] == []
    assert q["quality"]["tasks"]["arithmetic"] == {"accuracy": 0.95, "n": 20}
    assert q["quality_text"] == "ppl 6.30, 2 tasks 96.7%, KL 0.012"
    assert rows["gptq"]["kind"] == "sweep" and "quality" in rows["gptq"]
    assert "quality.json" in rows["20261203-100000-broken"]["quality_broken"]


# ---- the report -------------------------------------------------------------------------------------------
def test_report_of_a_quality_session(tmp_path: Path) -> None:
    res = result({"arithmetic": ts(100, 100), "retrieval@16K": ts(92, 100), "user|task": ts(3, 4)}, kl=0.031,
                 perplexity_ci=(6.2, 6.4))
    p = quality_session(tmp_path, "q", res, model="org/a|b")
    md = render_report(load_session(p))
    for gone in ("## Results", "## Metric definitions", "## Workloads", "| load |", "| SLOs |", "KV cache"):
        assert gone not in md
    assert "a\\|b on http://127.0.0.1:8000: quality probe (session `q`)." in md
    assert "| perplexity | 6.300 (95% interval 6.200-6.400) over 40,960 tokens | exp of the mean negative" in md
    assert "| reference session | bf16 |" in md and "| KL mean | 0.031 nats |" in md
    assert "| top-1 agreement | 97% |" in md and "| positions compared | 256 of 8 prompts |" in md
    assert "| first divergence | token 12.5 (mean) |" in md
    assert "Probe settings: tasks arithmetic, retrieval; contexts 1024, 16384; questions per task 100;" in md
    tbl = next(t for t in tables(md) if t.header[0] == "task")
    assert tbl.header == ["task", "context", "accuracy", "n", "95% interval (Wilson)"]
    assert tbl.rows[1] == ["retrieval", "16K tokens", "92%", "100", "85.0-95.9%"]
    assert tbl.rows[2][0] == "user|task"  # escaped: the table holds
    assert "## Notes\n\nNothing abnormal." in md and "did not complete" not in md
    assert md.index("## Setup") < md.index("## Quality") < md.index("## Notes")


def test_report_without_perplexity_says_why(tmp_path: Path) -> None:
    res = result({"json": ts(5, 5)}, kl=None, ppl=None,
                 perplexity_note="the server returns no prompt log-probabilities (vLLM's prompt_logprobs)")
    md = render_report(load_session(quality_session(tmp_path, "q", res)))
    assert "| perplexity | not measured | the server returns no prompt log-probabilities" in md
    assert "No reference was given: this session's 1 greedy traces can serve as one" in md
    tables(md)


def test_report_json_and_csv_of_a_quality_session(tmp_path: Path) -> None:
    p = quality_session(tmp_path, "q", result({"arithmetic": ts(9, 10)}))
    doc = json.loads(render_report(load_session(p), fmt="json"))["report"]
    assert doc["kind"] == "quality" and doc["cells"] == []
    assert doc["quality"]["tasks"]["arithmetic"]["correct"] == 9 and doc["quality"]["settings"]["n"] == 100
    assert "api_key" not in doc["quality"]["settings"]
    assert render_report(load_session(p), fmt="csv").startswith("session,session_dir")


def test_report_of_a_sweep_holding_quality_has_both(tmp_path: Path) -> None:
    p = build_session(tmp_path, gptq_spec())
    add_quality(p, result({"arithmetic": ts(10, 10)}))
    md = render_report(load_session(p), label_key="quant")
    assert "## Results: sharegpt" in md and "## Quality" in md
    assert md.index("## Results: sharegpt") < md.index("## Quality") < md.index("## Notes")
    tables(md)
    assert "## Quality" not in render_report(load_session(build_session(tmp_path, fp8_spec())))


# ---- quality under load (a cell's summary) -------------------------------------------------------------------
def under_load(correct: int, n: int, tasks: dict[str, tuple[int, int]] | None = None, **kw: Any) -> dict[str, Any]:
    t = tasks if tasks is not None else {"arithmetic": (correct, n)}
    return {"accuracy": correct / n if n else 0.0, "n": n, "correct": correct, "failed": 0,
            "tasks": {k: {"accuracy": c / m, "n": m, "correct": c} for k, (c, m) in t.items()}, **kw}


def load_spec(name: str, q: list[dict[str, Any] | None], quant: str) -> SessionSpec:
    return SessionSpec(name, tags={"quant": quant},
                       cells=[CellSpec("sharegpt", c, quality=x) for c, x in zip((1, 4), q, strict=True)])


def test_cell_quality_round_trips_and_reaches_cells_parquet(tmp_path: Path) -> None:
    q4 = under_load(45, 50, {"arithmetic": (20, 25), "retrieval@1K": (25, 25)}, kl_mean=0.002, kl_p99=0.01,
                    top1_agreement=0.99, first_divergence_mean=14.0, positions=64, prompts=4)
    only_traces = {"accuracy": 0.0, "n": 0, "correct": 0, "tasks": {}, "failed": 1, "kl_mean": 0.0,
                   "positions": 16, "top1_agreement": 1.0}
    p = build_session(tmp_path, load_spec("load", [only_traces, q4], "FP8"))  # an empty task table: no crash
    s = load_session(p)
    summ = s.summaries()
    assert summ[1] is not None and summ[1].quality == CellQuality.from_dict(q4) and summ[1].to_dict()["quality"] == q4
    assert summ[1].quality.tasks["retrieval@1K"] == TaskTally(accuracy=1.0, n=25, correct=25)  # typed to the leaves
    assert CellResult.from_dict(summ[1].to_dict()) == summ[1]
    assert "quality" not in CellResult.from_dict({"requests_ok": 1}).to_dict()  # absent stays absent
    cells = pl.read_parquet(p / "cells.parquet")
    assert cells["quality_accuracy"].to_list() == [0.0, 0.9] and cells["quality_n"].to_list() == [0, 50]
    assert "quality_tasks" not in cells.columns  # kept whole in summary_json only
    lq = load_quality(summ[1])
    assert lq is not None and lq.score.correct == 45 and lq.tasks["retrieval@1K"].n == 25
    md = render_report(s)
    tbl = next(t for t in tables(md) if t.header[:2] == ["load", "accuracy under load"])
    assert tbl.rows[0][:2] == ["c=1", "-"] and tbl.rows[0][-1] == "1"
    assert tbl.rows[1][:4] == ["c=4", "90% (45/50)", "78.6-95.7%", "arithmetic 20/25, retrieval@1K 25/25"]
    assert tbl.rows[1][4:6] == ["0.002 over 64 positions", "99%"]
    csv = render_report(s, fmt="csv")
    assert "quality.accuracy" in csv.splitlines()[0] and "quality.tasks.arithmetic.correct" in csv.splitlines()[0]


@pytest.mark.parametrize("junk", [None, "x", [], {"n": "many"}, {"n": -3, "correct": 2}, {"n": 2.5}])
def test_cell_quality_is_read_leniently(junk: Any) -> None:
    assert load_quality(CellResult.from_dict({"quality": junk})) is None


def test_compare_accuracy_under_load(tmp_path: Path) -> None:
    a = build_session(tmp_path, load_spec("a", [under_load(50, 50), under_load(49, 50)], "BF16"))
    b = build_session(tmp_path, load_spec("b", [under_load(49, 50), under_load(30, 50)], "FP8"))
    comp = compare_sessions([load_session(a), load_session(b)], label_key="quant")
    assert comp.quality is not None and comp.quality.missing == []  # no quality.json anywhere: none is missing
    rows = {r.key: r for r in comp.quality.rows}
    assert rows["load:sharegpt:c=1"].verdicts == [None, "within noise"]
    assert rows["load:sharegpt:c=4"].verdicts == [None, "worse"] and rows["load:sharegpt:c=4"].best == 0
    md = comparison_markdown(comp)
    assert "| sharegpt c=4 accuracy under load | **98% (49/50)** | 60% (30/50) | -38.0 pts worse | BF16 |" in md
    assert "sharegpt c=4 accuracy under load 60% vs 98% (worse, beyond noise)" in headline(comp)[0]
    tables(md)


def test_simulator_quality_figures_are_said_to_be_synthetic(tmp_path: Path) -> None:
    """The simulator makes its quality figures up (a perplexity of 50,804): wherever they are shown beside a real
    server's, a note says so, naming the simulated session; a real server's session carries no such note."""
    real = build_session(tmp_path, load_spec("real", [under_load(50, 50), under_load(49, 50)], "BF16"))
    spec = load_spec("sim", [under_load(49, 50), under_load(30, 50)], "FP8")
    spec.url = "sim://tiny"
    sim = build_session(tmp_path, spec)
    comp = compare_sessions([load_session(real), load_session(sim)], label_key="quant")
    assert comp.quality is not None
    assert [n for n in comp.quality.notes if "synthetic" in n] == [
        "FP8: synthetic: the simulator (sim://) makes these quality figures up; they measure no model"]
    assert "synthetic" not in render_report(load_session(real))
    assert "**Synthetic: the simulator (sim://) makes these quality figures up" in render_report(load_session(sim))


# ---- compare ---------------------------------------------------------------------------------------------
def two_quality(tmp_path: Path, a: QualityResult, b: QualityResult, **kw: Any) -> tuple[Any, Any]:
    pa = quality_session(tmp_path, "gptq", a, model=kw.get("model_a", "Qwen/Qwen3-8B-GPTQ"), tags={"quant": "GPTQ"})
    pb = quality_session(tmp_path, "fp8", b, model=kw.get("model_b", "Qwen/Qwen3-8B-FP8"), tags={"quant": "FP8"})
    return load_session(pa), load_session(pb)


def test_compare_significant_and_within_noise(tmp_path: Path) -> None:
    a, b = two_quality(tmp_path, result({"retrieval@16K": ts(100, 100), "arithmetic": ts(10, 10)}, kl=0.012),
                       result({"retrieval@16K": ts(92, 100), "arithmetic": ts(9, 10)}, kl=0.031))
    comp = compare_sessions([a, b], label_key="quant")
    assert comp.cells == [] and comp.quality is not None
    rows = {r.key: r for r in comp.quality.rows}
    r16 = rows["task:retrieval@16K"]
    assert r16.verdicts == [None, "worse"] and r16.best == 0 and r16.delta_text(1) == "-8.0 pts worse"
    ar = rows["task:arithmetic"]
    assert ar.verdicts == [None, "within noise"] and ar.best is None and ar.no_best == "within noise"
    assert ar.delta_text(1) == "-10.0 pts within noise"
    head = headline(comp)
    assert head == ["FP8 vs GPTQ: no speed cells in common; quality: KL 0.031 vs 0.012, perplexity 6.300 vs 6.300, "
                    "retrieval@16K 92% vs 100% (worse, beyond noise), arithmetic 90% vs 100% (within noise)"]
    md = comparison_markdown(comp)
    assert "| retrieval@16K | **100% (100/100)** | 92% (92/100) | -8.0 pts worse | GPTQ |" in md
    assert "| arithmetic | 100% (10/10) | 90% (9/10) | -10.0 pts within noise | within noise |" in md
    assert "| KL vs reference, mean (nats) | 0.012 | 0.031 | +0.019 nats (no interval) | no interval |" in md
    assert "No speed figures to compare: the sessions share no cell" in md
    assert "Capacity, knee and peak" not in md and "Deltas are against" not in md
    tables(md)
    # the other way round: better, beyond noise
    back = compare_sessions([b, a], label_key="quant")
    assert "retrieval@16K 100% vs 92% (better, beyond noise)" in headline(back)[0]


def test_compare_judges_perplexity_and_kl_by_their_intervals(tmp_path: Path) -> None:
    a, b = two_quality(tmp_path, result({}, kl=0.010, ppl=6.30, perplexity_ci=(6.25, 6.35), kl_ci=(0.008, 0.012)),
                       result({}, kl=0.031, ppl=6.33, perplexity_ci=(6.28, 6.38), kl_ci=(0.025, 0.037)))
    comp = compare_sessions([a, b], label_key="quant")
    assert comp.quality is not None
    rows = {r.key: r for r in comp.quality.rows}
    assert rows["kl_mean"].verdicts == [None, "worse"] and rows["kl_mean"].best == 0
    assert rows["perplexity"].verdicts == [None, "within noise"] and rows["perplexity"].no_best == "within noise"
    assert rows["kl_p99"].verdicts == [None, None] and rows["kl_p99"].no_best == "no interval"
    assert "KL 0.031 vs 0.01 (worse, beyond noise), perplexity 6.330 vs 6.300 (within noise)" in headline(comp)[0]


def test_compare_json_gains_quality_only_when_held(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, b = two_quality(tmp_path, result({"retrieval@16K": ts(100, 100)}), result({"retrieval@16K": ts(92, 100)}))
    assert run(["compare", str(a.path), str(b.path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    q = doc["quality"]
    assert [s["session"] for s in q["sessions"]] == ["gptq", "fp8"] and q["missing"] == []
    row = next(r for r in q["rows"] if r["key"] == "task:retrieval@16K")
    assert row["values"] == [1.0, 0.92] and row["deltas"] == [{"session": "fp8", "delta": pytest.approx(-0.08),
                                                                "verdict": "worse"}]
    assert q["sessions"][0]["quality"]["tasks"]["retrieval@16K"]["correct"] == 100
    assert doc["cells"] == [] and "share no cell" in doc["no_common_cells"]
    assert run(["compare", str(a.path), str(b.path)]) == 0
    assert "## Quality" in capsys.readouterr().out
    # sessions without quality: the JSON keeps exactly its keys
    base = tmp_path / "plain"
    pa, pb = build_session(base, gptq_spec()), build_session(base, fp8_spec())
    assert run(["compare", str(pa), str(pb), "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert list(plain) == ["sessions", "slos", "slos_source", "metrics", "significance", "mismatches",
                           "comparability", "config_diff", "cells", "only_in", "answers", "thinking", "notes"]


def test_quality_session_vs_sweep_without_quality(tmp_path: Path) -> None:
    q = load_session(quality_session(tmp_path, "q", result({"arithmetic": ts(9, 10)})))
    sweep = load_session(build_session(tmp_path, fp8_spec()))
    comp = compare_sessions([sweep, q])
    assert comp.quality is not None and comp.quality.missing == ["fp8"]
    assert headline(comp) == ["q vs fp8: no speed cells in common; quality: only q holds quality results"]
    md = comparison_markdown(comp)
    assert "- fp8 holds no quality results: run `servescope quality --save`" in md
    assert "| arithmetic | - | 90% (9/10) | - | - |" in md
    tables(md)


def test_sweeps_holding_quality_put_it_next_to_speed(tmp_path: Path) -> None:
    a = build_session(tmp_path, gptq_spec())
    b = build_session(tmp_path, fp8_spec())
    add_quality(a, result({"retrieval@16K": ts(100, 100)}, kl=0.012))
    add_quality(b, result({"retrieval@16K": ts(92, 100)}, kl=0.031))
    comp = compare_sessions([load_session(b), load_session(a)], label_key="quant")
    assert comp.cells and comp.no_common == ""
    line = headline(comp)[0]
    assert line.startswith("GPTQ-Int4 vs FP8: output tok/s ")
    assert line.endswith("(median over 2 common cells); quality: KL 0.012 vs 0.031, perplexity 6.300 vs 6.300, "
                         "retrieval@16K 100% vs 92% (better, beyond noise)")
    md = comparison_markdown(comp)
    assert md.index("## Quality") < md.index("Deltas are against") < md.index("## sharegpt")
    assert "\n\n\n" not in md
    tables(md)
    rep = render_report(load_session(b), [load_session(a)], label_key="quant")
    assert rep.count("## Quality") == 2  # the session's own section, and the comparison's block
    tables(rep)


def test_model_and_task_names_do_not_break_the_tables(tmp_path: Path) -> None:
    a, b = two_quality(tmp_path, result({"x|y`z": ts(3, 4), "retrieval@16K": ts(1, 2)}),
                       result({"x|y`z": ts(4, 4)}), model_a="a|b", model_b="<b>*c*</b>")
    a.meta["name"] = "ses|sion"
    comp = compare_sessions([a, b])
    md = comparison_markdown(comp)
    for t in tables(md):
        if t.header[0] == "figure":
            assert t.header[1] == "ses|sion"
            assert t.rows[1][0] == "x|y\\`z" and t.rows[1][1] == "75% (3/4)"  # the cell's source: `\|` unescaped
        if t.header[0] == "label":
            assert t.rows[0][2] == "a|b" and t.rows[1][2] == md_escape("<b>*c*</b>")


def test_sessions_that_share_no_cell_and_hold_no_quality_still_refuse(tmp_path: Path) -> None:
    a = build_session(tmp_path, SessionSpec("a", cells=[CellSpec("sharegpt", 1)]))
    b = build_session(tmp_path, SessionSpec("b", cells=[CellSpec("longout", 1)]))
    with pytest.raises(ServescopeError, match="share no cell"):
        compare_sessions([load_session(a), load_session(b)])


def test_gate_refuses_quality_only_sessions(tmp_path: Path) -> None:
    a, b = two_quality(tmp_path, result({"arithmetic": ts(9, 10)}), result({"arithmetic": ts(9, 10)}))
    with pytest.raises(ServescopeError, match="share no cell") as e:
        gate(a, b, parse_fail_on("output_tok_s:-5%"))
    assert "Only their quality" not in e.value.message


def test_goldens_untouched_by_quality_code(fixed_pair: Any) -> None:
    a, b = fixed_pair
    comp = compare_sessions([a, b], label_key="quant")
    assert comp.quality is None and "quality" not in comp.to_dict()
    assert comparison_markdown(comp) == (GOLDEN / "compare-gptq-vs-fp8.md").read_text(encoding="utf-8")


def test_formats() -> None:
    assert [pct(x) for x in (1.0, 0.92, 0.9166, None, float("nan"))] == ["100%", "92%", "91.7%", "-", "-"]
    assert split_task("retrieval@16K") == ("retrieval", "16K")
    assert split_task("needle@1536") == ("needle", "1536")
    assert split_task("mine@home") == ("mine@home", "")


# ---- fuzz: quality.json and a cell's quality from outside ------------------------------------------------------
_num = st.one_of(st.none(), st.integers(-5, 200), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=3))
_score = st.fixed_dictionaries({}, optional={k: _num for k in ("accuracy", "n", "correct", "lo", "hi")})
_trace = st.fixed_dictionaries({"prompt": st.sampled_from(["p", "q"]), "tokens": st.lists(st.sampled_from("ab"),
                                                                                         max_size=3),
                                "top": st.lists(st.dictionaries(st.sampled_from("ab"), st.floats(-1e3, 1e3),
                                                                max_size=2), max_size=3)})
_quality = st.fixed_dictionaries({}, optional={
    "perplexity": _num, "perplexity_tokens": _num, "perplexity_note": st.text(max_size=8),
    "tasks": st.dictionaries(st.text(max_size=6), _score, max_size=3),
    "reference": st.one_of(st.none(), st.fixed_dictionaries({k: _num for k in (
        "kl_mean", "kl_p99", "top1_agreement", "first_divergence_mean", "positions", "prompts")})),
    "reference_session": st.one_of(st.none(), st.text(max_size=6)),
    "traces": st.lists(_trace, max_size=2)})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.one_of(_quality, st.recursive(st.none() | st.integers() | st.text(max_size=4),
                                            lambda c: st.lists(c, max_size=3) | st.dictionaries(
                                                st.text(max_size=4), c, max_size=3), max_leaves=8)))
def test_any_quality_json_reads_or_is_one_line(tmp_path: Path, doc: Any) -> None:
    with tempfile.TemporaryDirectory(dir=tmp_path) as tmp:
        a = quality_session(Path(tmp), "a", result({"arithmetic": ts(3, 4)}))
        b = quality_session(Path(tmp), "b", result({"arithmetic": ts(4, 4)}))
        (b / "quality.json").write_text(json.dumps(doc))
        try:
            load_session(b).quality()
        except ServescopeError as e:
            assert "\n" not in e.message and "quality.json" in e.message
            return
        md = render_report(load_session(b), [load_session(a)])
        tables(md)
        json.loads(render_report(load_session(b), fmt="json"))
        compare_sessions([load_session(a), load_session(b)]).to_dict()


@settings(max_examples=60, deadline=None)
@given(q=st.one_of(_num, st.fixed_dictionaries({}, optional={
    "n": _num, "correct": _num, "accuracy": _num, "kl_mean": _num, "positions": _num, "failed": _num,
    "tasks": st.one_of(_num, st.dictionaries(st.text(max_size=4), st.one_of(_num, _score), max_size=3))})))
def test_any_cell_quality_reads(q: Any) -> None:
    lq = load_quality(CellResult.from_dict({"quality": q}))
    if lq is not None:
        assert 0 <= lq.correct <= lq.n and 0.0 <= lq.score.lo <= lq.score.hi <= 1.0
        assert all(0 <= t.correct <= t.n for t in lq.tasks.values())


def test_a_count_past_what_a_float_holds_reads_as_none() -> None:
    # found by the fuzz test above: a damaged session's count, too big for float arithmetic, is no count
    lq = load_quality(CellResult.from_dict({"quality": {"n": 6.703903964971299e153, "correct": 1.0}}))
    assert lq is None or (lq.n == 0 and lq.score.lo == 0.0 and lq.score.hi == 1.0)
