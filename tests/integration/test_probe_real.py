"""The quality probe's HTTP side against the real servers: the CPU vLLM 0.32 of the test session (a tiny
random-weight bf16 Llama) and a real llama.cpp `llama-server` (the same weights as GGUF f16).

What was found (and is checked here):
- greedy traces: at every position the chosen token's logprob is the largest of its top-k map, on both servers;
  the same request twice gives identical traces (vLLM; llama.cpp too, in our runs).
- vLLM's prompt_logprobs: one finite negative value per token after the first. The first greedy token's logprob
  equals its prompt logprob when prompt + token is sent back (the same prefill: exactly 0 apart in our runs).
  Later greedy tokens were computed by decode steps and the prompt logprobs by one prefill; in bf16 these drift
  apart by up to ~0.008 nats at a position, so they are compared with a looser bound.
- llama.cpp ignores `prompt_logprobs` (200, no such field): None.
- a prompt beyond the context is ContextTooLong on both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from servescope.core import quality
from servescope.core.errors import ServescopeError
from servescope.core.probe import ContextTooLong, answer, greedy, prompt_logprobs

PROMPTS = [
    "The quick brown fox jumps over the lazy dog. Then",
    "1, 2, 3, 4,",
    "In 1905, Einstein",
    "Hello world. This is a test of",
    "def main():\n    return",
]


@pytest.fixture
def llama(llamacpp_f16: Any) -> Any:
    """The test session's llama-server (tests/conftest.py): 1,024 tokens a slot."""
    return llamacpp_f16


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=300) as c:
        yield c


async def _tokens(http: httpx.AsyncClient, url: str, model: str, text: str) -> list[int]:
    r = await http.post(url + "/tokenize", json={"model": model, "prompt": text})
    r.raise_for_status()
    return list(r.json()["tokens"])


def _assert_greedy_is_argmax(trace: quality.Trace) -> None:
    assert trace.tokens and len(trace.tokens) == len(trace.top)
    for i, (tok, top) in enumerate(zip(trace.tokens, trace.top, strict=True)):
        assert 1 <= len(top) <= 6, (i, top)  # top-5, plus the chosen token had it been outside them
        assert top[tok] == max(top.values()), (i, tok, top)  # greedy: the chosen token is the most likely


@pytest.mark.vllm
async def test_vllm_greedy_traces_are_argmax_and_repeat_exactly(vllm_server: Any, http: httpx.AsyncClient) -> None:
    url, model = vllm_server.url, vllm_server.model
    for p in PROMPTS[:3]:
        text, trace = await greedy(http, url, model, p, 16, top_k=5)
        assert trace.prompt == p and "".join(trace.tokens) == text
        _assert_greedy_is_argmax(trace)
        assert all(len(top) == 5 for top in trace.top)
        _, again = await greedy(http, url, model, p, 16, top_k=5)
        assert again == trace  # same tokens, same maps, same values to the last bit
        assert quality.divergence([trace], [again]).kl_mean == 0.0
        assert await answer(http, url, model, p, 16) == text


@pytest.mark.vllm
async def test_vllm_prompt_logprobs_agree_with_greedy_traces(vllm_server: Any, http: httpx.AsyncClient) -> None:
    url, model = vllm_server.url, vllm_server.model
    checked = 0
    for p in PROMPTS:
        text, trace = await greedy(http, url, model, p, 12, top_k=5)
        chosen = [top[t] for t, top in zip(trace.tokens, trace.top, strict=True)]
        prompt_ids = await _tokens(http, url, model, p)

        # the prompt alone: one finite negative logprob per token after the first
        lps = await prompt_logprobs(http, url, model, p)
        assert lps is not None and len(lps) == len(prompt_ids) - 1
        assert all(-50 < v < 0 for v in lps), lps

        # prompt + the first greedy token, sent back as a prompt: its last logprob is the greedy one
        first = p + trace.tokens[0]
        ids = await _tokens(http, url, model, first)
        if ids[: len(prompt_ids)] != prompt_ids or len(ids) != len(prompt_ids) + 1:
            continue  # the token merges with the prompt's end when retokenized: not the same sequence
        lp1 = await prompt_logprobs(http, url, model, first)
        assert lp1 is not None and len(lp1) == len(ids) - 1
        assert abs(lp1[-1] - chosen[0]) <= 1e-3, (p, lp1[-1], chosen[0])
        assert all(abs(a - b) <= 1e-3 for a, b in zip(lp1[:-1], lps, strict=True))  # causal: the prompt's part

        # prompt + the whole greedy text: the generated part sums to the trace's (decode vs prefill drift aside)
        full_ids = await _tokens(http, url, model, p + text)
        if len(full_ids) == len(prompt_ids) + len(trace.tokens) and full_ids[: len(prompt_ids)] == prompt_ids:
            full = await prompt_logprobs(http, url, model, p + text)
            assert full is not None and len(full) == len(full_ids) - 1
            tail = full[-len(chosen):]
            assert max(abs(a - b) for a, b in zip(tail, chosen, strict=True)) < 0.05, (tail, chosen)
            assert abs(sum(tail) - sum(chosen)) < 0.05 * len(chosen)
            assert quality.perplexity(full) > 1
        checked += 1
    assert checked >= 3, "too few prompts retokenize to the same sequence to check anything"


@pytest.mark.vllm
async def test_vllm_errors_are_one_line(vllm_server: Any, http: httpx.AsyncClient) -> None:
    url = vllm_server.url
    with pytest.raises(ContextTooLong, match="maximum context length is 8192"):
        await prompt_logprobs(http, url, vllm_server.model, "word " * 9000)
    with pytest.raises(ServescopeError, match=r"HTTP 404\): The model `nope` does not exist") as e:
        await greedy(http, url, "nope", "hi", 4)
    assert "\n" not in str(e.value)


async def test_llamacpp_greedy_traces_and_no_prompt_logprobs(llama: Any, http: httpx.AsyncClient) -> None:
    model = str(llama.model)
    for p in PROMPTS[:3]:
        text, trace = await greedy(http, llama.url, model, p, 16, top_k=5)
        assert trace.prompt == p and "".join(trace.tokens) == text
        _assert_greedy_is_argmax(trace)
        _, again = await greedy(http, llama.url, model, p, 16, top_k=5)
        assert again.tokens == trace.tokens
        assert await answer(http, llama.url, model, p, 16) == text
    assert await prompt_logprobs(http, llama.url, model, PROMPTS[0]) is None
    with pytest.raises(ContextTooLong, match="exceeds the available context size"):
        await answer(http, llama.url, model, "word " * 3000, 4)


def test_the_quality_command_against_llamacpp_says_why_it_has_no_perplexity(llama: Any, tmp_path: Path) -> None:
    """End to end: tasks and divergence traces work on llama.cpp; perplexity is not measured, and the session says
    why (its server ignores prompt_logprobs)."""
    import json

    from servescope.sessions.store import load_session
    from tests.integration.helpers import servescope

    p = servescope("quality", "--url", llama.url, "--tasks", "arithmetic,json", "-n", "2", "--save",
                   str(tmp_path / "q"), "--json", timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["perplexity"] is None and {k: v["n"] for k, v in out["tasks"].items()} == {"arithmetic": 2, "json": 2}
    assert "perplexity: not measured" in p.stderr
    q = load_session(tmp_path / "q").quality()
    assert q is not None and "prompt log-probabilities" in q.perplexity_note
    assert len(q.traces) == 16 and all(t.tokens and len(t.top) == len(t.tokens) for t in q.traces)
    rep = servescope("report", str(tmp_path / "q"))
    assert rep.returncode == 0 and "prompt log-probabilities" in rep.stdout
