"""Speculative decoding, LoRA adapters, the prefix cache under control and cold starts on the real CPU vLLM 0.32
with the tiny model: its n-gram speculator, two LoRA adapters this module makes (tests/support/build_tiny_lora.py),
`POST /reset_prefix_cache` (served with VLLM_SERVER_DEV_MODE=1). One server of its own serves the module's tests
(speculation, two adapters, the dev-mode endpoints); cold starts and an n-gram server variant are tested where
servescope launches vLLM itself (tests/integration/test_vllm_launch.py), so CI starts vLLM no more often. A random-weight model's text
repeats itself only when decoded greedily: the workloads ask for temperature 0, so the n-gram proposer finds
matches and drafts are accepted."""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.helpers import run_json, servescope
from tests.support import vllm_server as vs
from tests.support.build_tiny_lora import build_adapters

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
NGRAM = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'
ADAPTERS = ("sql", "chat")


def _skip() -> None:
    if os.environ.get("SERVESCOPE_SKIP_VLLM") == "1":
        pytest.skip("SERVESCOPE_SKIP_VLLM=1: real-vLLM tests skipped on purpose")


@pytest.fixture(scope="module")
def adapters_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="ss-lora-") as d:
        _, models = vs.setup()
        build_adapters(models / "dense", Path(d), ADAPTERS)
        yield Path(d)


@pytest.fixture(scope="module")
def spec_lora_server(adapters_dir: Path) -> Iterator[vs.VLLMServer]:
    """vLLM with an n-gram speculator, two adapters (both in the GPU's slots: --max-loras 2), every request logged
    (the server's own per-adapter count) and its dev endpoints (POST /reset_prefix_cache)."""
    _skip()
    srv = vs.start("dense", [
        "--max-model-len", "2048", "--enforce-eager", "--enable-prompt-tokens-details",
        "--speculative-config", NGRAM, "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8",
        "--lora-modules", *(f"{n}={adapters_dir / n}" for n in ADAPTERS), "--enable-log-requests",
    ], env={"VLLM_SERVER_DEV_MODE": "1"})
    try:
        yield srv
    finally:
        srv.stop()


def _workload(tmp_path: Path, name: str, body: str) -> Path:
    f = tmp_path / f"{name}.toml"
    f.write_text(f'[workload]\nname = "{name}"\n{body}\n')
    return f


def _logged_adapters(log: str) -> Counter[str]:
    """The server's own count of the requests it received per adapter (its --enable-log-requests lines)."""
    out: Counter[str] = Counter()
    for m in re.finditer(r"Received request \S+: params: .*?, lora_request: (None|LoRARequest\(lora_name='([^']+)')",
                         log):
        out[m.group(2) or "base"] += 1
    return out


def test_speculation_and_two_adapters_per_cell(spec_lora_server: vs.VLLMServer, tmp_path: Path) -> None:
    srv = spec_lora_server
    w = _workload(tmp_path, "mix", "input_tokens = 128\noutput_tokens = 48\ntemperature = 0\n"
                                   "adapters = { sql = 0.5, chat = 0.3, base = 0.2 }")
    offset = srv.log_path.stat().st_size
    p = servescope("run", "--url", srv.url, "-w", str(w), "-c", "1,2", "-n", "10", "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    cells = json.loads(p.stdout.strip().splitlines()[-1])["cells"]
    sent: Counter[str] = Counter()
    for c in cells:
        assert c["status"] == "done" and c["requests_ok"] == 10, c
        sd = c["spec_decode"]
        assert sd is not None and set(sd) == {"acceptance_rate", "mean_accepted_tokens", "drafts_per_step"}
        # greedy text from a random model repeats itself: the n-gram proposer drafts, and vLLM accepts most drafts
        assert 0 < sd["acceptance_rate"] <= 1 and 0 < sd["mean_accepted_tokens"] <= 3 and 0 < sd["drafts_per_step"] <= 1
        figs = c["adapters"]
        assert set(figs) <= {"sql", "chat", "base"} and sum(a["requests"] for a in figs.values()) == 10
        for a in figs.values():
            assert a["output_tok_s"] > 0 and a["ttft_ms"]["p50"] > 0
        sent.update({k: a["requests"] for k, a in figs.items()})
        assert set(c["lora_server"]["adapters_running"]) >= set(figs) - {"base"}
        assert c["lora_server"]["max_loras"] == 2
    assert sent["sql"] and sent["chat"]
    # the server's own count, request by request from its log, agrees with the client's per adapter
    with open(srv.log_path, encoding="utf-8", errors="replace") as f:
        f.seek(offset)
        logged = _logged_adapters(f.read())
    assert {k: logged[k] for k in ADAPTERS} == {k: sent[k] for k in ADAPTERS}, (logged, sent)
    assert logged["base"] >= sent["base"]
    assert "speculative decoding (/metrics):" in p.stderr and "adapter sql:" in p.stderr


def test_reset_prefix_cache_drops_a_repeat_to_the_workloads_own_hit_rate(
        spec_lora_server: vs.VLLMServer, tmp_path: Path) -> None:
    """The same cell twice: the second finds every prompt in vLLM's prefix cache, unless the cache is reset before
    it: then it hits only the workload's shared prefix, as the first did."""
    # vLLM's CPU build caches whole blocks of 128 tokens: 1,024-token prompts share 4 of their 8 blocks, and a
    # prompt seen before hits 7 (the last token is always computed)
    w = _workload(tmp_path, "half", "input_tokens = 1024\noutput_tokens = 4\nprefix_cache_hit_rate = 0.5")
    args = ("--url", spec_lora_server.url, "-w", str(w), "-c", "2", "-n", "12", "--seed", "4242")
    first = run_json(*args)["cells"][0]
    again = run_json(*args)["cells"][0]
    reset = run_json(*args, "--reset-prefix-cache")["cells"][0]
    assert first["prefix_cache_target"] == 0.5
    # the first request sent misses the shared prefix too: 11 of 12 hit over the whole cell, more over its steady
    # window (which may start after it)
    assert 0.5 * 11 / 12 - 0.02 <= first["prefix_cache_hit_rate"] <= 0.5 + 0.02
    assert again["prefix_cache_hit_rate"] == pytest.approx(7 / 8, abs=0.02) and again["prefix_cache_reset"] is False
    assert reset["prefix_cache_reset"] is True
    assert reset["prefix_cache_hit_rate"] == pytest.approx(first["prefix_cache_hit_rate"], abs=0.05)


def test_a_server_without_the_dev_endpoints_is_said_once(vllm_server: vs.VLLMServer, tmp_path: Path) -> None:
    """The suite's shared vLLM runs without VLLM_SERVER_DEV_MODE: its 404 is said once, and no cell claims a reset."""
    p = servescope("run", "--url", vllm_server.url, "-w", "sharegpt", "-c", "1,2", "-n", "2", "--reset-prefix-cache",
                   "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stderr.count("does not offer POST /reset_prefix_cache (HTTP 404") == 1, p.stderr
    assert "VLLM_SERVER_DEV_MODE=1" in p.stderr
    assert [c["prefix_cache_reset"] for c in json.loads(p.stdout.strip().splitlines()[-1])["cells"]] == [False, False]
