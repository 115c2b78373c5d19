"""Prompt lengths for a server without /tokenize: `CalibratedTokenizer` fits tokens per word on what the server's
usage said, and prompts built with it are sized to the request (the count the fit predicts)."""

from __future__ import annotations

import random

from servescope.workloads.prompts import (
    CALIBRATION_WORDS,
    CalibratedTokenizer,
    build_prompts,
    calibration_texts,
)
from servescope.workloads.spec import Workload, fixed


def server_count(text: str, chat: bool) -> int:
    """A stand-in server: 1.3 tokens per word (a BPE's split words), a BOS, and a chat template of 12 tokens."""
    return round(1.3 * len(text.split())) + (12 if chat else 1)


def test_the_fit_finds_the_servers_overhead_and_tokens_per_word() -> None:
    tok = CalibratedTokenizer()
    assert tok.fit(False) == (0.0, 1.0) and not tok.exact and tok.calibrated  # nothing seen: 1 token per word
    for text in calibration_texts():
        tok.observe(False, text, server_count(text, False))
    a, b = tok.fit(False)
    assert abs(b - 1.3) < 0.01 and abs(a - 1) < 1.5, (a, b)
    assert tok.fitted
    assert abs(tok.tokens_per_word - 1.3) < 0.01
    # chat: nothing seen yet, the completions' per-word figure stands in; once seen, its own overhead
    assert tok.fit(True)[1] == b
    for text in calibration_texts(seed=1):
        tok.observe(True, text, server_count(text, True))
    a_chat, b_chat = tok.fit(True)
    assert abs(b_chat - 1.3) < 0.01 and abs(a_chat - 12) < 1.5, (a_chat, b_chat)
    assert tok.samples() == 2 * len(CALIBRATION_WORDS) and tok.samples(True) == len(CALIBRATION_WORDS)


def test_a_count_that_does_not_grow_is_no_fit() -> None:
    tok = CalibratedTokenizer()
    for text in calibration_texts():
        tok.observe(False, text, 3)
    assert tok.fit(False) == (0.0, 1.0) and not tok.fitted  # nothing to size prompts with: the runner estimates
    tok.observe(False, "ignored", 0)  # no usage: nothing learnt
    assert tok.samples() == len(CALIBRATION_WORDS)


def test_calibration_texts_fit_the_model() -> None:
    texts = calibration_texts(longest=100)
    assert [len(t.split()) for t in texts] == sorted({min(n, 100) for n in CALIBRATION_WORDS})
    assert calibration_texts() == calibration_texts()  # deterministic for a seed


async def test_prompts_land_on_the_requested_length_as_the_server_counts_them() -> None:
    tok = CalibratedTokenizer()
    for text in calibration_texts():
        tok.observe(False, text, server_count(text, False))
        tok.observe(True, text, server_count(text, True))
    for api in ("completions", "chat"):
        for n in (64, 300, 2000):
            wl = Workload(name=f"w{n}", api=api, input_tokens=fixed(n), output_tokens=fixed(8))
            prompts = await build_prompts(wl, 16, f"k{n}", tok)
            served = [server_count(p.text, api == "chat") for p in prompts]
            mean = sum(served) / len(served)
            assert abs(mean - n) <= 0.03 * n, (api, n, mean)
            assert all(abs(p.input_tokens - n) <= 1 for p in prompts), [p.input_tokens for p in prompts]


async def test_answers_correct_the_calibration() -> None:
    tok = CalibratedTokenizer()
    tok.observe(False, "one two three four", 6)  # one short probe: 1.5 tokens per word through the origin
    assert tok.fit(False) == (0.0, 1.5)
    rng = random.Random(0)
    for _ in range(200):  # the answers: the server really counts 1.2 per word plus a BOS
        words = rng.randrange(50, 2000)
        tok.observe(False, " ".join(["w"] * words), round(1.2 * words) + 1)
    a, b = tok.fit(False)
    assert abs(b - 1.2) < 0.005 and abs(a - 1) < 2, (a, b)
