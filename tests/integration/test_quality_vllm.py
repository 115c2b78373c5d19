"""The quality probe against the real CPU vLLM: the tests' tiny model against itself, and a perturbed copy of it
(its weights plus seeded noise, a stand-in for a lossy quantization) against it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.helpers import servescope

pytestmark = pytest.mark.timeout(1200)

# vLLM's CPU backend gives the same request the same logits again (measured: identical traces in repeated runs,
# KL against itself exactly 0), so the floor is 0 and 1e-9 leaves room for float rounding. The tiny model's weights
# are random: its next-token distribution is nearly flat (top-1 about -7.9 nats of 8,192 tokens), so its top-5
# hold ~0.2% of the mass and the top-k KL of the perturbed copy is small (measured 3e-7 nats), but 300x the floor
KL_FLOOR = 1e-9


def quality(*args: str) -> dict[str, Any]:
    p = servescope("quality", *args, "--json", timeout=900)
    assert p.returncode == 0, f"exit {p.returncode}\nstdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-3000:]}"
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def test_itself_gives_zero_divergence_and_the_perturbed_copy_does_not(vllm_server: Any, vllm_server_perturbed: Any,
                                                                       tmp_path: Path) -> None:
    # one probe request at a time: a CPU vLLM's numbers for a request depend on what it was batched with (a
    # busy host changes the batches, and the KL against itself read ~1e-8 instead of 0), so each runs alone
    common = ("--tasks", "arithmetic,retrieval,json", "--context", "1024", "-n", "4", "--concurrency", "1")
    ref = quality("--url", vllm_server.url, *common, "--save", str(tmp_path / "ref"))
    assert set(ref) == {"session", "perplexity", "tasks", "reference"} and ref["reference"] is None
    assert ref["perplexity"] is not None and ref["perplexity"] > 1
    assert set(ref["tasks"]) == {"arithmetic", "retrieval@1K", "json"}
    assert all(t["n"] == 4 and 0 <= t["accuracy"] <= 1 for t in ref["tasks"].values())

    same = quality("--url", vllm_server.url, *common, "--reference", str(tmp_path / "ref"),
                   "--save", str(tmp_path / "same"))
    r = same["reference"]
    assert r["kl_mean"] < KL_FLOOR and r["kl_p99"] < KL_FLOOR
    assert r["top1_agreement"] == 1.0
    assert same["perplexity"] == pytest.approx(ref["perplexity"], rel=1e-9)

    pert = quality("--url", vllm_server_perturbed.url, *common, "--reference", str(tmp_path / "ref"),
                   "--save", str(tmp_path / "pert"))
    p = pert["reference"]
    assert p["kl_mean"] > 10 * KL_FLOOR and p["top1_agreement"] < 1.0
    assert p["first_divergence_mean"] < r["first_divergence_mean"]  # the greedy outputs part earlier
    assert abs(pert["perplexity"] - ref["perplexity"]) / ref["perplexity"] > 1e-4

    # compare puts the two side by side and calls the KL difference real
    c = servescope("compare", str(tmp_path / "same"), str(tmp_path / "pert"))
    assert c.returncode == 0, c.stderr
    assert "KL" in c.stdout and "Quality" in c.stdout
    cj = servescope("compare", str(tmp_path / "same"), str(tmp_path / "pert"), "--json")
    assert cj.returncode == 0, cj.stderr
    rows = [r for r in json.loads(cj.stdout)["quality"]["rows"] if r["figure"] == "KL vs reference, mean (nats)"]
    assert len(rows) == 1 and rows[0]["deltas"][0]["verdict"] == "worse"  # beyond noise: the intervals do not overlap


def test_quality_share_on_the_real_vllm_reports_each_cells_accuracy_and_divergence(vllm_server: Any) -> None:
    from tests.integration.helpers import run_json

    out = run_json("--url", vllm_server.url, "-w", "sharegpt", "-c", "1,8", "-n", "24", "--quality-share", "0.2",
                   timeout=900)
    for cell in out["cells"]:
        assert cell["status"] == "done" and cell["requests_ok"] == 24  # probe requests are not in the speed figures
        q = cell["quality"]
        assert q["n"] >= 1 and sum(t["n"] for t in q["tasks"].values()) == q["n"], (cell["concurrency"], q)
        assert q["failed"] == 0, q.get("errors")
        assert q.get("prompts", 0) >= 1 and q["positions"] >= q["prompts"], q
        assert q["kl_mean"] >= 0 and 0 <= q["top1_agreement"] <= 1
