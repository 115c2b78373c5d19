"""Speculative decoding, LoRA traffic, the prefix cache under control, cold starts and energy per token, end to end
against the simulator: `servescope run` as a user runs it (its --json and its table), and a sweep in-process with a
fake NVML."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servescope.core.results import CellResult
from servescope.engine.background import Background
from servescope.engine.runner import run_sweep
from servescope.engine.spec import RunContext, SweepSpec
from servescope.engine.telemetryhub import TelemetryHub
from servescope.engine.twinshape import session_shape
from servescope.sessions.crossover import crossover_sentence, speculation_crossover
from servescope.sessions.store import load_session
from servescope.sim.launcher import SimHandle, start_sim
from servescope.workloads.spec import Workload
from tests.core.test_telemetry import FakeNVML
from tests.integration.helpers import run_json, servescope

NGRAM = '{"method": "ngram", "num_speculative_tokens": 3}'


def _workload(tmp_path: Path, name: str, body: str) -> Path:
    f = tmp_path / f"{name}.toml"
    f.write_text(f'[workload]\nname = "{name}"\n{body}\n')
    return f


@pytest.mark.slow  # two launches and 8 cells in real time: about 40 s on 2 cores
def test_speculation_on_and_off_cross_over_at_a_load(tmp_path: Path) -> None:
    """Two server variants, speculation off and on, over loads 1..64: speculation lowers TPOT at one user and raises
    it at 64; each speculating cell reports the workload's acceptance; each launch records its start."""
    w = _workload(tmp_path, "spec", "input_tokens = 256\noutput_tokens = 128\nspec_acceptance = 0.6")
    out = run_json("--launch", f"{sys.executable} -m servescope.sim --profile tiny",
                   "--server-variant", "--max-num-seqs 128", "--server-variant", f"--speculative-config '{NGRAM}'",
                   "-w", str(w), "-c", "1,4,16,64", "-n", "64", "--duration", "4s", "--save", str(tmp_path / "s"))
    cells = out["cells"]
    seen = [(c["concurrency"], c["status"], c["requests_ok"], c["tpot_ms"]["p50"], c["spec_decode"]) for c in cells]
    assert [c["status"] for c in cells] == ["done"] * 8, seen
    off, on = cells[:4], cells[4:]
    assert all(c["spec_decode"] is None for c in off), seen
    for c in on:
        sd = c["spec_decode"]
        assert set(sd) == {"acceptance_rate", "mean_accepted_tokens", "drafts_per_step"}
        # a drafted token is accepted at 0.6 given the ones before it: 0.6 (1 - 0.6^3) / (0.4 x 3) of them in all
        assert sd["acceptance_rate"] == pytest.approx(0.6 * (1 - 0.6 ** 3) / 0.4 / 3, rel=0.2), seen
        assert 0.35 < sd["drafts_per_step"] < 0.85, seen  # n-gram drafting at about 0.6 of the steps
    session = load_session(tmp_path / "s")
    summaries = [s for s in session.summaries() if s is not None]
    pairs = [(float(c["concurrency"]), s) for c, s in zip(cells, summaries, strict=True)]
    cross = speculation_crossover(pairs)
    assert cross is not None and cross.crosses, (cross, seen)
    assert cross.points[0][2] < cross.points[0][1] and cross.points[-1][2] > cross.points[-1][1]
    assert crossover_sentence(cross).startswith("speculation lowers TPOT up to c=")
    # every launch (one per variant) recorded its start: healthy, then a first token
    starts = {json.dumps(c["startup"], sort_keys=True) for c in cells}
    assert len(starts) == 2
    for c in cells:
        st = c["startup"]
        assert 0 < st["healthy_s"] <= st["first_token_s"], st


@pytest.mark.slow  # two cells of 96 requests in real time: about 15 s
def test_ten_zipf_adapters_cost_more_per_token_than_one(tmp_path: Path) -> None:
    """One adapter against a Zipf spread over ten through the simulator's one slot (vLLM's default --max-loras 1):
    batches split by adapter and adapters swap, so each output token takes longer."""
    one = _workload(tmp_path, "one", 'input_tokens = 256\noutput_tokens = 64\nadapters = { sql = 1.0 }')
    ten = _workload(tmp_path, "ten", "input_tokens = 256\noutput_tokens = 64\nadapters = { zipf = 1.1, count = 10 }")
    p = servescope("run", "--url", "sim://tiny", "-w", f"{one},{ten}", "-c", "16", "-n", "96", "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    a, b = json.loads(p.stdout.strip().splitlines()[-1])["cells"]
    assert set(a["adapters"]) == {"sql"} and a["adapters"]["sql"]["requests"] == 96
    assert set(b["adapters"]) <= {f"lora-{k}" for k in range(1, 11)} and len(b["adapters"]) >= 6
    assert sum(x["requests"] for x in b["adapters"].values()) == b["requests_ok"] == 96
    for fig in b["adapters"].values():
        assert set(fig) == {"requests", "output_tok_s", "ttft_ms", "tpot_ms"} and fig["ttft_ms"]["p50"] > 0
    # time per output token: the Zipf cell's aggregate throughput is well below the one adapter's
    assert b["output_tok_s"] < 0.8 * a["output_tok_s"]
    assert set(b["lora_server"]["adapters_running"]) == set(b["adapters"]) and b["lora_server"]["max_loras"] == 1
    # no NVML here: no energy, in the JSON or the table
    assert "energy" not in a and "energy" not in b and "energy" not in p.stderr
    assert "adapter lora-1:" in p.stderr and "server LoRA (vllm:lora_requests_info)" in p.stderr
    assert a["prefix_cache_reset"] is False and "startup" not in a  # not asked; not launched


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    with start_sim("tiny") as handle:
        yield handle


@pytest.mark.slow  # three short runs against one simulator: about 15 s
def test_reset_prefix_cache_makes_a_repeat_hit_only_its_own_prefix(sim: SimHandle, tmp_path: Path) -> None:
    """The same sweep twice against one server: the second finds every prompt cached (hit rate near 1), unless
    --reset-prefix-cache empties the cache first: then it hits only the workload's own shared prefix (its 50%)."""
    w = _workload(tmp_path, "half", "input_tokens = 512\noutput_tokens = 16\nprefix_cache_hit_rate = 0.5")
    args = ("--url", sim.url, "-w", str(w), "-c", "2", "-n", "24", "--seed", "7")
    first = run_json(*args)["cells"][0]
    again = run_json(*args)["cells"][0]
    reset = run_json(*args, "--reset-prefix-cache")["cells"][0]
    assert first["prefix_cache_target"] == again["prefix_cache_target"] == 0.5
    assert first["prefix_cache_hit_rate"] == pytest.approx(0.5 * 23 / 24, abs=0.04)  # its own: the first misses
    assert again["prefix_cache_hit_rate"] > 0.95 and again["prefix_cache_reset"] is False
    assert reset["prefix_cache_reset"] is True
    assert reset["prefix_cache_hit_rate"] == pytest.approx(first["prefix_cache_hit_rate"], abs=0.02)


@pytest.mark.slow  # a hosted-mode simulator and two cells: about 8 s
def test_a_server_without_the_reset_is_said_once(tmp_path: Path) -> None:
    with start_sim("tiny", ["--hosted", "--tpm", "0", "--net-latency-ms", "0", "--net-jitter-ms", "0"]) as h:
        p = servescope("run", "--url", h.url, "-w", "sharegpt", "-c", "1,2", "-n", "2", "--reset-prefix-cache",
                       "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stderr.count("does not offer POST /reset_prefix_cache") == 1, p.stderr
    cells = json.loads(p.stdout.strip().splitlines()[-1])["cells"]
    assert [c["prefix_cache_reset"] for c in cells] == [False, False]


@pytest.mark.slow  # one cell of 32 requests in real time: about 6 s
def test_energy_per_token_from_a_fake_nvml_is_the_integral_of_its_power(sim: SimHandle, tmp_path: Path) -> None:
    """One fake GPU drawing 250 W whenever it is read: a cell's joules per output token are 250 W over the seconds its
    samples cover, per output token, and its mean power 250 W."""
    nv = FakeNVML([{"name": "NVIDIA H100", "used_gib": 60.0, "total_gib": 80.0, "util": 95, "power_w": 250.0}])
    spec = SweepSpec(url=sim.url, workloads=(Workload("e"),), concurrency=(4,), requests=32, telemetry_interval_s=0.1)
    bg = Background()

    async def go() -> list[CellResult]:
        out: list[CellResult] = []
        hub = TelemetryHub(bg, 0.1, nvml=nv)
        async for ev in run_sweep(spec, RunContext(url=sim.url, save_dir=tmp_path / "s"), telemetry=hub):
            summary = getattr(ev, "summary", None)
            if isinstance(summary, CellResult):
                out.append(summary)
        return out

    try:
        [s] = asyncio.run(go())
    finally:
        bg.close()
    assert s.gpu is not None and s.energy is not None and s.output_tokens_total
    covered = (s.gpu.duration_s or 0) * (s.gpu.energy_coverage or 0)
    assert covered > 0.5 * (s.wall_s or 0)
    # 250 W held over the seconds the samples cover: joules / output tokens
    # (the GPU window's own output tokens: its samples span the whole cell, as the joules do, beside a steady
    # window's figures)
    assert s.energy.j_per_output_token == pytest.approx(250.0 * covered / s.gpu.output_tokens, rel=1e-6)
    assert s.energy.mean_w == pytest.approx(250.0, rel=1e-9)
    stored: dict[str, Any] = json.loads(load_session(tmp_path / "s").cells["summary_json"][0])
    assert stored["energy"] == s.energy.to_dict()


@pytest.mark.slow  # 4 cells, 2 launches and a model fit: about 60 s
def test_tune_searches_the_number_of_speculative_tokens(tmp_path: Path) -> None:
    launch = f"{sys.executable} -m servescope.sim --profile tiny --speculative-config '{NGRAM}'"
    p = servescope("tune", "--launch", launch, "--search", "num-speculative-tokens=1|4", "-w", "sharegpt",
                   "-c", "1..4", "--budget", "4", "-n", "8", "--save", str(tmp_path / "t"), "--json")
    assert p.returncode == 0, p.stderr[-3000:]
    best = json.loads(p.stdout.strip().splitlines()[-1])["best"]
    assert best["server_args"] in ("--num-speculative-tokens 1", "--num-speculative-tokens 4")
    assert "num_speculative_tokens" in p.stderr  # the `serve it` line: the config with the best's tokens
    seen = set()
    for cell in sorted((tmp_path / "t" / "cells").iterdir()):
        s = load_session(cell)
        args = s.info.server.args if s.info.server is not None else None
        k = json.loads(args["speculative_config"])["num_speculative_tokens"] if isinstance(args, dict) else None
        assert cell.name.endswith(f"num-speculative-tokens{k}")  # the setting reached the server's command
        [summary] = [x for x in s.summaries() if x is not None]
        assert summary.spec_decode is not None and summary.spec_decode.drafts_per_step
        seen.add(k)
    assert seen == {1, 4}


@pytest.mark.slow  # 2 cells and a model fit: about 40 s
def test_the_twin_fits_a_speculating_lora_session(tmp_path: Path) -> None:
    """The twin runs the simulator's speculation with the method and tokens the server was launched with and the
    acceptance the cells measured; it runs LoRA requests as the base model's."""
    w = _workload(tmp_path, "mix", "input_tokens = 256\noutput_tokens = 64\nspec_acceptance = 0.7\n"
                                   "adapters = { sql = 0.5, base = 0.5 }")
    launch = f"{sys.executable} -m servescope.sim --profile tiny --speculative-config '{NGRAM}'"
    run_json("--launch", launch, "-w", str(w), "-c", "1,4", "-n", "16", "--save", str(tmp_path / "s"))
    p = servescope("twin", "fit", str(tmp_path / "s"))
    assert p.returncode == 0, p.stderr[-3000:]
    shape = session_shape(load_session(tmp_path / "s"))
    e = shape.profile.engine
    assert (e.speculative_method, e.num_speculative_tokens) == ("ngram", 3)
    assert e.spec_acceptance == pytest.approx(0.7, abs=0.08) and "speculative decoding ngram x3" in shape.limits_source
    assert "speculative decoding ngram x3" in p.stdout + p.stderr
