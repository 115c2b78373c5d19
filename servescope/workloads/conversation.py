"""Multi-turn workloads (`kind = "conversation"` or `"agent"`): how a cell's pool of turns falls into
conversations, and the turns as requests.

A cell's prompts (workloads/prompts.py `build_prompts`) are its turns in order, conversation after
conversation: turn 1 of a conversation opens with the workload's shared start (the `prefix_tokens` system
prompt, or an agent's `context_tokens`), every turn's text is its new user message (an agent's tool result
after the first call). How many turns each conversation has is drawn here, from the workload's `turns` (an
agent's `calls`) or, with a ShareGPT dataset, from the conversations picked (all their human turns, in order),
and is the same for every caller with the same (workload, cell key, count): the prompt builder and the cell that
marks its requests (`mark_turns`) agree without passing anything else between them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

from servescope.core.client import RequestSpec
from servescope.workloads.spec import Workload, read_sharegpt_conversations

__all__ = ["dataset_picks", "layout", "mark_turns"]


def _rng(workload: Workload, cell_key: str, what: str) -> random.Random:
    return random.Random(f"servescope-{what}:{workload.seed}:{workload.name}:{cell_key}")


def dataset_picks(workload: Workload, cell_key: str, n: int) -> list[int]:
    """The dataset conversations (indices) a cell's `n` turns come from, in order."""
    convs = read_sharegpt_conversations(workload.dataset)
    rng = _rng(workload, cell_key, "conversations")
    picks: list[int] = []
    total = 0
    while total < n:
        i = rng.randrange(len(convs))
        picks.append(i)
        total += len(convs[i])
    return picks


def layout(workload: Workload, cell_key: str, n: int) -> list[int]:
    """How many turns each conversation of a cell's `n` turns has, in order (the last one cut to fit `n`)."""
    if n <= 0:
        return []
    if workload.dataset:
        convs = read_sharegpt_conversations(workload.dataset)
        sizes = [len(convs[i]) for i in dataset_picks(workload, cell_key, n)]
    else:
        rng = _rng(workload, cell_key, "conversations")
        sizes = []
        while sum(sizes) < n:
            sizes.append(workload.rounds.sample(rng))
    sizes[-1] -= sum(sizes) - n
    return sizes


def mark_turns(workload: Workload, cell_key: str, specs: Sequence[RequestSpec]) -> list[RequestSpec]:
    """A multi-turn cell's requests (its turns in order, as the runner built them from `build_prompts`) marked
    with their conversation, turn and think time; a single-turn workload's, or already marked ones, as they are."""
    if not workload.multi_turn or not specs or any(s.turn for s in specs):
        return list(specs)
    think = _rng(workload, cell_key, "think")
    out: list[RequestSpec] = []
    for c, size in enumerate(layout(workload, cell_key, len(specs))):
        for t in range(1, size + 1):
            pause = workload.think_time_s.sample(think) if t > 1 else 0.0
            out.append(replace(specs[len(out)], conversation=c, turn=t, think_s=pause))
    return out
