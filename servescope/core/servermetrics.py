"""vLLM's /metrics (Prometheus text) read with prometheus_client's parser, and the per-cell deltas that
let a report put the server's own latency next to the client's. Old and new metric names are accepted."""

from __future__ import annotations

from typing import Any

import httpx

# new name -> older names that meant the same
ALIASES = {
    "vllm:kv_cache_usage_perc": ("vllm:gpu_cache_usage_perc",),
    "vllm:request_success": ("vllm:request_success_total",),
}

Samples = dict[str, float]  # "name" or "name{k=v,...}" summed over labels -> value


def parse(text: str) -> dict[str, float]:
    """Sum each sample over its labels: {'vllm:request_success_total': 50.0, ...}; also keeps
    `vllm:cache_config_info` labels under 'cache_config.<label>'."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name
            if name == "vllm:cache_config_info":
                for k, v in s.labels.items():
                    try:
                        out[f"cache_config.{k}"] = float(v)
                    except ValueError:
                        pass
                continue
            if name.endswith("_bucket"):
                continue
            out[name] = out.get(name, 0.0) + float(s.value)
    for new, olds in ALIASES.items():
        for old in olds:
            if new not in out and old in out:
                out[new] = out[old]
    return out


async def scrape(http: httpx.AsyncClient) -> dict[str, float] | None:
    """Counters and histogram sums/counts at one moment (only the families servescope reads)."""
    from servescope.core.telemetry import parse_metrics

    try:
        r = await http.get("/metrics", timeout=5.0)
        if r.status_code != 200:
            return None
        return {k: v for k, v in parse_metrics(r.text).items() if isinstance(v, float)}
    except Exception:
        return None


def _hist_mean_ms(before: dict[str, float], after: dict[str, float], base: str) -> float | None:
    ds = after.get(f"{base}_sum", 0.0) - before.get(f"{base}_sum", 0.0)
    dc = after.get(f"{base}_count", 0.0) - before.get(f"{base}_count", 0.0)
    return ds / dc * 1000 if dc > 0 else None


def cell_delta(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, Any] | None:
    """What the server counted during one cell (warmup included: it cannot tell them apart)."""
    if not before or not after:
        return None

    def d(name: str) -> float | None:
        if name not in after:
            return None
        return after[name] - before.get(name, 0.0)

    out = {
        "requests_success": d("vllm:request_success_total"),
        "prompt_tokens": d("vllm:prompt_tokens_total"),
        "generation_tokens": d("vllm:generation_tokens_total"),
        "preemptions": d("vllm:num_preemptions_total"),
        "ttft_ms_mean": _hist_mean_ms(before, after, "vllm:time_to_first_token_seconds"),
        "itl_ms_mean": _hist_mean_ms(before, after, "vllm:inter_token_latency_seconds")
        or _hist_mean_ms(before, after, "vllm:time_per_output_token_seconds"),
        "e2e_ms_mean": _hist_mean_ms(before, after, "vllm:e2e_request_latency_seconds"),
        "queue_ms_mean": _hist_mean_ms(before, after, "vllm:request_queue_time_seconds"),
        "kv_cache_tokens": (after.get("cache_config.num_gpu_blocks", 0) * after.get("cache_config.block_size", 0)) or None,
    }
    q = d("vllm:prefix_cache_queries_total")
    h = d("vllm:prefix_cache_hits_total")
    out["prefix_cache_hit_rate"] = (h / q) if q and h is not None else None
    return out
