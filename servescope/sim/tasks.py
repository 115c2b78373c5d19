"""Exact-answer tasks the simulator recognises in a prompt and answers, as the quality probe asks them.

The formats are fixed (the probe builds its prompts exactly so):
    arithmetic  "What is A OP B? Reply with the number only."    -> the integer result
    retrieval   "What is the value of key K?"                     -> N from an earlier line "key K: value N"
    needle      "What is the secret code?"                        -> N from an earlier "The secret code is N."
    json        'Return a JSON object with the key "K" set to the integer N'  -> {"K": N} as json.dumps writes it

A profile's `[quality]` makes some answers wrong: with probability `error_rate`, plus `long_context_error_per_16k`
x prompt tokens / 16384 for retrieval and needle, decided from a hash of the prompt and the profile's `seed`
(so the same prompt is always answered the same way; of two profiles with one seed, the one with the higher rate
errs on a superset of the other's prompts); a wrong answer has one digit changed.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

ARITHMETIC = re.compile(r"What is (-?\d+) ([+*-]) (-?\d+)\? Reply with the number only\.")
RETRIEVAL = re.compile(r"What is the value of key (\S+)\?")
NEEDLE = re.compile(r"What is the secret code\?")
NEEDLE_FACT = re.compile(r"The secret code is (\d+)\.")
JSON_TASK = re.compile(r'Return a JSON object with the key "(\w+)" set to the integer (-?\d+)')
LONG_CONTEXT = ("retrieval", "needle")
CONTEXT_UNIT = 16384  # tokens per `long_context_error_per_16k`


@dataclass(frozen=True)
class Task:
    kind: str
    answer: str  # the right answer's text
    number: str  # the digits a wrong answer changes (the whole answer but for json)
    key: str = ""  # json: the object's key


def find_task(text: str) -> Task | None:
    """The task `text` asks, with its right answer, or None (for other prompts: a few substring tests)."""
    if "What is " not in text:  # every question but json's
        return _json_task(text) if "Return a JSON object" in text else None
    if "? Reply with the number only." in text:
        m = ARITHMETIC.search(text)
        if m is not None:
            a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
            n = str(a + b if op == "+" else a - b if op == "-" else a * b)
            return Task("arithmetic", n, n)
    if "What is the value of key " in text:
        m = RETRIEVAL.search(text)
        if m is not None:
            fact = re.compile(f"key {re.escape(m.group(1))}: value (\\d+)").search(text, 0, m.start())
            if fact is not None:
                return Task("retrieval", fact.group(1), fact.group(1))
    if "What is the secret code?" in text:
        m = NEEDLE.search(text)
        if m is not None:
            fact = NEEDLE_FACT.search(text, 0, m.start())
            if fact is not None:
                return Task("needle", fact.group(1), fact.group(1))
    return _json_task(text) if "Return a JSON object" in text else None


def _json_task(text: str) -> Task | None:
    m = JSON_TASK.search(text)
    if m is None:
        return None
    n = str(int(m.group(2)))
    return Task("json", json.dumps({m.group(1): int(n)}), n, m.group(1))


def error_probability(task: Task, prompt_tokens: int, error_rate: float, long_context_per_16k: float) -> float:
    p = error_rate
    if task.kind in LONG_CONTEXT:
        p += long_context_per_16k * prompt_tokens / CONTEXT_UNIT
    return min(max(p, 0.0), 1.0)


def prompt_hash(text: str, seed: int) -> int:
    """64 bits of a keyed hash of the prompt: the error draw and which digit it changes."""
    h = hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=8, key=str(seed).encode()[:64])
    return int.from_bytes(h.digest(), "little")


def corrupt(number: str, h: int) -> str:
    """`number` with one digit (chosen by `h`) replaced by another: a different value of as many digits."""
    digits = [i for i, c in enumerate(number) if c.isdigit()]
    i = digits[(h >> 32) % len(digits)]
    lead = i == digits[0] and len(digits) > 1
    choices = [c for c in "0123456789" if c != number[i] and not (lead and c == "0")]
    return number[:i] + choices[(h >> 48) % len(choices)] + number[i + 1 :]


def answer(task: Task, text: str, prompt_tokens: int, error_rate: float, long_context_per_16k: float,
           seed: int) -> tuple[str, bool]:
    """(the answer the simulated model gives to `text`, whether it is the right one)."""
    p = error_probability(task, prompt_tokens, error_rate, long_context_per_16k)
    if p <= 0.0:
        return task.answer, True
    h = prompt_hash(text, seed)
    if (h & 0xFFFFFFFF) / 2**32 >= p:
        return task.answer, True
    wrong = corrupt(task.number, h)
    if task.kind == "json":
        return json.dumps({task.key: int(wrong)}), False
    return wrong, False
