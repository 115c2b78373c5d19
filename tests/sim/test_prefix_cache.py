"""The prefix cache on a virtual clock: block-exact hits, TTFT, LRU eviction under pressure, KV usage."""

from __future__ import annotations

import heapq

import pytest

from servescope.sim.engine import Scheduler, VirtualRunner
from servescope.sim.prefixcache import chain_hashes
from servescope.sim.profile import CostModel, load_profile
from servescope.sim.request import SimRequest
from servescope.sim.responses import TokenSource

BS = 16  # the tiny profile's block size


def tiny_cost(**engine: object) -> CostModel:
    return CostModel(load_profile("tiny").with_overrides(**engine))


def ids(start: int, n: int) -> list[int]:
    """`n` distinct word ids from `start` on (two calls with different starts share no block)."""
    return [100 + (start + i) % 30000 for i in range(n)]


def check_accounting(s: Scheduler) -> None:
    """Every block is uncached-free, cached and nobody's, or held: shared cached ones once, own ones each."""
    pool = s.pool
    held_cached = sum(1 for r in pool.refs.values() if r > 0)
    assert sorted(pool.lru) == sorted(h for h, r in pool.refs.items() if r == 0)
    assert pool.free + len(pool.lru) + held_cached + sum(r.blocks for r in s.running) == s.num_blocks
    assert pool.free >= 0
    counted: dict[int, int] = {}
    for r in s.running:
        assert r.hashes is not None or r.held == 0
        for h in (r.hashes or [])[:r.held]:
            counted[h] = counted.get(h, 0) + 1
    assert counted == {h: n for h, n in pool.refs.items() if n > 0}


def run_one(runner: VirtualRunner, req: SimRequest) -> SimRequest:
    """Submit one request now and run the engine until it is idle, checking the block accounting each step."""
    runner.submit(req)
    sched = runner.sched
    while True:
        while runner._arrivals and runner._arrivals[0][0] <= runner.now:
            sched.add(heapq.heappop(runner._arrivals)[2])
        if not sched.has_work():
            if not runner._arrivals:
                return req
            runner.now = runner._arrivals[0][0]
            continue
        step = sched.schedule(runner.now)
        assert step.reqs
        runner.now += step.duration
        sched.finish(step, runner.now)
        check_accounting(sched)


def ttft(req: SimRequest) -> float:
    return req.first_token_t - req.arrival


def test_chain_hashes_share_exactly_the_common_full_blocks() -> None:
    a, ta = chain_hashes(ids(0, 100), BS)
    b, _ = chain_hashes(ids(0, 50) + ids(5000, 50), BS)
    assert len(a) == 6 and ta == ids(96, 4)
    assert a[:3] == b[:3] and a[3] != b[3]  # 50 shared tokens: 3 full blocks
    # the chain: an equal block after a different one hashes differently
    c, _ = chain_hashes(ids(7000, 16) + ids(16, 16), BS)
    assert c[1] != a[1]


def test_shared_prefix_hits_its_full_blocks_and_cuts_ttft() -> None:
    cost = tiny_cost()
    runner = VirtualRunner(cost)
    shared = ids(0, 1000)
    run_one(runner, SimRequest(1, 1200, 4, prompt_ids=shared + ids(10_000, 200)))
    warm = run_one(runner, SimRequest(2, 1200, 4, prompt_ids=shared + ids(20_000, 200)))
    cold = run_one(runner, SimRequest(3, 1200, 4, prompt_ids=ids(15_000, 1200)))
    assert warm.cached_tokens == 992  # 62 full blocks of the 1000 shared tokens
    assert cold.cached_tokens == 0
    s = runner.sched
    assert s.prefix_hits == 992 and s.prefix_queries == 3 * 1200
    assert ttft(warm) < 0.5 * ttft(cold)
    # the warm prefill is the cold one of its 208 new tokens over a 992-token context
    prefill = cost.step_time(208, 1, cost.footprint_tokens(1200), 208 * (992 + 209 / 2))
    assert ttft(warm) == pytest.approx(cost.frontend_s + prefill)
    assert ttft(cold) == pytest.approx(cost.predict_c1(1200, 4)[0])


def test_the_last_prompt_token_is_always_computed() -> None:
    runner = VirtualRunner(tiny_cost())
    run_one(runner, SimRequest(1, 320, 2, prompt_ids=ids(0, 320)))
    again = run_one(runner, SimRequest(2, 320, 2, prompt_ids=ids(0, 320)))
    assert again.cached_tokens == 304  # 20 blocks cached, but the 320th token must be computed: 19
    longer = run_one(runner, SimRequest(3, 330, 2, prompt_ids=ids(0, 330)))
    assert longer.cached_tokens == 320


def test_blocks_enter_the_cache_as_they_are_computed() -> None:
    """A request sharing the prefix of one still running hits it; shared blocks count once in the usage."""
    s = Scheduler(tiny_cost())
    a = SimRequest(1, 328, 100, prompt_ids=ids(0, 328))
    s.add(a)
    t = 0.0
    for _ in range(3):
        step = s.schedule(t)
        t += step.duration
        s.finish(step, t)
    assert a.held == 20 and a.blocks == 1  # 330 tokens: 20 full blocks cached, the partial one its own
    b = SimRequest(2, 400, 100, prompt_ids=ids(0, 330) + ids(9000, 70))
    s.add(b)
    step = s.schedule(t)
    assert b.cached_tokens == 320 and step.tokens == [1, 80]
    s.finish(step, t + step.duration)
    check_accounting(s)
    # 20 shared blocks + a's partial block + b's 6 blocks past the shared ones (400 tokens: 25 blocks)
    assert s.num_blocks - s.free_blocks == 20 + 1 + 5


def test_cached_blocks_do_not_count_as_used() -> None:
    runner = VirtualRunner(tiny_cost())
    s = runner.sched
    run_one(runner, SimRequest(1, 500, 30, prompt_ids=ids(0, 500), out_ids=TokenSource(7).take))
    # 529 tokens computed (the last output token never is): 33 full blocks, prompt and output, all cached
    assert s.pool.cached == 33 and len(s.pool.lru) == 33
    assert s.kv_usage == 0.0 and s.free_blocks == s.num_blocks


def test_generated_blocks_are_cached_for_the_next_turn() -> None:
    """A conversation resends its history and the answer it got: the answer's full blocks hit too."""
    runner = VirtualRunner(tiny_cost())
    first = run_one(runner, SimRequest(1, 200, 60, prompt_ids=ids(0, 200), out_ids=TokenSource(3).take))
    gen = TokenSource(3)
    answer = [gen.next() for _ in range(first.num_output)]
    nxt = run_one(runner, SimRequest(2, 300, 5, prompt_ids=ids(0, 200) + answer + ids(800, 40)))
    assert nxt.cached_tokens == (200 + 60 - 1) // BS * BS  # 256: up to the answer's last computed full block


def test_lru_evicts_the_oldest_prefix_and_a_prefix_tail_first() -> None:
    runner = VirtualRunner(tiny_cost(kv_cache_tokens=1024))  # 64 blocks
    s = runner.sched
    x, y = ids(0, 320), ids(5000, 320)
    run_one(runner, SimRequest(1, 320, 1, prompt_ids=x))  # 20 blocks cached
    run_one(runner, SimRequest(2, 320, 1, prompt_ids=y))  # 20 more, newer
    assert s.pool.free == 24 and len(s.pool.lru) == 40 and s.kv_usage == 0.0
    run_one(runner, SimRequest(3, 480, 1, prompt_ids=ids(10_000, 480)))  # 30 blocks: 24 free + 6 evicted
    assert s.pool.evictions == 6
    # x was least recently used, and its last blocks go first: its first 14 blocks remain
    assert run_one(runner, SimRequest(4, 320, 1, prompt_ids=x)).cached_tokens == 14 * BS
    # x's 6 recomputed blocks evicted y's last 6; y keeps 14
    assert run_one(runner, SimRequest(5, 320, 1, prompt_ids=y)).cached_tokens == 14 * BS


def test_pressure_evicts_an_old_prefix_entirely() -> None:
    runner = VirtualRunner(tiny_cost(kv_cache_tokens=1024))
    s = runner.sched
    prefix = ids(0, 320)
    run_one(runner, SimRequest(1, 320, 1, prompt_ids=prefix))
    assert run_one(runner, SimRequest(2, 330, 1, prompt_ids=prefix + ids(900, 10))).cached_tokens == 320
    peak = 0.0
    for i in range(4):  # four at once, 15-16 blocks each: the whole cache
        runner.submit(SimRequest(10 + i, 240, 16, prompt_ids=ids(20_000 + 1000 * i, 240)))
    while runner._arrivals or s.has_work():
        runner.run(until=runner.now + 1e-3)
        peak = max(peak, s.kv_usage)
        check_accounting(s)
    assert peak > 0.9
    assert run_one(runner, SimRequest(3, 330, 1, prompt_ids=prefix + ids(900, 10))).cached_tokens == 0


def test_caching_off_never_hits_nor_counts() -> None:
    cost = tiny_cost(enable_prefix_caching=False)
    runner = VirtualRunner(cost)
    run_one(runner, SimRequest(1, 1200, 4, prompt_ids=ids(0, 1200)))
    again = run_one(runner, SimRequest(2, 1200, 4, prompt_ids=ids(0, 1200)))
    s = runner.sched
    assert again.cached_tokens == 0 and s.prefix_hits == 0 and s.prefix_queries == 0
    assert s.pool.cached == 0 and s.free_blocks == s.num_blocks
    assert ttft(again) == pytest.approx(cost.predict_c1(1200, 4)[0])


def test_resumed_request_rehits_its_own_blocks_but_is_not_counted() -> None:
    """vLLM re-queries the cache for a preempted request; its stats go to separate, unexported counters."""
    s = Scheduler(tiny_cost(kv_cache_tokens=128))  # 8 blocks
    a = SimRequest(1, 64, 16, prompt_ids=ids(0, 64))  # peaks at 80 tokens: 5 blocks
    b = SimRequest(2, 48, 40, prompt_ids=ids(3000, 48))
    s.add(a)
    s.add(b)
    t = 0.0
    resumed_tokens = None
    while s.has_work():
        step = s.schedule(t)
        if b in step.reqs and b.num_preemptions and resumed_tokens is None:
            resumed_tokens = (b.num_computed, step.tokens[step.reqs.index(b)])
        t += step.duration
        s.finish(step, t)
        check_accounting(s)
    assert b.num_preemptions == 1 and a.num_preemptions == 0
    assert resumed_tokens == (48, 1)  # its 3 prompt blocks hit: only the sampled token is recomputed
    assert b.cached_tokens == 0 and s.prefix_hits == 0 and s.prefix_queries == 64 + 48
    assert a.num_output == 16 and b.num_output == 40 and s.kv_usage == 0.0


def test_no_token_ids_means_nothing_cached() -> None:
    runner = VirtualRunner(tiny_cost())
    run_one(runner, SimRequest(1, 500, 4))
    again = run_one(runner, SimRequest(2, 500, 4))
    assert again.cached_tokens == 0 and runner.sched.prefix_queries == 1000 and runner.sched.pool.cached == 0


@pytest.mark.parametrize(("name", "kv_tokens"), [("tiny", 4096), ("dgx-spark/gemma-4-31b-awq", 4096),
                                               ("dgx-spark/qwen3.6-27b-fp8", 16384)])  # 76 blocks of state a request
def test_block_accounting_holds_under_churn(name: str, kv_tokens: int) -> None:
    """Shared prefixes, pressure, preemptions and aborts: every block stays accounted for, and all are free
    (most of them cached) at the end."""
    import random

    rng = random.Random(7)
    cost = CostModel(load_profile(name).with_overrides(kv_cache_tokens=kv_tokens, max_num_batched_tokens=512))
    s = Scheduler(cost)
    prefixes = [ids(1000 * k, rng.randrange(16, 600)) for k in range(4)]
    live: list[SimRequest] = []
    t = 0.0
    for i in range(400):
        if rng.random() < 0.6:
            prompt = rng.choice(prefixes) + ids(50_000 + 97 * i, rng.randrange(1, 200))
            req = SimRequest(i, len(prompt), rng.randrange(1, 400), prompt_ids=prompt, out_ids=TokenSource(i).take)
            s.add(req)
            live.append(req)
        if live and rng.random() < 0.02:
            s.abort(live.pop(rng.randrange(len(live))))
        step = s.schedule(t)
        t += step.duration
        s.finish(step, t)
        check_accounting(s)
    while s.has_work():
        step = s.schedule(t)
        t += step.duration
        s.finish(step, t)
        check_accounting(s)
    assert s.num_preemptions > 0 and s.pool.evictions > 0 and s.prefix_hits > 0
    assert s.kv_usage == 0.0 and s.free_blocks == s.num_blocks and s.pool.cached > 0
