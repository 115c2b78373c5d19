"""A request inside the simulator's engine: its lengths, its progress through the scheduler and the KV blocks and
cached prefix it holds. The scheduler (`servescope.sim.engine`) and the KV pool (`servescope.sim.prefixcache`)
both work on it."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

WAITING, RUNNING, FINISHED, ABORTED = 0, 1, 2, 3


class SimRequest:
    """One request inside the engine. Token emission goes through `on_tokens(req, n, finished, t)`.

    `prompt_ids` (hashed for the prefix cache when the request enters the engine) and `out_ids` (`out_ids(n)`:
    the next n output token ids, in the order the client gets them) are optional: without prompt ids nothing
    is cached, without output ids only the prompt's blocks.
    """

    __slots__ = (
        "rid", "prompt_len", "max_tokens", "target_len", "finish_reason", "arrival", "state",
        "num_computed", "num_output", "blocks", "first_token_t", "last_token_t", "first_scheduled_t",
        "num_preemptions", "on_tokens", "cached_tokens", "done_t",
        "prompt_ids", "out_ids", "hashes", "tail", "out_pulled", "held", "reg_at",
        "adapter", "accept_p", "rng", "draft", "accept",
    )

    def __init__(
        self,
        rid: int,
        prompt_len: int,
        max_tokens: int,
        target_len: int | None = None,
        arrival: float = 0.0,
        on_tokens: Callable[[SimRequest, int, bool, float], None] | None = None,
        prompt_ids: Sequence[int] | None = None,
        out_ids: Callable[[int], list[int]] | None = None,
        adapter: str | None = None,
        accept_p: float | None = None,
    ) -> None:
        self.rid = rid
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.target_len = max_tokens if target_len is None else max(1, min(target_len, max_tokens))
        self.finish_reason = "length" if self.target_len >= max_tokens else "stop"
        self.arrival = arrival
        self.state = WAITING
        self.num_computed = 0  # tokens whose KV is in the cache
        self.num_output = 0
        self.blocks = 0  # KV blocks of its own (cached ones it shares: `held`)
        self.first_token_t = -1.0
        self.last_token_t = -1.0
        self.first_scheduled_t = -1.0
        self.num_preemptions = 0
        self.on_tokens = on_tokens
        self.cached_tokens = 0  # prompt tokens the prefix cache had when first scheduled (usage's cached_tokens)
        self.done_t = -1.0
        # prefix cache (servescope.sim.prefixcache)
        self.prompt_ids = prompt_ids
        self.out_ids = out_ids
        self.hashes: list[int] | None = None  # chain hashes of its full blocks, as far as known
        self.tail: list[int] = []  # token ids after the last hashed block
        self.out_pulled = 0  # output ids taken from `out_ids`
        self.held = 0  # cached blocks it holds: the first `held` of `hashes`
        self.reg_at = 0.0  # computed tokens at which its next full block is cached
        # LoRA: the adapter it runs with (None: the base model); speculative decoding (servescope.sim.specdecode):
        # its drafts' acceptance (None: the engine's), the seeded draws, this step's drafted and accepted tokens
        self.adapter = adapter
        self.accept_p = accept_p
        self.rng: random.Random | None = None
        self.draft = 0
        self.accept = 0

    @property
    def total_len(self) -> int:
        """Tokens whose KV must exist before the next token can be sampled."""
        return self.prompt_len + self.num_output
