"""Prometheus text for `/metrics`, with vLLM 0.32's metric names, labels and histogram buckets.

Written by hand (no prometheus_client import): rendering is a few string joins, and the server starts faster.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
FINISH_REASONS = ("stop", "length", "abort")


class Histogram:
    __slots__ = ("name", "doc", "bounds", "counts", "total", "n")

    def __init__(self, name: str, doc: str, bounds: Sequence[float]) -> None:
        self.name = name
        self.doc = doc
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0
        self.n = 0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.bounds, v)] += 1
        self.total += v
        self.n += 1

    def render(self, labels: str, out: list[str]) -> None:
        out.append(f"# HELP {self.name} {self.doc}")
        out.append(f"# TYPE {self.name} histogram")
        cum = 0
        for b, c in zip(self.bounds, self.counts, strict=False):
            cum += c
            out.append(f'{self.name}_bucket{{{labels},le="{b}"}} {float(cum)}')
        out.append(f'{self.name}_bucket{{{labels},le="+Inf"}} {float(self.n)}')
        out.append(f"{self.name}_count{{{labels}}} {float(self.n)}")
        out.append(f"{self.name}_sum{{{labels}}} {self.total!r}")


class Metrics:
    """Request-level histograms and counters; engine counters are read from the scheduler at render time."""

    def __init__(self, model_name: str) -> None:
        self.labels = f'engine="0",model_name="{model_name}"'
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.tpot = Histogram("vllm:request_time_per_output_token_seconds", "Histogram of time_per_output_token_seconds per request.", ITL_BUCKETS)
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_BUCKETS)
        self.queue = Histogram("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", REQUEST_BUCKETS)
        self.prefill = Histogram("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", REQUEST_BUCKETS)
        self.decode = Histogram("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", REQUEST_BUCKETS)
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.late_steps = 0
        self.lag_seconds = 0.0
        self.max_lag_seconds = 0.0

    def render(
        self,
        *,
        running: int,
        waiting: int,
        kv_usage: float,
        preemptions: int,
        prompt_tokens: int,
        generation_tokens: int,
        prefix_queries: int,
        prefix_hits: int,
        cache_info: dict[str, str],
    ) -> str:
        lb = self.labels
        out: list[str] = []

        def metric(name: str, kind: str, doc: str, value: float, extra: str = "") -> None:
            out.append(f"# HELP {name} {doc}")
            out.append(f"# TYPE {name} {kind}")
            out.append(f"{name}{{{lb}{extra}}} {float(value)!r}")

        metric("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", running)
        metric("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", waiting)
        metric("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", kv_usage)
        metric("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.", prefix_queries)
        metric("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.", prefix_hits)
        metric("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", preemptions)
        metric("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", prompt_tokens)
        metric("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", generation_tokens)
        out.append("# HELP vllm:request_success_total Count of successfully processed requests.")
        out.append("# TYPE vllm:request_success_total counter")
        for reason, n in self.success.items():
            out.append(f'vllm:request_success_total{{{lb},finished_reason="{reason}"}} {float(n)!r}')
        info = ",".join(f'{k}="{v}"' for k, v in cache_info.items())
        out.append("# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig")
        out.append("# TYPE vllm:cache_config_info gauge")
        out.append(f"vllm:cache_config_info{{{info},engine=\"0\"}} 1.0")
        for h in (self.ttft, self.itl, self.tpot, self.e2e, self.queue, self.prefill, self.decode):
            h.render(lb, out)
        metric("servescope_sim:late_steps_total", "counter", "Steps that ended late against wall time (simulator CPU lag).", self.late_steps)
        metric("servescope_sim:lag_seconds_total", "counter", "Total lag of late steps in seconds.", self.lag_seconds)
        metric("servescope_sim:max_lag_seconds", "gauge", "Largest lag of one step in seconds.", self.max_lag_seconds)
        out.append("")
        return "\n".join(out)
