"""The quality probe's typed contract and its arithmetic: task items, scores, greedy traces, divergence from a
reference, perplexity, and the binomial interval of an accuracy.

Who uses what:
    workloads/quality.py  builds `TaskItem`s (arithmetic, retrieval, needle, json, a user's JSONL)
    core/probe.py         sends them (and the fixed divergence prompts) and returns texts and `Trace`s
    engine/quality.py     scores them here and builds a `QualityResult`
    sessions/             stores `QualityResult.to_dict()` as quality.json and compares two of them

The formulas (also in docs/quality.md):
    perplexity      exp(-(1/N) * sum_i log p(x_i | x_<i)) over the corpus's tokens after the first
    KL(P || Q)      at one position, P = the reference's top-k distribution, Q = the candidate's, each with the
                    rest of the mass as one "other" outcome:
                        sum_{t in topk(P)} p_t * (log p_t - log q_t)  +  p_other * (log p_other - log q_other)
                    where q_t for a token missing from Q's top-k is min(Q's smallest listed probability,
                    Q's unlisted mass) and q_other = 1 - sum of those q_t (floored at 1e-10)
    top-1 agreement the share of compared positions where Q's most likely token is P's
    first divergence the index of the first generated token where the greedy outputs differ (the output's
                    length when they never do); positions after it have different contexts and are not compared
    accuracy        correct / n, with a Wilson score interval at 95%; two accuracies differ when a pooled
                    two-proportion z-test says so at 95%
    intervals       KL mean: mean +- 1.96 standard errors over the prompts' own means (positions of one prompt
                    are not independent); perplexity: exp of mean +- 1.96 standard errors of the per-token
                    negative log-likelihood; two differ when their intervals do not overlap

This module imports neither polars nor textual.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import TypedDict

import msgspec

from servescope.core.jsontypes import JsonObject

TASKS = ("arithmetic", "retrieval", "needle", "json")
SCORERS = ("exact", "choice", "regex", "json")
FLOOR = 1e-10


class TaskItem(msgspec.Struct, frozen=True, kw_only=True):
    """One exact-answer question. `context` is the prompt's intended length in tokens (0: short task)."""

    task: str
    prompt: str
    answer: str
    scorer: str = "exact"
    context: int = 0
    max_tokens: int = 16


class TaskScore(msgspec.Struct, kw_only=True):
    accuracy: float
    n: int
    correct: int
    lo: float
    hi: float


class Trace(msgspec.Struct, kw_only=True):
    """A greedy generation: the tokens (as the server names them) and, per position, the top-k log
    probabilities {token: logprob} the server returned."""

    prompt: str
    tokens: list[str]
    top: list[dict[str, float]]


class Divergence(msgspec.Struct, kw_only=True):
    kl_mean: float
    kl_p99: float
    top1_agreement: float
    first_divergence_mean: float
    positions: int
    prompts: int
    method: str = "greedy prefix"  # how positions were aligned (see `divergence`)
    kl_ci: tuple[float, float] | None = None  # 95% interval of kl_mean over prompts (see `mean_ci`)
    diverged: int = 0  # compared generations whose greedy tokens differ somewhere


class Answer(TypedDict):
    """One task question as asked and answered (its output cut to 200 characters)."""

    task: str
    context: int
    answer: str
    output: str
    ok: bool


class TaskAccuracy(TypedDict):
    accuracy: float
    n: int


class ReferenceSummary(TypedDict):
    kl_mean: float
    kl_p99: float
    top1_agreement: float
    first_divergence_mean: float


class QualitySummary(TypedDict):
    """`QualityResult.summary()`: what `--json` prints of a session's quality."""

    perplexity: float | None
    tasks: dict[str, TaskAccuracy]
    reference: ReferenceSummary | None


class QualityResult(msgspec.Struct, kw_only=True):
    perplexity: float | None = None
    perplexity_tokens: int = 0
    perplexity_note: str = ""  # why there is no perplexity (e.g. the server has no prompt_logprobs)
    perplexity_ci: tuple[float, float] | None = None  # 95% interval (see `perplexity_interval`)
    tasks: dict[str, TaskScore] = msgspec.field(default_factory=dict)
    reference: Divergence | None = None
    reference_session: str | None = None
    traces: list[Trace] = msgspec.field(default_factory=list)  # kept so this session can be a reference
    answers: list[Answer] = msgspec.field(default_factory=list)

    def to_dict(self) -> JsonObject:
        """quality.json's shape."""
        out: JsonObject = msgspec.to_builtins(self)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> QualityResult:
        return msgspec.convert(dict(d), cls)

    def summary(self) -> QualitySummary:
        """The Contract's shape without the session name: {"perplexity", "tasks": {NAME: {"accuracy", "n"}},
        "reference": {...} | null}."""
        ref: ReferenceSummary | None = None
        if self.reference is not None:
            r = self.reference
            ref = {"kl_mean": r.kl_mean, "kl_p99": r.kl_p99, "top1_agreement": r.top1_agreement,
                   "first_divergence_mean": r.first_divergence_mean}
        return {"perplexity": self.perplexity,
                "tasks": {k: {"accuracy": v.accuracy, "n": v.n} for k, v in self.tasks.items()},
                "reference": ref}


# --------------------------------------------------------------------------------------------------------
# accuracy
# --------------------------------------------------------------------------------------------------------


def wilson(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% at z=1.96); (0, 1) when n is 0."""
    if n <= 0:
        return 0.0, 1.0
    nf = float(n)  # float arithmetic throughout: n * n of a huge count cannot overflow int-to-float
    p = correct / nf
    den = 1 + z * z / nf
    mid = (p + z * z / (2 * nf)) / den
    half = z * math.sqrt(p * (1 - p) / nf + z * z / (4 * nf * nf)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def task_score(oks: Sequence[bool]) -> TaskScore:
    n = len(oks)
    c = sum(1 for o in oks if o)
    lo, hi = wilson(c, n)
    return TaskScore(accuracy=c / n if n else 0.0, n=n, correct=c, lo=lo, hi=hi)


def accuracies_differ(a: TaskScore, b: TaskScore, z: float = 1.96) -> bool:
    """Two-proportion z-test (pooled) at 95%: is the difference between two accuracies beyond noise?"""
    if a.n == 0 or b.n == 0:
        return False
    p = (a.correct + b.correct) / (a.n + b.n)
    se = math.sqrt(p * (1 - p) * (1 / a.n + 1 / b.n))
    if se == 0:
        return a.accuracy != b.accuracy
    return abs(a.accuracy - b.accuracy) / se > z


# --------------------------------------------------------------------------------------------------------
# scoring
# --------------------------------------------------------------------------------------------------------

_FENCE = re.compile(r"^```[a-zA-Z]*\s*|\s*```$")


def first_line(text: str) -> str:
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()
    return ""


def score(item: TaskItem, output: str) -> bool:
    """Is `output` the right answer to `item`? exact: the first non-empty line equals the answer (surrounding
    spaces and a final period ignored); choice: the first letter/word token equals the answer (case-insensitive);
    regex: the answer is a pattern searched in the output; json: the output (code fences stripped) parses to the
    same JSON value as the answer."""
    if item.scorer == "exact":
        return first_line(output).rstrip(".").strip() == item.answer.strip()
    if item.scorer == "choice":
        m = re.match(r"\W*([A-Za-z0-9]+)", output)
        return m is not None and m.group(1).lower() == item.answer.strip().lower()
    if item.scorer == "regex":
        try:
            return re.search(item.answer, output) is not None
        except re.error:
            return False
    if item.scorer == "json":
        text = _FENCE.sub("", output.strip())
        try:
            got = json.JSONDecoder().raw_decode(text.strip())[0]
            return bool(got == json.loads(item.answer))
        except ValueError:
            return False
    raise ValueError(f"unknown scorer {item.scorer!r}: use one of {', '.join(SCORERS)}")


# --------------------------------------------------------------------------------------------------------
# perplexity and divergence
# --------------------------------------------------------------------------------------------------------


def perplexity(logprobs: Sequence[float]) -> float:
    """exp of the mean negative log-likelihood (natural log) of the scored tokens."""
    if not logprobs:
        raise ValueError("no token log probabilities to compute a perplexity from")
    return math.exp(-sum(logprobs) / len(logprobs))


def mean_ci(values: Sequence[float], z: float = 1.96) -> tuple[float, float] | None:
    """Mean +- z standard errors (a normal approximation); None for fewer than two values."""
    n = len(values)
    if n < 2:
        return None
    m = sum(values) / n
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    return m - z * sd / math.sqrt(n), m + z * sd / math.sqrt(n)


def perplexity_interval(logprobs: Sequence[float]) -> tuple[float, float] | None:
    """95% interval of the perplexity: exp of the interval of the mean negative log-likelihood per token."""
    ci = mean_ci([-v for v in logprobs])
    return None if ci is None else (math.exp(ci[0]), math.exp(ci[1]))


def intervals_apart(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
    """Do two 95% intervals not overlap (a conservative test of a difference)?"""
    return a is not None and b is not None and (a[1] < b[0] or b[1] < a[0])


def kl_topk(p_top: Mapping[str, float], q_top: Mapping[str, float]) -> float:
    """KL(P || Q) in nats from two top-k logprob maps (see the module's docstring); 0 for identical maps."""
    if not p_top:
        return 0.0
    q_listed = {t: math.exp(v) for t, v in q_top.items()}
    q_rest = max(1.0 - sum(q_listed.values()), FLOOR)
    q_missing = min(min(q_listed.values(), default=q_rest), q_rest)
    kl = 0.0
    q_used = 0.0
    p_used = 0.0
    for t, lp in p_top.items():
        p = math.exp(lp)
        q = q_listed.get(t, q_missing)
        q = max(q, FLOOR)
        kl += p * (lp - math.log(q))
        p_used += p
        q_used += q
    p_other = 1.0 - p_used
    if p_other > FLOOR:
        q_other = max(1.0 - q_used, FLOOR)
        kl += p_other * (math.log(p_other) - math.log(q_other))
    return kl if kl > 1e-12 else 0.0  # float rounding of identical maps is no divergence


def _argmax(top: Mapping[str, float]) -> str | None:
    return max(top.items(), key=lambda kv: kv[1])[0] if top else None


def _p99(values: Sequence[float]) -> float:
    s = sorted(values)
    if not s:
        return 0.0
    k = (len(s) - 1) * 0.99
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def divergence(reference: Sequence[Trace], candidate: Sequence[Trace]) -> Divergence:
    """Compare greedy traces with a reference's traces of the same prompts (matched by prompt text).

    Positions are compared while both generations share their context: up to and including the first position
    where the greedy tokens differ (at that position both saw the same prefix; after it they did not)."""
    refs = {t.prompt: t for t in reference}
    kls: list[float] = []
    per_prompt: list[float] = []
    agree = 0
    firsts: list[int] = []
    prompts = diverged = 0
    for c in candidate:  # a prompt may come more than once (the same prompt at different moments of a load)
        ref = refs.get(c.prompt)
        if ref is None:
            continue
        prompts += 1
        n = min(len(ref.tokens), len(c.tokens), len(ref.top), len(c.top))
        first = n
        start = len(kls)
        for i in range(n):
            kls.append(kl_topk(ref.top[i], c.top[i]))
            if _argmax(c.top[i]) == _argmax(ref.top[i]):
                agree += 1
            if ref.tokens[i] != c.tokens[i]:
                first = i
                break
        firsts.append(first)
        diverged += first < n
        if len(kls) > start:
            per_prompt.append(sum(kls[start:]) / (len(kls) - start))
    if not prompts:
        raise ValueError("the reference and this run share no prompt: run the probe with the same prompts")
    return Divergence(kl_mean=sum(kls) / len(kls) if kls else 0.0, kl_p99=_p99(kls),
                      top1_agreement=agree / len(kls) if kls else 1.0,
                      first_divergence_mean=sum(firsts) / len(firsts), positions=len(kls), prompts=prompts,
                      kl_ci=mean_ci(per_prompt), diverged=diverged)
