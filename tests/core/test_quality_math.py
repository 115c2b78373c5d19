"""The quality probe's arithmetic (servescope/core/quality.py): KL from top-k maps, divergence of greedy traces,
perplexity, the Wilson interval, the two-proportion test, and exact scoring."""

from __future__ import annotations

import math

import pytest

from servescope.core.quality import (
    QualityResult,
    TaskItem,
    Trace,
    accuracies_differ,
    divergence,
    kl_topk,
    perplexity,
    score,
    task_score,
    wilson,
)


def _lp(probs: dict[str, float]) -> dict[str, float]:
    return {k: math.log(v) for k, v in probs.items()}


def test_kl_of_identical_maps_is_zero_and_of_different_ones_is_the_exact_kl():
    p = _lp({"a": 0.5, "b": 0.3, "c": 0.2})
    assert kl_topk(p, p) == pytest.approx(0.0, abs=1e-12)
    q = _lp({"a": 0.2, "b": 0.3, "c": 0.5})
    exact = 0.5 * math.log(0.5 / 0.2) + 0.3 * math.log(1) + 0.2 * math.log(0.2 / 0.5)
    assert kl_topk(p, q) == pytest.approx(exact, rel=1e-9)


def test_kl_counts_the_unlisted_mass_and_a_token_missing_from_the_candidate():
    p = _lp({"a": 0.6, "b": 0.2})  # 0.2 elsewhere
    q = _lp({"a": 0.6, "c": 0.3})  # b not listed: q_b = min(0.3, 0.1 unlisted) = 0.1
    q_other = 1 - 0.6 - 0.1
    want = 0.6 * 0 + 0.2 * math.log(0.2 / 0.1) + 0.2 * math.log(0.2 / q_other)
    assert kl_topk(p, q) == pytest.approx(want, rel=1e-9)
    assert kl_topk(p, q) > 0


def test_divergence_compares_up_to_the_first_differing_token():
    top_same = [_lp({"x": 0.9, "y": 0.05}), _lp({"y": 0.8, "x": 0.1}), _lp({"z": 0.7, "w": 0.2})]
    ref = [Trace(prompt="p1", tokens=["x", "y", "z"], top=top_same), Trace(prompt="p2", tokens=["x", "y", "z"], top=top_same)]
    cand_same = [Trace(prompt="p1", tokens=["x", "y", "z"], top=top_same), Trace(prompt="p2", tokens=["x", "y", "z"], top=top_same)]
    d = divergence(ref, cand_same)
    assert d.kl_mean == pytest.approx(0.0, abs=1e-12) and d.top1_agreement == 1.0
    assert d.first_divergence_mean == 3 and d.positions == 6 and d.prompts == 2 and d.diverged == 0
    flipped = [_lp({"x": 0.9, "y": 0.05}), _lp({"x": 0.6, "y": 0.3}), _lp({"q": 0.99})]
    cand = [Trace(prompt="p1", tokens=["x", "x", "q"], top=flipped), Trace(prompt="p2", tokens=["x", "y", "z"], top=top_same)]
    d = divergence(ref, cand)
    assert d.first_divergence_mean == pytest.approx((1 + 3) / 2) and d.diverged == 1
    assert d.positions == 2 + 3  # p1 stops at its first difference (position 1 still shares the context)
    assert d.top1_agreement == pytest.approx(4 / 5)
    assert d.kl_mean > 0 and d.kl_p99 >= d.kl_mean


def test_divergence_needs_shared_prompts():
    with pytest.raises(ValueError, match="share no prompt"):
        divergence([Trace(prompt="a", tokens=[], top=[])], [Trace(prompt="b", tokens=[], top=[])])


def test_perplexity_is_exp_of_mean_nll():
    assert perplexity([math.log(0.5)] * 4) == pytest.approx(2.0)
    assert perplexity([math.log(0.25), math.log(1.0)]) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        perplexity([])


def test_wilson_interval_matches_known_values():
    lo, hi = wilson(92, 100)
    assert lo == pytest.approx(0.8500, abs=5e-4) and hi == pytest.approx(0.9589, abs=5e-4)
    lo, hi = wilson(10, 10)
    assert hi == 1.0 and lo == pytest.approx(0.7225, abs=5e-4)
    assert wilson(0, 0) == (0.0, 1.0)
    lo, hi = wilson(0, 10**160)  # a count no float squares (a damaged session): an interval, not OverflowError
    assert 0.0 <= lo <= hi < 1e-100


def test_two_accuracies_differ_only_beyond_noise():
    assert accuracies_differ(task_score([True] * 100), task_score([True] * 92 + [False] * 8))
    assert not accuracies_differ(task_score([True] * 10), task_score([True] * 9 + [False]))
    assert not accuracies_differ(task_score([]), task_score([True]))


@pytest.mark.parametrize(("scorer", "answer", "output", "ok"), [
    ("exact", "4211", " 4211\nmore text", True),
    ("exact", "4211", "4211.", True),
    ("exact", "4211", "42110", False),
    ("choice", "B", " (b) because", True),
    ("choice", "B", "C", False),
    ("regex", r"\bParis\b", "It is Paris.", True),
    ("regex", r"\bParis\b", "It is Lyon.", False),
    ("json", '{"count": 7}', '```json\n{"count": 7}\n```', True),
    ("json", '{"count": 7}', '{"count": 8}', False),
    ("json", '{"count": 7}', 'not json', False),
])
def test_scoring(scorer: str, answer: str, output: str, ok: bool):
    assert score(TaskItem(task="t", prompt="", answer=answer, scorer=scorer), output) is ok


def test_result_round_trips_and_summarises_in_the_contract_shape():
    r = QualityResult(perplexity=12.5, perplexity_tokens=100, tasks={"arithmetic": task_score([True, False])},
                      traces=[Trace(prompt="p", tokens=["a"], top=[{"a": -0.1}])])
    back = QualityResult.from_dict(r.to_dict())
    assert back == r
    s = back.summary()
    assert s == {"perplexity": 12.5, "tasks": {"arithmetic": {"accuracy": 0.5, "n": 2}}, "reference": None}


def test_intervals_of_kl_and_perplexity():
    from servescope.core.quality import intervals_apart, mean_ci, perplexity_interval

    lo, hi = mean_ci([1.0, 2.0, 3.0])  # mean 2, sd 1, se 1/sqrt(3)
    assert lo == pytest.approx(2 - 1.96 / math.sqrt(3)) and hi == pytest.approx(2 + 1.96 / math.sqrt(3))
    assert mean_ci([1.0]) is None
    lo, hi = perplexity_interval([math.log(0.5), math.log(0.25)] * 50)
    assert lo < perplexity([math.log(0.5), math.log(0.25)] * 50) < hi
    assert intervals_apart((0, 1), (1.5, 2)) and not intervals_apart((0, 1), (0.5, 2))
    assert not intervals_apart(None, (0, 1))
    ref = [Trace(prompt=f"p{i}", tokens=["x"], top=[_lp({"x": 0.5, "y": 0.4})]) for i in range(4)]
    cand = [Trace(prompt=f"p{i}", tokens=["x"], top=[_lp({"x": 0.5 - 0.05 * i, "y": 0.4})]) for i in range(4)]
    d = divergence(ref, cand)
    assert d.kl_ci is not None and d.kl_ci[0] < d.kl_mean < d.kl_ci[1]
    r = QualityResult(perplexity=2.0, perplexity_ci=(1.9, 2.1), reference=d)
    assert QualityResult.from_dict(r.to_dict()) == r
