"""LoRA traffic: which adapter each request of a workload names as its model.

A workload TOML names its adapters with weights, `adapters = { sql = 0.6, chat = 0.3, base = 0.1 }` ("base": the
base model, no adapter), or spreads its requests over N adapters by a Zipf law, `adapters = { zipf = 1.1,
count = 10 }` (adapter k of N, named `lora-k`, or `PREFIX-k` with `prefix = "..."`, gets a share proportional to
1 / k^s). Each prompt of a cell draws its adapter from the weights with the cell's prompt key as the seed, so the
same sweep sends every request to the same adapter again."""

from __future__ import annotations

import difflib
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass

from servescope.core.errors import ServescopeError

BASE = "base"  # the base model: a request that names no adapter
ZIPF_KEYS = ("zipf", "count", "prefix")
MAX_ADAPTERS = 10_000


@dataclass(frozen=True)
class AdapterMix:
    """Adapter names and their shares of the requests (None for the base model's share)."""

    names: tuple[str, ...]
    weights: tuple[float, ...]
    zipf: float | None = None  # the TOML's zipf form, kept to write it back as it was given
    prefix: str = "lora"

    @property
    def adapters(self) -> tuple[str, ...]:
        """The adapters proper (the base model left out): what a server must serve."""
        return tuple(n for n in self.names if n != BASE)

    def share(self, name: str) -> float:
        total = math.fsum(self.weights)
        return sum(w for n, w in zip(self.names, self.weights, strict=True) if n == name) / total

    def assign(self, n: int, key: str) -> list[str | None]:
        """The adapter of each of `n` prompts (None: the base model), drawn from the weights, seeded by `key`."""
        rng = random.Random(f"adapters:{key}")
        picks = rng.choices(self.names, self.weights, k=n)
        return [None if p == BASE else p for p in picks]

    def describe(self) -> str:
        if self.zipf is not None:
            return f"{len(self.names)} LoRA adapters, Zipf {self.zipf:g}"
        total = math.fsum(self.weights)
        return "LoRA " + ", ".join(f"{n} {w / total:.0%}" for n, w in zip(self.names, self.weights, strict=True))

    def to_table(self) -> dict[str, float | int | str]:
        if self.zipf is not None:
            out: dict[str, float | int | str] = {"zipf": self.zipf, "count": len(self.names)}
            if self.prefix != "lora":
                out["prefix"] = self.prefix
            return out
        return dict(zip(self.names, self.weights, strict=True))


def zipf_mix(s: float, count: int, prefix: str = "lora") -> AdapterMix:
    names = tuple(f"{prefix}-{k}" for k in range(1, count + 1))
    return AdapterMix(names, tuple(k ** -s for k in range(1, count + 1)), zipf=s, prefix=prefix)


def parse_adapters(raw: object, where: str) -> AdapterMix:
    """`adapters = { NAME = WEIGHT, ... }` or `{ zipf = S, count = N }`; a bad table is one line naming it."""
    where = f"{where}: adapters"
    if not isinstance(raw, Mapping) or not raw:
        raise ServescopeError(f"{where}: give a table of weights, e.g. adapters = {{ sql = 0.6, chat = 0.3, base = 0.1 "
                              "}, or a Zipf spread, adapters = { zipf = 1.1, count = 10 }")
    if "zipf" in raw or "count" in raw:
        unknown = [str(k) for k in raw if k not in ZIPF_KEYS]
        if unknown:
            near = difflib.get_close_matches(unknown[0], ZIPF_KEYS, n=1)
            hint = f"did you mean {near[0]!r}?" if near else "a Zipf spread takes zipf, count and prefix"
            raise ServescopeError(f"{where}: unknown key {unknown[0]!r} beside zipf/count; {hint}")
        s, count, prefix = raw.get("zipf"), raw.get("count"), raw.get("prefix", "lora")
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s < 0:
            raise ServescopeError(f"{where}: zipf must be a number >= 0 (the spread's exponent, e.g. 1.1)")
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_ADAPTERS:
            raise ServescopeError(f"{where}: count must be a whole number from 1 to {MAX_ADAPTERS:,} (how many "
                                  "adapters)")
        if not isinstance(prefix, str) or not prefix.strip() or any(c.isspace() for c in prefix):
            raise ServescopeError(f"{where}: prefix must be a name without spaces (adapters are PREFIX-1, PREFIX-2, ...)")
        return zipf_mix(float(s), count, prefix)
    names, weights = [], []
    for k, w in raw.items():
        name = str(k)
        if not name.strip() or any(c.isspace() for c in name):
            raise ServescopeError(f"{where}: {name!r} is not an adapter name (no spaces)")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w < 0:
            raise ServescopeError(f"{where}: {name} = {w!r}: a weight must be a number >= 0")
        names.append(name)
        weights.append(float(w))
    if not math.fsum(weights) > 0:
        raise ServescopeError(f"{where}: every weight is 0; give at least one above 0")
    return AdapterMix(tuple(names), tuple(weights))
