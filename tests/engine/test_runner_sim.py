"""`run_sweep` in-process with its real collaborators against the built-in simulator: one /metrics path per
cell (the sampler's boundary samples give both summary["server"] and summary["telemetry"]), also with
telemetry sampling off, and the KV budget as a typed event."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from servescope.engine.events import CellFinished, KvBudgetKnown, SweepFinished
from servescope.engine.runner import run_sweep
from servescope.engine.spec import RunContext, SweepSpec
from servescope.sessions.store import load_session
from servescope.sim.launcher import SimHandle, start_sim
from servescope.workloads.spec import Workload, fixed
from tests.support.meta import stored

# the --fast lane leaves this module out: 2 tests, ~7 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

WL = Workload("tiny", "completions", fixed(32), fixed(5), source="inline")


@pytest.fixture(scope="module")
def sim() -> Iterator[SimHandle]:
    h = start_sim("tiny")
    try:
        yield h
    finally:
        h.stop()


@pytest.mark.parametrize("interval", [None, 0.2])
async def test_server_part_comes_from_the_boundary_samples(sim: SimHandle, tmp_path: Path,
                                                          interval: float | None) -> None:
    spec = SweepSpec(url="sim://tiny", workloads=(WL,), concurrency=(1, 3), requests=6, warmup=2,
                     telemetry_interval_s=interval)
    ctx = RunContext(url=sim.url, target_label="sim://tiny", save_dir=tmp_path / "s")
    events = [ev async for ev in run_sweep(spec, ctx)]
    fin = events[-1]
    assert isinstance(fin, SweepFinished) and fin.status == "completed", fin
    done = [e for e in events if isinstance(e, CellFinished)]
    assert [d.status for d in done] == ["done", "done"]
    for d in done:
        srv = d.summary.server
        assert srv is not None
        # the start sample is taken after the warmup requests ended: the server counted the measured ones
        assert srv.requests_success == 6 and srv.generation_tokens == 6 * 5
        assert srv.prompt_tokens is not None and srv.prompt_tokens >= 6 * 32
        assert srv.ttft_ms_mean is not None and srv.ttft_ms_mean > 0
        assert srv.e2e_ms_mean is not None and srv.e2e_ms_mean >= srv.ttft_ms_mean
        tel = d.summary.telemetry
        assert tel is not None and tel.available and tel.samples >= 2
        assert tel.requests_success is not None and tel.requests_success >= 6
    kv = [e for e in events if isinstance(e, KvBudgetKnown)]
    s = load_session(tmp_path / "s")
    if kv:  # the simulator states its KV cache in vllm:cache_config_info
        assert stored(s)["kv_budget"]["kv_cache_tokens"] == kv[0].budget["kv_cache_tokens"]
        for d in done:  # one figure everywhere: the report reads the server part, the app the budget
            assert d.summary.server is not None
            assert d.summary.server.kv_cache_tokens == kv[0].budget["kv_cache_tokens"]
    assert stored(s)["target"]["url"] == "sim://tiny"
    assert stored(s)["sweep"]["target"]["url"] == "sim://tiny"
    # every table the runner wrote (target, sweep, cells, telemetry, gpu, kv_budget, events) reads back typed, whole
    assert stored(s) == tomllib.loads((tmp_path / "s" / "session.toml").read_text())
    assert (tmp_path / "s" / "telemetry.parquet").is_file()
    saved = json.loads(s.cells.sort("index")["summary_json"][0])  # the on-disk format keeps its "server" object
    assert saved["server"]["requests_success"] == 6 and set(saved["server"]) == {
        "requests_success", "prompt_tokens", "generation_tokens", "preemptions", "ttft_ms_mean", "itl_ms_mean",
        "e2e_ms_mean", "queue_ms_mean", "kv_cache_tokens", "prefix_cache_hit_rate"}
