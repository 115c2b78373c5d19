"""The /metrics scrape: it reads every sample name of `core.telemetry.READ` from a real vLLM's text (the same as
prometheus_client's parser of the whole text gives), skips every other family without parsing it, keeps one
connection across scrapes and measures its own CPU."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servescope.core.servermetrics import MetricsReader, labels_of
from servescope.core.specdecode import LORA_INFO, lora_keys
from servescope.core.telemetry import (
    _MAX_OVER_LABELS,
    CACHE_INFO,
    READ,
    MetricsSampler,
    RawMetrics,
    parse_metrics,
)
from servescope.sim.launcher import start_sim

VLLM_TEXT = (Path(__file__).parent / "data" / "vllm-0.32-cpu-metrics-ngram-lora.txt").read_bytes()


def _reference(text: str) -> dict[str, float | str]:
    """What parse_metrics must give: prometheus_client's parser over the WHOLE text, kept to READ's names."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float | str] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name not in READ:
                continue
            if s.name == CACHE_INFO:
                for k, v in s.labels.items():
                    try:
                        out[f"cache_config.{k}"] = float(v)
                    except ValueError:
                        out[f"cache_config.{k}"] = v
            elif s.name == LORA_INFO:
                lora_keys(s.labels, float(s.value), out)
            else:
                prev, v = out.get(s.name), float(s.value)
                out[s.name] = ((max(prev, v) if s.name in _MAX_OVER_LABELS else prev + v) if isinstance(prev, float)
                               else v)
    return out


def test_every_listed_family_of_a_real_vllm_is_read() -> None:
    """vLLM 0.32 serving n-gram speculative decoding and two LoRA adapters: the same values as the whole-text
    parse, spec-decode counters, the LoRA gauge, prefix-cache counters and the cache config among them."""
    got = parse_metrics(VLLM_TEXT)
    assert got == _reference(VLLM_TEXT.decode())
    for name in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total", "vllm:prefix_cache_queries_total",
                 "vllm:prefix_cache_hits_total", "vllm:num_requests_running", "vllm:kv_cache_usage_perc",
                 "vllm:time_to_first_token_seconds_sum", "vllm:request_queue_time_seconds_count"):
        assert isinstance(got.get(name), float), name
    assert got["lora.max_lora"] == 2.0 and {"lora.running.sql", "lora.running.chat"} <= set(got)
    assert got["cache_config.block_size"] == 128.0 and got["cache_config.cache_dtype"] == "auto"
    assert parse_metrics(VLLM_TEXT.decode()) == got  # text or bytes alike


def test_each_name_of_the_list_is_read_wherever_it_is_typed() -> None:
    """Every name in READ, each under its own `# TYPE` line among families that are not read."""
    lines = []
    for i, name in enumerate(sorted(READ)):
        lines += [f"# HELP other_{i} not ours", f"# TYPE other_{i} gauge", f'other_{i}{{a="{i}"}} 1',
                  f"# HELP {name} ours", f"# TYPE {name} gauge", f'{name}{{engine="0"}} {i + 1}']
    got = parse_metrics("\n".join(lines) + "\n")
    plain = {n for n in READ if n not in (CACHE_INFO, LORA_INFO)}
    assert {n: got.get(n) for n in plain} == {n: float(sorted(READ).index(n) + 1) for n in plain}
    assert not any(k.startswith("other_") for k in got)


def test_families_not_listed_are_skipped_unparsed() -> None:
    """A family that is not read may hold lines no parser accepts: they are stepped over, not parsed (the whole
    text's parser refuses them), and what follows is still read."""
    text = (b"# TYPE junk_total counter\n" + b'junk_total{a="never closed 1\n' + b"junk_total not-a-number\n" * 50
            + b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"
            + b"# TYPE vllm:num_requests_running_extra gauge\nvllm:num_requests_running_extra 99\n")
    from prometheus_client.parser import text_string_to_metric_families

    with pytest.raises(ValueError):
        list(text_string_to_metric_families(text.decode()))
    assert parse_metrics(text) == {"vllm:num_requests_running": 3.0}


def test_skipped_families_cost_no_memory() -> None:
    """Skipping is not parsing: a text of 4 MB of families that are not read (histogram buckets) and one that is
    read is parsed without splitting it into lines (nothing near its size is allocated); a line-by-line reader
    allocates a string per line."""
    junk = b"".join(b'# TYPE junk_%d histogram\n' % i + b'junk_%d_bucket{le="%d",model_name="m"} 5.0\n' % (i, i) * 40
                    for i in range(2200))
    text = junk + b"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3\n"
    assert len(text) > 4_000_000
    tracemalloc.start()
    try:
        got = parse_metrics(text)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == {"vllm:num_requests_running": 3.0}
    assert peak < 100_000, peak


def test_a_text_without_type_lines_is_read_line_by_line() -> None:
    text = 'vllm:num_requests_waiting{engine="0"} 2\nother 5\nvllm:num_requests_waiting{engine="1"} 4 1700000000\n'
    assert parse_metrics(text) == {"vllm:num_requests_waiting": 6.0}


def test_labels_with_escapes_and_braces() -> None:
    text = ('# TYPE vllm:lora_requests_info gauge\n'
            'vllm:lora_requests_info{max_lora="3",running_lora_adapters="a\\"}b,c\\\\d",waiting_lora_adapters=""} 7\n'
            '# TYPE vllm:cache_config_info gauge\r\n'
            'vllm:cache_config_info{block_size="16",note="x}y\\ny"} 1\r\n')
    got = parse_metrics(text)
    assert got["lora.running.a\"}b"] == 7.0 and got["lora.running.c\\d"] == 7.0 and got["lora.max_lora"] == 3.0
    assert got["cache_config.block_size"] == 16.0 and got["cache_config.note"] == "x}y\ny"
    assert labels_of(b'k="v\\\\"') == {"k": "v\\"}


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.sampled_from([
    b"# TYPE vllm:num_requests_running gauge", b"# HELP vllm:num_requests_running x", b"vllm:num_requests_running",
    b"vllm:num_requests_running{", b'{a="b"}', b" 1", b" NaN", b" +Inf", b"}", b"\\", b'"', b"\r", b"\n", b"#",
    b"# TYPE ", b"vllm:cache_config_info", b"vllm:lora_requests_info", b' {x="1"} 2'] ), st.binary(max_size=12)),
    max_size=40))
def test_any_bytes_parse_without_an_exception(parts: list[bytes]) -> None:
    got = parse_metrics(b"".join(parts))
    assert all(isinstance(v, (float, str)) for v in got.values())


def test_a_reader_of_no_names_reads_nothing() -> None:
    assert MetricsReader([]).samples(VLLM_TEXT) == []


async def test_the_sampler_keeps_one_connection_and_measures_its_cost() -> None:
    with start_sim("tiny") as sim:
        src = RawMetrics(sim.url)
        s = MetricsSampler(src, interval_s=3600)
        try:
            await s.start()
            for _ in range(4):
                assert await s.sample_now()
        finally:
            await s.stop()
            await src.aclose()
    assert s.available and len(s) == 5
    assert src.http.opened == 1  # one kept-alive connection for every scrape
    n, cpu = s.scrape_cost(0, 2**62)
    assert n == 5 and cpu > 0
    assert s.last.get("vllm:num_requests_running") == 0.0


async def test_a_scrape_of_a_closed_port_is_a_counted_failure_with_its_cost() -> None:
    s = MetricsSampler(RawMetrics("http://127.0.0.1:9"), interval_s=0.01, timeout_s=2.0)
    await s.start()
    await s.stop()
    assert s.available is False and s.failures == 1 and s.reason
    assert s.scrape_cost(0, 2**62)[0] == 1


def test_the_list_is_one_place() -> None:
    """The spec-decode counters and the LoRA gauge (core/specdecode.py) are in the one list a scrape reads."""
    from servescope.core.specdecode import SPEC_COUNTERS

    assert set(SPEC_COUNTERS) | {LORA_INFO, CACHE_INFO} <= READ
