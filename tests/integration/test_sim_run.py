"""`servescope run` end to end against servescope's own simulator: loads, faults, interruption."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from servescope.sessions.store import load_session
from servescope.sim.launcher import start_sim
from tests.integration.helpers import ROOT, Running, events, measured, run_json, servescope, wait_for
from tests.support.meta import stored

# the --fast lane leaves this module out: 5 tests, ~28 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

CELL_KEYS = {"workload", "concurrency", "rate", "requests_ok", "requests_failed", "input_tokens_requested",
             "input_tokens_mean", "output_tokens_mean", "request_s", "output_tok_s", "total_tok_s",
             "goodput_req_s", "ttft_ms", "ttfo_ms", "tpot_ms", "itl_ms", "e2e_ms", "per_user_tok_s",
             "client_queue_ms"}


@pytest.mark.slow
def test_closed_and_open_loop_json(tmp_path: Path) -> None:
    out = run_json("--url", "sim://tiny", "-w", "sharegpt", "-c", "1,8", "-n", "8", "--warmup", "1",
                   "--sessions-dir", str(tmp_path), "--slo", "ttft_ms=2000,tpot_ms=50")
    assert Path(out["session"]).is_dir()
    c1, c8 = out["cells"]
    for c in (c1, c8):
        assert set(c) >= CELL_KEYS
        assert set(c["ttft_ms"]) == {"mean", "p50", "p90", "p99"}
        assert c["requests_ok"] == 8 and c["output_tokens_mean"] == 256
        assert c["input_tokens_mean"] == c["input_tokens_requested"]
    # more users: more aggregate throughput, less per user (the curve the brief talks about)
    assert c8["output_tok_s"] > 2 * c1["output_tok_s"]
    assert c8["per_user_tok_s"]["mean"] < c1["per_user_tok_s"]["mean"]
    assert stored(load_session(out["session"]))["target"]["url"] == "sim://tiny"

    rate = run_json("--url", "sim://tiny", "-w", "sharegpt", "--rate", "20", "--arrival", "constant",
                    "--max-concurrency", "1", "-n", "3", "--sessions-dir", str(tmp_path))
    [c] = rate["cells"]
    assert c["rate"] == 20 and c["concurrency"] is None and c["requests_ok"] == 3
    # 20/s offered, one slot for ~1 s replies: the third request waits ~2 s for the slot, and it shows
    assert c["client_queue_ms"]["p99"] > 1000


def test_duration_limited_cell(tmp_path: Path) -> None:
    out = run_json("--url", "sim://tiny", "-w", "sharegpt", "-c", "4", "--duration", "2s",
                   "--save", str(tmp_path / "s"))
    [c] = out["cells"]
    assert c["requests_ok"] >= 4
    req = load_session(tmp_path / "s").requests(0)
    assert req.height == c["requests_ok"]  # no request cap: the duration ended the cell
    first, last = int(req["scheduled_ns"].min()), int(req["scheduled_ns"].max())
    assert last - first < 2e9  # no request started after the cell's 2 s
    # each user sends until the 2 s are over, then the cell waits for what is in flight, and no longer (the whole
    # cell's wall time: the figures' own, `wall_s`, are over its steady window)
    # a busy machine can leave a 2 s cell no steady window worth the name (too few requests sent in it): its
    # figures are then the whole cell's, and say so
    steady = c["window"]["kind"] == "steady"
    wall = c["whole"]["wall_s"] if steady else c["wall_s"]
    assert 2.0 <= wall <= (int(req["end_ns"].max()) - first) / 1e9 + 0.05, wall
    if steady:
        assert c["wall_s"] == pytest.approx(c["window"]["end_s"] - c["window"]["start_s"]) and c["wall_s"] < wall
    else:
        assert c.get("whole") is None and c["window"]["basis"].startswith("every measured request")


@pytest.mark.slow  # 5 s of the --fast lane on 2 cores
def test_thinking_counts_reasoning_apart(tmp_path: Path) -> None:
    out = run_json("--url", "sim://tiny", "-w", "sharegpt-think", "-c", "2", "-n", "2",
                   "--sessions-dir", str(tmp_path))
    [c] = out["cells"]
    assert c["output_tokens_mean"] == 1024
    assert 0 < c["reasoning_tokens_mean"] < 1024
    assert c["ttfo_ms"]["mean"] > c["ttft_ms"]["mean"] + 100  # first content comes after the reasoning


def test_every_request_failing_stops_the_cell_but_not_the_sweep(tmp_path: Path) -> None:
    with start_sim("tiny", ["--error-rate", "1.0"]) as sim:
        p = servescope("run", "--url", sim.url, "-w", "sharegpt", "-c", "2,4", "-n", "200", "--json",
                       "--sessions-dir", str(tmp_path))
    assert p.returncode == 0, p.stderr
    import json

    out = json.loads(p.stdout)
    assert [c["status"] for c in out["cells"]] == ["stopped", "stopped"]
    for c in out["cells"]:
        assert c["requests_ok"] == 0 and 5 <= c["requests_failed"] < 200
        assert "in a row failed" in c["reason"]
        assert c["errors"] and "HTTP 500" in c["errors"][0]["error"]


@pytest.mark.slow  # 8 s of the --fast lane on 2 cores
def test_server_dies_mid_sweep_keeps_finished_cells(tmp_path: Path) -> None:
    with start_sim("tiny", ["--exit-after-requests", "12"]) as sim:
        p = servescope("run", "--url", sim.url, "-w", "sharegpt", "-c", "4,5,6", "-n", "10", "--json",
                       "--save", str(tmp_path / "s"), "--recover-timeout", "2s")
    assert p.returncode == 1
    err = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert "stopped answering during cell 2 (sharegpt c=5)" in err[0]
    assert "did not come back within 2 s" in err[-1] and "servescope resume" in err[-1]
    s = load_session(tmp_path / "s")
    assert s.status == "failed"
    assert s.cells["status"].to_list() == ["done", "server_lost"]  # cell 3 never started
    assert s.requests(0).height == 10 and s.requests(0)["status"].to_list() == ["ok"] * 10


def _kill_9_after_first_cell(save: Path, requests: int) -> None:
    """Run a 3-cell sweep on sim://tiny and kill -9 servescope once the first cell is on disk."""
    proc = subprocess.Popen([sys.executable, "-m", "servescope", "run", "--url", "sim://tiny", "-w", "sharegpt",
                             "-c", "4,5,6", "-n", str(requests), "--save", str(save)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: (save / "cells.parquet").exists() and pl.read_parquet(save / "cells.parquet").height >= 1,
                 120, "the first cell on disk")
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()


def test_kill_9_loses_at_most_the_running_cell(tmp_path: Path) -> None:
    save = tmp_path / "s"
    _kill_9_after_first_cell(save, 8)
    s = load_session(save)
    assert s.status == "interrupted"  # session.toml still said "running": the process never finished
    done = s.cells.filter(pl.col("status") == "done")
    assert done.height >= 1
    for idx in done["index"].to_list():
        assert s.requests(idx).height == 8


def test_ctrl_c_ends_the_cell_cleanly(tmp_path: Path) -> None:
    save = tmp_path / "s"
    run = Running("run", "--url", "sim://tiny", "-w", "sharegpt", "-c", "2,3", "-n", "50", "--warmup", "0",
                  "--save", str(save))
    with run:  # Ctrl-C once the first cell has measured a request (its event log says so), with more in flight
        wait_for(lambda: measured(events(save), 0) >= 1, 120, "the first cell's first request")
        run.proc.send_signal(signal.SIGINT)
        rc, _, err = run.finish(120)
    assert rc == 130, err
    assert "stopping" in err
    s = load_session(save)
    assert s.status == "interrupted"
    assert s.cells["status"].to_list() == ["stopped"]  # the second cell never started
    assert s.requests(0).height >= 1


def test_api_key_is_never_written(tmp_path: Path) -> None:
    secret = "sk-servescope-test-SECRET-1234"
    out = run_json("--url", "sim://tiny", "-w", "sharegpt", "-c", "1", "-n", "2", "--api-key-env", "MY_KEY",
                   "--save", str(tmp_path / "s"), env={"MY_KEY": secret})
    assert out["cells"][0]["requests_ok"] == 2
    for f in (tmp_path / "s").rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f


def _sim_cmd(port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "servescope.sim", "--profile", "tiny", "--port", str(port), *extra]


def _answers(port: int) -> bool:
    import urllib.request

    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_server_restarts_mid_sweep_and_the_lost_cell_is_rerun(tmp_path: Path) -> None:
    """The sim exits after 12 requests (as a crashed vLLM, during cell 2); once servescope says it waits for it,
    something restarts it on the same port."""
    import json

    from tests.support.vllm_server import free_port

    port = free_port()
    sims = [subprocess.Popen(_sim_cmd(port, "--exit-after-requests", "12"), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)]
    try:
        wait_for(lambda: _answers(port), 60, "the simulator")
        run = Running("run", "--url", f"http://127.0.0.1:{port}", "-w", "sharegpt", "-c", "4,5,6", "-n", "8",
                      "--save", str(tmp_path / "s"), "--recover-timeout", "300s", "--json")
        with run:
            run.line(r"stopped answering during cell 2 .*waiting up to 300 s", 180)
            assert sims[0].wait(30) == 1  # it crashed as told, and its port is free
            sims.append(subprocess.Popen(_sim_cmd(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            rc, stdout, stderr = run.finish(300)
    finally:
        for p in sims:
            p.terminate()
            p.wait()
    assert rc == 0, stderr[-3000:]
    out = json.loads(stdout.strip().splitlines()[-1])
    assert out["status"] == "completed"
    statuses = [c["status"] for c in out["cells"]]
    assert statuses.count("server_lost") == 1 and statuses.count("done") == 3
    s = load_session(tmp_path / "s")
    assert s.status == "completed"
    assert s.cells.sort("index")["status"].to_list() == ["done", "done", "done"]
    kinds = [e["kind"] for e in stored(s)["events"] if e["kind"] != "ramp"]  # how each workload's users start
    assert kinds == ["server_lost", "server_back"]
    assert list((tmp_path / "s" / "requests").glob("cell-0001-lost1.parquet"))  # what the lost attempt measured
    for i in range(3):
        assert s.requests(i)["status"].to_list() == ["ok"] * 8


@pytest.mark.slow
def test_resume_after_kill_9(tmp_path: Path) -> None:
    save = tmp_path / "s"
    _kill_9_after_first_cell(save, 8)
    assert load_session(save).status == "interrupted"
    p = servescope("resume", str(save), "--json")
    assert p.returncode == 0, p.stderr
    assert "cells left" in p.stderr
    s = load_session(save)
    assert s.status == "completed"
    assert s.cells.sort("index")["status"].to_list() == ["done", "done", "done"]
    assert s.requests().height == 24
    assert [e["kind"] for e in stored(s)["events"] if e["kind"] != "ramp"] == ["resumed"]
