"""Telemetry: /metrics sampling against the simulator, old vLLM names, the KV budget from both sources,
GPU energy arithmetic with a fake NVML, and the absent-NVML path for real."""

from __future__ import annotations

import asyncio
import math
import sys
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from servescope.core.telemetry import (
    COLUMNS,
    GpuSampler,
    KVBudget,
    MetricsSampler,
    kv_budget_from_log,
    kv_budget_from_metrics,
    parse_metrics,
)
from servescope.sim.launcher import start_sim

# --------------------------------------------------------------------------------------------------------
# MetricsSampler against the real simulator
# --------------------------------------------------------------------------------------------------------


async def _stream_one(http: httpx.AsyncClient, max_tokens: int) -> int:
    body = {"model": "tiny", "prompt": "benchmark the server " * 20, "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True}
    chunks = 0
    async with http.stream("POST", "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks += 1
    return chunks


async def _until(cond: Callable[[], bool], limit_s: float = 60.0) -> None:
    """Return once `cond()` holds; fail after `limit_s` (generous: it returns as soon as it holds)."""
    async with asyncio.timeout(limit_s):
        while not cond():  # noqa: ASYNC110 - the sampler has no event to wait on: its samples are polled
            await asyncio.sleep(0.005)


async def test_metrics_sampler_against_sim() -> None:
    with start_sim("tiny") as sim:
        async with httpx.AsyncClient(base_url=sim.url) as http:
            s = MetricsSampler(http, interval_s=0.05)
            await s.start()
            assert s.available is True
            await _until(lambda: len(s) >= 3)  # the sampler's own timer ran: samples before the cell's window
            t0 = time.perf_counter_ns()
            await s.sample_now()
            n, max_tokens = 16, 96
            await asyncio.gather(*[_stream_one(http, max_tokens) for _ in range(n)])
            await s.sample_now()
            t1 = time.perf_counter_ns()
            seen = len(s)
            await _until(lambda: len(s) > seen)  # ... and after it
            await s.stop()
            before = s.window_summary(0, t0 - 1).to_dict()
            cell = s.window_summary(t0, t1).to_dict()
            budget = s.kv_budget()

    df = s.frame()
    assert df.columns == ["t_ns", *COLUMNS]
    assert df.height == len(s) >= 5
    assert df["t_ns"].is_sorted()
    assert (df["num_requests_running"] > 0).any(), "some sample must see requests running"
    assert s.failures == 0

    assert before["requests_success"] in (None, 0.0)
    assert cell["available"] is True and cell["samples"] >= 3
    assert cell["requests_success"] == n
    assert cell["generation_tokens"] == n * max_tokens
    assert cell["prompt_tokens"] and cell["prompt_tokens"] > 0
    assert cell["running_max"] and cell["running_max"] > 0
    assert cell["running_mean"] is not None and cell["waiting_max"] is not None
    assert cell["kv_cache_usage_peak"] is not None and 0 < cell["kv_cache_usage_peak"] <= 1
    assert cell["kv_cache_usage_mean"] <= cell["kv_cache_usage_peak"]
    assert cell["preemptions"] == 0
    assert 0 <= cell["prefix_cache_hit_rate"] <= 1  # identical prompts share their prefix
    for k in ("ttft_ms_mean", "itl_ms_mean", "e2e_ms_mean", "queue_ms_mean"):
        assert cell[k] is not None and cell[k] >= 0, k
    assert cell["e2e_ms_mean"] > cell["ttft_ms_mean"] > 0
    assert budget is not None and budget.source == "metrics" and budget.tokens > 0


def test_kv_budget_sim_metrics_equals_log() -> None:
    with start_sim("tiny") as sim:
        text = httpx.get(sim.url + "/metrics", timeout=5).text
        mml = httpx.get(sim.url + "/v1/models", timeout=5).json()["data"][0]["max_model_len"]
        deadline = time.monotonic() + 60  # a generous limit: the wait ends when the line is there
        while "Maximum concurrency" not in "\n".join(sim.log_tail(50)) and time.monotonic() < deadline:
            time.sleep(0.05)
        log = "\n".join(sim.log_tail(50))
    from_metrics = kv_budget_from_metrics(parse_metrics(text), max_model_len=mml)
    from_log = kv_budget_from_log(log)
    assert from_metrics is not None and from_log is not None
    assert from_metrics.tokens == from_log.tokens > 0
    assert from_metrics.concurrency_at == from_log.concurrency_at
    assert from_metrics.same_budget(from_log)
    assert from_metrics.cache_dtype == "auto" and from_metrics.gpu_memory_utilization == 0.5
    assert from_metrics.block_size == 16 and from_metrics.num_gpu_blocks
    # raw text is accepted too
    assert kv_budget_from_metrics(text, max_model_len=mml) == from_metrics


# --------------------------------------------------------------------------------------------------------
# Hand-written Prometheus text: old names, deltas, restarts, failures
# --------------------------------------------------------------------------------------------------------

OLD = """\
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{{model_name="m"}} {kv}
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{{model_name="m"}} {run}
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{{model_name="m"}} {wait}
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{{model_name="m"}} {pre}
# TYPE vllm:gpu_prefix_cache_queries counter
vllm:gpu_prefix_cache_queries_total{{model_name="m"}} {q}
# TYPE vllm:gpu_prefix_cache_hits counter
vllm:gpu_prefix_cache_hits_total{{model_name="m"}} {h}
# TYPE vllm:request_success counter
vllm:request_success_total{{finished_reason="stop",model_name="m"}} {ok1}
vllm:request_success_total{{finished_reason="length",model_name="m"}} {ok2}
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{{le="0.01",model_name="m"}} {itl_n}
vllm:time_per_output_token_seconds_bucket{{le="+Inf",model_name="m"}} {itl_n}
vllm:time_per_output_token_seconds_count{{model_name="m"}} {itl_n}
vllm:time_per_output_token_seconds_sum{{model_name="m"}} {itl_s}
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{{le="+Inf",model_name="m"}} {ttft_n}
vllm:time_to_first_token_seconds_count{{model_name="m"}} {ttft_n}
vllm:time_to_first_token_seconds_sum{{model_name="m"}} {ttft_s}
# TYPE vllm:some_other_metric gauge
vllm:some_other_metric 7.0
"""


def _old(**kw: float) -> str:
    base = dict(kv=0.0, run=0, wait=0, pre=0, q=0, h=0, ok1=0, ok2=0, itl_n=0, itl_s=0.0, ttft_n=0, ttft_s=0.0)
    base.update(kw)
    return OLD.format(**base)


def test_old_names_are_aliased() -> None:
    p = parse_metrics(_old(kv=0.42, run=3, pre=2, q=100, h=25, ok1=4, ok2=6, itl_n=10, itl_s=0.05))
    assert p["vllm:gpu_cache_usage_perc"] == 0.42
    assert p["vllm:request_success_total"] == 10.0  # summed over finished_reason
    assert "vllm:some_other_metric" not in p
    from servescope.core.telemetry import _row_from_parsed

    row = dict(zip(COLUMNS, _row_from_parsed(p), strict=True))
    assert row["kv_cache_usage_perc"] == 0.42
    assert row["num_preemptions_total"] == 2
    assert row["prefix_cache_queries_total"] == 100 and row["prefix_cache_hits_total"] == 25
    assert row["itl_seconds_count"] == 10 and row["itl_seconds_sum"] == 0.05
    assert math.isnan(row["e2e_seconds_sum"])  # the server lacks it: NaN, null in the frame


def test_new_name_wins_and_kv_usage_is_max_over_engines() -> None:
    text = """\
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0"} 0.25
vllm:kv_cache_usage_perc{engine="1"} 0.75
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0"} 2
vllm:num_requests_running{engine="1"} 3
"""
    p = parse_metrics(text)
    assert p["vllm:kv_cache_usage_perc"] == 0.75
    assert p["vllm:num_requests_running"] == 5


def _mock_client(texts: list[str | int]) -> tuple[httpx.AsyncClient, list[int]]:
    """Each GET /metrics answers the next entry: text (200) or a status code."""
    calls = [0]

    def handler(request: httpx.Request) -> httpx.Response:
        i = min(calls[0], len(texts) - 1)
        calls[0] += 1
        item = texts[i]
        if isinstance(item, int):
            return httpx.Response(item, text="nope")
        return httpx.Response(200, text=item)

    return httpx.AsyncClient(transport=httpx.MockTransport(handler), base_url="http://server"), calls


async def test_window_deltas_restart_and_failures() -> None:
    texts: list[str | int] = [
        _old(kv=0.1, run=1, ok1=10, q=100, h=50, ttft_n=10, ttft_s=1.0, itl_n=100, itl_s=1.0),  # baseline
        _old(kv=0.5, run=4, wait=2, ok1=12, pre=1, q=200, h=100, ttft_n=12, ttft_s=1.4, itl_n=150, itl_s=1.5),
        500,  # a failed scrape: a missing sample, counted
        _old(kv=0.9, run=8, wait=6, ok1=15, pre=3, q=300, h=125, ttft_n=15, ttft_s=2.0, itl_n=200, itl_s=2.0),
        # the server restarted: counters start again from zero
        _old(kv=0.2, run=2, wait=0, ok1=2, pre=1, q=40, h=10, ttft_n=2, ttft_s=0.2, itl_n=20, itl_s=0.1),
    ]
    http, _ = _mock_client(texts)
    async with http:
        s = MetricsSampler(http, interval_s=3600)
        await s.start()  # first sample
        t0 = time.perf_counter_ns()
        for _ in range(4):
            await s.sample_now()
        t1 = time.perf_counter_ns()
    assert s.available and s.failures == 1 and len(s) == 4
    w = s.window_summary(t0, t1).to_dict()
    assert w["samples"] == 3 and w["scrape_failures"] == 1
    assert w["kv_cache_usage_peak"] == 0.9
    assert w["kv_cache_usage_mean"] == pytest.approx((0.5 + 0.9 + 0.2) / 3)
    assert w["running_max"] == 8 and w["running_mean"] == pytest.approx(14 / 3)
    assert w["waiting_max"] == 6
    # increases: 10->12->15, then restart to 2 (adds 2)
    assert w["requests_success"] == 7
    assert w["preemptions"] == 1 + 2 + 1
    assert w["prefix_cache_queries"] == 100 + 100 + 40 and w["prefix_cache_hits"] == 50 + 25 + 10
    assert w["prefix_cache_hit_rate"] == pytest.approx(85 / 240)
    assert w["ttft_ms_mean"] == pytest.approx((0.4 + 0.6 + 0.2) / (2 + 3 + 2) * 1000)
    assert w["itl_ms_mean"] == pytest.approx((0.5 + 0.5 + 0.1) / (50 + 50 + 20) * 1000)
    assert w["e2e_ms_mean"] is None  # the old server has no e2e histogram
    df = s.frame()
    assert df["e2e_seconds_sum"].null_count() == df.height
    empty = s.window_summary(t1 + 1, t1 + 10).to_dict()
    assert empty["samples"] == 0 and empty["kv_cache_usage_peak"] is None and empty["requests_success"] is None


async def test_server_without_metrics_is_unavailable_not_an_error() -> None:
    http, calls = _mock_client([404])
    async with http:
        s = MetricsSampler(http, interval_s=0.01)
        await s.start()
        await asyncio.sleep(0.05)
        await s.stop()
    assert s.available is False and "HTTP 404" in s.reason
    assert calls[0] == 1  # it does not keep polling a server that has no /metrics
    assert s.frame().height == 0
    w = s.window_summary(0, time.perf_counter_ns()).to_dict()
    assert w["available"] is False and w["reason"] and w["samples"] == 0 and w["ttft_ms_mean"] is None


async def test_unreachable_server_counts_failures() -> None:
    async with httpx.AsyncClient(base_url="http://127.0.0.1:9") as http:
        s = MetricsSampler(http, interval_s=0.01, timeout_s=0.5)
        await s.start()
        await s.stop()
    assert s.available is False and s.failures == 1 and s.reason


# --------------------------------------------------------------------------------------------------------
# KV budget from log lines
# --------------------------------------------------------------------------------------------------------


def test_kv_budget_from_field_report_log_lines() -> None:
    log = (
        "INFO 05-01 10:00:00 [kv_cache_utils.py:1087] GPU KV cache size: 12,752 tokens\n"
        "INFO 05-01 10:00:00 [kv_cache_utils.py:1091] Maximum concurrency for 32,768 tokens per request: 2.41x\n"
    )
    b = kv_budget_from_log(log)
    assert b == KVBudget(tokens=12752, source="log", concurrency_at=(32768, 2.41))
    assert b.max_concurrency(32768) == 2.41  # vLLM's own figure for its length
    assert b.max_concurrency(1024) == pytest.approx(12752 / 1024)
    assert kv_budget_from_log("nothing here") is None
    # with colours, a restart's second statement wins
    again = log + "\x1b[32mINFO\x1b[0m GPU KV cache size: 25,504 tokens\nMaximum concurrency for 2,048 tokens per request: 12.45x\n"
    b2 = kv_budget_from_log(again)
    assert b2 is not None and b2.tokens == 25504 and b2.concurrency_at == (2048, 12.45)


# what vLLM 0.32's CPU build logged and served (one line for both statements, "CPU" for "GPU")
REAL_CPU_LOG = ("(EngineCore pid=10531) INFO 12-02 20:17:16 [kv_cache_utils.py:2327] CPU KV cache size: 1,048,576 "
                "tokens, Maximum concurrency for 8,192 tokens per request: 128.00x\n")
REAL_CPU_INFO = (
    '# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n'
    'vllm:cache_config_info{_block_size_resolved="True",block_size="128",cache_dtype="auto",'
    'enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.92",kv_cache_max_concurrency="128.0",'
    'kv_cache_memory_bytes="2147483648",kv_cache_size_tokens="1048576",num_cpu_blocks="None",'
    'num_gpu_blocks="8192",num_gpu_blocks_override="None",sliding_window="None"} 1.0\n'
)


def test_kv_budget_real_cpu_vllm_formats() -> None:
    log = kv_budget_from_log(REAL_CPU_LOG)
    met = kv_budget_from_metrics(REAL_CPU_INFO, max_model_len=8192)
    assert log is not None and met is not None
    assert log.tokens == met.tokens == 1_048_576
    assert log.concurrency_at == met.concurrency_at == (8192, 128.0)
    assert log.same_budget(met)
    assert met.num_gpu_blocks == 8192 and met.block_size == 128 and met.gpu_memory_utilization == 0.92
    assert met.max_concurrency(2048) == 512.0


def test_kv_budget_blocks_arithmetic() -> None:
    b = kv_budget_from_metrics({"cache_config.num_gpu_blocks": 24.0, "cache_config.block_size": 16.0,
                                "cache_config.cache_dtype": "fp8", "cache_config.gpu_memory_utilization": 0.9})
    assert b is not None and b.tokens == 384 and b.cache_dtype == "fp8"
    assert b.max_concurrency(128) == 3.0
    assert b.max_concurrency(130) == 24 / 9  # whole blocks per request, as vLLM
    assert b.concurrency_at is None
    assert kv_budget_from_metrics({"vllm:num_requests_running": 1.0}) is None
    assert b.as_dict()["kv_cache_tokens"] == 384


# --------------------------------------------------------------------------------------------------------
# GpuSampler with a fake NVML
# --------------------------------------------------------------------------------------------------------


class NVMLError(Exception):
    pass


class FakeNVML:
    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, gpus: list[dict[str, Any]], init_error: bool = False) -> None:
        self.gpus = gpus
        self.init_error = init_error
        self.power_mw: list[float] = [g["power_w"] * 1000 for g in gpus]
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_error:
            raise NVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return self.gpus[h]["name"].encode()

    def nvmlDeviceGetMemoryInfo(self, h: int) -> SimpleNamespace:
        g = self.gpus[h]
        if g.get("no_mem"):
            raise NVMLError("Not Supported")
        return SimpleNamespace(used=g["used_gib"] * (1 << 30), total=g["total_gib"] * (1 << 30), free=0)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=self.gpus[h]["util"], memory=10)

    def nvmlDeviceGetPowerUsage(self, h: int) -> float:
        return self.power_mw[h]

    def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
        assert kind == self.NVML_CLOCK_SM
        return 1800

    def nvmlDeviceGetTemperature(self, h: int, kind: int) -> int:
        return 60 + h


class FakeClock:
    def __init__(self) -> None:
        self.t = 0

    def __call__(self) -> int:
        return self.t

    def at(self, seconds: float) -> FakeClock:
        self.t = int(round(seconds * 1e9))
        return self


S = 1_000_000_000


def _two_gpus() -> FakeNVML:
    return FakeNVML([
        {"name": "NVIDIA RTX PRO 6000", "used_gib": 80.0, "total_gib": 96.0, "util": 90, "power_w": 300.0},
        {"name": "NVIDIA RTX PRO 6000", "used_gib": 40.0, "total_gib": 96.0, "util": 50, "power_w": 300.0},
    ])


def test_gpu_energy_constant_power_exact() -> None:
    nv, clock = _two_gpus(), FakeClock()
    g = GpuSampler(interval_s=1.0, nvml=nv, clock=clock)
    assert g.available and g.names == ["NVIDIA RTX PRO 6000"] * 2 and g.reason == ""
    for sec in range(11):  # samples at 0..10 s
        clock.at(sec)
        g.sample_once()
    w = g.window_summary(int(2.5 * S), int(7.5 * S), output_tokens=1000, price_usd_per_kwh=0.20).to_dict()
    # 2 GPUs x 300 W x 5 s = 3000 J = 0.8333 Wh
    assert w["energy_wh"] == pytest.approx(3000 / 3600, rel=1e-12)
    assert w["energy_coverage"] == pytest.approx(1.0)
    assert w["wh_per_1m_output_tokens"] == pytest.approx(3000 / 3600 / 1000 * 1e6)
    assert w["cost_usd_per_1m_output_tokens"] == pytest.approx(3000 / 3600 / 1000 * 1e6 / 1000 * 0.20)
    assert w["power_w_mean"] == 600 and w["power_w_peak"] == 600
    assert w["mem_used_gib_peak"] == pytest.approx(120.0) and w["mem_total_gib"] == pytest.approx(192.0)
    assert w["util_pct_mean"] == pytest.approx(70.0)
    assert w["sm_clock_mhz_mean"] == 1800 and w["temp_c_max"] == 61
    assert w["gpus"] == 2 and w["samples"] == 5  # 3, 4, 5, 6, 7 s
    assert [p["energy_wh"] for p in w["per_gpu"]] == pytest.approx([1500 / 3600] * 2)
    assert w["per_gpu"][0]["mem_used_gib_peak"] == 80.0
    nothing_priced = g.window_summary(int(2.5 * S), int(7.5 * S), output_tokens=1000, price_usd_per_kwh=None).to_dict()
    assert nothing_priced["cost_usd_per_1m_output_tokens"] is None and nothing_priced["wh_per_1m_output_tokens"]
    no_tokens = g.window_summary(int(2.5 * S), int(7.5 * S), output_tokens=0).to_dict()
    assert no_tokens["wh_per_1m_output_tokens"] is None and no_tokens["energy_wh"] == pytest.approx(3000 / 3600)


def test_gpu_energy_trapezoid_of_a_ramp_and_missing_fields() -> None:
    nv = FakeNVML([{"name": "GB10", "used_gib": 0, "total_gib": 0, "util": 10, "power_w": 0.0, "no_mem": True}])
    clock = FakeClock()
    g = GpuSampler(interval_s=1.0, nvml=nv, clock=clock)
    for sec in range(5):  # power ramps 100, 200, 300, 400, 500 W
        nv.power_mw[0] = (sec + 1) * 100_000
        clock.at(sec)
        g.sample_once()
    w = g.window_summary(0, 4 * S, output_tokens=2_000_000, price_usd_per_kwh=0.5).to_dict()
    # the integral of a linear ramp from 100 to 500 W over 4 s is 1200 J
    assert w["energy_wh"] == pytest.approx(1200 / 3600)
    assert w["wh_per_1m_output_tokens"] == pytest.approx(1200 / 3600 / 2)
    # window ends between samples are interpolated: 0.5..1.5 s -> mean of 150..250 W for 1 s
    assert g.window_summary(S // 2, 3 * S // 2).to_dict()["energy_wh"] == pytest.approx(200 / 3600)
    assert w["mem_used_gib_peak"] is None  # unified memory: NVML says Not Supported
    assert g.errors >= 5
    df = g.frame()
    assert df.height == 5 and df["mem_used_gib"].null_count() == 5 and df["name"][0] == "GB10"


def test_gpu_window_past_the_samples_is_partly_covered() -> None:
    nv, clock = _two_gpus(), FakeClock()
    g = GpuSampler(interval_s=1.0, nvml=nv, clock=clock)
    for sec in (0, 1, 2):
        clock.at(sec)
        g.sample_once()
    # samples end at 2 s; the reading is held for 2 intervals (to 4 s), not beyond
    w = g.window_summary(0, 10 * S, output_tokens=10).to_dict()
    assert w["energy_wh"] == pytest.approx(600 * 4 / 3600)
    assert w["energy_coverage"] == pytest.approx(0.4)


def test_gpu_sampler_thread_with_fake() -> None:
    nv = _two_gpus()
    g = GpuSampler(interval_s=0.02, nvml=nv)
    t0 = time.perf_counter_ns()
    g.start()
    deadline = time.monotonic() + 60  # a generous limit: the wait ends as soon as the rows are there
    while g.latest()[0] < 2 * 4 and time.monotonic() < deadline:
        time.sleep(0.005)
    g.stop()
    t1 = time.perf_counter_ns()
    g.close()
    assert nv.shutdowns == 1
    df = g.frame()
    assert df.height >= 2 * 4 and set(df["gpu"].to_list()) == {0, 1}
    ts = sorted(set(df["t_ns"].to_list()))
    assert len(ts) == df.height // 2 and all(b > a for a, b in zip(ts, ts[1:], strict=False))  # both GPUs per reading
    # 2 x 300 W over the span of the readings, exactly: the thread's readings are integrated as written
    first, last = ts[0], ts[-1]
    w = g.window_summary(first, last, output_tokens=100).to_dict()
    assert w["energy_coverage"] == pytest.approx(1.0)
    assert w["energy_wh"] == pytest.approx(600 * (last - first) / 1e9 / 3600, rel=1e-9)
    # the caller's own window: start() and stop() each take a reading, so it is covered but for the moments
    # between its stamps and theirs (a busy host may stretch those beyond the 2 intervals a reading is held)
    outer = g.window_summary(t0, t1, output_tokens=100).to_dict()
    assert t0 < first and last < t1 and 0 < outer["energy_coverage"] <= 1
    assert outer["energy_wh"] == pytest.approx(600 * outer["duration_s"] * outer["energy_coverage"] / 3600, rel=1e-9)


def test_nvml_init_failure_is_a_reason_not_an_error() -> None:
    g = GpuSampler(nvml=FakeNVML([], init_error=True))
    assert g.available is False and "nvmlInit failed" in g.reason and "Driver Not Loaded" in g.reason
    g2 = GpuSampler(nvml=FakeNVML([]))
    assert g2.available is False and "no GPU" in g2.reason


def test_pynvml_not_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    g = GpuSampler()
    assert g.available is False and "pynvml cannot be imported" in g.reason


def _nvml_works() -> bool:
    return GpuSampler().available


@pytest.mark.skipif(_nvml_works(), reason="this machine has NVML and a GPU: the absent path cannot be run for real")
def test_absent_nvml_for_real() -> None:
    g = GpuSampler(interval_s=0.01)  # the real pynvml, on a machine without an NVIDIA driver
    assert g.available is False and g.reason
    g.start()
    g.sample_once()
    time.sleep(0.03)
    g.stop()
    g.close()
    assert g.frame().height == 0
    assert set(g.frame().columns) >= {"t_ns", "gpu", "power_w", "mem_used_gib"}
    w = g.window_summary(0, 10 * S, output_tokens=1000, price_usd_per_kwh=0.3).to_dict()
    assert w["available"] is False and w["reason"] == g.reason
    assert w["energy_wh"] is None and w["cost_usd_per_1m_output_tokens"] is None and w["gpus"] == 0


def test_importing_telemetry_and_launch_is_light() -> None:
    import subprocess

    code = ("import sys, servescope.core.telemetry, servescope.core.launch; "
            "print('\\n'.join(sys.modules))")
    mods = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())
    heavy = {"textual", "pynvml", "polars", "prometheus_client", "httpx"}
    assert not heavy & mods, heavy & mods
