"""Build prompts of exact token lengths with the server's tokenizer (or a local one), deterministically.

For each prompt of N tokens: take a window of a seeded word corpus already tokenized by the server,
detokenize it, count the result as the server will (`/tokenize`, chat template included for chat) and
trim or extend until the count is N. Each cell gets its own seed so cells do not hit each other's prefix
cache; a workload's shared prefix (`prefix_tokens`) is the same for every prompt of every cell.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from servescope.core.target import Tokenizer
from servescope.workloads.spec import Workload, read_sharegpt

_WORDS = ["the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at", "from", "his", "her", "they", "this", "which", "be", "are", "an", "or", "had", "not", "have", "were", "one", "all", "their", "there", "been", "has", "when", "who", "will", "more", "no", "if", "out", "so", "said", "what", "up", "its", "about", "into", "than", "them", "can", "only", "other", "new", "some", "could", "time", "these", "two", "may", "then", "do", "first", "any", "my", "now", "such", "like", "our", "over", "man", "me", "even", "most", "made", "after", "also", "did", "many", "before", "must", "through", "back", "years", "where", "much", "your", "way", "well", "down", "should", "because", "each", "just", "those", "people", "how", "too", "little", "state", "good", "very", "make", "world", "still", "own", "see", "men", "work", "long", "get", "here", "between", "both", "life", "being", "under", "never", "day", "same", "another", "know", "while", "last", "might", "us", "great", "old", "year", "off", "come", "since", "against", "go", "came", "right", "used", "take", "three", "states", "himself", "few", "house", "use", "during", "without", "again", "place", "around", "however", "home", "small", "found", "thought", "went", "say", "part", "once", "general", "high", "upon", "school", "every", "does", "got", "united", "left", "number", "course", "war", "until", "always", "away", "something", "fact", "though", "water", "less", "public", "put", "think", "almost", "hand", "enough", "far", "took", "head", "yet", "government", "system", "better", "set", "told", "nothing", "night", "end", "why", "called", "didn", "eyes", "find", "going", "look", "asked", "later", "knew", "point", "next", "program", "city", "business", "give", "group", "toward", "young", "days", "let", "room", "president", "side", "social", "given", "present", "several", "order", "national", "possible", "rather", "second", "face", "per", "among", "form", "important", "often", "things", "looked", "early", "white", "case", "john", "become", "large", "big", "need", "four", "within", "felt", "children", "along", "saw", "best", "church", "ever", "least", "power", "development", "light", "thing", "seemed", "family", "interest", "want", "members", "mind", "country", "area", "others", "done", "turned", "although", "open", "problem", "began", "various", "kernel", "cache", "token", "latency", "throughput", "server", "request", "model", "batch", "queue", "memory", "tensor", "matrix", "vector", "stream"]


@dataclass(frozen=True)
class Prompt:
    text: str
    input_tokens: int  # what the tokenizer counted for this text (the server's own count when exact)
    output_tokens: int


def cell_rng(workload: Workload, cell_key: str) -> random.Random:
    return random.Random(f"servescope:{workload.seed}:{workload.name}:{cell_key}")


def _corpus(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


async def _corpus_ids(tok: Tokenizer, rng: random.Random, need: int) -> list[int]:
    words = max(64, int(need * 1.1) + 16)
    while True:
        ids = await tok.encode(_corpus(rng, words))
        if len(ids) >= need:
            return ids
        words *= 2


def _read_sharegpt(path: str) -> list[tuple[str, str]]:
    return read_sharegpt(path)


async def build_prompts(
    workload: Workload,
    n: int,
    cell_key: str,
    tok: Tokenizer,
    concurrency: int = 8,
) -> list[Prompt]:
    """`n` prompts for one cell, in issue order. Deterministic for (workload.seed, cell_key)."""
    rng = cell_rng(workload, cell_key)
    chat = workload.api == "chat"
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
    prefix_ids: list[int] = []
    if workload.prefix_tokens:
        prng = random.Random(f"servescope-prefix:{workload.seed}:{workload.name}")
        prefix_ids = (await _corpus_ids(tok, prng, workload.prefix_tokens))[: workload.prefix_tokens]
    longest = max(ins)
    corpus = await _corpus_ids(tok, rng, 2 * longest + 64)
    offsets = [rng.randrange(0, max(1, len(corpus) - longest)) for _ in range(n)]

    async def one(i: int) -> Prompt:
        target = ins[i]
        k = max(1, target - overhead - len(prefix_ids))
        best_text, best_count = "", -1
        async with sem:
            for _ in range(6):
                window = corpus[offsets[i] : offsets[i] + k]
                if len(window) < k:  # extend from the start of the corpus
                    window = window + corpus[: k - len(window)]
                text = await tok.decode(prefix_ids + window)
                c = await count(text)
                if best_count < 0 or abs(c - target) < abs(best_count - target):
                    best_text, best_count = text, c
                if c == target or not tok.exact:
                    break
                k = max(1, k + (target - c))
        return Prompt(best_text, best_count, outs[i])

    return list(await asyncio.gather(*(one(i) for i in range(n))))
