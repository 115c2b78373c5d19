"""The engine on a virtual clock: KV admission, preemption, chunked prefill, c=1 timing."""

from __future__ import annotations

import pytest

from servescope.sim.engine import Scheduler, VirtualRunner, run_closed_loop
from servescope.sim.profile import CostModel, list_profiles, load_profile
from servescope.sim.request import RUNNING, SimRequest


def tiny_cost(**engine: int) -> CostModel:
    return CostModel(load_profile("tiny").with_overrides(**engine))


def test_profiles_load_and_log_figures() -> None:
    names = list_profiles()
    assert "tiny" in names and "rtx-pro-6000/qwen3.5-35b-a3b-gptq-int4" in names and len(names) >= 7
    for name in names:
        cost = CostModel(load_profile(name))
        assert cost.kv_cache_tokens > 0 and cost.num_blocks > 0
        assert cost.max_concurrency(load_profile(name).model.max_model_len) >= 1.0
    assert CostModel(load_profile("dgx-spark/gemma-4-31b-awq")).kv_cache_tokens == 12752


def test_kv_admission_only_what_fits() -> None:
    cost = tiny_cost(kv_cache_tokens=160)  # 10 blocks of 16
    s = Scheduler(cost)
    for i in range(4):
        s.add(SimRequest(i, 60, 8))  # 4 blocks each for the prompt
    step = s.schedule()
    assert [r.rid for r in step.reqs] == [0, 1]  # a third needs 4 more blocks, only 2 are free
    assert s.free_blocks == 2 and len(s.waiting) == 2
    s.finish(step, step.duration)
    assert all(r.num_output == 1 for r in step.reqs)
    assert s.free_blocks >= 0


def test_preemption_with_too_small_cache_then_all_finish() -> None:
    cost = tiny_cost(kv_cache_tokens=256)  # 16 blocks
    runner = VirtualRunner(cost)
    for i in range(6):
        runner.submit(SimRequest(i, 40, 60), 0.0)  # 6 x 100 tokens > 256
    runner.run()
    sched = runner.sched
    assert sched.num_preemptions > 0
    assert sorted(r.output_len for r in runner.results) == [60] * 6
    assert sched.free_blocks == sched.num_blocks
    assert any(r.preemptions > 0 for r in runner.results)


def test_preempts_the_newest_running_request() -> None:
    cost = tiny_cost(kv_cache_tokens=64)  # 4 blocks
    s = Scheduler(cost)
    a, b = SimRequest(1, 16, 40), SimRequest(2, 16, 40)
    s.add(a)
    s.add(b)
    t = 0.0
    while a.num_output < 18:  # a reaches 34 tokens: needs a third block once both hold two
        step = s.schedule(t)
        t += step.duration
        s.finish(step, t)
    assert s.num_preemptions >= 1
    assert a.state == RUNNING and a.num_preemptions == 0 and b.num_preemptions >= 1


def test_chunked_prefill_splits_by_token_budget() -> None:
    cost = tiny_cost(max_num_batched_tokens=2048)
    s = Scheduler(cost)
    req = SimRequest(1, 5000, 4)
    s.add(req)
    chunks = []
    t = 0.0
    while req.num_output == 0:
        step = s.schedule(t)
        chunks.append(step.tokens[0])
        t += step.duration
        s.finish(step, t)
    assert chunks == [2048, 2048, 904]
    assert req.first_token_t == pytest.approx(t)


def test_decodes_ride_along_with_a_prefill_chunk() -> None:
    cost = tiny_cost(max_num_batched_tokens=512)
    s = Scheduler(cost)
    a = SimRequest(1, 10, 50)
    s.add(a)
    step = s.schedule()
    s.finish(step, 1.0)
    b = SimRequest(2, 2000, 5)
    s.add(b)
    step = s.schedule()
    assert step.tokens == [1, 511]  # a's decode first, then b's first chunk fills the budget


@pytest.mark.parametrize("name", ["tiny", "rtx-pro-6000/qwen3.5-35b-a3b-gptq-int4", "dgx-spark/qwen3.6-27b-fp8"])
def test_c1_timing_matches_roofline_prediction(name: str) -> None:
    cost = CostModel(load_profile(name))
    for prompt in (256, 4096):
        ttft_pred, tpot_pred = cost.predict_c1(prompt, 128)
        res, _ = run_closed_loop(cost, 1, 1, prompt, 128)
        assert res[0].ttft == pytest.approx(ttft_pred, rel=0.10)
        assert res[0].tpot == pytest.approx(tpot_pred, rel=0.10)


def test_tiny_profile_is_fast_and_roomy() -> None:
    cost = CostModel(load_profile("tiny"))
    ttft, tpot = cost.predict_c1(256, 64)
    assert 0.002 <= tpot <= 0.005
    assert 0.010 <= ttft <= 0.090
    assert cost.kv_cache_tokens >= 64 * 1024


def test_throughput_rises_with_concurrency_while_per_user_falls() -> None:
    cost = CostModel(load_profile("dgx-spark/qwen3.6-27b-fp8"))
    out = {}
    for c in (1, 8, 32):
        res, wall = run_closed_loop(cost, c, 2 * c, 300, 64)
        out[c] = (sum(r.output_len for r in res) / wall, sum(r.output_len / r.e2e for r in res) / len(res))
    assert out[1][0] < out[8][0] < out[32][0]
    assert out[1][1] > out[8][1] > out[32][1]
