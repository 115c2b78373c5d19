"""summary["server"] from two parsed /metrics samples: the same keys and arithmetic the per-cell scrapes
(servermetrics.cell_delta) had, now from the sampler's boundary samples; its KV-cache size is the figure the
session's kv_budget (and the app's panel) shows."""

from __future__ import annotations

import pytest

from servescope.core.kvbudget import kv_budget_from_parsed
from servescope.core.telemetry import parse_metrics, server_delta


def _text(success: float, gen: float, ttft_sum: float, ttft_n: float, tpot_sum: float, tpot_n: float,
          q: float, h: float) -> str:
    return f"""# TYPE vllm:request_success_total counter
vllm:request_success_total{{finished_reason="length",model_name="m"}} {success - 1}
vllm:request_success_total{{finished_reason="stop",model_name="m"}} 1
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{{model_name="m"}} {gen}
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{{model_name="m"}} {gen * 4}
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{le="+Inf",model_name="m"}} {ttft_n}
vllm:time_to_first_token_seconds_sum{{model_name="m"}} {ttft_sum}
vllm:time_to_first_token_seconds_count{{model_name="m"}} {ttft_n}
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_sum{{model_name="m"}} {tpot_sum}
vllm:time_per_output_token_seconds_count{{model_name="m"}} {tpot_n}
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{model_name="m"}} {q}
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{model_name="m"}} {h}
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",num_gpu_blocks="100",cache_dtype="auto"}} 1.0
"""


def test_deltas_means_and_the_older_itl_name() -> None:
    before = parse_metrics(_text(10, 100, 1.0, 10, 0.5, 90, 1000, 100))
    after = parse_metrics(_text(30, 500, 3.0, 30, 2.5, 490, 3000, 1100))
    d = server_delta(before, after)
    assert d is not None
    assert set(d.to_dict()) == {"requests_success", "prompt_tokens", "generation_tokens", "preemptions", "ttft_ms_mean",
                      "itl_ms_mean", "e2e_ms_mean", "queue_ms_mean", "kv_cache_tokens", "prefix_cache_hit_rate"}
    assert d.requests_success == 20 and d.generation_tokens == 400 and d.prompt_tokens == 1600
    assert d.preemptions is None and d.e2e_ms_mean is None and d.queue_ms_mean is None
    assert d.ttft_ms_mean == pytest.approx(100.0)
    assert d.itl_ms_mean == pytest.approx(5.0)  # from time_per_output_token (older vLLM)
    assert d.kv_cache_tokens == 1600
    assert d.prefix_cache_hit_rate == pytest.approx(0.5)


def test_none_without_both_samples() -> None:
    s = parse_metrics(_text(10, 100, 1.0, 10, 0.5, 90, 1000, 100))
    assert server_delta(None, s) is None and server_delta(s, None) is None and server_delta({}, s) is None


CACHE_CONFIG = """# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{block_size="16",num_gpu_blocks="406666",kv_cache_size_tokens="6506660",cache_dtype="auto"}} 1.0
# TYPE vllm:request_success_total counter
vllm:request_success_total{{model_name="m",finished_reason="length"}} {n}
"""


def test_the_kv_cache_size_is_the_same_figure_in_the_app_and_the_report() -> None:
    before, after = parse_metrics(CACHE_CONFIG.format(n=1)), parse_metrics(CACHE_CONFIG.format(n=5))
    budget = kv_budget_from_parsed(after)  # what session.toml's kv_budget and the app's panel show
    d = server_delta(before, after)  # what each cell's server part (the report) holds
    assert budget is not None and d is not None
    assert budget.tokens == 6_506_660
    assert d.kv_cache_tokens == budget.tokens  # not 406,666 x 16 = 6,506,656
