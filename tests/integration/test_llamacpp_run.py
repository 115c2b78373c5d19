"""servescope against a real llama.cpp server (built by .ci/setup_llamacpp.sh): recognised with no flag, exact
input lengths as its own tokenizer counts them (completions and chat), exact output lengths, every request
measured (its pooled connections closed by the server are retried, never counted as failures), the output
tokens equal to its `llamacpp:tokens_predicted_total` delta, and the client's TTFT at or above its own prompt
time."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import metrics, run_json, servescope
from tests.support.meta import stored

pytestmark = pytest.mark.skipif(os.environ.get("SERVESCOPE_SKIP_LLAMACPP") == "1",
                                reason="SERVESCOPE_SKIP_LLAMACPP=1: real llama.cpp tests skipped on purpose")

WORKLOADS = """
[[workload]]
name = "comp"
input_tokens = { dist = "uniform", min = 150, max = 300 }
output_tokens = 24

[[workload]]
name = "chat"
api = "chat"
input_tokens = 180
output_tokens = 12
"""


@pytest.fixture
def llama(llamacpp_f16: Any) -> Any:
    """The test session's llama-server (tests/conftest.py): -c 4096 shared by 4 slots."""
    return llamacpp_f16


def test_a_sweep_against_llamacpp_is_exact_and_loses_no_request(llama: Any, tmp_path: Path) -> None:
    (tmp_path / "w.toml").write_text(WORKLOADS)
    before = metrics(llama.url)
    out = run_json("--url", llama.url, "-w", str(tmp_path / "w.toml"), "-c", "1,3", "-n", "9",
                   "--telemetry-interval", "off")
    after = metrics(llama.url)
    cells = out["cells"]
    assert len(cells) == 4
    for c in cells:
        assert c["status"] == "done" and c["requests_ok"] == 9 and c["requests_failed"] == 0, c
        assert c["input_tokens_mean"] == c["input_tokens_requested"], c  # as llama.cpp's tokenizer counts
        assert c["output_tokens_mean"] == (24 if c["workload"] == "comp" else 12)
    predicted = after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"]
    assert predicted == sum(c["requests_ok"] * c["output_tokens_mean"] for c in cells)
    n = sum(c["requests_ok"] for c in cells)
    server_prompt_ms = 1000 * (after["llamacpp:prompt_seconds_total"] - before["llamacpp:prompt_seconds_total"]) / n
    client_ttft_ms = sum(c["ttft_ms"]["mean"] * c["requests_ok"] for c in cells) / n
    assert client_ttft_ms >= server_prompt_ms, (client_ttft_ms, server_prompt_ms)
    # its own per-request prompt time (`timings.prompt_ms`) is kept, and each client TTFT is at or above it
    from servescope.core.metrics import per_request
    from servescope.sessions.store import load_session

    pr = per_request(load_session(out["session"]).requests())
    pairs = [(t, s) for t, s in zip(pr["ttft_ms"].to_list(), pr["server_prompt_ms"].to_list(), strict=True)]
    assert len(pairs) == n and all(s is not None and t >= s for t, s in pairs), pairs[:5]
    assert all(c["server"]["ttft_ms_mean"] is not None for c in cells)  # the server's TTFT beside the client's


def test_the_engine_is_recognised_and_can_be_forced(llama: Any, tmp_path: Path) -> None:
    (tmp_path / "w.toml").write_text(WORKLOADS)
    p = servescope("run", "--url", llama.url, "-w", str(tmp_path / "w.toml"), "-c", "1", "-n", "2",
                   "--telemetry-interval", "off", timeout=120)
    assert p.returncode == 0, p.stderr
    assert "(llama.cpp " in p.stdout and "tokenizer: llama.cpp /tokenize" in p.stdout, p.stdout[:400]
    forced = run_json("--url", llama.url, "-w", str(tmp_path / "w.toml"), "-c", "1", "-n", "2", "--engine", "llamacpp",
                      "--telemetry-interval", "off")
    assert all(c["input_tokens_mean"] == c["input_tokens_requested"] for c in forced["cells"])
    p = servescope("run", "--url", llama.url, "-w", str(tmp_path / "w.toml"), "-c", "1", "-n", "2", "--engine",
                   "openai", "--telemetry-interval", "off", timeout=120)
    assert p.returncode == 0, p.stderr  # forced to a plain OpenAI server: no llama.cpp tokenizer, lengths estimated
    assert "(OpenAI-compatible server)" in p.stdout, p.stdout[:300]  # sized on its usage, or estimated without one
    assert "input lengths are calibrated" in p.stderr or "input lengths are estimated" in p.stderr, p.stderr[-600:]


def test_its_metrics_are_read_live_and_per_cell(llama: Any, tmp_path: Path) -> None:
    (tmp_path / "w.toml").write_text(WORKLOADS)
    before = metrics(llama.url)
    out = run_json("--url", llama.url, "-w", str(tmp_path / "w.toml"), "-c", "2", "-n", "6",
                   "--telemetry-interval", "0.25s")
    after = metrics(llama.url)
    srv = [c["server"] for c in out["cells"]]
    assert all(s is not None for s in srv), out["cells"]
    total = after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"]
    # each workload's ramp is timed by one request sent alone first, counted by no cell (a /metrics sample after it)
    assert sum(s["generation_tokens"] for s in srv) == 6 * 24 + 6 * 12 == total - (24 + 12)
    assert all(s["requests_success"] is None for s in srv)  # llama.cpp counts no requests: said as unknown
    from servescope.sessions.store import load_session

    kv = stored(load_session(out["session"]))["kv_budget"]  # its KV budget: -c shared by the --parallel slots
    assert (kv["slots"], kv["slot_tokens"], kv["kv_cache_tokens"]) == (4, 1024, 4096)
    assert kv["max_concurrency_by_workload"] == {"comp": 4.0, "chat": 4.0}


def _processing(port: int) -> float:
    try:
        return metrics(f"http://127.0.0.1:{port}").get("llamacpp:requests_processing", 0.0)
    except OSError:
        return 0.0


def _llama_pids(port: int) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd and cmd[0].endswith(b"llama-server") and str(port).encode() in cmd:
            pids.append(int(d.name))
    return pids


def test_launch_two_variants_and_survive_a_kill_9(tmp_path: Path) -> None:
    """servescope launches llama-server itself (its --metrics added), once per variant, and relaunches it when
    it is killed mid-cell; the lost cell runs again and no finished cell is lost."""
    import signal
    import threading
    import time

    import polars as pl

    from servescope.core.launchspec import free_port
    from servescope.sessions.store import load_session
    from tests.support import llamacpp_server as ls

    binary, models = ls.setup()
    port = free_port()
    (tmp_path / "w.toml").write_text('[workload]\nname = "l"\ninput_tokens = 200\noutput_tokens = 48\n')
    save = tmp_path / "s"
    killed: list[int] = []

    def killer() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed:
            try:
                # the second cell's requests are in the server (the relaunch's own probes, before its CellStarted,
                # are not the cell: a server killed then fails the relaunch, not a cell)
                ready = ((save / "cells.parquet").exists() and pl.read_parquet(save / "cells.parquet").height >= 1
                         and (save / "events.jsonl").read_text().count('"kind":"CellStarted"') >= 2
                         and _processing(port) > 0)
            except Exception:  # noqa: BLE001 - a file being replaced: look again
                ready = False
            if ready:
                for pid in _llama_pids(port):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            time.sleep(0.05)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    out = run_json("--launch", f"{binary} -m {models / 'tiny-f16.gguf'} -c 4096 --port {port}",
                   "--server-variant", "--parallel 1", "--server-variant", "--parallel 4",
                   "-w", str(tmp_path / "w.toml"), "-c", "4", "-n", "40", "--save", str(save),
                   "--recover-timeout", "60s", timeout=600)
    t.join(5)
    assert killed, "the server was never killed mid-sweep"
    assert out["status"] == "completed"
    s = load_session(save)
    assert s.cells.sort("index")["status"].to_list() == ["done", "done"]
    assert s.cells.sort("index")["server_variant"].to_list() == ["--parallel 1", "--parallel 4"]
    kinds = [e["kind"] for e in stored(s)["events"]]
    assert "server_lost" in kinds and "server_back" in kinds
    assert stored(s)["server"]["args"]["parallel"] == 1 and stored(s)["server"]["variant_args"]["1"]["parallel"] == 4
    reqs = s.requests()
    short = reqs.filter(pl.col("output_tokens") != 48)
    assert short.is_empty() and reqs.height == 80, (reqs.height, short.select("cell", "index", "status", "error").rows())
    assert not _llama_pids(port)  # servescope stopped what it launched


def test_q4_k_m_against_f16_in_one_report(tmp_path: Path) -> None:
    """The consumer-GPU question: the same model as Q4_K_M and f16 GGUF, side by side at the "usable" SLO
    (TTFT under 3 s, 20 tok/s per user), with the capacity each holds."""
    from tests.support import llamacpp_server as ls

    _binary, models = ls.setup()
    (tmp_path / "w.toml").write_text('[workload]\nname = "chat"\napi = "chat"\ninput_tokens = 200\noutput_tokens = 24\n')
    sessions = {}
    all_bound: dict[str, bool] = {}  # every cell's client the limit (a starved machine): no capacity to tell
    for quant, gguf in (("f16", "tiny-f16.gguf"), ("Q4_K_M", "tiny-q4_k_m.gguf")):
        with ls.running(models / gguf, ctx=4096, parallel=2) as srv:
            out = run_json("--url", srv.url, "-w", str(tmp_path / "w.toml"), "-c", "1,2,4", "-n", "8",
                           "--slo", "ttft_ms=3000,per_user_tok_s=20", "--tag", f"quant={quant}",
                           "--telemetry-interval", "off")
        assert all(c["requests_ok"] == 8 for c in out["cells"])
        sessions[quant] = out["session"]
        all_bound[quant] = all((c.get("client") or {}).get("verdict") == "bound" for c in out["cells"])
    rep = servescope("report", sessions["f16"], "--compare", sessions["Q4_K_M"], "--label", "quant", timeout=120)
    assert rep.returncode == 0, rep.stderr
    md = rep.stdout
    assert "## Comparison: f16 vs Q4\\_K\\_M" in md and "Capacity at the SLOs" in md  # (markdown-escaped)
    assert "| Q4\\_K\\_M | chat |" in md
    # the capacity each holds, as a level (c=4 "not reached" on a quiet machine; lower on a busy one); where
    # the client was the limit in every cell (it says so: a machine so busy its own loop lagged), the report
    # must say it cannot tell, not give a level
    answers = r"c=[124]\b|none: even the lowest load"
    if any(all_bound.values()):
        answers += r"|unknown \(no completed cell whose client kept up\)"
    caps = re.findall(rf"\*\*Capacity at the SLOs:\*\* ({answers})", md)
    assert caps, md[md.index("Capacity at the SLOs"):][:600]
