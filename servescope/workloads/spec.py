"""Workload specs: length distributions, the built-in presets and custom TOML files."""

from __future__ import annotations

import functools
import json
import math
import random
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Required, TypedDict

from servescope.core.arrivals import parse_seconds
from servescope.core.errors import ServescopeError, error_text
from servescope.core.textsafe import clean_text
from servescope.workloads.adapters import AdapterMix, parse_adapters


class DistTable(TypedDict, total=False):
    """A distribution as a workload table saves it: `dist` and the keys that kind of distribution takes."""

    dist: Required[str]
    value: float
    min: float
    max: float
    mean: float
    std: float


class WorkloadTable(TypedDict, total=False):
    """A workload as saved (session.toml's [[workloads]], a workload TOML): the keys `Workload.to_dict` writes."""

    name: Required[str]
    api: str
    input_tokens: DistTable
    output_tokens: DistTable
    prefix_tokens: int
    dataset: str
    seed: int
    source: str
    thinking: bool
    ramp: str
    kind: str
    turns: DistTable
    think_time_s: DistTable
    context_tokens: int
    calls: DistTable
    tool_result_tokens: DistTable
    trace: str
    format: str
    time_scale: float
    adapters: dict[str, float | int | str]
    spec_acceptance: float
    temperature: float
    prefix_cache_hit_rate: float


@dataclass(frozen=True)
class LengthDist:
    """A token-length distribution: fixed, uniform (inclusive), or a clipped normal."""

    dist: str = "fixed"
    value: int = 0
    min: int = 0
    max: int = 0
    mean: float = 0.0
    std: float = 0.0

    def sample(self, rng: random.Random) -> int:
        if self.dist == "fixed":
            return self.value
        if self.dist == "uniform":
            return rng.randint(self.min, self.max)
        v = round(rng.gauss(self.mean, self.std))
        return max(self.min, min(self.max, v))

    @property
    def upper(self) -> int:
        return self.value if self.dist == "fixed" else self.max

    def describe(self) -> str:
        if self.dist == "fixed":
            return f"{self.value}"
        if self.dist == "uniform":
            return f"{self.min}-{self.max} (uniform)"
        return f"N({self.mean:g}, {self.std:g}) in [{self.min}, {self.max}]"

    def to_dict(self) -> DistTable:
        if self.dist == "fixed":
            return {"dist": "fixed", "value": self.value}
        if self.dist == "uniform":
            return {"dist": "uniform", "min": self.min, "max": self.max}
        return {"dist": "normal", "mean": self.mean, "std": self.std, "min": self.min, "max": self.max}

    @classmethod
    def parse(cls, raw: object, where: str, unit: str = "tokens") -> LengthDist:
        """A length (or, with `unit` "turns"/"calls", a count) as a number or a { dist = ... } table."""
        count = functools.partial(_count, unit=unit)
        if isinstance(raw, (int, float, str)) and not isinstance(raw, bool):
            raw = {"dist": "fixed", "value": count(raw, where)}
        if not isinstance(raw, dict):
            raise ServescopeError(f"{where}: expected a number of {unit} or a table like "
                                  f"{{ dist = \"fixed\", value = {1024 if unit == 'tokens' else 5} }}")
        kind = raw.get("dist", "fixed")
        for k in raw:
            if k not in DIST_KEYS:
                raise ServescopeError(f"{where}: unknown key {str(k)!r}; {_did_you_mean(str(k), DIST_KEYS)}")
        try:
            if kind == "fixed":
                d = cls("fixed", value=count(raw["value"], f"{where}: value"))
                lo = d.value
            elif kind == "uniform":
                d = cls("uniform", min=count(raw["min"], f"{where}: min"), max=count(raw["max"], f"{where}: max"))
                lo = d.min
                if d.max < d.min:
                    raise ServescopeError(f"{where}: max ({d.max}) is below min ({d.min})")
            elif kind == "normal":
                mean = _real(raw["mean"], f"{where}: mean")
                std = _real(raw.get("std", 0.0), f"{where}: std")
                if not 1 <= mean <= MAX_TOKENS:
                    raise ServescopeError(f"{where}: mean ({mean:g}) must be between 1 and {MAX_TOKENS:,} {unit}")
                lo_v = count(raw["min"], f"{where}: min") if "min" in raw else max(1, round(mean - 3 * std))
                hi_v = count(raw["max"], f"{where}: max") if "max" in raw else min(MAX_TOKENS, round(mean + 3 * std))
                if hi_v < lo_v:
                    raise ServescopeError(f"{where}: max ({hi_v}) is below min ({lo_v})")
                d = cls("normal", mean=mean, std=std, min=lo_v, max=hi_v)
                lo = d.min
            else:
                shown = repr(kind) if isinstance(kind, str) else type(kind).__name__
                raise ServescopeError(f"{where}: unknown dist {shown}; use fixed, uniform or normal")
        except KeyError as e:
            raise ServescopeError(f"{where}: dist {kind!r} needs the key {e.args[0]!r}") from None
        if lo < 1:
            raise ServescopeError(f"{where}: {_noun(unit)} must be at least 1")
        return d


MAX_TOKENS = 100_000_000  # no model reads or writes more tokens in one request
DIST_KEYS = ("dist", "value", "min", "max", "mean", "std")


def _did_you_mean(key: str, known: Iterable[str]) -> str:
    import difflib

    near = difflib.get_close_matches(key, sorted(known), n=1)
    return f"did you mean {near[0]!r}?" if near else f"expected one of {', '.join(sorted(known))}"


def _tokens(v: object, where: str, lo: int = 1) -> int:
    """A token length: a whole number from `lo` to MAX_TOKENS (an integral float such as 1024.0 is accepted)."""
    return _count(v, where, lo)


def _noun(unit: str) -> str:
    return "token lengths" if unit == "tokens" else f"numbers of {unit}"


def _count(v: object, where: str, lo: int = 1, unit: str = "tokens") -> int:
    """A whole number of `unit` from `lo` to MAX_TOKENS (an integral float such as 1024.0 is accepted)."""
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int):
        shown = f", not {v!r}" if isinstance(v, (float, str)) and len(repr(v)) < 40 else ""
        what = "lengths must be integers (a number of tokens)" if unit == "tokens" else f"must be a whole number of {unit}"
        raise ServescopeError(f"{where}: {what}{shown}")
    hi = MAX_TOKENS if unit == "tokens" else MAX_TURNS
    if not lo <= v <= hi:
        raise ServescopeError(f"{where}: {v} is out of range; {_noun(unit)} must be from {lo} to {hi:,}")
    return v


def _real(v: object, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ServescopeError(f"{where}: must be a finite number, at least 0")
    return float(v)


@dataclass(frozen=True)
class SecondsDist:
    """A time distribution in seconds (think time between turns): fixed, uniform (inclusive) or a normal clipped
    to [min, max] (never below 0)."""

    dist: str = "fixed"
    value: float = 0.0
    min: float = 0.0
    max: float = 0.0
    mean: float = 0.0
    std: float = 0.0

    def sample(self, rng: random.Random) -> float:
        if self.dist == "fixed":
            return self.value
        if self.dist == "uniform":
            return rng.uniform(self.min, self.max)
        return max(self.min, min(self.max, rng.gauss(self.mean, self.std)))

    @property
    def upper(self) -> float:
        return self.value if self.dist == "fixed" else self.max

    def describe(self) -> str:
        if self.dist == "fixed":
            return f"{self.value:g} s"
        if self.dist == "uniform":
            return f"{self.min:g}-{self.max:g} s (uniform)"
        return f"N({self.mean:g}, {self.std:g}) s in [{self.min:g}, {self.max:g}]"

    def to_dict(self) -> DistTable:
        if self.dist == "fixed":
            return {"dist": "fixed", "value": self.value}
        if self.dist == "uniform":
            return {"dist": "uniform", "min": self.min, "max": self.max}
        return {"dist": "normal", "mean": self.mean, "std": self.std, "min": self.min, "max": self.max}

    @classmethod
    def parse(cls, raw: object, where: str) -> SecondsDist:
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            raw = {"dist": "fixed", "value": raw}
        if not isinstance(raw, dict):
            raise ServescopeError(f"{where}: expected a number of seconds or a table like "
                                  "{ dist = \"uniform\", min = 1, max = 5 }")
        kind = raw.get("dist", "fixed")
        for k in raw:
            if k not in DIST_KEYS:
                raise ServescopeError(f"{where}: unknown key {str(k)!r}; {_did_you_mean(str(k), DIST_KEYS)}")

        def secs(k: str) -> float:
            v = _real(raw[k], f"{where}: {k}")
            if v > MAX_THINK_S:
                raise ServescopeError(f"{where}: {k} ({v:g} s) is more than {MAX_THINK_S:g} s")
            return v

        try:
            if kind == "fixed":
                return cls("fixed", value=secs("value"))
            if kind == "uniform":
                lo, hi = secs("min"), secs("max")
                if hi < lo:
                    raise ServescopeError(f"{where}: max ({hi:g}) is below min ({lo:g})")
                return cls("uniform", min=lo, max=hi)
            if kind == "normal":
                mean, std = secs("mean"), _real(raw.get("std", 0.0), f"{where}: std")
                lo = secs("min") if "min" in raw else max(0.0, mean - 3 * std)
                hi = secs("max") if "max" in raw else min(MAX_THINK_S, mean + 3 * std)
                if hi < lo:
                    raise ServescopeError(f"{where}: max ({hi:g}) is below min ({lo:g})")
                return cls("normal", mean=mean, std=std, min=lo, max=hi)
        except KeyError as e:
            raise ServescopeError(f"{where}: dist {kind!r} needs the key {e.args[0]!r}") from None
        shown = repr(kind) if isinstance(kind, str) else type(kind).__name__
        raise ServescopeError(f"{where}: unknown dist {shown}; use fixed, uniform or normal")


MAX_THINK_S = 86_400.0  # a pause between turns longer than a day is a typo
MAX_TURNS = 10_000  # turns of one conversation, calls of one agent session


def fixed(n: int) -> LengthDist:
    return LengthDist("fixed", value=n)


def uniform(lo: int, hi: int) -> LengthDist:
    return LengthDist("uniform", min=lo, max=hi)


@dataclass(frozen=True)
class Workload:
    name: str
    api: str = "completions"  # "completions" | "chat"
    input_tokens: LengthDist = field(default_factory=lambda: fixed(256))
    output_tokens: LengthDist = field(default_factory=lambda: fixed(64))
    prefix_tokens: int = 0
    thinking: bool | None = None  # None: leave the server's default
    dataset: str = ""
    seed: int = 0
    description: str = ""
    # defaults a preset may carry (the CLI's flags override them)
    default_concurrency: tuple[int, ...] = ()
    default_requests: int = 0
    source: str = "preset"
    output_from_dataset: bool = False  # dataset workloads without output_tokens use the replies' lengths
    # multi-turn kinds: "conversation" (turns resend the whole history), "agent" (calls on one long context)
    kind: str = "single"
    turns: LengthDist = field(default_factory=lambda: fixed(1))  # conversation: turns per conversation
    think_time_s: SecondsDist = field(default_factory=lambda: SecondsDist())  # pause before each later turn
    context_tokens: int = 0  # agent: the long context every session shares (system prompt, tools, repository)
    calls: LengthDist = field(default_factory=lambda: fixed(1))  # agent: model calls per session
    tool_result_tokens: LengthDist = field(default_factory=lambda: fixed(1))  # agent: appended before each later call
    # kind "trace": requests replayed at a trace file's times (servescope.workloads.traces)
    trace: str = ""
    trace_format: str = "auto"
    time_scale: float = 1.0  # multiplies the trace's times: 0.5 replays it twice as fast
    ramp_s: float | None = None  # this workload's cells ramp up over it (the sweep's --ramp wins)
    # what GPU-box users change (servescope.workloads.adapters; docs/speculation.md): the LoRA adapters requests
    # name, how predictable the text is for speculative decoding (the acceptance of drafted tokens, which the
    # simulator models), the sampling temperature, and the prefix-cache hit rate aimed at (the shared prefix is
    # sized to hit it: prefix_tokens = rate x the mean input length)
    adapters: AdapterMix | None = None
    spec_acceptance: float | None = None
    temperature: float | None = None
    prefix_cache_hit_rate: float | None = None

    @property
    def multi_turn(self) -> bool:
        return self.kind in ("conversation", "agent")

    @property
    def rounds(self) -> LengthDist:
        """Requests per conversation (turns, or an agent's calls)."""
        return self.calls if self.kind == "agent" else self.turns

    @property
    def shared_tokens(self) -> int:
        """The shared start of every conversation: the prefix (system prompt), or an agent's context."""
        return self.context_tokens if self.kind == "agent" else self.prefix_tokens

    @property
    def later_tokens(self) -> LengthDist:
        """New tokens of each turn after the first: user messages, or an agent's tool results."""
        return self.tool_result_tokens if self.kind == "agent" else self.input_tokens

    @property
    def max_request_tokens(self) -> int:
        """The longest request's context (prompt + output) when the dataset does not decide it: a conversation's
        last turn holds the shared start and every turn's message and reply (chat template tokens aside)."""
        if self.kind == "trace":
            return 0  # the trace file's (servescope.workloads.traces.workload_trace(w).max_total())
        if not self.multi_turn:
            return self.input_tokens.upper + self.output_tokens.upper
        n = self.rounds.upper
        return (self.shared_tokens + self.input_tokens.upper + (n - 1) * self.later_tokens.upper
                + n * self.output_tokens.upper)

    def shape(self) -> str:
        think = {True: ", thinking on", False: ", thinking off", None: ""}[self.thinking]
        pre = f", {self.prefix_tokens} shared prefix" if self.prefix_tokens else ""
        if self.prefix_cache_hit_rate is not None:
            pre += f" (aiming at a {self.prefix_cache_hit_rate:.0%} prefix-cache hit rate)"
        if self.adapters is not None:
            pre += f", {self.adapters.describe()}"
        if self.temperature is not None:
            pre += f", temperature {self.temperature:g}"
        if self.spec_acceptance is not None:
            pre += f", drafts accepted at {self.spec_acceptance:g}"
        ds = f", dataset {Path(self.dataset).name}" if self.dataset else ""
        out = "as the dataset's replies" if self.output_from_dataset else self.output_tokens.describe()
        inp = "as the dataset's prompts" if self.dataset else self.input_tokens.describe()
        pause = f", think {self.think_time_s.describe()}"
        if self.kind == "conversation":
            turns = "as the dataset's conversations" if self.dataset else self.turns.describe()
            return f"{turns} turns x in {inp} new / out {out}{pause} (conversation{pre}{think}{ds})"
        if self.kind == "trace":
            scale = f" x{self.time_scale:g} time" if self.time_scale != 1 else ""
            return f"trace {Path(self.trace).name} ({self.trace_format}{scale}; {self.api})"
        if self.kind == "agent":
            return (f"context {self.context_tokens} + task {self.input_tokens.describe()}, {self.calls.describe()} "
                    f"calls x tool result {self.tool_result_tokens.describe()} / out {out}{pause} (agent{think})")
        return f"in {inp} / out {out} ({self.api}{pre}{think}{ds})"

    def to_dict(self) -> WorkloadTable:
        d: WorkloadTable = {
            "name": self.name,
            "api": self.api,
            "input_tokens": self.input_tokens.to_dict(),
            "output_tokens": self.output_tokens.to_dict(),
            "prefix_tokens": self.prefix_tokens,
            "dataset": self.dataset,
            "seed": self.seed,
            "source": self.source,
        }
        if self.thinking is not None:
            d["thinking"] = self.thinking
        if self.ramp_s:
            d["ramp"] = f"{self.ramp_s:g}s"
        if self.adapters is not None:
            d["adapters"] = self.adapters.to_table()
        if self.spec_acceptance is not None:
            d["spec_acceptance"] = self.spec_acceptance
        if self.temperature is not None:
            d["temperature"] = self.temperature
        if self.prefix_cache_hit_rate is not None:  # the prefix is sized from it again when read
            d["prefix_cache_hit_rate"] = self.prefix_cache_hit_rate
            del d["prefix_tokens"]
        if self.kind == "conversation":
            d["kind"], d["turns"], d["think_time_s"] = self.kind, self.turns.to_dict(), self.think_time_s.to_dict()
        elif self.kind == "agent":
            d["kind"], d["context_tokens"], d["calls"] = self.kind, self.context_tokens, self.calls.to_dict()
            d["tool_result_tokens"], d["think_time_s"] = self.tool_result_tokens.to_dict(), self.think_time_s.to_dict()
        if self.kind == "agent":  # its shared context is context_tokens, and it reads no dataset
            del d["prefix_tokens"], d["dataset"]
        if self.kind == "trace":  # the lengths and times are the trace's
            del d["input_tokens"], d["output_tokens"], d["prefix_tokens"], d["dataset"]
            d["kind"], d["trace"], d["format"], d["time_scale"] = "trace", self.trace, self.trace_format, self.time_scale
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, object], where: str = "workload") -> Workload:
        """A workload table (TOML) -> Workload; any bad key or value is a ServescopeError naming it."""
        if not isinstance(d, dict):
            raise ServescopeError(f"{where}: a workload must be a table (name = ..., input_tokens = ...)")
        for k in d:
            if k not in WORKLOAD_KEYS:
                raise ServescopeError(f"{where}: unknown key {str(k)!r}; {_did_you_mean(str(k), WORKLOAD_KEYS)}")
        name = d.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ServescopeError(f"{where}: the workload needs a name = \"...\"")
        if clean_text(name) != name.strip():  # a name is shown in every table and on the terminal: one printable line
            raise ServescopeError(f"{where}: name {name!r} holds a line break, tab or control character (an escape "
                                  "sequence); give a name of printable text on one line")
        kind = _kind(d, where)
        api = d.get("api", "chat" if kind in ("conversation", "agent") else "completions")
        if api not in ("completions", "chat"):
            shown = repr(api) if isinstance(api, str) else type(api).__name__
            raise ServescopeError(f"{where}: api must be \"completions\" or \"chat\", not {shown}")
        if kind in ("conversation", "agent") and api != "chat":
            raise ServescopeError(f"{where}: kind = \"{kind}\" needs api = \"chat\" (each turn resends the history "
                                  "as chat messages)")
        thinking = d.get("thinking")
        if thinking is not None and not isinstance(thinking, bool):
            raise ServescopeError(f"{where}: thinking must be true or false")
        dataset = d.get("dataset", "") or ""
        if not isinstance(dataset, str):
            raise ServescopeError(f"{where}: dataset must be a path (a text), e.g. dataset = \"sharegpt.json\"")
        for k in ("description", "source"):
            if not isinstance(d.get(k, ""), str):
                raise ServescopeError(f"{where}: {k} must be a text")
        inp = LengthDist.parse(d.get("input_tokens", 256), f"{where}: input_tokens")
        out = LengthDist.parse(d.get("output_tokens", 64), f"{where}: output_tokens")
        prefix = _tokens(d.get("prefix_tokens", 0), f"{where}: prefix_tokens", lo=0)
        extra = _serving_keys(d, where)
        hit = extra.get("prefix_cache_hit_rate")
        if isinstance(hit, float):
            if "prefix_tokens" in d:
                raise ServescopeError(f"{where}: give prefix_tokens or prefix_cache_hit_rate (which sizes the shared "
                                      "prefix), not both")
            mean_in = inp.value if inp.dist == "fixed" else (inp.mean if inp.dist == "normal" else (inp.min + inp.max) / 2)
            prefix = round(hit * mean_in)
            lowest_in = inp.value if inp.dist == "fixed" else inp.min
            if prefix >= lowest_in:
                raise ServescopeError(f"{where}: prefix_cache_hit_rate {hit:g} needs a shared prefix of {prefix} "
                                      f"tokens, not below the shortest input ({lowest_in}); aim lower or give "
                                      "longer inputs")
        seed = d.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int) or not -(2**63) <= seed < 2**63:
            raise ServescopeError(f"{where}: seed must be an integer")
        lowest = inp.value if inp.dist == "fixed" else inp.min
        # a conversation's prefix is a system prompt before the first message, not part of it
        if prefix < 0 or (kind == "single" and not dataset and prefix >= lowest):
            raise ServescopeError(f"{where}: prefix_tokens ({prefix}) must be between 0 and the shortest input length ({lowest})")
        multi = _trace_keys(d, where) if kind == "trace" else _multi_turn(d, kind, where)
        if "ramp" in d:
            multi["ramp_s"] = _ramp(d["ramp"], f"{where}: ramp")
        return cls(
            name=name,
            api=api,
            input_tokens=inp,
            output_tokens=out,
            prefix_tokens=prefix,
            thinking=thinking,
            dataset=dataset,
            seed=seed,
            description=str(d.get("description", "")),
            source=str(d.get("source", "file")),
            output_from_dataset=bool(dataset) and "output_tokens" not in d,
            kind=kind,
            **multi,
            **extra,
        )


    def check(self, where: str = "workload") -> Workload:
        """What can be checked before a server starts: the dataset exists, is JSON and is ShareGPT-shaped."""
        if self.dataset:
            try:
                read_sharegpt(self.dataset)
            except ServescopeError as e:
                raise ServescopeError(f"{where}: workload {self.name!r}: {e.message}") from None
        return self


def read_sharegpt(path: str) -> list[tuple[str, str]]:
    """A ShareGPT-format dataset's (first human turn, first reply) pairs; one line when it is missing, not
    JSON or not ShareGPT-shaped. Read once per file version (path, size, mtime)."""
    return [c[0] for c in read_sharegpt_conversations(path)]


def read_sharegpt_conversations(path: str) -> list[tuple[tuple[str, str], ...]]:
    """Each conversation of a ShareGPT-format dataset as its (human turn, reply) pairs in order, up to the first
    pair that is not two texts; errors as `read_sharegpt`."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        st = None
    if st is None or not p.is_file():
        what = "is a directory, not a file" if p.is_dir() else "no such file"
        raise ServescopeError(f"dataset {path}: {what}; fix `dataset` in the workload TOML")
    return _read_sharegpt_cached(str(p), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _read_sharegpt_cached(path: str, size: int, mtime_ns: int) -> list[tuple[tuple[str, str], ...]]:
    del size, mtime_ns  # the cache key: a changed file is read again
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        why = error_text(e)
        raise ServescopeError(f"dataset {path}: not valid JSON ({why[:120]}); it must be a ShareGPT-format "
                              "JSON list") from None
    except OSError as e:
        raise ServescopeError(f"dataset {path}: cannot read it ({e.strerror or e}); check the path") from None
    convs: list[tuple[tuple[str, str], ...]] = []
    if isinstance(data, list):
        for item in data:
            conv = item.get("conversations") if isinstance(item, dict) else None
            if not isinstance(conv, list):
                continue
            pairs: list[tuple[str, str]] = []
            for first, second in zip(conv[::2], conv[1::2], strict=False):
                if not (isinstance(first, dict) and isinstance(second, dict)):
                    break
                q, a = first.get("value"), second.get("value")
                if not (isinstance(q, str) and isinstance(a, str) and q.strip() and a.strip()):
                    break
                pairs.append((q, a))
            if pairs:
                convs.append(tuple(pairs))
    if not convs:
        raise ServescopeError(
            f"dataset {path}: not ShareGPT-shaped; expected a JSON list of "
            '{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}]}'
        )
    return convs


WORKLOAD_KEYS = {"name", "api", "input_tokens", "output_tokens", "prefix_tokens", "thinking", "dataset", "seed",
                 "description", "source", "kind", "turns", "think_time_s", "context_tokens", "calls",
                 "tool_result_tokens", "trace", "format", "time_scale", "ramp", "adapters", "spec_acceptance",
                 "temperature", "prefix_cache_hit_rate"}
KINDS = ("single", "conversation", "agent", "trace")
TRACE_FORMATS = ("mooncake", "burstgpt", "azure", "session")  # read by servescope.workloads.traces
# keys only some kinds take, and the kinds that take them
_KIND_KEYS = {"turns": ("conversation",), "think_time_s": ("conversation", "agent"), "context_tokens": ("agent",),
              "calls": ("agent",), "tool_result_tokens": ("agent",), "prefix_tokens": ("single", "conversation"),
              "dataset": ("single", "conversation"), "trace": ("trace",), "format": ("trace",),
              "time_scale": ("trace",), "input_tokens": ("single", "conversation", "agent"),
              "output_tokens": ("single", "conversation", "agent"), "adapters": ("single",),
              "prefix_cache_hit_rate": ("single",)}
AGENT_CONTEXT = 16384  # an agent's shared context when the TOML does not say


class _KindFields(TypedDict, total=False):
    """The Workload fields only some kinds (and a ramp) set, as keyword arguments."""

    trace: str
    trace_format: str
    time_scale: float
    think_time_s: SecondsDist
    turns: LengthDist
    calls: LengthDist
    context_tokens: int
    tool_result_tokens: LengthDist
    ramp_s: float


class _ServingFields(TypedDict, total=False):
    """The Workload fields of the serving keys (adapters, speculation, temperature, prefix-cache target)."""

    adapters: AdapterMix
    spec_acceptance: float
    temperature: float
    prefix_cache_hit_rate: float


def _share_of(v: object, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
        raise ServescopeError(f"{where}: must be a number from 0 to 1")
    return float(v)


def _serving_keys(d: Mapping[str, object], where: str) -> _ServingFields:
    out: _ServingFields = {}
    if "adapters" in d:
        out["adapters"] = parse_adapters(d["adapters"], where)
    if "spec_acceptance" in d:
        out["spec_acceptance"] = _share_of(d["spec_acceptance"], f"{where}: spec_acceptance")
    if "temperature" in d:
        t = d["temperature"]
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 <= t <= 100:
            raise ServescopeError(f"{where}: temperature must be a number >= 0 (0: greedy)")
        out["temperature"] = float(t)
    if "prefix_cache_hit_rate" in d:
        h = _share_of(d["prefix_cache_hit_rate"], f"{where}: prefix_cache_hit_rate")
        if h >= 1:
            raise ServescopeError(f"{where}: prefix_cache_hit_rate must be below 1 (every prompt keeps a part of "
                                  "its own)")
        out["prefix_cache_hit_rate"] = h
    return out


def _kind(d: Mapping[str, object], where: str) -> str:
    kind = d.get("kind", "single")
    if kind not in KINDS:
        shown = repr(kind) if isinstance(kind, str) else type(kind).__name__
        raise ServescopeError(f"{where}: unknown kind {shown}; use one of {', '.join(KINDS)}")
    for k, kinds in _KIND_KEYS.items():
        if k in d and kind not in kinds:
            need = " or ".join(f'kind = "{x}"' for x in kinds)
            raise ServescopeError(f"{where}: {k} is only for {need} workloads (this one is kind = \"{kind}\")")
    if kind == "conversation" and d.get("dataset") and "turns" in d:
        raise ServescopeError(f"{where}: with a dataset, the turns are each conversation's own (all of them, in "
                              "order); drop turns")
    return str(kind)


def _ramp(raw: object, where: str) -> float:
    """A workload's `ramp = "10s"` (or seconds as a number): above 0, at most a day."""
    return parse_seconds(raw, where)


def _trace_keys(d: Mapping[str, object], where: str) -> _KindFields:
    """The Workload fields of a trace's keys: the file (read and checked later, by `check`), its format and
    how its times are scaled."""
    path = d.get("trace")
    if not isinstance(path, str) or not path.strip():
        raise ServescopeError(f'{where}: kind = "trace" needs trace = "FILE" (a Mooncake JSONL, BurstGPT or Azure '
                              "CSV, or a session directory)")
    fmt = d.get("format", "auto")
    if fmt not in ("auto", *TRACE_FORMATS):
        shown = repr(fmt) if isinstance(fmt, str) else type(fmt).__name__
        raise ServescopeError(f"{where}: format {shown} is not one of auto, {', '.join(TRACE_FORMATS)}")
    scale = d.get("time_scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ServescopeError(f"{where}: time_scale must be a number above 0 (0.5 replays the trace twice as "
                              "fast, 2 at half speed)")
    return {"trace": path, "trace_format": str(fmt), "time_scale": float(scale)}


def _multi_turn(d: Mapping[str, object], kind: str, where: str) -> _KindFields:
    """The Workload fields of a conversation's or an agent's keys (none for a single-turn workload)."""
    if kind == "single":
        return {}
    out: _KindFields = {"think_time_s": SecondsDist.parse(d.get("think_time_s", 0), f"{where}: think_time_s")}
    rounds = "turns" if kind == "conversation" else "calls"
    dist = LengthDist.parse(d.get(rounds, 5 if kind == "conversation" else 8), f"{where}: {rounds}", unit=rounds)
    if dist.upper > MAX_TURNS:
        raise ServescopeError(f"{where}: {rounds} ({dist.upper}) must be at most {MAX_TURNS:,}")
    if kind == "conversation":
        out["turns"] = dist
    else:
        out["calls"] = dist
    if kind == "agent":
        out["context_tokens"] = _tokens(d.get("context_tokens", AGENT_CONTEXT), f"{where}: context_tokens", lo=0)
        out["tool_result_tokens"] = LengthDist.parse(d.get("tool_result_tokens", {"dist": "uniform", "min": 100,
                                                                                   "max": 1000}),
                                                     f"{where}: tool_result_tokens")
    return out
_SHAREGPT_IN = uniform(200, 512)

PRESETS: dict[str, Workload] = {
    w.name: w
    for w in [
        Workload("sharegpt", "chat", _SHAREGPT_IN, fixed(256), description="short chat, Q&A"),
        Workload("balanced1k1k", "completions", fixed(1024), fixed(1024), description="RAG, long-form"),
        Workload("random", "completions", fixed(6000), fixed(512), description="code completion, repo questions"),
        Workload("longout", "completions", fixed(128), fixed(2048), description="creative writing, agent replies"),
        Workload("longin", "completions", fixed(8192), fixed(256), description="document summarisation"),
        Workload(
            "sharegpt-think", "chat", _SHAREGPT_IN, fixed(1024), thinking=True, description="chat with reasoning on"
        ),
        Workload(
            "sustained-c32",
            "chat",
            _SHAREGPT_IN,
            fixed(256),
            description="stability over time: sharegpt at c=32, 300 prompts",
            default_concurrency=(32,),
            default_requests=300,
        ),
        Workload("chat-multiturn", "chat", uniform(200, 500), fixed(256), kind="conversation", turns=fixed(5),
                 description="chat: 5 turns, each resending the history"),
        Workload("coding-agent", "chat", fixed(256), fixed(64), kind="agent", context_tokens=AGENT_CONTEXT,
                 calls=fixed(8), tool_result_tokens=uniform(100, 1000),
                 description="coding assistant: 8 calls on a shared 16K context"),
    ]
}
CONTEXT_SWEEP = (1024, 4096, 8192, 16384, 32768)
COMPOSITE = {"context-sweep": "inputs 1K, 4K, 8K, 16K, 32K tokens, output 256 (cells that do not fit are skipped)"}


def context_sweep() -> list[Workload]:
    return [
        Workload(
            f"context-sweep/{n // 1024}k",
            "completions",
            fixed(n),
            fixed(256),
            description=f"context sweep, {n} input tokens",
        )
        for n in CONTEXT_SWEEP
    ]


def preset_names() -> list[str]:
    return [*PRESETS, *COMPOSITE]


def load_toml(path: str | Path) -> list[Workload]:
    """Load one or more workloads from a TOML file: `[workload]` or `[[workload]]`."""
    p = Path(path)
    if not p.is_file():
        raise ServescopeError(f"{p}: no such workload file; give a preset name ({', '.join(preset_names())}) or a .toml path")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ServescopeError(f"{p}: not a text file (not UTF-8); give a workload TOML file") from None
    except OSError as e:
        raise ServescopeError(f"{p}: cannot read it ({e.strerror or e}); check the path") from None
    data = parse_toml(text, str(p))
    raw = data.get("workload")
    if raw is None:
        raise ServescopeError(f"{p}: no [workload] table; see docs/measuring.md#workloads for the workload TOML schema")
    items = raw if isinstance(raw, list) else [raw]
    out: list[Workload] = []
    for i, item in enumerate(items):
        where = f"{p}: workload {i + 1}" if len(items) > 1 else str(p)
        if not isinstance(item, dict):
            raise ServescopeError(f"{where}: expected a [workload] table (name = ..., input_tokens = ...)")
        w = Workload.from_dict({**item, "source": str(p)}, where)
        if w.dataset and not Path(w.dataset).is_absolute():
            w = replace(w, dataset=str((p.parent / w.dataset).resolve()))
        if w.trace and not Path(w.trace).is_absolute():  # a trace path is relative to its TOML file
            w = replace(w, trace=str((p.parent / w.trace).resolve()))
        twin = next((j for j, o in enumerate(out) if o.name == w.name), None)
        if twin is not None:
            raise ServescopeError(f"{where}: named {w.name!r} as workload {twin + 1} is; give each "
                                  "[[workload]] its own name (cells, reports and compare tell workloads apart by it)")
        out.append(w)
    return out


def parse_toml(text: str, filename: str) -> dict[str, object]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        # Python's message already says "(at line L, column C)": make it file:line:col first
        msg = str(e)
        line = getattr(e, "lineno", None)
        col = getattr(e, "colno", None)
        if line is None:
            import re

            m = re.search(r"at line (\d+), column (\d+)", msg)
            if m:
                line, col = int(m.group(1)), int(m.group(2))
        base = msg.split(" (at line")[0]
        loc = f"{filename}:{line}:{col}" if line is not None else filename
        raise ServescopeError(f"{loc}: TOML error: {base}; fix the file and run again") from None


def resolve(names: str | list[str]) -> list[Workload]:
    """Resolve 'sharegpt,longin,my.toml' into workloads; unknown names list the presets."""
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    out: list[Workload] = []
    for n in names:
        if n in PRESETS:
            out.append(PRESETS[n])
        elif n == "context-sweep":
            out.extend(context_sweep())
        elif n.startswith("context-sweep/") and any(w.name == n for w in context_sweep()):
            out.extend(w for w in context_sweep() if w.name == n)
        elif n.endswith(".toml") or Path(n).is_file():
            out.extend(load_toml(n))
        else:
            raise ServescopeError(
                f"unknown workload {n!r}; use a preset ({', '.join(preset_names())}) or a path to a .toml file"
            )
    if not out:
        raise ServescopeError("no workload given; use --workload sharegpt (see `servescope workloads`)")
    return out


def from_saved(d: Mapping[str, object]) -> Workload:
    """A workload as a session recorded it: presets come back with their defaults."""
    name = d.get("name", "")
    if d.get("source") == "preset":
        if name in PRESETS:
            return PRESETS[name]
        for w in context_sweep():
            if w.name == name:
                return w
    return Workload.from_dict(d, f"saved workload {name!r}")
