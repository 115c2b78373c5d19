"""The capacity twin on a real CPU vLLM: the model's shape comes from the config.json of the directory vLLM serves,
the KV budget from its /metrics; a prediction is confirmed by running it. (Accuracy on this noisy 2-core box is
measured by benchmarks/twin_accuracy.py, medians of 3 rounds, not asserted here beyond sanity.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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


def _bound_cells(*sessions: Path) -> list[str]:
    """The cells of these sessions whose client was bound, with its reasons."""
    out = []
    for path in sessions:
        s = load_session(path)
        for row, summary in zip(s.cells.to_dicts(), s.summaries(), strict=True):
            if summary is not None and summary.client_bound and summary.client is not None:
                out.append(f"{path.name} c={row['concurrency']}: {'; '.join(summary.client.reasons)}")
    return out


def fit_and_confirm(url: str, tmp_path: Path) -> None:
    """Fit a twin from c=1,2 and confirm its prediction at c=4, three tries at most: on this 2-core machine the
    other tests' processes can starve the server's API process or the client while a cell runs, and a request's
    tokens then reach the client in one burst at its end (TPOT ~0 ms, the client bound by the bunched tokens).
    A try whose cells were client-bound, or whose prediction misses, is tried again with other prompts (its own
    seed); the last try is asserted either way. A twin gone wrong misses every try."""
    for attempt in range(3):
        cell, info, save = _fit_and_confirm_once(url, tmp_path / f"try{attempt}", attempt)
        bound = _bound_cells(save, *(Path(p) for p in cell["confirm_sessions"]))
        wild = {k: v for k, v in cell["error"].items() if v is None or not -1 < v < 10}  # predicted / measured - 1
        if not (bound or wild):
            break
        print(f"try {attempt + 1}: errors out of bounds {wild}; client-bound cells {bound}")
    assert not wild, (wild, cell, info, bound)  # a prediction, not a wild guess; accuracy: the benchmark
    assert cell["error"]["output_tok_s"] == pytest.approx(cell["output_tok_s"] / cell["measured"]["output_tok_s"] - 1)
    record = (save / "twin" / "confirm.jsonl").read_text().splitlines()
    assert len(record) == 1 and json.loads(record[0])["measured"] == cell["measured"]


def _fit_and_confirm_once(url: str, tmp_path: Path, seed: int) -> tuple[dict[str, Any], dict[str, Any], Path]:
    tmp_path.mkdir()
    save = tmp_path / "s"
    wl = tmp_path / "w.toml"
    wl.write_text('[workload]\nname = "w256"\ninput_tokens = 256\noutput_tokens = 32\n')
    run_json("--url", url, "-w", str(wl), "-c", "1,2", "-n", "8", "--warmup", "2", "--seed", str(seed),
             "--save", str(save))
    fit = servescope("twin", "fit", str(save), "--json")
    assert fit.returncode == 0, fit.stderr
    info = json.loads(fit.stdout)
    root = json.loads(load_session(save).info.models_json or "[]")[0]["root"]
    assert info["shape_from"] == f"config {Path(root) / 'config.json'}"
    profile = (save / "twin" / "profile.toml").read_text()
    assert "num_layers = 4" in profile and "num_kv_heads = 2" in profile  # tests/support/build_tiny_model.py
    budget = load_session(save).info.kv_budget or {}
    assert f"kv_cache_tokens = {budget['kv_cache_tokens']}" in profile

    p = servescope("whatif", str(save), "-c", "4", "-n", "12", "--confirm", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    (cell,) = out["cells"]
    assert cell["status"] == "predicted" and cell["extrapolated"] is True and cell["requests_ok"] == 12
    assert cell["measured"]["output_tok_s"] > 0
    cell["confirm_sessions"] = out["confirm"]["sessions"]
    return cell, info, save
