"""The KV-cache budget of a vLLM server, from `/metrics` (`vllm:cache_config_info`) or from its startup log,
and what it means for concurrency."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Required, TypedDict

__all__ = ["KVBudget", "fmt_concurrency", "kv_budget_from_log", "kv_budget_from_parsed"]


def fmt_concurrency(v: float) -> str:
    """A max concurrency as people read it: 8472.21 -> '8,472', 16.63 -> '16.6' (the CLI and the app alike)."""
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


class KvBudgetMeta(TypedDict, total=False):
    """session.toml's `kv_budget` table: what /metrics states (`KVBudget.as_dict()`), a launched server's log or
    llama.cpp's slots state, and the concurrency each synthetic workload's longest request allows."""

    kv_cache_tokens: Required[int]
    source: Required[str]  # "metrics", "log", "metrics+log" or "llama.cpp /props"
    num_gpu_blocks: int | None
    block_size: int | None
    cache_dtype: str | None
    gpu_memory_utilization: float | None
    concurrency_at_tokens: int | None
    concurrency_at: float | None
    log_kv_cache_tokens: int
    slots: int  # llama.cpp: parallel slots of slot_tokens each
    slot_tokens: int
    max_concurrency_by_workload: dict[str, float]


@dataclass(frozen=True)
class KVBudget:
    """How many tokens of KV cache the server holds, and what that means for concurrency.

    `concurrency_at` is vLLM's own statement `(tokens per request, max concurrency)` (from the log line
    `Maximum concurrency for 32,768 tokens per request: 2.41x` or cache_config_info's
    `kv_cache_max_concurrency` at max_model_len), rounded as vLLM printed it.
    """

    tokens: int
    source: str  # "metrics" or "log"
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    cache_dtype: str | None = None
    gpu_memory_utilization: float | None = None
    concurrency_at: tuple[int, float] | None = None

    def max_concurrency(self, tokens_per_request: int) -> float:
        """Requests of `tokens_per_request` (input + output) that fit in the KV cache at once.

        As vLLM: whole blocks per request (num_blocks / ceil(tokens / block_size)) when the block size is
        known, else tokens / tokens_per_request. For vLLM's own length its stated figure is returned
        (it also accounts for hybrid/sliding-window layers, which this arithmetic does not)."""
        if tokens_per_request <= 0:
            return math.inf
        if self.concurrency_at and self.concurrency_at[0] == tokens_per_request:
            return self.concurrency_at[1]
        if self.block_size:
            blocks = self.num_gpu_blocks if self.num_gpu_blocks else self.tokens // self.block_size
            return blocks / math.ceil(tokens_per_request / self.block_size)
        return self.tokens / tokens_per_request

    def same_budget(self, other: KVBudget) -> bool:
        """True when two sources state the same budget (tokens, and the concurrency both state)."""
        if self.tokens != other.tokens:
            return False
        if self.concurrency_at and other.concurrency_at and self.concurrency_at[0] == other.concurrency_at[0]:
            return abs(self.concurrency_at[1] - other.concurrency_at[1]) < 0.006
        return True

    def as_dict(self) -> KvBudgetMeta:
        return {
            "kv_cache_tokens": self.tokens,
            "source": self.source,
            "num_gpu_blocks": self.num_gpu_blocks,
            "block_size": self.block_size,
            "cache_dtype": self.cache_dtype,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "concurrency_at_tokens": self.concurrency_at[0] if self.concurrency_at else None,
            "concurrency_at": self.concurrency_at[1] if self.concurrency_at else None,
        }


def _num(v: float | str | None) -> float | None:
    if v is None:
        return None
    try:
        return float(v)
    except ValueError:
        return None


def kv_budget_from_parsed(parsed: Mapping[str, float | str], max_model_len: int | None = None) -> KVBudget | None:
    """From `vllm:cache_config_info`: `parsed` is `core.telemetry.parse_metrics()` output (keys
    `cache_config.<label>`; `core.telemetry.kv_budget_from_metrics` also takes the raw text). Tokens:
    `kv_cache_size_tokens` when the server states it, else num_gpu_blocks x block_size. Its
    `kv_cache_max_concurrency` is for max_model_len, which the labels do not carry: pass it (from /v1/models)
    to keep that figure in `concurrency_at`. None when the labels are absent (older vLLM, other servers)."""
    blocks = _num(parsed.get("cache_config.num_gpu_blocks"))
    bs = _num(parsed.get("cache_config.block_size"))
    stated = _num(parsed.get("cache_config.kv_cache_size_tokens"))
    if stated is not None and stated > 0:
        tokens = int(stated)
    elif blocks and bs:
        tokens = int(blocks * bs)
    else:
        return None
    dtype = parsed.get("cache_config.cache_dtype")
    conc = _num(parsed.get("cache_config.kv_cache_max_concurrency"))
    mml = max_model_len or _num(parsed.get("cache_config.max_model_len"))
    return KVBudget(
        tokens=tokens,
        source="metrics",
        num_gpu_blocks=int(blocks) if blocks else None,
        block_size=int(bs) if bs else None,
        cache_dtype=str(dtype) if dtype is not None and not isinstance(dtype, float) else None,
        gpu_memory_utilization=_num(parsed.get("cache_config.gpu_memory_utilization")),
        concurrency_at=(int(mml), conc) if conc is not None and mml else None,
    )


_KV_LINE = re.compile(r"(?:GPU|CPU)?\s*KV cache size:\s*([\d,_]+)\s*tokens", re.IGNORECASE)
_CONC_LINE = re.compile(
    r"Maximum concurrency for\s*([\d,_]+)\s*tokens per request:\s*([\d.,]+)\s*x", re.IGNORECASE
)


def kv_budget_from_log(text: str) -> KVBudget | None:
    """From vLLM's startup lines `GPU KV cache size: 12,752 tokens` (the CPU build says `GPU` too) and
    `Maximum concurrency for 32,768 tokens per request: 2.41x`. The last statement wins (a restart logged
    into the same file). None when the log has no KV cache size line yet."""
    kv = _KV_LINE.findall(text)
    if not kv:
        return None
    tokens = int(re.sub(r"[,_]", "", kv[-1]))
    conc = _CONC_LINE.findall(text)
    at: tuple[int, float] | None = None
    if conc:
        length, x = conc[-1]
        at = (int(re.sub(r"[,_]", "", length)), float(x.replace(",", "")))
    return KVBudget(tokens=tokens, source="log", concurrency_at=at)

