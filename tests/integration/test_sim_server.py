"""Telemetry, launching and server-config sweeps against the simulator (fast stand-in for vLLM)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from servescope.sessions.store import load_session
from tests.integration.helpers import run_json, servescope
from tests.support.meta import stored

# the --fast lane leaves this module out: 3 tests, ~15 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow


def test_telemetry_is_sampled_and_summarised(tmp_path: Path) -> None:
    (tmp_path / "w.toml").write_text('[workload]\nname = "long512"\ninput_tokens = 128\noutput_tokens = 512\n')
    # 8 replies of 512 tokens at once: about 2 s of decoding, some 10 samples at 0.2 s
    out = run_json("--url", "sim://tiny", "-w", str(tmp_path / "w.toml"), "-c", "8", "-n", "8",
                   "--telemetry-interval", "0.2s", "--save", str(tmp_path / "s"))
    [c] = out["cells"]
    s = load_session(tmp_path / "s")
    import json

    summary = json.loads(s.cells["summary_json"][0])
    tel = summary["telemetry"]
    assert tel["available"] and tel["samples"] >= 5
    assert tel["running_max"] == 8 and tel["kv_cache_usage_peak"] > 0
    assert tel["requests_success"] == 8 == c["requests_ok"]
    assert tel["generation_tokens"] == 8 * 512
    assert summary["gpu"]["available"] is False and "NVML" in summary["gpu"]["reason"]
    kv = stored(s)["kv_budget"]
    assert kv["kv_cache_tokens"] > 0 and kv["max_concurrency_by_workload"]["long512"] > 8
    assert stored(s)["gpu"]["available"] is False
    import polars as pl

    t = pl.read_parquet(tmp_path / "s" / "telemetry.parquet")
    assert t.height >= 5 and t["num_requests_running"].max() == 8


@pytest.mark.slow  # 6 s of the --fast lane on 2 cores
def test_kv_pressure_shows_preemptions(tmp_path: Path) -> None:
    """A KV cache too small for the load: preemptions and waiting requests appear in the cell."""
    import json

    from servescope.sim.launcher import start_sim

    (tmp_path / "w.toml").write_text('[workload]\nname = "grow"\ninput_tokens = 128\noutput_tokens = 384\n')
    with start_sim("tiny", ["--kv-cache-tokens", "2048"]) as sim:  # 16 x 512 tokens need four times that
        run_json("--url", sim.url, "-w", str(tmp_path / "w.toml"), "-c", "16", "-n", "16", "--telemetry-interval",
                 "0.25s", "--save", str(tmp_path / "s"))
    s = load_session(tmp_path / "s")
    tel = json.loads(s.cells["summary_json"][0])["telemetry"]
    assert tel["preemptions"] > 0 and tel["waiting_max"] > 0 and tel["kv_cache_usage_peak"] > 0.9
    assert stored(s)["kv_budget"]["kv_cache_tokens"] == 2048


@pytest.mark.slow
def test_launch_with_server_variants(tmp_path: Path) -> None:
    launch = f"{sys.executable} -m servescope.sim --profile tiny"
    out = run_json("--launch", launch, "--server-variant", "--max-num-seqs 1", "--server-variant", "--max-num-seqs 8",
                   "-w", "sharegpt", "-c", "8", "-n", "8", "--save", str(tmp_path / "s"))
    one, eight = out["cells"]
    assert one["requests_ok"] == eight["requests_ok"] == 8
    # one sequence at a time queues everybody: far slower in aggregate than 8 in a batch
    assert eight["output_tok_s"] > 3 * one["output_tok_s"]
    s = load_session(tmp_path / "s")
    assert stored(s)["server"]["launch"] == launch
    assert stored(s)["server"]["variants"] == ["--max-num-seqs 1", "--max-num-seqs 8"]
    assert s.cells["server_variant"].to_list() == ["--max-num-seqs 1", "--max-num-seqs 8"]
    assert (tmp_path / "s" / "server-0.log").is_file() and (tmp_path / "s" / "server-1.log").is_file()
    assert "GPU KV cache size" in (tmp_path / "s" / "server-0.log").read_text()


@pytest.mark.slow  # 8 s of the --fast lane on 2 cores
def test_launched_server_that_crashes_is_relaunched(tmp_path: Path) -> None:
    launch = f"{sys.executable} -m servescope.sim --profile tiny --exit-after-requests 12"
    out = run_json("--launch", launch, "-w", "sharegpt", "-c", "4,5", "-n", "8", "--save", str(tmp_path / "s"))
    assert out["status"] == "completed"
    s = load_session(tmp_path / "s")
    assert s.cells.sort("index")["status"].to_list() == ["done", "done"]
    assert [e["kind"] for e in stored(s)["events"] if e["kind"] != "ramp"][:2] == ["server_lost", "server_back"]
    assert s.requests().height == 16


def test_launch_errors_are_one_line(tmp_path: Path) -> None:
    p = servescope("run", "--launch", f"{sys.executable} -m servescope.sim --profile nosuch", "-n", "1",
                   "--save", str(tmp_path / "s"))
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    p = servescope("run", "--server-variant", "--max-num-seqs 4", "-n", "1")
    assert p.returncode == 2 and "server variants need a launch command" in p.stderr


def test_telemetry_off_samples_only_cell_boundaries(tmp_path: Path) -> None:
    import json

    run_json("--url", "sim://tiny", "-w", "sharegpt", "-c", "4", "-n", "8", "--telemetry-interval", "off",
             "--save", str(tmp_path / "s"))
    s = load_session(tmp_path / "s")
    tel = json.loads(s.cells["summary_json"][0])["telemetry"]
    assert tel["samples"] == 2 and tel["requests_success"] == 8  # exact deltas all the same
    assert stored(s)["telemetry"]["interval_s"] == "cell boundaries"


@pytest.mark.slow
def test_sweep_file_launches_server_variants(tmp_path: Path) -> None:
    """`servescope run --sweep` with a [server] table: servescope launches the server once per variant."""
    import tomli_w

    launch = f"{sys.executable} -m servescope.sim --profile tiny --port 0"
    sweep = {
        "workloads": ["sharegpt"],
        "load": {"concurrency": [8], "requests": 8},
        "tags": {"box": "sim"},
        "server": {"launch": launch, "recover_timeout": "60s",
                   "variants": [{"args": "--max-num-seqs 1"}, {"args": "--max-num-seqs 8"}]},
    }
    f = tmp_path / "sweep.toml"
    f.write_text(tomli_w.dumps(sweep))
    out = run_json("--sweep", str(f), "--save", str(tmp_path / "s"), "--telemetry-interval", "off")
    one, eight = out["cells"]
    assert one["requests_ok"] == eight["requests_ok"] == 8
    assert eight["output_tok_s"] > 3 * one["output_tok_s"]
    s = load_session(tmp_path / "s")
    assert stored(s)["server"]["variants"] == ["--max-num-seqs 1", "--max-num-seqs 8"]
    assert stored(s)["tags"] == {"box": "sim"}
    # the variant is a dimension of the report: its own section per variant, the variants in the setup
    from tests.sessions.mdcheck import mermaid_charts, tables

    p = servescope("report", str(tmp_path / "s"), "-o", str(tmp_path / "r.md"))
    assert p.returncode == 0, p.stderr
    md = (tmp_path / "r.md").read_text()
    assert "## Results: sharegpt \\[--max-num-seqs 1\\]" in md and "## Results: sharegpt \\[--max-num-seqs 8\\]" in md
    assert "| server variants | 1: --max-num-seqs 1; 2: --max-num-seqs 8" in md
    tables(md)
    mermaid_charts(md)
    # and of a comparison: the two sessions align variant by variant (the second one smaller: flags override
    # the file's load)
    small = run_json("--sweep", str(f), "-n", "2", "--save", str(tmp_path / "s2"), "--telemetry-interval", "off")
    assert [c["requests_ok"] for c in small["cells"]] == [2, 2]
    p = servescope("compare", str(tmp_path / "s"), str(tmp_path / "s2"), "--json")
    assert p.returncode == 0, p.stderr
    import json

    cmp_ = json.loads(p.stdout)
    assert sorted(c["workload"] for c in cmp_["cells"]) == ["sharegpt [--max-num-seqs 1]", "sharegpt [--max-num-seqs 8]"]
    # flags override the file, and are checked as strictly as without it: one line, exit 2
    p = servescope("run", "--sweep", str(f), "-c", "2,x")
    assert p.returncode == 2 and "--concurrency: bad value 'x'" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.slow
def test_server_killed_near_a_cells_end_is_caught(tmp_path: Path) -> None:
    """c=8: the 10 requests left after the crash fail fast, fewer than the early-stop threshold (16) and
    before the watchdog's second miss; the cell must still be marked lost and re-run, not counted done."""
    launch = f"{sys.executable} -m servescope.sim --profile tiny --exit-after-requests 30"
    out = run_json("--launch", launch, "-w", "sharegpt", "-c", "8,9", "-n", "20", "--save", str(tmp_path / "s"))
    assert out["status"] == "completed"
    s = load_session(tmp_path / "s")
    assert s.cells.sort("index")["status"].to_list() == ["done", "done"]
    assert "server_lost" in [e["kind"] for e in stored(s)["events"]]
    assert s.requests().filter(s.requests()["status"] == "ok").height == 40
