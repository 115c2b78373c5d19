"""The quality probe's questions: four built-in tasks generated from a seed, a user's JSONL of tasks, the fixed
prompts for greedy divergence, and the shipped corpus (filler for the needle task, text for perplexity).

The prompt formats below are fixed: the simulator recognises them by regex and answers them, so their wording,
spacing and punctuation never change.

    arithmetic  "Question: What is {a} {op} {b}? Reply with the number only.\\nAnswer:"
    retrieval   "Below is a list of keys and values.\\n" + "key {k}: value {v}\\n" lines up to the context, then
                "Question: What is the value of key {k}? Reply with the value only.\\nAnswer:"
    needle      corpus filler up to the context with "The secret code is {code}." between two of its sentences,
                then "\\nQuestion: What is the secret code? Reply with the code only.\\nAnswer:"
    json        'Return a JSON object with the key "{key}" set to the integer {n} and nothing else.\\nAnswer:'

arithmetic and json are short (context 0) and built n times; retrieval and needle are built n times for each
context length, padded to that many tokens as `count_tokens` counts them (by default `estimate_tokens`):
never above it, and within 5% below it where whole lines (retrieval) or words (needle) allow.
Every item draws from its own `random.Random` seeded with (seed, task, context, index), so an item does not
change when n, the other tasks or the other contexts do.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable, Sequence
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from servescope.core.errors import ServescopeError
from servescope.core.quality import TASKS, TaskItem

CORPUS_SOURCE = (
    "The Declaration of Independence (1776), the Gettysburg Address (1863) and Lincoln's Second Inaugural "
    "Address (1865), public domain, after the U.S. National Archives' and Library of Congress's transcriptions"
)
SHORT_TASKS = ("arithmetic", "json")
LONG_TASKS = ("retrieval", "needle")
USER_SCORERS = ("exact", "choice", "regex")
JSON_KEYS = ("count", "total", "score", "index", "level", "size", "limit", "rank")
SLACK = 0.05  # a padded prompt is accepted from (1 - SLACK) * context tokens up to the context
NEEDLE_DEPTHS = (0.05, 0.95)  # the needle's depths are spread over this range across the n items
MAX_KEYS = 1 << 22  # retrieval lines in one prompt (keys are 6 hex digits: 16.7M possible)

DIVERGENCE_PROMPTS: tuple[str, ...] = (
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    "A prime number is a natural number greater than one that",
    "The three primary colors of light are",
    "To bake a simple loaf of bread, you will need flour, water, salt and",
    "The water cycle describes how water moves between the oceans, the air and",
    "It was a cold and windy night when the old lighthouse keeper heard",
    "Photosynthesis is the process by which green plants",
    "The planets of the solar system, in order from the Sun, are",
    "A good way to learn a new language is to",
    "The French Revolution began in 1789, when",
    "In computer science, a hash table is a data structure that",
    "Dear Sir or Madam, I am writing to",
    "The most important rules of chess are that",
    "Gravity is the force that",
    "The days of the week are Monday, Tuesday,",
    "When the train finally pulled into the station, Maria",
)

_RETRIEVAL_HEAD = "Below is a list of keys and values.\n"
_NEEDLE_QUESTION = "\nQuestion: What is the secret code? Reply with the code only.\nAnswer:"
_SENTENCE_END = re.compile(r"[.!?][\"')\]]*$")


def estimate_tokens(text: str) -> int:
    """The default token count: four characters a token, which English prose and most tokenizers exceed."""
    return len(text) // 4


@lru_cache(maxsize=1)
def corpus_text() -> str:
    """The shipped corpus (see `CORPUS_SOURCE` and data/SOURCE.md), as UTF-8 text."""
    return resources.files("servescope.workloads").joinpath("data").joinpath("corpus.txt").read_text(encoding="utf-8")


def build_tasks(tasks: Sequence[str], contexts: Sequence[int], n: int = 20, seed: int = 0,
                count_tokens: Callable[[str], int] | None = None) -> list[TaskItem]:
    """n items of each task in `tasks` (in that order), the long ones n times per context length (in the order
    of `contexts`). Raises ServescopeError for an unknown task, n < 1, or a context too short to hold a task."""
    names = list(dict.fromkeys([tasks] if isinstance(tasks, str) else tasks))
    for name in names:
        if name not in TASKS:
            raise ServescopeError(f"unknown quality task {name!r}: use one of {', '.join(TASKS)}")
    if n < 1:
        raise ServescopeError(f"{n} items per task is too few: use at least 1")
    lengths = list(dict.fromkeys(contexts))
    for ctx in lengths:
        if ctx < 1:
            raise ServescopeError(f"context length {ctx} is not a positive number of tokens: use e.g. 4096")
    long = [name for name in names if name in LONG_TASKS]
    if long and not lengths:
        raise ServescopeError(f"the {' and '.join(long)} task needs at least one context length: give e.g. 4096")
    count = count_tokens or estimate_tokens
    items: list[TaskItem] = []
    for name in names:
        if name == "arithmetic":
            items += [_arithmetic(_rng(seed, name, 0, i)) for i in range(n)]
        elif name == "json":
            items += [_json(_rng(seed, name, 0, i)) for i in range(n)]
        elif name == "retrieval":
            items += [_retrieval(seed, i, n, ctx, count) for ctx in lengths for i in range(n)]
        else:
            items += [_needle(seed, i, n, ctx, count) for ctx in lengths for i in range(n)]
    return items


# --------------------------------------------------------------------------------------------------------
# the four tasks
# --------------------------------------------------------------------------------------------------------


def _rng(seed: int, task: str, context: int, index: int, part: str = "") -> random.Random:
    return random.Random(f"servescope-quality:{seed}:{task}:{context}:{index}:{part}")


def _spread(rng: random.Random, i: int, n: int, lo: float, hi: float) -> float:
    """Item i's depth in [lo, hi): one seeded point in the i-th of n equal strata, so n items cover the range."""
    return lo + (hi - lo) * (i + rng.random()) / n


def _arithmetic(rng: random.Random) -> TaskItem:
    op = rng.choice("+-*")
    a = rng.randint(2, 9999)
    b = rng.randint(2, 99 if op == "*" else 9999)
    result = a + b if op == "+" else a - b if op == "-" else a * b
    return TaskItem(task="arithmetic", prompt=f"Question: What is {a} {op} {b}? Reply with the number only.\nAnswer:",
                    answer=str(result), scorer="exact", max_tokens=8)


def _json(rng: random.Random) -> TaskItem:
    key = rng.choice(JSON_KEYS)
    value = rng.randint(0, 9999)
    prompt = f'Return a JSON object with the key "{key}" set to the integer {value} and nothing else.\nAnswer:'
    return TaskItem(task="json", prompt=prompt, answer=json.dumps({key: value}), scorer="json", max_tokens=16)


class _KeyValues:
    """Unique keys and their values, drawn in order from one generator, so the first k are the same whatever
    k the fitting tries."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.keys: list[str] = []
        self.values: list[int] = []
        self.lines: list[str] = []
        self.seen: set[str] = set()

    def grow(self, k: int) -> None:
        if k > MAX_KEYS:
            raise ServescopeError(f"a retrieval prompt of {k} lines is past the {MAX_KEYS} this task can make: "
                                  "use a shorter context")
        while len(self.keys) < k:
            key = f"k-{self.rng.getrandbits(24):06x}"
            if key in self.seen:
                continue
            value = self.rng.randint(100000, 999999)
            self.seen.add(key)
            self.keys.append(key)
            self.values.append(value)
            self.lines.append(f"key {key}: value {value}\n")


def _retrieval(seed: int, i: int, n: int, context: int, count: Callable[[str], int]) -> TaskItem:
    rng = _rng(seed, "retrieval", context, i)
    depth = _spread(rng, i, n, 0.0, 1.0)
    kv = _KeyValues(_rng(seed, "retrieval", context, i, "lines"))

    def probe(k: int) -> int:
        return min(k - 1, int(depth * k))

    def make(k: int) -> str:
        kv.grow(k)
        question = f"Question: What is the value of key {kv.keys[probe(k)]}? Reply with the value only.\nAnswer:"
        return _RETRIEVAL_HEAD + "".join(kv.lines[:k]) + question

    k, prompt = _fit(make, count, context, "retrieval")
    return TaskItem(task="retrieval", prompt=prompt, answer=str(kv.values[probe(k)]), scorer="exact",
                    context=context, max_tokens=8)


@lru_cache(maxsize=1)
def _corpus_words() -> tuple[tuple[str, ...], tuple[bool, ...], tuple[int, ...]]:
    """The corpus as words, whether each word ends a sentence, and the index of each sentence's first word."""
    words = tuple(corpus_text().split())
    ends = tuple(bool(_SENTENCE_END.search(w)) for w in words)
    starts = tuple(sorted({0} | {(j + 1) % len(words) for j, e in enumerate(ends) if e}))
    return words, ends, starts


def _needle(seed: int, i: int, n: int, context: int, count: Callable[[str], int]) -> TaskItem:
    words, ends, starts = _corpus_words()
    rng = _rng(seed, "needle", context, i)
    depth = _spread(rng, i, n, *NEEDLE_DEPTHS)
    start = rng.choice(starts)
    code = rng.randint(1_000_000, 9_999_999)
    needle = f"The secret code is {code}."
    size = len(words)

    def boundary(w: int) -> int:
        """The place between two filler sentences (as a word index) nearest to depth * w."""
        def ok(b: int) -> bool:
            return b == 0 or ends[(start + b - 1) % size]

        aim = round(depth * w)
        for d in range(w + 1):
            for b in (aim - d, aim + d):
                if 0 < b < w and ok(b):
                    return b
        return w if ok(w) and depth >= 0.5 else 0

    def make(w: int) -> str:
        reps = (start + w) // size + 1
        filler = list((words * reps)[start : start + w])
        b = boundary(w)
        return " ".join([*filler[:b], needle, *filler[b:]]) + _NEEDLE_QUESTION

    _, prompt = _fit(make, count, context, "needle")
    return TaskItem(task="needle", prompt=prompt, answer=str(code), scorer="exact", context=context, max_tokens=8)


def _fit(make: Callable[[int], str], count: Callable[[str], int], target: int, what: str) -> tuple[int, str]:
    """(k, make(k)) for a k >= 1 whose text counts at most `target` tokens and, where whole units allow, at least
    (1 - SLACK) * target. `make(k)` grows with k (lines or words); secant steps on the counts, then bisection."""
    floor = math.ceil(target * (1 - SLACK))
    aim = target - (target - floor) // 3
    text = make(1)
    c = count(text)
    if c > target:
        raise ServescopeError(f"a context of {target} tokens is too short for the {what} task (its smallest prompt "
                              f"takes {c}): use a longer context")
    lo, lo_text, lo_c = 1, text, c
    hi: int | None = None
    slope = max(1e-6, (len(make(2)) - len(text)) * c / max(1, len(text)))  # tokens per unit, first guess
    last_k, last_c = lo, lo_c
    for step in range(64):
        if lo_c >= floor or (hi is not None and hi - lo <= 1):
            break
        k = lo + max(1, round((aim - lo_c) / slope))
        if hi is None:
            k = min(k, max(lo * 4 + 16, 2 * target))  # a sanity bound: no unit is under half a token
        elif k >= hi or step >= 12:
            k = (lo + hi) // 2
        text = make(k)
        c = count(text)
        if k != last_k and (c - last_c) / (k - last_k) > 0:
            slope = (c - last_c) / (k - last_k)
        last_k, last_c = k, c
        if c <= target:
            lo, lo_text, lo_c = k, text, c
        else:
            hi = k
    return lo, lo_text


# --------------------------------------------------------------------------------------------------------
# a user's tasks
# --------------------------------------------------------------------------------------------------------


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _short(value: Any, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


def load_user_tasks(path: str | Path) -> list[TaskItem]:
    """A user's tasks from a JSONL file: one object a line with "prompt", "answer", optional "scorer" (exact,
    choice or regex; exact by default) and "max_tokens" (16 by default); blank lines are skipped. The task's
    name is the file's stem. Raises ServescopeError naming the file and line of the first bad one."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ServescopeError(f"{path}: no such task file; give the path of a JSONL file with one task a line") from None
    except UnicodeDecodeError:
        raise ServescopeError(f"{path}: not UTF-8 text; save the task file as UTF-8 JSONL") from None
    except OSError as e:
        raise ServescopeError(f"{path}: cannot read it ({e.strerror or e}); give the path of a readable JSONL "
                              "file") from None
    items = []
    for lineno, line in enumerate(text.split("\n"), 1):
        if line.strip():
            items.append(_user_item(f"{path}:{lineno}", p.stem, line))
    if not items:
        raise ServescopeError(f'{path}: no tasks in the file; write one JSON object a line with "prompt" and "answer"')
    return items


def _user_item(where: str, task: str, line: str) -> TaskItem:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ServescopeError(f"{where}: not valid JSON ({e.msg} at column {e.colno}); write one JSON object a "
                              "line") from None
    except (ValueError, RecursionError):
        raise ServescopeError(f"{where}: not valid JSON; write one JSON object a line") from None
    if not isinstance(obj, dict):
        raise ServescopeError(f'{where}: expected a JSON object, got {_kind(obj)}; write {{"prompt": "...", '
                              '"answer": "..."}')
    fields = {}
    for field in ("prompt", "answer"):
        value = obj.get(field)
        if field not in obj:
            raise ServescopeError(f'{where}: missing "{field}"; give every task a "prompt" and an "answer" string')
        if not isinstance(value, str):
            hint = f'"{field}": "{value}"' if _kind(value) == "a number" else f'"{field}": "..."'
            raise ServescopeError(f'{where}: "{field}" is {_kind(value)}, not a string; write it as a string, '
                                  f"e.g. {hint}")
        if not value.strip():
            raise ServescopeError(f'{where}: "{field}" is empty; give every task a non-empty "{field}"')
        fields[field] = value
    scorer = obj.get("scorer", "exact")
    if scorer not in USER_SCORERS:
        raise ServescopeError(f"{where}: unknown scorer {_short(scorer)}; use one of {', '.join(USER_SCORERS)}")
    if scorer == "regex":
        try:
            re.compile(fields["answer"])
        except re.error as e:
            raise ServescopeError(f"{where}: the answer {_short(fields['answer'])} is not a valid regular expression "
                                  f"({e}); fix the pattern or use the \"exact\" scorer") from None
    max_tokens = obj.get("max_tokens", 16)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ServescopeError(f'{where}: "max_tokens" is {_short(max_tokens)}, not a positive integer; give e.g. '
                              '"max_tokens": 16 or leave it out')
    return TaskItem(task=task, prompt=fields["prompt"], answer=fields["answer"], scorer=str(scorer),
                    max_tokens=max_tokens)
