"""The KV block pool with automatic prefix caching, as vLLM V1's `BlockPool` and `KVCacheManager` run it.

What is modelled:
- KV memory is `num_blocks` blocks of `block_size` tokens; a request holding `t` tokens needs
  `CostModel.blocks_for(t)` of them.
- A request's tokens (prompt, then generated) are hashed per full block as a chain: block i's hash is
  `hash((hash of block i-1, its token ids))`, so two requests share cached blocks exactly over their common
  full-block prefix. Prompt blocks are hashed once, when the request enters the engine; generated blocks as
  their KV is computed (the engine sees the same output ids as the client, so a conversation that resends
  its history and the answer it got shares the answer's full blocks too).
- A full block enters the cache as soon as its KV is computed, so a request arriving while another with the
  same prefix still runs shares it. Blocks held by running requests are pinned (reference counted).
- When a request finishes, is preempted or aborted, its cached blocks become free-but-cached, in LRU order,
  its last block first (vLLM frees a request's blocks in reverse, so a prefix outlives its tail).
- Allocation takes blocks with no cached content first, then evicts the least recently used cached block.
- A request being scheduled from the waiting queue with nothing computed (new, or preempted and resumed:
  vLLM re-queries too) takes the longest cached prefix of full blocks, at most `num_tokens - 1` tokens (the
  last token is always computed, to sample from). The scheduler counts queries and hits for new requests
  only, at admission, as vLLM's `vllm:prefix_cache_queries/hits` do (resumed ones go to vLLM's separate
  preempted counters, which the simulator does not export).
- Usage (`vllm:kv_cache_usage_perc`) counts blocks held by requests only: cached-free blocks count as free.
- A LoRA request's blocks hash under its adapter (the chain starts from the adapter's own root), so the same
  prompt through two adapters, or an adapter and the base model, shares nothing, as in vLLM.
- `reset()` (vLLM's `POST /reset_prefix_cache`) empties the cache, and fails, as vLLM's does, while a running
  request holds blocks.

Not modelled:
- vLLM keeps uncached and cached free blocks in one FIFO queue, so it can evict a cached block while an
  uncached one waits further back; here uncached free blocks are always used first (the cache lives a little
  longer under pressure).
- Two running requests computing the same block at once: vLLM keeps both copies until they end; here the
  second copy is merged into the first as soon as it is computed, and its block freed.
- Hybrid models: one cached block costs one pool block, though a sliding-window model's old blocks hold
  only its full-attention layers; a hit on a linear-attention (Mamba, DeltaNet) model restores the recurrent
  state for free, where vLLM needs a state checkpoint at that block. A request whose `blocks_for` is below
  its full-block count (sliding window) caches only as many blocks as it holds.
- Extra hash keys (multimodal inputs, `cache_salt`), prompt logprobs skipping the cache, KV events; hashes are Python's 64-bit tuple hashes (vLLM: SHA-256 or xxHash), so collisions
  are possible in principle.
"""

from __future__ import annotations

import math
import zlib
from collections import OrderedDict
from collections.abc import Sequence

from servescope.sim.profile import CostModel
from servescope.sim.request import SimRequest

ROOT_HASH = 0x5E5C09E  # the parent of a chain's first block (an int: Python does not randomise int hashes)


def chain_hashes(ids: Sequence[int], block_size: int, parent: int = ROOT_HASH) -> tuple[list[int], list[int]]:
    """(hashes of the full blocks of `ids`, the ids left over in the last partial block)."""
    end = len(ids) - len(ids) % block_size
    hashes: list[int] = []
    h = parent
    for i in range(0, end, block_size):
        h = hash((h, tuple(ids[i:i + block_size])))
        hashes.append(h)
    return hashes, list(ids[end:])


def _root(req: SimRequest) -> int:
    """The parent of a request's first block: the base model's root, or its adapter's own."""
    return ROOT_HASH if req.adapter is None else hash((ROOT_HASH, zlib.crc32(req.adapter.encode())))


class KVPool:
    """The blocks: uncached free ones (`free`), cached ones nobody holds (`lru`), and those requests hold.

    A request holds `req.held` cached blocks (the first of its chain, shared and reference counted in
    `refs`) plus `req.blocks` of its own (the partial last block, blocks not yet computed, recurrent state).
    """

    def __init__(self, cost: CostModel, caching: bool) -> None:
        self.cost = cost
        self.block_size = cost.block_size
        self.num_blocks = cost.num_blocks
        self.caching = caching
        self.free = cost.num_blocks
        self.refs: dict[int, int] = {}  # cached block hash -> running requests holding it (0: in `lru`)
        self.lru: OrderedDict[int, None] = OrderedDict()  # cached blocks nobody holds, least recently used first
        self.evictions = 0

    @property
    def available(self) -> int:
        """Blocks an allocation can take: uncached free ones and evictable cached ones."""
        return self.free + len(self.lru)

    @property
    def usage(self) -> float:
        return 1.0 - self.available / self.num_blocks if self.num_blocks else 0.0

    @property
    def cached(self) -> int:
        """Blocks in the prefix cache, held or not."""
        return len(self.refs)

    def reset(self, running: int) -> bool:
        """Empty the prefix cache (vLLM's reset_prefix_cache): False, and nothing changed, while `running` requests
        hold blocks (vLLM refuses then too)."""
        if running:
            return False
        self.free += len(self.lru)
        self.lru.clear()
        self.refs.clear()
        return True

    def prepare(self, req: SimRequest) -> None:
        """Hash a request's prompt as it enters the engine (once), then drop its token ids."""
        if req.prompt_ids is not None:
            if self.caching and req.hashes is None:
                req.hashes, req.tail = chain_hashes(req.prompt_ids, self.block_size, _root(req))
            req.prompt_ids = None
        if req.hashes is None:
            req.reg_at = math.inf

    def _take(self, n: int) -> None:
        """Take `n` blocks, which the caller checked are available: uncached ones first, then evict LRU."""
        own = min(n, self.free)
        self.free -= own
        n -= own
        if n:
            lru, refs = self.lru, self.refs
            for _ in range(n):
                h, _ = lru.popitem(last=False)
                del refs[h]
            self.evictions += n

    def grow(self, req: SimRequest, tokens: int) -> bool:
        """Give a running request room for `tokens` tokens; False (and nothing taken) when they do not fit."""
        need = self.cost.blocks_for(tokens) - req.held - req.blocks
        if need <= 0:
            return True
        if need > self.free + len(self.lru):
            return False
        self._take(need)
        req.blocks += need
        return True

    def _extend(self, req: SimRequest, nblocks: int) -> int:
        """Hash the request's blocks up to `nblocks` as far as its sampled tokens go; returns how many are hashed."""
        hashes = req.hashes
        if hashes is None:
            return 0
        bs = self.block_size
        take = req.out_ids
        while len(hashes) < nblocks:
            tail = req.tail
            need = bs - len(tail)
            if take is None or req.num_output - req.out_pulled < need:
                break
            tail.extend(take(need))
            req.out_pulled += need
            hashes.append(hash((hashes[-1] if hashes else _root(req), tuple(tail))))
            req.tail = []
        return len(hashes)

    def lookup(self, req: SimRequest) -> int:
        """Blocks of the longest cached prefix of a request, leaving at least its last token to compute."""
        if not self.caching or req.hashes is None:
            return 0
        limit = (req.total_len - 1) // self.block_size
        limit = min(limit, self._extend(req, limit))
        hashes, refs = req.hashes, self.refs
        k = 0
        while k < limit and hashes[k] in refs:
            k += 1
        return k

    def admit(self, req: SimRequest, hit: int, tokens: int) -> bool:
        """Give a waiting request its `hit` cached blocks and room for `tokens` tokens, or nothing if that
        does not fit (cached blocks nobody holds count against the free ones, as vLLM counts them)."""
        hit_hashes = req.hashes[:hit] if hit and req.hashes is not None else []
        lru, refs = self.lru, self.refs
        touched = sum(1 for h in hit_hashes if h in lru)
        need = max(self.cost.blocks_for(tokens) - hit, 0)
        if need + touched > self.free + len(lru):
            return False
        for h in hit_hashes:
            r = refs[h]
            if r == 0:
                del lru[h]
            refs[h] = r + 1
        self._take(need)
        bs = self.block_size
        req.held = hit
        req.blocks = need
        req.num_computed = hit * bs
        if req.reg_at != math.inf:
            req.reg_at = (hit + 1) * bs
        return True

    def register(self, req: SimRequest) -> None:
        """Enter a request's newly computed full blocks in the cache (vLLM caches a block once it is computed)."""
        bs = self.block_size
        full = req.num_computed // bs
        n = min(self._extend(req, full), full)
        hashes = req.hashes
        if hashes is not None:
            refs, lru = self.refs, self.lru
            while req.held < n and req.blocks > 0:
                h = hashes[req.held]
                r = refs.get(h)
                if r is None:
                    refs[h] = 1
                else:  # computed twice: share the cached copy, free this one
                    if r == 0:
                        del lru[h]
                    refs[h] = r + 1
                    self.free += 1
                req.blocks -= 1
                req.held += 1
        if hashes is None or n < full:  # no token ids for the rest: nothing more to cache
            req.reg_at = math.inf
        else:
            req.reg_at = (full + 1) * bs

    def release(self, req: SimRequest) -> None:
        """Free a request's blocks: its cached ones stay cached, evictable, its last one first."""
        held = req.held
        if held:
            refs, lru = self.refs, self.lru
            hashes = req.hashes
            assert hashes is not None
            for i in range(held - 1, -1, -1):
                h = hashes[i]
                r = refs[h] - 1
                refs[h] = r
                if r == 0:
                    lru[h] = None
        self.free += req.blocks
        req.held = 0
        req.blocks = 0
        req.num_computed = 0
        if req.reg_at != math.inf:
            req.reg_at = self.block_size
