"""`servescope run` against a real CPU vLLM serving the tiny dense model (started once per session)."""

from __future__ import annotations

import http.server
import threading
from pathlib import Path

import polars as pl
import pytest

from servescope.sessions.store import load_session
from tests.integration.helpers import metrics, run_json, servescope
from tests.support.meta import stored


@pytest.mark.vllm
def test_two_cell_sweep_agrees_with_vllm(vllm_server, tmp_path: Path) -> None:
    wl = tmp_path / "w.toml"
    wl.write_text('[workload]\nname = "fixed-256-32"\napi = "completions"\n'
                  'input_tokens = { dist = "fixed", value = 256 }\noutput_tokens = { dist = "fixed", value = 32 }\n'
                  "seed = 11\n")
    before = metrics(vllm_server.url)
    out = run_json("--url", vllm_server.url, "--workload", str(wl), "--concurrency", "1,4", "--requests", "12",
                   "--save", str(tmp_path / "s"), "--tag", "quant=bf16", "--slo", "ttft_ms=5000")
    after = metrics(vllm_server.url)

    cells = out["cells"]
    assert [c["concurrency"] for c in cells] == [1, 4]
    for c in cells:
        assert c["status"] == "done" and c["requests_ok"] == 12 and c["requests_failed"] == 0
        assert c["input_tokens_requested"] == 256 and c["input_tokens_mean"] == 256
        assert c["output_tokens_mean"] == 32
        # the client cannot see a first token before the server produced it
        assert c["ttft_ms"]["mean"] >= c["server"]["ttft_ms_mean"]
        assert c["output_tok_s"] > 0 and c["tpot_ms"]["p50"] > 0 and c["e2e_ms"]["p99"] >= c["e2e_ms"]["p50"]
        assert c["goodput_req_s"] == pytest.approx(c["request_s"])

    served = after["vllm:request_success_total"] - before["vllm:request_success_total"]
    assert served == sum(c["requests_ok"] for c in cells)
    server_ttft_ms = ((after["vllm:time_to_first_token_seconds_sum"] - before["vllm:time_to_first_token_seconds_sum"])
                      / (after["vllm:time_to_first_token_seconds_count"] - before["vllm:time_to_first_token_seconds_count"])
                      * 1000)
    ours = sum(c["ttft_ms"]["mean"] * c["requests_ok"] for c in cells) / served
    assert ours >= server_ttft_ms

    # every request's exact lengths are on disk, one row per request with raw stamps
    s = load_session(tmp_path / "s")
    assert s.status == "completed" and stored(s)["model"] == vllm_server.model
    assert stored(s)["tags"] == {"quant": "bf16"} and stored(s)["target"]["version"]
    req = s.requests()
    assert req.height == 24
    assert (req["prompt_tokens"] == 256).all() and (req["output_tokens"] == 32).all()
    assert req.select(pl.col("chunk_tokens").list.sum()).to_series().to_list() == [32] * 24
    assert s.cells.height == 2


@pytest.mark.vllm
def test_chat_workload_exact_input_lengths(vllm_server, tmp_path: Path) -> None:
    out = run_json("--url", vllm_server.url, "-w", "sharegpt", "-c", "2", "-n", "6", "--warmup", "2",
                   "--sessions-dir", str(tmp_path))
    [c] = out["cells"]
    assert c["requests_ok"] == 6 and c["output_tokens_mean"] == 256
    req = load_session(out["session"]).requests()
    measured = req.filter(~pl.col("warmup"))
    assert measured.height == 6  # warmup requests are not kept as measured
    assert (measured["prompt_tokens"] == measured["input_tokens_requested"]).all()
    assert measured["prompt_tokens"].min() >= 200 and measured["prompt_tokens"].max() <= 512


@pytest.mark.vllm
def test_context_sweep_skips_what_does_not_fit(vllm_server, tmp_path: Path) -> None:
    out = run_json("--url", vllm_server.url, "-w", "context-sweep", "-c", "1", "-n", "1",
                   "--sessions-dir", str(tmp_path))
    by = {c["workload"]: c for c in out["cells"]}
    assert by["context-sweep/1k"]["status"] == "done" and by["context-sweep/4k"]["status"] == "done"
    assert by["context-sweep/4k"]["input_tokens_mean"] == 4096
    for name in ("context-sweep/8k", "context-sweep/16k", "context-sweep/32k"):
        assert by[name]["status"] == "skipped"
        assert "exceed the model's max length 8192" in by[name]["reason"]


@pytest.mark.vllm
def test_unknown_model_lists_served(vllm_server) -> None:
    p = servescope("run", "--url", vllm_server.url, "--model", "nope", "-n", "1")
    assert p.returncode == 2
    assert "unknown model 'nope'" in p.stderr and vllm_server.model in p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_unreachable_url_one_line() -> None:
    p = servescope("run", "--url", "http://127.0.0.1:9", "-n", "1")
    assert p.returncode == 2
    assert "cannot connect to http://127.0.0.1:9" in p.stderr and "Traceback" not in p.stderr


def test_not_an_openai_server(tmp_path: Path) -> None:
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        p = servescope("run", "--url", f"http://127.0.0.1:{srv.server_address[1]}", "-n", "1")
    finally:
        srv.shutdown()
    assert p.returncode == 2 and "is not an OpenAI-compatible server" in p.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (["-w", "nosuch"], "unknown workload 'nosuch'"),
        (["-c", "1,x,4"], "--concurrency: bad value 'x'"),
        (["--slo", "ttft=3"], "bad SLO"),
        (["--url", "localhost:8000"], "is not an http(s) URL with a host"),
    ],
)
def test_bad_flags_one_line(args: list[str], needle: str) -> None:
    p = servescope("run", "--url", "http://127.0.0.1:9", *args)
    assert p.returncode == 2 and needle in p.stderr and "Traceback" not in p.stderr
