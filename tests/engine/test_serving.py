"""The sweep's serving wiring (engine/serving.py): each request's adapter, temperature and acceptance from its
workload, and a prefix-cache target's shared prefix in the server's whole KV blocks."""

from __future__ import annotations

from servescope.core.client import RequestSpec
from servescope.engine.serving import block_sized, serving_specs, sim_serving_args
from servescope.workloads.spec import Workload


def test_requests_carry_the_workloads_adapter_temperature_and_acceptance() -> None:
    w = Workload.from_dict({"name": "w", "adapters": {"sql": 1, "base": 1}, "temperature": 0, "spec_acceptance": 0.7})
    specs = serving_specs(w, "cell3", [RequestSpec("completions", f"p{i}", 8, 8) for i in range(200)])
    assert {s.model for s in specs} == {"sql", None}
    assert all(s.temperature == 0.0 and s.spec_acceptance == 0.7 for s in specs)
    assert [s.model for s in specs] == [s.model for s in serving_specs(w, "cell3", specs)]  # seeded by the cell
    plain = [RequestSpec("completions", "p", 8, 8)]
    assert serving_specs(Workload("x"), "cell0", plain) == plain
    assert sim_serving_args([w, Workload("x")]) == ["--enable-lora", "--lora-modules", "sql=sql"]
    assert sim_serving_args([Workload("x")]) == []


def test_a_prefix_target_is_sized_in_whole_blocks() -> None:
    w = Workload.from_dict({"name": "w", "input_tokens": 1024, "prefix_cache_hit_rate": 0.3})
    assert w.prefix_tokens == 307  # as the TOML says, before the server's block size is known
    assert block_sized(w, 128).prefix_tokens == 256  # 2.4 blocks of 128: the nearest whole number of blocks
    assert block_sized(w, 16).prefix_tokens == 304
    assert block_sized(w, None) is w and block_sized(Workload("x"), 16) == Workload("x")
    short = Workload.from_dict({"name": "s", "input_tokens": 100, "prefix_cache_hit_rate": 0.8})
    assert block_sized(short, 128).prefix_tokens == 0  # a block would be the whole prompt: none shared
