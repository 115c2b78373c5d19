from __future__ import annotations

import random

from servescope.sim.tokenizer import BOS_ID, VOCAB_SIZE, WORD_BASE, Tokenizer, render_chat

TEXTS = [
    "Hello, world! How are you today?",
    "def f(x):\n    return x ** 2  # squares\n",
    "Tiếng Việt có dấu, và 中文字符 mixed with ASCII 12345678.",
    "internationalization antidisestablishmentarianism <|im_start|>user\nhi<|im_end|>",
    "",
    "   \t  ",
]


def test_roundtrip_of_encoded_text() -> None:
    tok = Tokenizer()
    for text in TEXTS:
        ids = tok.encode(text)
        assert tok.encode(tok.decode(ids)) == ids
        assert tok.count(text) == len(ids)


def test_roundtrip_of_any_word_ids() -> None:
    tok = Tokenizer()
    rng = random.Random(1)
    for n in (1, 2, 17, 1000):
        ids = [rng.randrange(WORD_BASE, VOCAB_SIZE) for _ in range(n)]
        assert tok.encode(tok.decode(ids)) == ids
    edge = [WORD_BASE, VOCAB_SIZE - 1, WORD_BASE + 1]
    assert tok.encode(tok.decode(edge)) == edge


def test_word_ish_and_deterministic() -> None:
    tok = Tokenizer()
    text = "the quick brown fox jumps over the lazy dog"
    assert len(tok.encode(text)) == 9
    assert tok.encode(text) == Tokenizer().encode(text)
    assert tok.encode("x" * 25) == tok.encode("x" * 25) and len(tok.encode("x" * 25)) == 3


def test_bos_only_with_special_tokens() -> None:
    tok = Tokenizer(add_bos_token=True)
    assert tok.encode("hi there", add_special_tokens=True)[0] == BOS_ID
    assert BOS_ID not in tok.encode("hi there")
    assert tok.count("hi there", add_special_tokens=True) == 3


def test_chat_template_counts_specials() -> None:
    tok = Tokenizer()
    text = render_chat([{"role": "user", "content": "hello there"}], add_generation_prompt=True)
    # <|im_start|> user \n hello there <|im_end|> \n <|im_start|> assistant \n
    assert len(tok.encode(text)) == 10
