"""`--precision` on the real CPU vLLM (the tiny dense model): the stop rule ends a cell once its figures are within
the target, long before its ceiling, and the cell's precision says so; a ceiling that comes first marks it
imprecise. The server counts exactly the requests the cell says it sent (the drain's included)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.helpers import metrics, run_json

WL = ('[workload]\nname = "fixed-64-16"\napi = "completions"\ninput_tokens = { dist = "fixed", value = 64 }\n'
      'output_tokens = { dist = "fixed", value = 16 }\nseed = 5\n')


@pytest.mark.slow
@pytest.mark.vllm
def test_the_stop_rule_ends_a_cell_at_its_target_on_a_real_vllm(vllm_server, tmp_path: Path) -> None:
    wl = tmp_path / "w.toml"
    wl.write_text(WL)
    before = metrics(vllm_server.url)
    out = run_json("--url", vllm_server.url, "-w", str(wl), "-c", "1", "--precision", "15%", "-n", "2000",
                   "--sessions-dir", str(tmp_path / "a"), timeout=900)
    after = metrics(vllm_server.url)
    [c] = out["cells"]
    p = c["precision"]
    assert set(p) == {"target", "reached", "requests", "figure"}
    assert c["status"] == "done" and "imprecise" not in c["reason"]
    assert p["target"] == 0.15 and p["reached"] <= 0.15 and p["requests"] < 2000
    served = after["vllm:request_success_total"] - before["vllm:request_success_total"]
    assert served == p["requests"] == c["requests_ok"]  # c=1: no request sent alone to time a ramp

    out = run_json("--url", vllm_server.url, "-w", str(wl), "-c", "2", "--precision", "0.1%", "-n", "24",
                   "--sessions-dir", str(tmp_path / "b"), timeout=900)
    [c] = out["cells"]
    assert c["status"] == "done" and c["reason"].startswith("imprecise: ")
    assert c["precision"]["requests"] == 24 and (c["precision"]["reached"] or 1.0) > 0.001
