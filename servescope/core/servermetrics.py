"""vLLM's /metrics (Prometheus text) summed over labels with prometheus_client's parser, for tests and
benchmarks that read the whole text. The sweep itself reads /metrics through core/telemetry.py
(MetricsSampler, and `server_delta` for a cell's counts). Old and new metric names are accepted."""

from __future__ import annotations

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
