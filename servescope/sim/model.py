"""The simulator's seeded toy "model": a deterministic next-token distribution for any context, so that it can
answer log-probability requests (`logprobs`, `prompt_logprobs`) and greedy generations like a real server.

At each position the model lists `NUM_LISTED` tokens with their own logits and lumps the rest of the vocabulary
into one "tail" outcome spread evenly over its tokens, so every log-probability is proper (the listed
probabilities plus the tail's sum to 1). The listed tokens are 8 word ids drawn from a hash of the last two
tokens and the position, plus a fixed set of frequent tokens (punctuation, newline, English function words),
in an order drawn from the same hash. The logits follow a fixed shape by rank: the top token, a gap to the
second (near ties in `NEAR_TIE` of the positions), then small steps down. The base model is the same for every
profile: two servers differ only through the profile's degradation.

Degradation (`[quality]` in the profile): `logit_noise` is the standard deviation of Gaussian noise added to
every logit, the tail's included, seeded by the profile's `seed` and the position's hash. Noise 0 reproduces
the base model exactly; a noisy one has a KL divergence of about noise^2 / 4 nats to it, and its greedy
choice differs where the top two logits are closer than the noise (at about 0.1 x noise of the positions:
2.6% for noise 0.25, so a greedy output parts from the base model's after some 40 tokens). The model knows no
language: a real text's perplexity under it is in the millions (most tokens fall in the tail), and only the ratio
between two servers' perplexities means something (noise raises it by about noise^2 / 4 in the log).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from servescope.sim.tokenizer import BOS_ID, NUM_WORDS, VOCAB_SIZE, WORD_BASE, Tokenizer

NUM_CANDIDATES = 8  # hashed word ids listed at each position
FREQUENT = (".", ",", "\n", "the", "of", "and", "to", "a", "in", "is", "that", "it", "for", "was", "on", "with")
# how likely each frequent token is to rank high (a candidate word draws its rank score from U(0, 1))
FREQUENT_WEIGHTS = (0.95, 0.95, 0.8, 0.9, 0.8, 0.8, 0.8, 0.75, 0.75, 0.7, 0.6, 0.6, 0.6, 0.55, 0.55, 0.5)
FREQUENT_IDS: tuple[int, ...] = tuple(Tokenizer().encode(" ".join(FREQUENT)))
NUM_LISTED = NUM_CANDIDATES + len(FREQUENT)
NEAR_TIE = 0.3  # share of positions whose top two logits are within 2 nats (uniformly)
FORCE_MARGIN = 5.0  # a forced token's logit over the model's own top one
_MASK = 0xFFFFFFFFFFFFFFFF
_FREQUENT_SET = frozenset(FREQUENT_IDS)


def _mix(x: int) -> int:
    """splitmix64's finalizer: a well-spread 64-bit hash of a 64-bit integer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def context_key(prev2: int, prev1: int, pos: int) -> int:
    """The hash a position's distribution derives from: the two tokens before it (-1: none) and its index."""
    return _mix(_mix(_mix(pos) ^ (prev1 + 1)) ^ (prev2 + 1))


class Dist:
    """One position's next-token distribution: the listed tokens sorted by log-probability (highest first), and
    the log-probability of each of the `n_tail` other tokens of the vocabulary."""

    __slots__ = ("ids", "lps", "tail_lp", "n_tail")

    def __init__(self, ids: list[int], lps: list[float], tail_lp: float, n_tail: int) -> None:
        self.ids = ids
        self.lps = lps
        self.tail_lp = tail_lp
        self.n_tail = n_tail

    def logprob(self, token: int) -> float:
        try:
            return self.lps[self.ids.index(token)]
        except ValueError:
            return self.tail_lp

    def rank(self, token: int) -> int:
        """1 + the number of tokens of the vocabulary more likely than `token` (vLLM's rank)."""
        lps = self.lps
        try:
            i = self.ids.index(token)
        except ValueError:
            return 1 + sum(1 for lp in lps if lp > self.tail_lp)
        return i + 1 + (self.n_tail if self.tail_lp > lps[i] else 0)

    def top(self, k: int) -> list[tuple[int, float]]:
        """The `k` most likely tokens with their log-probabilities (listed tokens only: k <= NUM_LISTED)."""
        return list(zip(self.ids[:k], self.lps[:k], strict=True))

    def total_prob(self) -> float:
        return sum(math.exp(lp) for lp in self.lps) + self.n_tail * math.exp(self.tail_lp)

    def sample(self, rng: random.Random, temperature: float) -> int:
        """A token drawn from the distribution at `temperature` (> 0)."""
        inv = 1.0 / temperature
        tail_w = self.tail_lp * inv + math.log(self.n_tail)
        m = max(self.lps[0] * inv, tail_w)
        weights = [math.exp(lp * inv - m) for lp in self.lps]
        weights.append(math.exp(tail_w - m))
        r = rng.random() * sum(weights)
        for tid, w in zip(self.ids, weights, strict=False):
            r -= w
            if r < 0:
                return tid
        listed = set(self.ids)
        while True:  # a tail token: any word id not listed
            tid = WORD_BASE + rng.randrange(NUM_WORDS)
            if tid not in listed:
                return tid


class ToyModel:
    """The base model plus a profile's logit noise (`noise`, seeded by `seed`)."""

    def __init__(self, noise: float = 0.0, seed: int = 0) -> None:
        self.noise = float(noise)
        self.seed_key = _mix(seed & _MASK ^ 0x5EED)
        self._rng = random.Random(0)

    def dist(self, prev2: int, prev1: int, pos: int, force: int | None = None) -> Dist:
        """The distribution of the token at index `pos` after `prev2, prev1` (-1 where the context is shorter).
        `force`: a token the "model" knows comes next (a task's answer): it gets the top logit, by a margin."""
        key = context_key(prev2, prev1, pos)
        rng = self._rng
        rng.seed(key)
        cands: list[int] = []
        while len(cands) < NUM_CANDIDATES:
            tid = WORD_BASE + rng.randrange(NUM_WORDS)
            if tid not in _FREQUENT_SET and tid not in cands:
                cands.append(tid)
        listed = cands + list(FREQUENT_IDS)
        scores = [rng.random() for _ in cands] + [w * rng.random() for w in FREQUENT_WEIGHTS]
        order = sorted(range(NUM_LISTED), key=scores.__getitem__, reverse=True)
        ids = [listed[i] for i in order]
        gap = 2.0 * rng.random() if rng.random() < NEAR_TIE else 2.0 + 3.0 * rng.random()
        level = -gap
        logits = [0.0, level]
        for _ in range(NUM_LISTED - 2):
            level -= 0.05 + 0.25 * rng.random()
            logits.append(level)
        tail = -2.0 - 2.0 * rng.random()  # the logit of "any other token", all of them together
        if force is not None:
            if force in ids:  # keep the shape: the ranks below it move up one
                ids.remove(force)
                logits.pop()
            ids.insert(0, force)
            logits.insert(0, FORCE_MARGIN)
        if self.noise > 0.0:
            rng.seed(key ^ self.seed_key)
            gauss = rng.gauss
            sigma = self.noise
            logits = [x + gauss(0.0, sigma) for x in logits]
            tail += gauss(0.0, sigma)
            pairs = sorted(zip(logits, ids, strict=True), reverse=True)
            logits = [p[0] for p in pairs]
            ids = [p[1] for p in pairs]
        m = max(logits[0], tail)
        exp = math.exp
        lse = m + math.log(sum(exp(x - m) for x in logits) + exp(tail - m))
        n_tail = VOCAB_SIZE - len(ids)
        return Dist(ids, [x - lse for x in logits], tail - lse - math.log(n_tail), n_tail)

    def dist_at(self, ids: Sequence[int], i: int, force: int | None = None) -> Dist:
        """The distribution of token `i` of a sequence given the tokens before it (see `context_at`)."""
        return self.dist(*context_at(ids, i), force)


def context_at(ids: Sequence[int], i: int) -> tuple[int, int, int]:
    """(prev2, prev1, pos) of token `i` of a sequence. A leading BOS is no context (the model is the same for a
    profile that adds one and one that does not): positions count from the token after it."""
    start = 1 if ids and ids[0] == BOS_ID else 0
    return ids[i - 2] if i - 2 >= start else -1, ids[i - 1] if i - 1 >= start else -1, i - start
