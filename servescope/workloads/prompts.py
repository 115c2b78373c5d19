"""Build prompts of exact token lengths with the server's tokenizer (or a local one), deterministically.

For each prompt of N tokens: take a window of a seeded word corpus already tokenized by the server,
detokenize it, count the result as the server will (`/tokenize`, chat template included for chat) and
trim or extend until the count is N. Each cell gets its own seed so cells do not hit each other's prefix
cache; a workload's shared prefix (`prefix_tokens`) is the same for every prompt of every cell.

A server with neither `/tokenize` nor `--tokenizer` (a hosted API) is counted by `CalibratedTokenizer`: tokens per
word of this corpus fitted on the server's own `usage.prompt_tokens`, for a few probe requests first
(`calibration_texts`), then for every answer as they arrive; lengths are then calibrated, not exact.
"""

from __future__ import annotations

import asyncio
import random
import weakref
from collections import deque
from dataclasses import dataclass
from typing import Any

from servescope.core.target import EstimateTokenizer, Tokenizer, counted_text, not_counting
from servescope.workloads.conversation import dataset_picks, layout
from servescope.workloads.spec import Workload, read_sharegpt, read_sharegpt_conversations

_WORDS = ["the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at", "from", "his", "her", "they", "this", "which", "be", "are", "an", "or", "had", "not", "have", "were", "one", "all", "their", "there", "been", "has", "when", "who", "will", "more", "no", "if", "out", "so", "said", "what", "up", "its", "about", "into", "than", "them", "can", "only", "other", "new", "some", "could", "time", "these", "two", "may", "then", "do", "first", "any", "my", "now", "such", "like", "our", "over", "man", "me", "even", "most", "made", "after", "also", "did", "many", "before", "must", "through", "back", "years", "where", "much", "your", "way", "well", "down", "should", "because", "each", "just", "those", "people", "how", "too", "little", "state", "good", "very", "make", "world", "still", "own", "see", "men", "work", "long", "get", "here", "between", "both", "life", "being", "under", "never", "day", "same", "another", "know", "while", "last", "might", "us", "great", "old", "year", "off", "come", "since", "against", "go", "came", "right", "used", "take", "three", "states", "himself", "few", "house", "use", "during", "without", "again", "place", "around", "however", "home", "small", "found", "thought", "went", "say", "part", "once", "general", "high", "upon", "school", "every", "does", "got", "united", "left", "number", "course", "war", "until", "always", "away", "something", "fact", "though", "water", "less", "public", "put", "think", "almost", "hand", "enough", "far", "took", "head", "yet", "government", "system", "better", "set", "told", "nothing", "night", "end", "why", "called", "didn", "eyes", "find", "going", "look", "asked", "later", "knew", "point", "next", "program", "city", "business", "give", "group", "toward", "young", "days", "let", "room", "president", "side", "social", "given", "present", "several", "order", "national", "possible", "rather", "second", "face", "per", "among", "form", "important", "often", "things", "looked", "early", "white", "case", "john", "become", "large", "big", "need", "four", "within", "felt", "children", "along", "saw", "best", "church", "ever", "least", "power", "development", "light", "thing", "seemed", "family", "interest", "want", "members", "mind", "country", "area", "others", "done", "turned", "although", "open", "problem", "began", "various", "kernel", "cache", "token", "latency", "throughput", "server", "request", "model", "batch", "queue", "memory", "tensor", "matrix", "vector", "stream"]


@dataclass(frozen=True)
class Prompt:
    text: str
    input_tokens: int  # what the tokenizer counted for this text (the server's own count when exact)
    output_tokens: int


CALIBRATION_WORDS = (32, 128, 512)  # the probe texts' lengths (words): ~1k tokens per API, spread for the fit
CALIBRATION_KEEP = 4096  # the most recent (words, tokens) pairs the fit keeps per API


def calibration_texts(seed: int = 0, longest: int | None = None) -> list[str]:
    """The probe texts a calibration sends (`CALIBRATION_WORDS` words of the prompts' corpus, at most `longest`)."""
    rng = random.Random(f"servescope-calibration:{seed}")
    sizes = sorted({max(8, min(n, longest)) if longest else n for n in CALIBRATION_WORDS})
    return [_corpus(rng, n) for n in sizes]


class CalibratedTokenizer:
    """Counts a text as `overhead + per_word x words`, the two fitted (least squares) on what the server's
    `usage.prompt_tokens` said for texts it was sent (`observe`): the calibration's probes, then every answer. One
    fit per API (a chat's template adds its own overhead). Its ids are words (as EstimateTokenizer's), so prompts
    are cut by words to the count the fit predicts. Before any observation it counts 1 token per word."""

    exact = False
    calibrated = True
    name = "calibrated on the server's usage (no /tokenize)"

    def __init__(self) -> None:
        self._words = EstimateTokenizer()
        self._seen: dict[bool, deque[tuple[int, int]]] = {False: deque(maxlen=CALIBRATION_KEEP),
                                                          True: deque(maxlen=CALIBRATION_KEEP)}
        self._fits: dict[bool, tuple[float, float]] = {}

    def observe(self, chat: bool, text: str, prompt_tokens: int) -> None:
        """The server counted `prompt_tokens` for `text` (sent as a chat's one message when `chat`)."""
        if prompt_tokens > 0:
            self._seen[chat].append((len(text.split()), prompt_tokens))
            self._fits.pop(chat, None)

    def samples(self, chat: bool | None = None) -> int:
        return sum(len(v) for k, v in self._seen.items() if chat is None or k == chat)

    @property
    def fitted(self) -> bool:
        """The server's counts grew with the text for some API: there is a fit to size prompts with."""
        return any(_least_squares(v) is not None for v in self._seen.values())

    def fit(self, chat: bool) -> tuple[float, float]:
        """(overhead, tokens per word) for the API; the other API's per-word figure when this one has no
        observation yet (the corpus is the same), and (0, 1) when neither has any."""
        got = self._fits.get(chat)
        if got is None:
            got = self._fits[chat] = _least_squares(self._seen[chat]) or _least_squares(self._seen[not chat]) \
                or (0.0, 1.0)
        return got

    @property
    def tokens_per_word(self) -> float:
        """The fitted tokens per word (the completions API's, else the chat API's)."""
        return self.fit(not self._seen[False] and bool(self._seen[True]))[1]

    async def encode(self, text: str) -> list[int]:
        return await self._words.encode(text)

    async def decode(self, ids: list[int]) -> str:
        return await self._words.decode(ids)

    def _count(self, chat: bool, text: str) -> int:
        a, b = self.fit(chat)
        return max(0, round(a + b * len(text.split())))

    async def count_prompt(self, text: str) -> int:
        return self._count(False, text)

    async def count_chat(self, text: str) -> int:
        return self._count(True, text)


def _least_squares(pairs: deque[tuple[int, int]]) -> tuple[float, float] | None:
    """(intercept, slope) of tokens over words; with one distinct length, the slope through the origin; None
    without any pair."""
    n = len(pairs)
    if not n:
        return None
    mx = sum(w for w, _ in pairs) / n
    my = sum(t for _, t in pairs) / n
    sxx = sum((w - mx) ** 2 for w, _ in pairs)
    if sxx <= 0 or n < 2:
        return (0.0, my / mx) if mx > 0 else None
    b = sum((w - mx) * (t - my) for w, t in pairs) / sxx
    if b <= 0:  # counts that do not grow with the text: no fit (one token per word until they do)
        return None
    return my - b * mx, b


def cell_rng(workload: Workload, cell_key: str) -> random.Random:
    return random.Random(f"servescope:{workload.seed}:{workload.name}:{cell_key}")


def _corpus(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


async def _corpus_ids(tok: Tokenizer, rng: random.Random, need: int) -> list[int]:
    words = max(64, int(need * 1.1) + 16)
    first, last = words, -1
    while True:
        ids = await tok.encode(_corpus(rng, words))
        if len(ids) >= need:
            return ids
        if tok.exact and len(ids) <= last:  # twice the words, no more tokens: it would double until the server refused
            raise not_counting(tok, f"answered {len(ids):,} tokens for texts of {first:,} to {words:,} words")
        last = len(ids)
        words *= 2


PROBE_WORDS = (10, 200)  # the texts `check_counting` counts: any tokenizer of a language model counts more for more
_counted: weakref.WeakKeyDictionary[Tokenizer, set[bool]] = weakref.WeakKeyDictionary()  # checked: (tok, chat)


async def check_counting(tok: Tokenizer, chat: bool) -> None:
    """A ServescopeError when an exact tokenizer counts no more tokens for 200 words than for 10 (a /tokenize that
    always answers 3 once sent ever longer texts for 14 s, until the server answered HTTP 413). Once per tokenizer
    and API: two counts."""
    if not tok.exact or chat in _counted.get(tok, set()):
        return
    count = tok.count_chat if chat else tok.count_prompt
    few, many = PROBE_WORDS
    a, b = await count(" ".join(_WORDS[:few])), await count(" ".join(_WORDS[:many]))
    if b <= a:
        raise not_counting(tok, counted_text(a, few, b, many))
    try:
        _counted.setdefault(tok, set()).add(chat)
    except TypeError:  # pragma: no cover (a tokenizer that cannot be weakly referenced: checked every time)
        pass


async def _windows(tok: Tokenizer, rng: random.Random, longest: int, n: int) -> tuple[list[int], list[int]]:
    """A corpus and `n` distinct start offsets in it, each with `longest` tokens after it. Each prompt its own
    window: two prompts from one window would be one prompt twice, and the server's prefix cache would serve the
    second (a random workload shares only its `prefix_tokens`). A corpus of 2 x the longest prompt, as before,
    gave 200 prompts of 256 tokens ~320 windows to draw from: a quarter of them repeated one before."""
    corpus = await _corpus_ids(tok, rng, longest + max(longest, n) + 64)
    span = max(1, len(corpus) - longest)
    return corpus, (rng.sample(range(span), n) if n <= span else [rng.randrange(0, span) for _ in range(n)])


def _read_sharegpt(path: str) -> list[tuple[str, str]]:
    return read_sharegpt(path)


async def _fit(tok: Tokenizer, count: Any, corpus: list[int], offset: int, head: list[int], target: int,
               k: int) -> tuple[str, int]:
    """The text of `head` + a window of `corpus` from `offset`, its window length adjusted (up to 6 tries) until
    `count` says `target` tokens; the closest (text, count) found."""
    best_text, best_count = "", -1
    fitted = tok.exact or getattr(tok, "calibrated", False)  # a count worth fitting to (else one try)
    per_id = getattr(tok, "tokens_per_word", 1.0) if not tok.exact else 1.0  # a calibrated id is a word
    for _ in range(6):
        window = corpus[offset : offset + k]
        if len(window) < k:  # extend from the start of the corpus
            window = window + corpus[: k - len(window)]
        text = await tok.decode(head + window)
        c = await count(text)
        if best_count < 0 or abs(c - target) < abs(best_count - target):
            best_text, best_count = text, c
        if c == target or not fitted:
            break
        k = max(1, k + round((target - c) / max(per_id, 0.05)) or (1 if target > c else -1))
    return best_text, best_count


async def _shared_ids(workload: Workload, tok: Tokenizer) -> list[int]:
    """The tokens every prompt of the workload starts with, in every cell (the prefix cache shares them)."""
    n = workload.shared_tokens
    if not n:
        return []
    prng = random.Random(f"servescope-prefix:{workload.seed}:{workload.name}")
    return (await _corpus_ids(tok, prng, n))[:n]


async def build_prompts(
    workload: Workload,
    n: int,
    cell_key: str,
    tok: Tokenizer,
    concurrency: int = 8,
) -> list[Prompt]:
    """`n` prompts for one cell, in issue order. Deterministic for (workload.seed, cell_key). For a multi-turn
    workload, its turns (workloads/conversation.py)."""
    if workload.multi_turn:
        return await _turn_prompts(workload, n, cell_key, tok, concurrency)
    rng = cell_rng(workload, cell_key)
    chat = workload.api == "chat"
    await check_counting(tok, chat)
    count = tok.count_chat if chat else tok.count_prompt
    sem = asyncio.Semaphore(concurrency)

    if workload.dataset:
        pairs = _read_sharegpt(workload.dataset)
        picks = [pairs[rng.randrange(len(pairs))] for _ in range(n)]
        outs = [workload.output_tokens.sample(rng) for _ in range(n)]

        async def one_ds(i: int) -> Prompt:
            q, a = picks[i]
            async with sem:
                nin = await count(q)
                nout = outs[i]
                if workload.output_from_dataset:
                    nout = max(1, min(4096, len(await tok.encode(a))))
            return Prompt(q, nin, nout)

        return list(await asyncio.gather(*(one_ds(i) for i in range(n))))

    ins = [workload.input_tokens.sample(rng) for _ in range(n)]
    outs = [workload.output_tokens.sample(rng) for _ in range(n)]
    overhead = await count("")
    prefix_ids = await _shared_ids(workload, tok)
    corpus, offsets = await _windows(tok, rng, max(ins), n)

    async def one(i: int) -> Prompt:
        target = ins[i]
        async with sem:
            text, c = await _fit(tok, count, corpus, offsets[i], prefix_ids, target,
                                 max(1, target - overhead - len(prefix_ids)))
        return Prompt(text, c, outs[i])

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def _turn_prompts(workload: Workload, n: int, cell_key: str, tok: Tokenizer, concurrency: int) -> list[Prompt]:
    """A multi-turn cell's `n` turns in order: each the new user message (an agent's tool result after its first
    call), turn 1 opening with the shared start; `input_tokens` counts that message alone in the chat template
    (the history comes on top: core/conversation.py)."""
    rng = cell_rng(workload, cell_key)
    await check_counting(tok, True)
    sizes = layout(workload, cell_key, n)
    firsts = [t == 1 for size in sizes for t in range(1, size + 1)]
    sem = asyncio.Semaphore(concurrency)
    shared = await _shared_ids(workload, tok)
    if workload.dataset:
        convs = read_sharegpt_conversations(workload.dataset)
        pairs = [p for i in dataset_picks(workload, cell_key, n) for p in convs[i]][:n]
        outs = [workload.output_tokens.sample(rng) for _ in range(n)]
        head = (await tok.decode(shared)) + "\n\n" if shared else ""

        async def one_ds(i: int) -> Prompt:
            q, a = pairs[i]
            text = head + q if firsts[i] else q
            async with sem:
                nin = await tok.count_chat(text)
                nout = max(1, min(4096, len(await tok.encode(a)))) if workload.output_from_dataset else outs[i]
            return Prompt(text, nin, nout)

        return list(await asyncio.gather(*(one_ds(i) for i in range(n))))

    news = [(workload.input_tokens if first else workload.later_tokens).sample(rng) for first in firsts]
    outs = [workload.output_tokens.sample(rng) for _ in range(n)]
    overhead = await tok.count_chat("")
    corpus, offsets = await _windows(tok, rng, max(news), n)

    async def one(i: int) -> Prompt:
        head = shared if firsts[i] else []
        target = overhead + len(head) + news[i]
        async with sem:
            text, c = await _fit(tok, tok.count_chat, corpus, offsets[i], head, target, news[i])
        return Prompt(text, c, outs[i])

    return list(await asyncio.gather(*(one(i) for i in range(n))))
