"""A local Hugging Face tokenizer (--tokenizer PATH) counts a chat prompt as the server's template renders it:
newer transformers return a BatchEncoding from apply_chat_template, whose len() is its number of keys."""

from __future__ import annotations

import asyncio
import os

import pytest

from servescope.core.target import LocalTokenizer
from tests.support.vllm_server import setup


@pytest.mark.vllm  # the tiny model's tokenizer is built by the real vLLM's setup (.ci/setup_vllm.sh)
def test_count_chat_counts_the_rendered_template_tokens() -> None:
    if os.environ.get("SERVESCOPE_SKIP_VLLM") == "1":
        pytest.skip("SERVESCOPE_SKIP_VLLM=1: real-vLLM tests skipped on purpose")
    _venv, models = setup()
    tok = LocalTokenizer(str(models / "dense"))
    text = "hello there, how are you today? " * 5
    rendered = tok.tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False)
    expected = len(tok.tok.encode(rendered, add_special_tokens=False))
    got = asyncio.run(tok.count_chat(text))
    assert got == expected and got > asyncio.run(tok.count_prompt(text)) > 10
