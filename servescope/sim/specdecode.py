"""Speculative decoding in the simulator: vLLM's `--speculative-config` read, what each decode step drafts and
accepts, what verifying the drafts costs, and vLLM's spec-decode counters in `/metrics`.

What is modelled:
- A decode step of a request that drafts computes 1 + d tokens (its last sampled token and d drafted ones,
  d = num_speculative_tokens, fewer near the end of its output) and samples 1 + a of them: the a drafts the
  target model accepts (position i is accepted with probability `acceptance` when every position before it was:
  a truncated geometric count) and the bonus token. The drafted tokens count against the step's token budget and
  its KV blocks, as in vLLM.
- Acceptance is a property of the traffic (how predictable its text is): a request's `vllm_xargs.spec_acceptance`
  (the workload's `spec_acceptance`), else the profile's `[engine] spec_acceptance`, else the method's default.
- The n-gram proposer drafts only when the context repeats an n-gram: here at a step with the same probability as
  a draft token is accepted (repetitive text both matches and is accepted); the model-based methods (EAGLE, MTP,
  a draft model, ...) draft at every step.
- The cost: verifying 1 + d tokens per request is a small prefill (the step's rows and attention grow, its
  weights are read once), so a memory-bound step at low load pays almost nothing for it while a compute-bound
  one at high load pays in full: speculation lowers the time per output token at low load and raises it at high
  load. A model-based proposer adds its own forward passes (a share of the target's decode step per drafted
  token, `DRAFT_COST`); n-gram matching costs the host a little per request and, as in vLLM 0.32, turns
  asynchronous scheduling off.

Not modelled: tree attention, per-request acceptance that changes along the output, rejection sampling at a
temperature (the acceptance given is the one seen), the proposer's own KV cache.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

# vLLM 0.32's methods (vllm/config/speculative.py); "draft_model" when a "model" is given without a method
METHODS = ("ngram", "eagle", "eagle3", "medusa", "mlp_speculator", "mtp", "draft_model", "suffix")
# acceptance of a drafted token when neither the request nor the profile says (typical published figures)
DEFAULT_ACCEPTANCE = {"ngram": 0.5, "suffix": 0.5}
DEFAULT_MODEL_ACCEPTANCE = 0.7
# the proposer's GPU time per drafted token, as a share of the target model's decode step of the same batch
DRAFT_COST = {"ngram": 0.0, "suffix": 0.0, "eagle": 0.06, "eagle3": 0.07, "mtp": 0.06, "medusa": 0.03,
              "mlp_speculator": 0.03, "draft_model": 0.12}
NGRAM_HOST_US = 8.0  # the n-gram proposer's CPU time per request per step (its matching kernel)
CPU_PROPOSERS = ("ngram", "suffix")  # vLLM 0.32 turns asynchronous scheduling off with these


class SpecConfigError(ValueError):
    """A `--speculative-config` that vLLM would refuse; the message is one line naming what to fix."""


@dataclass(frozen=True)
class SpecConfig:
    method: str
    num_speculative_tokens: int

    @property
    def drafts_always(self) -> bool:
        return self.method not in CPU_PROPOSERS


def parse_spec_config(text: str) -> SpecConfig:
    """vLLM's `--speculative-config` JSON: {"method": "ngram", "num_speculative_tokens": 3, ...} (other keys, such
    as prompt_lookup_max or model, are accepted and not used); one-line SpecConfigError when it cannot run."""
    try:
        raw = json.loads(text)
    except ValueError as e:
        raise SpecConfigError(f"--speculative-config {text!r}: not JSON ({e}); give e.g. "
                              '\'{"method": "ngram", "num_speculative_tokens": 3}\'') from None
    if not isinstance(raw, dict):
        raise SpecConfigError(f"--speculative-config {text!r}: must be a JSON object")
    method = raw.get("method")
    if method is None and raw.get("model"):
        method = "draft_model"
    if method not in METHODS:
        raise SpecConfigError(f"--speculative-config: method {method!r} is not one of {', '.join(METHODS)}")
    k = raw.get("num_speculative_tokens")
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 64:
        raise SpecConfigError(f"--speculative-config: num_speculative_tokens must be a whole number from 1 to 64, "
                              f"got {k!r}")
    return SpecConfig(str(method), k)


def default_acceptance(method: str) -> float:
    return DEFAULT_ACCEPTANCE.get(method, DEFAULT_MODEL_ACCEPTANCE)


def accepted_count(rng: random.Random, p: float, d: int) -> int:
    """How many of `d` drafted tokens are accepted: each in turn with probability `p`, until one is rejected."""
    a = 0
    while a < d and rng.random() < p:
        a += 1
    return a


def expected_accepted(p: float, d: int) -> float:
    """E[accepted_count(p, d)] = p (1 - p^d) / (1 - p)."""
    if p >= 1.0:
        return float(d)
    return p * (1.0 - p ** d) / (1.0 - p)


@dataclass
class SpecCounters:
    """vLLM's spec-decode counters (`vllm:spec_decode_num_drafts_total`, ...), summed over the engine's life."""

    k: int
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.accepted_per_pos:
            self.accepted_per_pos = [0] * self.k

    def observe(self, drafted: int, accepted: int) -> None:
        self.drafts += 1
        self.draft_tokens += drafted
        self.accepted += accepted
        for i in range(accepted):
            self.accepted_per_pos[i] += 1

    def render(self, labels: str, out: list[str]) -> None:
        """The counters as vLLM 0.32 exports them (vllm/v1/spec_decode/metrics.py SpecDecodingProm)."""
        for name, doc, v in (("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.", self.drafts),
                             ("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.", self.draft_tokens),
                             ("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.",
                              self.accepted)):
            out.append(f"# HELP {name} {doc}")
            out.append(f"# TYPE {name} counter")
            out.append(f"{name}{{{labels}}} {float(v)!r}")
        name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
        out.append(f"# HELP {name} Accepted tokens per draft position.")
        out.append(f"# TYPE {name} counter")
        for pos, v in enumerate(self.accepted_per_pos):
            out.append(f'{name}{{{labels},position="{pos}"}} {float(v)!r}')
