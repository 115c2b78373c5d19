"""The engine: a step-level model of vLLM V1's scheduler, on whatever clock the caller runs it.

Each step: running requests first (a decode token each, or their next prefill chunk), in arrival order;
a request that needs a KV block when none is free preempts the newest running request (recompute: its
blocks are freed and it goes back to the front of the queue, to prefill prompt + output so far). Then
waiting requests are admitted while sequences, the token budget (chunked prefill) and free blocks allow;
one with nothing computed first takes its longest cached prefix (prefill skips those tokens). The KV blocks
and the prefix cache (chain-hashed full blocks, LRU eviction) live in `servescope.sim.prefixcache`, a
request's state in `servescope.sim.request`.
The step's duration comes from `CostModel.step_time`; its tokens are emitted at the step's end.

With speculative decoding on (the profile's `speculative_method`), a decode step of a request may verify drafted
tokens and emit several (`servescope.sim.specdecode`); with LoRA on (`enable_lora`), a step's batch holds at most
`max_loras` distinct adapters, swapping them into the GPU's slots as needed (`servescope.sim.lora`).

`Scheduler` is pure: `schedule()` plans a step, `finish(step, t_end)` applies it. `VirtualRunner` drives
it on a virtual clock (tests, `benchmarks/sim_vs_field.py`); `servescope.sim.server` drives it in real time.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from servescope.sim.lora import LoraCost, LoraInfo, LoraSlots, adapter_bytes
from servescope.sim.prefixcache import KVPool
from servescope.sim.profile import CostModel
from servescope.sim.request import ABORTED, FINISHED, RUNNING, WAITING, SimRequest
from servescope.sim.specdecode import (
    DRAFT_COST,
    NGRAM_HOST_US,
    SpecCounters,
    accepted_count,
    default_acceptance,
)


@dataclass
class Step:
    reqs: list[SimRequest] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    duration: float = 0.0
    num_tokens: int = 0
    num_prefill_tokens: int = 0
    preempted: list[SimRequest] = field(default_factory=list)


class Scheduler:
    def __init__(self, cost: CostModel, max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
                 seed: int = 0) -> None:
        e = cost.profile.engine
        m = cost.profile.model
        self.cost = cost
        self.max_num_seqs = max_num_seqs or e.max_num_seqs
        self.budget = max_num_batched_tokens or e.max_num_batched_tokens
        self.num_blocks = cost.num_blocks
        self.block_size = cost.block_size
        self.prefix_caching = e.enable_prefix_caching
        self.pool = KVPool(cost, e.enable_prefix_caching)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        # counters (exported as vLLM metrics)
        self.num_preemptions = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.steps = 0
        # speculative decoding
        self.spec_method = e.speculative_method
        self.spec_k = e.num_speculative_tokens if e.speculative_method else 0
        self.spec_counters = SpecCounters(self.spec_k) if self.spec_k else None
        self.spec_accept = e.spec_acceptance or (default_acceptance(e.speculative_method) if self.spec_k else 0.0)
        self.spec_drafts_always = self.spec_method not in ("ngram", "suffix")
        self.draft_cost = DRAFT_COST.get(self.spec_method, 0.0)
        self.seed = seed
        # LoRA
        self.lora = e.enable_lora
        self.max_loras = max(1, e.max_loras)
        self.lora_slots = LoraSlots(self.max_loras) if self.lora else None
        self.lora_info = LoraInfo(self.max_loras) if self.lora else None
        self.lora_cost = LoraCost(adapter_bytes(m.dense_params_b + m.unquantized_params_b, m.num_q_heads * m.head_dim,
                                                e.max_lora_rank), cost.bandwidth, cost.gemm_peak)

    # --- queue -----------------------------------------------------------------------------------------
    def add(self, req: SimRequest) -> None:
        req.state = WAITING
        self.pool.prepare(req)
        self.waiting.append(req)

    def abort(self, req: SimRequest) -> None:
        if req.state == RUNNING:
            self.running.remove(req)
            self.pool.release(req)
        elif req.state == WAITING:
            try:
                self.waiting.remove(req)
            except ValueError:
                pass
        req.state = ABORTED

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    @property
    def free_blocks(self) -> int:
        """Blocks no request holds (cached ones nobody holds included, as vLLM counts them)."""
        return self.pool.available

    @property
    def kv_usage(self) -> float:
        return self.pool.usage

    # --- one step --------------------------------------------------------------------------------------
    def _draft(self, req: SimRequest, room: int) -> int:
        """Speculative decoding: the tokens this decode step drafts for `req` (0: none) within `room` budget
        tokens; draws (and keeps on the request) how many of them the target model accepts."""
        d = min(self.spec_k, req.target_len - req.num_output - 1, room)
        if d <= 0:
            return 0
        p = self.spec_accept if req.accept_p is None else req.accept_p
        rng = req.rng
        if rng is None:
            rng = req.rng = random.Random(hash((self.seed, req.rid)))
        if not self.spec_drafts_always and rng.random() >= p:
            return 0  # the n-gram proposer found no match in the context
        req.accept = accepted_count(rng, p, d)
        return d

    def schedule(self, now: float = 0.0) -> Step:
        step = Step()
        pool = self.pool
        grow = pool.grow
        budget = self.budget
        kv_read = 0.0
        pairs = 0.0
        verify = 0.0  # speculative decoding: (query, key) pairs of the drafted tokens' verification
        drafting = 0  # requests that verify drafts this step, and the KV they read
        draft_kv = 0.0
        running = self.running
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n = min(req.total_len - req.num_computed, budget)
            if n <= 0:  # cannot happen: a running request always has a token to compute
                i += 1
                continue
            d = self._draft(req, budget - n) if self.spec_k and n == 1 and req.num_output > 0 else 0
            while not grow(req, req.num_computed + n + d):
                victim = running.pop()  # newest
                self._preempt(victim, step)
                if victim is req:
                    break
            if req.state != RUNNING:
                break
            req.draft = d
            step.reqs.append(req)
            step.tokens.append(n)
            budget -= n + d
            ctx = req.num_computed
            kv_read += self.cost.footprint_tokens(ctx + n)
            if n > 1:
                pairs += n * (ctx + (n + 1) / 2.0)
                step.num_prefill_tokens += n
            if d:
                verify += (1 + d) * (ctx + (d + 2) / 2.0)
                drafting += 1
                draft_kv += self.cost.footprint_tokens(ctx + 1)
            i += 1
        # admit waiting requests (FCFS: stop at the first that does not fit; none in a step that preempted,
        # as vLLM, unless the step would be empty); with LoRA, one whose adapter would be one too many in the
        # batch is skipped (it waits) and the next is looked at, as vLLM's scheduler does
        active = {r.adapter for r in running if r.adapter is not None} if self.lora else set()
        j = 0
        while (j < len(self.waiting) and budget > 0 and len(running) < self.max_num_seqs
               and not (step.preempted and step.reqs)):
            req = self.waiting[j]
            if req.adapter is not None and req.adapter not in active and len(active) >= self.max_loras:
                j += 1
                continue
            hit = pool.lookup(req)  # a waiting request has nothing computed (preemption drops it all)
            start = hit * self.block_size
            n = min(req.total_len - start, budget)
            if not pool.admit(req, hit, start + n):
                break
            del self.waiting[j]
            if req.adapter is not None:
                active.add(req.adapter)
            req.draft = 0
            req.state = RUNNING
            if req.first_scheduled_t < 0:  # first admission: vLLM counts new requests' lookups only
                req.first_scheduled_t = now
                req.cached_tokens = start
                if self.prefix_caching:
                    self.prefix_queries += req.total_len
                    self.prefix_hits += start
            running.append(req)
            step.reqs.append(req)
            step.tokens.append(n)
            budget -= n
            ctx = req.num_computed
            kv_read += self.cost.footprint_tokens(ctx + n)
            pairs += n * (ctx + (n + 1) / 2.0)
            step.num_prefill_tokens += n
        step.num_tokens = self.budget - budget
        if step.reqs:
            cost = self.cost
            step.duration = cost.step_time(step.num_tokens, len(step.reqs), kv_read, pairs, verify)
            if drafting:
                step.duration += self._proposer_s(drafting, draft_kv)
            if self.lora:
                step.duration += self._lora_s(step, active, now)
        return step

    def _proposer_s(self, drafting: int, draft_kv: float) -> float:
        """The proposer's own time this step: a model's forward passes (a share of a decode step of the drafting
        requests per drafted token), or the n-gram matcher's CPU time (not overlapped: asynchronous scheduling
        is off with it)."""
        if self.draft_cost:
            return self.draft_cost * self.spec_k * self.cost.step_time(drafting, drafting, draft_kv, 0.0)
        return drafting * NGRAM_HOST_US / 1e6 if self.spec_method == "ngram" else 0.0

    def _lora_s(self, step: Step, active: set[str], now: float) -> float:
        """What the step's adapters cost it: swaps into the GPU's slots, reading and computing through them."""
        slots, info = self.lora_slots, self.lora_info
        assert slots is not None and info is not None
        used: dict[str, None] = {}
        tokens = 0
        for req, n in zip(step.reqs, step.tokens, strict=True):
            if req.adapter is not None:
                used[req.adapter] = None
                tokens += n + req.draft
        swaps = sum(slots.use(a, active) for a in used)
        info.set(list(dict.fromkeys(r.adapter for r in self.running if r.adapter is not None)),
                 list(dict.fromkeys(r.adapter for r in self.waiting if r.adapter is not None)), time.time())
        return swaps * self.lora_cost.swap_s + self.lora_cost.step_s(len(used), tokens)

    def preempt_all(self) -> None:
        """Preempt every running request (vLLM's reset_prefix_cache with reset_running_requests): they go back to
        the front of the queue, in order, to be computed again."""
        step = Step()
        while self.running:
            self._preempt(self.running.pop(), step)

    def _preempt(self, victim: SimRequest, step: Step) -> None:
        self.pool.release(victim)
        victim.state = WAITING
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)
        step.preempted.append(victim)

    def finish(self, step: Step, t_end: float) -> list[SimRequest]:
        """Apply a step at its end time: advance KV, sample tokens, retire finished requests."""
        self.steps += 1
        done: list[SimRequest] = []
        pool = self.pool
        for req, n in zip(step.reqs, step.tokens, strict=True):
            if req.state != RUNNING:
                continue  # preempted or aborted within this step
            req.num_computed += n
            if req.num_computed < req.total_len:  # a prefill chunk that samples nothing
                if req.num_computed >= req.reg_at:
                    pool.register(req)
                continue
            if req.num_output == 0 and req.num_computed == req.prompt_len:
                self.prompt_tokens_total += req.prompt_len
            emit = 1
            if req.draft:  # the accepted drafts' KV is kept, and they are output with the bonus token
                a = req.accept
                req.num_computed += a
                emit += a
                if self.spec_counters is not None:
                    self.spec_counters.observe(req.draft, a)
                req.draft = req.accept = 0
            req.num_output += emit
            if req.num_computed >= req.reg_at:
                pool.register(req)
            self.generation_tokens_total += emit
            if req.first_token_t < 0:
                req.first_token_t = t_end
            req.last_token_t = t_end
            finished = req.num_output >= req.target_len
            if finished:
                req.state = FINISHED
                req.done_t = t_end
                done.append(req)
            if req.on_tokens is not None:
                req.on_tokens(req, emit, finished, t_end)
        if done:
            for req in done:
                pool.release(req)
            self.running = [r for r in self.running if r.state == RUNNING]
        return done


@dataclass
class RequestResult:
    prompt_len: int
    output_len: int
    arrival: float
    first_token: float
    done: float
    preemptions: int

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def e2e(self) -> float:
        return self.done - self.arrival

    @property
    def tpot(self) -> float:
        return (self.done - self.first_token) / (self.output_len - 1) if self.output_len > 1 else 0.0


class VirtualRunner:
    """Runs the scheduler on a virtual clock: no sleeping, no CPU lag. For tests and calibration."""

    def __init__(self, cost: CostModel, **kw: int) -> None:
        self.cost = cost
        self.sched = Scheduler(cost, **kw)
        self.now = 0.0
        self._arrivals: list[tuple[float, int, SimRequest]] = []
        self._seq = 0
        self.results: list[RequestResult] = []
        self.on_done: Callable[[SimRequest, float], None] | None = None
        self.max_running = 0
        self.max_waiting = 0

    def submit(self, req: SimRequest, at: float | None = None) -> None:
        t = self.now if at is None else at
        req.arrival = t
        heapq.heappush(self._arrivals, (t + self.cost.frontend_s, self._seq, req))
        self._seq += 1

    def run(self, until: float = math.inf) -> None:
        sched = self.sched
        while self.now < until:
            while self._arrivals and self._arrivals[0][0] <= self.now:
                sched.add(heapq.heappop(self._arrivals)[2])
            if not sched.has_work():
                if not self._arrivals:
                    return
                self.now = self._arrivals[0][0]
                continue
            step = sched.schedule(self.now)
            if not step.reqs:  # nothing fits (a request larger than the whole cache)
                raise RuntimeError("KV cache too small for the oldest waiting request")
            self.max_running = max(self.max_running, len(sched.running))
            self.max_waiting = max(self.max_waiting, len(sched.waiting))
            self.now += step.duration
            for req in sched.finish(step, self.now):
                self.results.append(
                    RequestResult(req.prompt_len, req.num_output, req.arrival, req.first_token_t, req.done_t, req.num_preemptions)
                )
                if self.on_done is not None:
                    self.on_done(req, self.now)


def _filler_ids(n: int) -> list[int]:
    return [64] * n


def run_closed_loop(
    cost: CostModel,
    concurrency: int,
    num_requests: int,
    prompt_len: Callable[[int], int] | int,
    output_len: int,
    **kw: int,
) -> tuple[list[RequestResult], float]:
    """`concurrency` users each send their next request when the last one ends. Returns (results, wall).

    The prompts share no prefix, but carry token ids, so that a preempted request re-hits its own cached
    blocks, as it does in the server."""
    runner = VirtualRunner(cost, **kw)
    sent = 0

    def make(i: int) -> SimRequest:
        pl = prompt_len(i) if callable(prompt_len) else prompt_len
        return SimRequest(i, pl, output_len, prompt_ids=[i, *range(64, 63 + pl)], out_ids=_filler_ids)

    def on_done(req: SimRequest, t: float) -> None:
        nonlocal sent
        if sent < num_requests:
            runner.submit(make(sent), t)
            sent += 1

    runner.on_done = on_done
    for _ in range(min(concurrency, num_requests)):
        runner.submit(make(sent), 0.0)
        sent += 1
    runner.run()
    return runner.results, runner.now
