"""How long and over what a cell is measured, through the real CLI against the simulator: `--precision` stops a cell
at its target (and marks one whose ceiling came first `imprecise`), the steady window against the whole cell,
interference probes (`--probe-rate`), the saturation mark and `--stop-after-saturation` on the KV-limited profile,
and `run` reproducing `tune`'s figure at tune's answer (one regime for both)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servescope.engine.spec import RunContext, SweepSpec
from servescope.engine.tune import Setting
from servescope.engine.tunerun import LiveMeasurer
from servescope.reports.report import render_report
from servescope.sessions.store import load_session
from servescope.workloads.spec import Workload, fixed
from tests.integration.helpers import run_json

# the --fast lane leaves this module out: 3 tests, ~31 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

SHORT = '[workload]\nname = "short"\ninput_tokens = 64\noutput_tokens = 32\n'
CONTRACT = {"target", "reached", "requests", "figure"}


def _workload(tmp_path: Path, text: str = SHORT, name: str = "w.toml") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.slow  # about 40 s on 2 busy cores: the cell runs until its figures are precise
def test_a_cell_stops_at_its_target_and_one_whose_ceiling_comes_first_is_imprecise(tmp_path: Path) -> None:
    w = _workload(tmp_path)
    out = run_json("--url", "sim://tiny", "-w", w, "-c", "2", "--precision", "10%", "-n", "3000",
                   "--sessions-dir", str(tmp_path / "a"))
    [c] = out["cells"]
    assert c["status"] == "done" and "imprecise" not in c["reason"]
    assert set(c["precision"]) == CONTRACT  # exactly the names scripts rely on
    p = c["precision"]
    assert p["target"] == 0.1 and p["reached"] <= 0.1 and p["figure"] in ("output_tok_s", "ttft_ms.p50")
    assert p["requests"] == c["requests_ok"] + c["requests_failed"] < 3000  # stopped long before its ceiling
    for fig in ("output_tok_s", "ttft_ms.p50"):
        lo, hi = c["intervals"][fig]
        assert lo <= (c["output_tok_s"] if fig == "output_tok_s" else c["ttft_ms"]["p50"]) <= hi
    assert c["window"]["kind"] == "steady" and "precise enough" in c["window"]["basis"]

    # a ceiling of 40 requests and a target of 0.5%: the ceiling comes first, and the cell says what it reached
    out = run_json("--url", "sim://tiny", "-w", w, "-c", "2", "--precision", "output_tok_s:0.5%,ttft_ms.p50:0.5%",
                   "-n", "40", "--sessions-dir", str(tmp_path / "b"))
    [c] = out["cells"]
    assert c["status"] == "done" and c["reason"].startswith("imprecise: ")
    p = c["precision"]
    assert p["target"] == 0.005 and p["requests"] == 40 and p["reached"] > 0.005
    assert f"+-{p['reached'] * 100:.1f}%" in c["reason"] and "the ceiling (40 requests) came first" in c["reason"]


def test_steady_figures_equal_the_whole_cells_on_an_open_loop_without_ramp_and_differ_with_one(
        tmp_path: Path) -> None:
    """An open loop with no ramp is at its target rate from its first send: its steady window holds every request,
    so every per-request figure is the whole cell's; with a ramp, the requests sent during it are left out."""
    w = _workload(tmp_path)
    out = run_json("--url", "sim://tiny", "-w", w, "--rate", "20", "--arrival", "constant", "-n", "40",
                   "--sessions-dir", str(tmp_path))
    [c] = out["cells"]
    win, whole = c["window"], c["whole"]
    assert win["kind"] == "steady" and win["requests"] == 40 and win["ramp_requests"] == 0
    for key in ("ttft_ms", "tpot_ms", "e2e_ms", "per_user_tok_s", "ttfo_ms"):
        assert c[key] == whole[key], key
    assert c["requests_ok"] == whole["requests_ok"] == 40

    out = run_json("--url", "sim://tiny", "-w", w, "--rate", "20", "--arrival", "constant", "-n", "40", "--ramp", "1s",
                   "--sessions-dir", str(tmp_path))
    [c] = out["cells"]
    win, whole = c["window"], c["whole"]
    assert win["ramp_requests"] >= 5 and win["requests"] == 40 - win["ramp_requests"] - win["drain_requests"]
    assert c["ttft_ms"] != whole["ttft_ms"] and c["requests_ok"] == whole["requests_ok"] == 40  # counts: the cell's

    # --window whole: today's figures over every request and the cell's wall time
    out = run_json("--url", "sim://tiny", "-w", w, "--rate", "20", "--arrival", "constant", "-n", "40", "--ramp", "1s",
                   "--window", "whole", "--sessions-dir", str(tmp_path))
    [c] = out["cells"]
    assert c["window"]["kind"] == "whole" and "whole" not in c and c["window"]["requests"] == c["requests_ok"] == 40


def test_interference_probes_are_reported_per_cell(tmp_path: Path) -> None:
    w = _workload(tmp_path)
    out = run_json("--url", "sim://tiny", "-w", w, "-c", "2", "-n", "30", "--probe-rate", "5",
                   "--sessions-dir", str(tmp_path))
    [c] = out["cells"]
    pr = c["probes"]
    assert pr["rate"] == 5 and pr["sent"] >= 1 and pr["ok"] == pr["sent"] - pr["failed"] and pr["ok"] >= 1
    assert pr["input_tokens"] == 64 and pr["output_tokens"] == 16
    assert 0 < pr["ttft_ms"]["p50"] <= pr["e2e_ms"]["p50"]
    assert c["requests_ok"] == 30  # the probes are not the cell's requests


def test_a_lone_user_on_the_dense_profile_is_not_saturated(tmp_path: Path) -> None:
    w = _workload(tmp_path)
    out = run_json("--url", "sim://rtx-pro-6000/qwen3.5-27b-gptq-int4", "-w", w, "-c", "1", "-n", "8",
                   "--sessions-dir", str(tmp_path))
    [c] = out["cells"]
    assert c["saturated"] is False and c["saturation"]["basis"] == "server waiting"


@pytest.mark.slow  # about 2.5 minutes: a real-time sweep of the KV-limited profile past its KV budget
def test_the_kv_limited_profile_saturates_and_the_sweep_stops_one_load_past_it(tmp_path: Path) -> None:
    """The KV-limited profile (12,752 tokens of KV cache) holds 24 requests of 512 + 16 tokens: at 16 users its
    queue is empty, at 32 one stands through the cell (the simulator's own waiting gauge) and its throughput no
    longer rises with the load, so c=32 is saturated; --stop-after-saturation runs c=64 and skips c=128, saying so."""
    w = _workload(tmp_path, '[workload]\nname = "kv"\ninput_tokens = 512\noutput_tokens = 16\n')
    out = run_json("--url", "sim://dgx-spark/gemma-4-31b-awq", "-w", w, "-c", "16,32,64,128", "--duration", "20s",
                   "--stop-after-saturation", "--sessions-dir", str(tmp_path), timeout=900)
    by = {c["concurrency"]: c for c in out["cells"]}
    assert by[16]["saturated"] is False
    assert by[32]["saturated"] is True and "queue never emptied" in by[32]["saturation"]["reason"]
    assert by[32]["saturation"]["waiting_min"] >= 1 and by[32]["saturation"]["elasticity"] < 0.5
    assert by[64]["status"] == "done"
    assert by[128]["status"] == "skipped" and "saturated" in by[128]["reason"] and "32 users" in by[128]["reason"]
    # the report says it: the saturated cell marked, the skipped load with why, the knee at the saturation mark
    md = render_report(load_session(Path(out["session"])))
    assert "| c=32 **saturated** |" in md or "| c=32 **imprecise** **saturated** |" in md
    assert "| c=128 **skipped** | skipped after saturation (--stop-after-saturation): the load 32 users was" in md
    assert "the server saturated at c=32" in md


@pytest.mark.slow  # about 90 s: two launches of the dense profile, tune's measurement and run's
def test_run_at_tunes_answer_gives_a_goodput_inside_tunes_interval(tmp_path: Path) -> None:
    """The issue's case: the dense GPTQ profile at 1,024 in / 128 out, `--max-num-seqs 16`, 8 users, TTFT <= 1,500 ms
    and TPOT <= 40 ms. Users started together (lockstep) put 8 prefills of 1,024 tokens on one step and missed the
    TTFT SLO (goodput 0.23 req/s where tune said 1.77); measured in one regime, `run`'s goodput lies inside the
    interval tune reports for the cell."""
    launch = "servescope sim --profile rtx-pro-6000/qwen3.5-27b-gptq-int4 --max-num-seqs 16"
    wl = Workload("w1k", "completions", fixed(1024), fixed(128), source="inline")
    base = SweepSpec(workloads=(wl,), launch="servescope sim --profile rtx-pro-6000/qwen3.5-27b-gptq-int4",
                     slos={"ttft_ms": 1500.0, "tpot_ms": 40.0}, requests=48, telemetry_interval_s=None)
    measurer = LiveMeasurer(base, RunContext(), tmp_path / "tune", "goodput", 48)
    try:
        m = measurer.measure(Setting((("--max-num-seqs", "16"),)), 8)
    finally:
        measurer.close()
    assert m.ci is not None
    lo, hi = m.ci
    w = _workload(tmp_path, '[workload]\nname = "w1k"\ninput_tokens = 1024\noutput_tokens = 128\n')
    out = run_json("--launch", launch, "-w", w, "-c", "8", "-n", "48", "--slo", "ttft_ms=1500,tpot_ms=40",
                   "--sessions-dir", str(tmp_path / "run"), timeout=900)
    [c] = out["cells"]
    assert lo <= c["goodput_req_s"] <= hi, (c["goodput_req_s"], m.ci)
    assert c["goodput_req_s"] > 1.0  # far from lockstep's 0.23 req/s
    assert c["window"]["kind"] == "steady" and c["window"]["ramp_s"]
