"""The simulator's deterministic, word-ish tokenizer.

Roughly one token per word or short piece: ASCII letter runs up to 10 letters, digit runs up to 3,
other letters (accented, CJK...) two at a time, each punctuation or symbol character alone, and each
newline. Other whitespace only separates pieces. ChatML special tokens are single tokens.

Word ids live in ``[WORD_BASE, VOCAB_SIZE)``. Each word id has a canonical spelling, six lowercase
letters alternating consonant and vowel, that decodes straight back to that id; any other piece is
hashed (CRC-32) onto a word id. Detokenizing writes each word id as a space and its canonical
spelling, so for any id list made by `encode`, or any ids in ``[WORD_BASE, VOCAB_SIZE)``,
``encode(decode(ids)) == ids``: a client can cut a prompt to an exact token count.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Sequence

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
IM_START_ID = 3
IM_END_ID = 4
NEWLINE_ID = 5
SPECIALS = {"<pad>": PAD_ID, "<s>": BOS_ID, "</s>": EOS_ID, "<|im_start|>": IM_START_ID, "<|im_end|>": IM_END_ID}
PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
PUNCT_BASE = 6
WORD_BASE = 64
VOCAB_SIZE = 32000
NUM_WORDS = VOCAB_SIZE - WORD_BASE

_CONSONANTS = "bdfghjklmnprstvwyzcq"  # 20
_VOWELS = "aeiou"  # 5
_SYLLABLES = [c + v for c in _CONSONANTS for v in _VOWELS]  # 100
_SYLLABLE_INDEX = {s: i for i, s in enumerate(_SYLLABLES)}

_PIECE_RE = re.compile(
    r"<\|im_start\|>|<\|im_end\|>|</s>|<s>|<pad>|\n|[A-Za-z]{1,10}|[0-9]{1,3}|[^\W\d_]{1,2}|[^\s]"
)


def canonical_word(word_id: int) -> str:
    """The six-letter spelling of a word id (without its leading space)."""
    k = word_id - WORD_BASE
    return _SYLLABLES[k // 10000] + _SYLLABLES[(k // 100) % 100] + _SYLLABLES[k % 100]


def _decode_canonical(piece: str) -> int | None:
    if len(piece) != 6:
        return None
    a = _SYLLABLE_INDEX.get(piece[0:2])
    b = _SYLLABLE_INDEX.get(piece[2:4])
    c = _SYLLABLE_INDEX.get(piece[4:6])
    if a is None or b is None or c is None:
        return None
    k = a * 10000 + b * 100 + c
    return WORD_BASE + k if k < NUM_WORDS else None


def _piece_id(piece: str) -> int:
    special = SPECIALS.get(piece)
    if special is not None:
        return special
    if piece == "\n":
        return NEWLINE_ID
    if len(piece) == 1:
        p = PUNCT.find(piece)
        if p >= 0:
            return PUNCT_BASE + p
    canon = _decode_canonical(piece)
    if canon is not None:
        return canon
    return WORD_BASE + zlib.crc32(piece.encode("utf-8")) % NUM_WORDS


def _id_text(token_id: int) -> str:
    if token_id >= WORD_BASE:
        return " " + canonical_word(token_id)
    if token_id >= PUNCT_BASE + len(PUNCT):
        return ""  # unused id range: renders as nothing
    if token_id >= PUNCT_BASE:
        return PUNCT[token_id - PUNCT_BASE]
    if token_id == NEWLINE_ID:
        return "\n"
    for text, i in SPECIALS.items():
        if i == token_id:
            return text
    return ""


class Tokenizer:
    """Deterministic word-ish tokenizer with a bounded piece cache."""

    def __init__(self, add_bos_token: bool = False, cache_size: int = 200_000) -> None:
        self.add_bos_token = add_bos_token
        self.vocab_size = VOCAB_SIZE
        self.eos_token_id = EOS_ID
        self._cache: dict[str, int] = {}
        self._cache_size = cache_size
        self._texts = [_id_text(i) for i in range(VOCAB_SIZE)]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        cache = self._cache
        out: list[int] = [BOS_ID] if add_special_tokens and self.add_bos_token else []
        append = out.append
        for piece in _PIECE_RE.findall(text):
            tid = cache.get(piece)
            if tid is None:
                tid = _piece_id(piece)
                if len(cache) < self._cache_size:
                    cache[piece] = tid
            append(tid)
        return out

    def spans(self, text: str) -> list[tuple[int, str]]:
        """The tokens of `text` (no BOS), each with the text it covers: the whitespace before it included, so that
        the texts join back to `text` exactly (trailing whitespace goes with the last token)."""
        out: list[tuple[int, str]] = []
        end = 0
        for m in _PIECE_RE.finditer(text):
            out.append((_piece_id(m.group()), text[end : m.end()]))
            end = m.end()
        if out and end < len(text):
            out[-1] = (out[-1][0], out[-1][1] + text[end:])
        return out

    def count(self, text: str, add_special_tokens: bool = False) -> int:
        n = len(_PIECE_RE.findall(text))
        return n + 1 if add_special_tokens and self.add_bos_token else n

    def decode(self, ids: Iterable[int]) -> str:
        texts = self._texts
        return "".join(texts[i] for i in ids if 0 <= i < VOCAB_SIZE)

    def token_text(self, token_id: int) -> str:
        return self._texts[token_id]

    def valid_ids(self, ids: Sequence[object]) -> bool:
        return all(type(i) is int and 0 <= i < VOCAB_SIZE for i in ids)


def render_chat(messages: Sequence[dict[str, object]], add_generation_prompt: bool = True) -> str:
    """ChatML, as the test model's template and Qwen's (without tools): the text /tokenize counts."""
    parts: list[str] = []
    for m in messages:
        role = str(m.get("role", "user"))
        parts.append("<|im_start|>" + role + "\n" + message_text(m.get("content")) + "<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def message_text(content: object) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, str):
                texts.append(part)
        return "\n".join(texts)
    return str(content)
