"""A local Hugging Face tokenizer (--tokenizer PATH) counts a chat prompt as the server's template renders it:
newer transformers return a BatchEncoding from apply_chat_template, whose len() is its number of keys."""

from __future__ import annotations

import asyncio

from servescope.core.target import LocalTokenizer
from tests.support.vllm_server import setup


def test_count_chat_counts_the_rendered_template_tokens() -> None:
    _venv, models = setup()
    tok = LocalTokenizer(str(models / "dense"))
    text = "hello there, how are you today? " * 5
    rendered = tok.tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False)
    expected = len(tok.tok.encode(rendered, add_special_tokens=False))
    got = asyncio.run(tok.count_chat(text))
    assert got == expected and got > asyncio.run(tok.count_prompt(text)) > 10
