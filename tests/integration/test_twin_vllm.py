"""The capacity twin on a real CPU vLLM: the model's shape comes from the config.json of the directory vLLM serves,
the KV budget from its /metrics; a prediction is confirmed by running it. (Accuracy on this noisy 2-core box is
measured by benchmarks/twin_accuracy.py, medians of 3 rounds, not asserted here beyond sanity.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servescope.sessions.store import load_session
from tests.integration.helpers import run_json, servescope
from tests.support import vllm_server as vllm_server_mod


@pytest.mark.vllm
def test_twin_fits_a_real_vllm_and_confirms_a_prediction(vllm_server, tmp_path: Path) -> None:
    # the shared server's engine below its API server and the client while this test measures, nearer a GPU box:
    # on 2 cores at equal priority its polling can starve the API server, and the tokens of a request then reach
    # the client in one burst at its end (TPOT ~0 ms, TTFT ~ E2E), which no twin of the engine predicts
    vllm_server_mod.engine_apart(None, nice=15, group=vllm_server.proc.pid)
    try:
        fit_and_confirm(vllm_server.url, tmp_path)
    finally:
        vllm_server_mod.engine_apart(None, nice=0, group=vllm_server.proc.pid)


def fit_and_confirm(url: str, tmp_path: Path) -> None:
    wl = tmp_path / "w.toml"
    wl.write_text('[workload]\nname = "w256"\ninput_tokens = 256\noutput_tokens = 32\n')
    run_json("--url", url, "-w", str(wl), "-c", "1,2", "-n", "8", "--warmup", "2",
             "--save", str(tmp_path / "s"))
    fit = servescope("twin", "fit", str(tmp_path / "s"), "--json")
    assert fit.returncode == 0, fit.stderr
    info = json.loads(fit.stdout)
    root = json.loads(load_session(tmp_path / "s").info.models_json or "[]")[0]["root"]
    assert info["shape_from"] == f"config {Path(root) / 'config.json'}"
    profile = (tmp_path / "s" / "twin" / "profile.toml").read_text()
    assert "num_layers = 4" in profile and "num_kv_heads = 2" in profile  # tests/support/build_tiny_model.py
    budget = load_session(tmp_path / "s").info.kv_budget or {}
    assert f"kv_cache_tokens = {budget['kv_cache_tokens']}" in profile

    p = servescope("whatif", str(tmp_path / "s"), "-c", "4", "-n", "12", "--confirm", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    (cell,) = out["cells"]
    assert cell["status"] == "predicted" and cell["extrapolated"] is True and cell["requests_ok"] == 12
    assert cell["measured"]["output_tok_s"] > 0
    for k, v in cell["error"].items():
        assert v is not None and -1 < v < 10, (k, v, cell, info)  # a prediction, not a wild guess; accuracy: the benchmark
    assert cell["error"]["output_tok_s"] == pytest.approx(cell["output_tok_s"] / cell["measured"]["output_tok_s"] - 1)
    record = (tmp_path / "s" / "twin" / "confirm.jsonl").read_text().splitlines()
    assert len(record) == 1 and json.loads(record[0])["measured"] == cell["measured"]
