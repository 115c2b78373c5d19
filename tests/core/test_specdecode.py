"""Speculative decoding and LoRA from vLLM's /metrics (core/specdecode.py), on a /metrics text captured from the real
CPU vLLM 0.32 serving the tiny model with an n-gram speculator (3 tokens) and two LoRA adapters
(`data/vllm-0.32-cpu-metrics-ngram-lora.txt`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servescope.core.specdecode import accepted_per_position, lora_window, spec_decode_delta
from servescope.core.telemetry import parse_metrics

CAPTURED = (Path(__file__).parent / "data" / "vllm-0.32-cpu-metrics-ngram-lora.txt").read_text()


def test_parse_keeps_the_spec_decode_counters_and_each_running_adapter() -> None:
    p = parse_metrics(CAPTURED)
    assert p["vllm:spec_decode_num_drafts_total"] == 130.0
    assert p["vllm:spec_decode_num_draft_tokens_total"] == 344.0
    assert p["vllm:spec_decode_num_accepted_tokens_total"] == 293.0
    # the newest time each adapter was seen running (several label sets name it: "sql", "sql,chat")
    assert p["lora.running.sql"] == pytest.approx(1.7966694119264605e9)
    assert p["lora.running.chat"] == pytest.approx(1.7966694115995893e9)
    assert p["lora.max_lora"] == 2.0
    assert accepted_per_position(CAPTURED) == [114.0, 95.0, 84.0]


def test_a_cells_figures_are_the_counters_increase() -> None:
    after = parse_metrics(CAPTURED)
    before = {**after, "vllm:spec_decode_num_drafts_total": 30.0, "vllm:spec_decode_num_draft_tokens_total": 44.0,
              "vllm:spec_decode_num_accepted_tokens_total": 33.0,
              "vllm:generation_tokens_total": float(after["vllm:generation_tokens_total"]) - 600.0}
    sd = spec_decode_delta(before, after)
    assert sd is not None
    assert sd.acceptance_rate == pytest.approx(260 / 300)  # accepted / drafted tokens
    assert sd.mean_accepted_tokens == pytest.approx(260 / 100)  # per draft
    assert sd.drafts_per_step == pytest.approx(100 / (600 - 260))  # steps = generated - accepted


def test_none_without_speculation_and_nothing_drafted_says_so() -> None:
    plain = {"vllm:generation_tokens_total": 10.0}
    assert spec_decode_delta(plain, {"vllm:generation_tokens_total": 99.0}) is None
    after = parse_metrics(CAPTURED)
    idle = spec_decode_delta(after, after)
    assert idle is not None and idle.acceptance_rate is None and idle.mean_accepted_tokens is None
    assert idle.drafts_per_step == 0.0
    assert spec_decode_delta(None, after) is None


def test_adapters_running_between_two_samples_need_no_shared_clock() -> None:
    after = parse_metrics(CAPTURED)
    before = {**after, "lora.running.sql": float(after["lora.running.sql"])}  # sql's series not set since
    del before["lora.running.chat"]
    assert lora_window(before, after) == (["chat"], 2)
    assert lora_window({}, after) == (["chat", "sql"], 2)
    assert lora_window({}, {"vllm:generation_tokens_total": 1.0}) is None  # a server without LoRA
