"""The capacity twin's parts without a server: the fit recovers a known profile from its own virtual cells, the
what-if knobs resize the KV cache as vLLM would, a config.json gives the model's shape, bands widen outside the
measured range, and capacity answers follow the SLOs."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from servescope.core.errors import ServescopeError
from servescope.engine.twin import (
    MeasuredCell,
    Twin,
    data_range,
    fit,
    fit_seconds,
    nelder_mead,
    quick_figures,
    run_virtual,
    virtual_summary,
)
from servescope.engine.twinpredict import BAND_Z, Load, predict, sample_lengths
from servescope.engine.twinshape import Knobs, Shape, apply_knobs, model_from_config, vllm_default_limits
from servescope.engine.whatif import AT_CAPACITY, capacity_row, confirm_pairs
from servescope.sim.profile import CostModel, EfficiencySpec, load_profile
from servescope.workloads.spec import Workload, fixed, uniform


def _cells(cost: CostModel, prompt: int, out: int, levels: list[tuple[int, int]]) -> list[MeasuredCell]:
    cells = []
    for i, (c, n) in enumerate(levels):
        v = run_virtual(cost, [prompt] * n, [out] * n, c)
        figs = quick_figures(v, cost.profile.efficiency.frontend_ms)  # with the server's own TTFT, as vLLM reports it
        cells.append(MeasuredCell(i, "w", c, None, [prompt] * n, [out] * n, [0.0] * n, figs))
    return cells


def test_nelder_mead_finds_a_quadratic_minimum() -> None:
    x, v, n = nelder_mead(lambda p: (p[0] - 1.5) ** 2 + 3 * (p[1] + 0.5) ** 2, [0.0, 0.0], max_evals=400, tol=1e-12)
    assert x[0] == pytest.approx(1.5, abs=1e-3) and x[1] == pytest.approx(-0.5, abs=1e-3)
    assert v < 1e-6 and n <= 400


@pytest.mark.slow  # a fit: 20-70 s on this 2-core machine under load
def test_fit_recovers_a_profile_from_its_own_cells_and_predicts_beyond_them() -> None:
    truth = load_profile("tiny")
    cost = CostModel(truth)
    # one to four rounds of each level's users are enough: the cells are the twin's own, without noise
    cells = _cells(cost, 1024, 16, [(1, 4), (4, 8), (16, 16)])
    shape = Shape(replace(truth, efficiency=EfficiencySpec()), "profile tiny", "profile", "profile")
    r = fit(shape, cells)
    assert max(r.residuals.values()) < 0.05, r.residuals
    twin = Twin(r.profile, r.residuals, r.data_range, True)
    true_twin = Twin(truth, {}, {}, True)
    w = Workload("w48", input_tokens=fixed(1024), output_tokens=fixed(16))  # only the load is beyond the cells
    got = predict(twin, w, [Load(48)], requests=96)[0]
    want = predict(true_twin, w, [Load(48)], requests=96)[0]
    for name, stat in (("output_tok_s", None), ("ttft_ms", "p50"), ("tpot_ms", "p50")):
        key = f"{name}.{stat}" if stat else name
        g = got.summary.value(key)
        t = want.summary.value(key)
        assert g == pytest.approx(t, rel=0.10), name
    assert got.extrapolated and "c=48 outside the measured c=1..16" in got.why
    # the band holds the prediction and is wider than the fit's residual (48 is 1.6 doublings past 16)
    lo, hi = got.band["output_tok_s"]
    assert lo < got.summary.output_tok_s < hi
    assert math.log(hi / got.summary.output_tok_s) > 2 * max(r.residuals["output_tok_s"], 0.03)


@pytest.mark.slow  # a fit: 20-70 s on this 2-core machine under load
def test_one_prompt_length_and_the_servers_own_ttft_predict_longer_prompts() -> None:
    """The API server's fixed cost (frontend_ms) and the prefill's cost per prompt token look alike in a client's
    TTFT at one prompt length; the server's own TTFT (which starts when the engine got the request) tells them
    apart, so a fit on 256-token prompts predicts 1,024-token ones."""
    truth = load_profile("tiny")
    cost = CostModel(truth)
    cells = _cells(cost, 256, 16, [(1, 4), (2, 4), (4, 8), (8, 16)])
    shape = Shape(replace(truth, efficiency=EfficiencySpec()), "profile tiny", "profile", "profile")
    r = fit(shape, cells)
    assert r.profile.efficiency.frontend_ms == pytest.approx(truth.efficiency.frontend_ms, rel=0.15)
    w = Workload("long", input_tokens=fixed(1024), output_tokens=fixed(16))  # only the prompt is longer
    got = predict(Twin(r.profile, r.residuals, r.data_range, True), w, [Load(4)], requests=32)[0]
    want = predict(Twin(truth, {}, {}, True), w, [Load(4)], requests=32)[0]
    assert got.summary.ttft_ms.p50 == pytest.approx(want.summary.ttft_ms.p50, rel=0.10)


@pytest.mark.slow  # a fit: 20-70 s on this 2-core machine under load
def test_the_fit_finds_whether_host_and_device_time_add_up() -> None:
    """A server whose host work is not hidden behind the device's step (vLLM's CPU build, no async scheduling)
    is told apart, when the shape does not say (not a simulator profile), and predicted at 4x the load; where
    host work hides behind the device, either mode may fit the cells, and the prediction must still hold."""
    base = load_profile("tiny")
    w = Workload("w", input_tokens=fixed(256), output_tokens=fixed(16))
    for mode in (False, True):
        truth = replace(base, efficiency=replace(base.efficiency, async_scheduling=mode, per_seq_overhead_us=150.0))
        cells = _cells(CostModel(truth), 256, 16, [(1, 4), (4, 8), (8, 16)])
        shape = Shape(replace(truth, efficiency=EfficiencySpec()), "config x", "profile", "profile")
        r = fit(shape, cells)
        if not mode:
            assert r.profile.efficiency.async_scheduling is False
        assert max(r.residuals[k] for k in ("output_tok_s", "tpot_ms.p50")) < 0.05, (mode, r.residuals)
        got = predict(Twin(r.profile, r.residuals, r.data_range, True), w, [Load(32)], requests=64)[0].summary
        want = predict(Twin(truth, {}, {}, True), w, [Load(32)], requests=64)[0].summary
        assert got.output_tok_s == pytest.approx(want.output_tok_s, rel=0.10), mode
        assert got.tpot_ms.p50 == pytest.approx(want.tpot_ms.p50, rel=0.10), mode


def test_vllms_default_limits_follow_the_device() -> None:
    assert vllm_default_limits(None)[:2] == (256, 2048)  # unknown: a CPU build, a remote server
    assert vllm_default_limits(24.0, "NVIDIA L4")[:2] == (256, 2048)
    assert vllm_default_limits(80.0, "NVIDIA A100-SXM4-80GB")[:2] == (256, 2048)
    assert vllm_default_limits(80.0, "NVIDIA H100 80GB HBM3")[:2] == (1024, 8192)
    assert vllm_default_limits(95.0, "NVIDIA RTX PRO 6000 Blackwell")[:2] == (1024, 8192)
    assert vllm_default_limits(180.0, "NVIDIA B200")[:2] == (1024, 16384)


def test_bands_and_extrapolation_inside_the_measured_range() -> None:
    p = load_profile("tiny")
    cells = _cells(CostModel(p), 512, 16, [(1, 4), (8, 16)])
    twin = Twin(p, {"output_tok_s": 0.02, "ttft_ms.p50": 0.05, "tpot_ms.p50": 0.04}, data_range(cells), True)
    inside = predict(twin, Workload("w", input_tokens=fixed(512), output_tokens=fixed(16)), [Load(4)], requests=16)[0]
    assert not inside.extrapolated and inside.why == []
    v = inside.summary.tpot_ms.p50
    # fixed lengths and a closed loop: every draw of the cell's requests is the same, no sampling spread
    assert inside.band["tpot_ms"] == pytest.approx([v * math.exp(-BAND_Z * 0.04), v * math.exp(BAND_Z * 0.04)])
    # another sample of the measured distribution is not an extrapolation (its extremes differ by a few tokens)
    spread = Twin(p, twin.residuals, {**data_range(cells), "prompt_tokens": [205, 495]}, True)
    same = predict(spread, Workload("w", input_tokens=uniform(200, 512), output_tokens=fixed(16)), [Load(4)],
                   requests=64)[0]
    assert not same.extrapolated, same.why
    longer = predict(twin, Workload("w", input_tokens=fixed(2048), output_tokens=fixed(16)), [Load(4)], requests=16)[0]
    assert longer.extrapolated and "prompt tokens 2048-2048 outside the measured 512-512" in longer.why
    fp8 = predict(twin, Workload("w", input_tokens=fixed(512), output_tokens=fixed(16)), [Load(4)],
                  Knobs(kv_cache_dtype="fp8"), requests=16)[0]
    assert fp8.extrapolated and any("--kv-cache-dtype fp8" in w for w in fp8.why)


def test_knobs_resize_the_kv_cache_as_vllm_does() -> None:
    p = load_profile("tiny")  # 16 GiB x 0.5 - weights - 1 GiB activations
    cost = CostModel(p)
    assert apply_knobs(p, Knobs(kv_cache_dtype="fp8"), True).engine.kv_cache_tokens == pytest.approx(
        2 * cost.kv_cache_tokens, abs=2)
    g = apply_knobs(p, Knobs(gpu_memory_utilization=0.8), True)
    fixed_b = cost.weight_bytes + p.engine.activation_reserve_gib * 2**30
    want = cost.kv_cache_tokens * (16 * 2**30 * 0.8 - fixed_b) / (16 * 2**30 * 0.5 - fixed_b)
    assert g.engine.kv_cache_tokens == pytest.approx(want, rel=1e-3)
    assert CostModel(g).kv_cache_tokens == g.engine.kv_cache_tokens
    assert apply_knobs(p, Knobs(max_num_seqs=4, max_model_len=2048), True).engine.max_num_seqs == 4
    with pytest.raises(ServescopeError, match="leaves no memory for the KV cache"):
        apply_knobs(p, Knobs(gpu_memory_utilization=0.05), True)
    with pytest.raises(ServescopeError, match="the GPU's memory is unknown"):
        apply_knobs(p, Knobs(gpu_memory_utilization=0.8), False)
    with pytest.raises(ServescopeError, match="unknown --kv-cache-dtype 'int3'"):
        apply_knobs(p, Knobs(kv_cache_dtype="int3"), True)


def test_shape_from_a_hugging_face_config() -> None:
    dense = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
             "head_dim": 64, "intermediate_size": 768, "vocab_size": 1000, "tie_word_embeddings": False}
    m = model_from_config(dense, "tiny", 8192)
    attn = 4 * 256 * (4 * 64 + 2 * 2 * 64 + 4 * 64)
    assert m.dense_params_b * 1e9 == pytest.approx(attn + 4 * 3 * 256 * 768)
    assert m.num_kv_heads == 2 and m.head_dim == 64 and m.full_attention_layers == 4 and m.num_experts == 0
    moe = model_from_config({**dense, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 128},
                            "moe", 8192)
    assert moe.num_experts == 8 and moe.experts_per_token == 2
    assert moe.expert_params_b * 1e9 == pytest.approx(4 * 8 * 3 * 256 * 128)
    with pytest.raises(ServescopeError, match="lacks hidden_size"):
        model_from_config({"num_hidden_layers": 2}, "x", 10)


def test_capacity_follows_the_slos() -> None:
    p = load_profile("tiny")
    twin = Twin(p, {}, {"concurrency": [1, 16], "prompt_tokens": [1024, 1024], "output_tokens": [64, 64]}, True)
    w = Workload("w", input_tokens=fixed(1024), output_tokens=fixed(64))
    loose = capacity_row(twin, w, {"tpot_ms": 40.0}, max_level=64)
    strict = capacity_row(twin, w, {"tpot_ms": 8.0}, max_level=64)
    assert strict.capacity is not None and loose.capacity is not None and strict.capacity < loose.capacity
    # the level above the capacity misses the SLO on the twin; the capacity meets it
    above = predict(twin, w, [Load(strict.capacity + 1)], slos={"tpot_ms": 8.0})[0]
    assert above.summary.slo_met_fraction < 0.9
    assert strict.at_capacity is not None and strict.at_capacity["slo_met_fraction"] >= 0.9
    # its figures by their keys, as compare, gate and the confirm pairs spell them (not `ttft_ms_p50`)
    assert list(strict.at_capacity) == list(AT_CAPACITY) and "ttft_ms.p50" in AT_CAPACITY
    assert strict.at_capacity["ttft_ms.p50"] is not None and strict.at_capacity["ttft_ms.p50"] > 0
    too_long = capacity_row(twin, Workload("big", input_tokens=fixed(9000), output_tokens=fixed(8)), {"tpot_ms": 40.0})
    assert too_long.capacity is None and "max_model_len" in too_long.reason


def test_confirm_pairs_error_is_predicted_over_measured() -> None:
    p = load_profile("tiny")
    pred = predict(Twin(p, {}, {}, True), Workload("w", input_tokens=fixed(256), output_tokens=fixed(16)), [Load(2)],
                   requests=8)[0]
    measured = {"status": "done", "output_tok_s": pred.summary.output_tok_s / 1.25,
                "ttft_ms": {"p50": pred.summary.ttft_ms.p50}, "tpot_ms": {"p50": None}}
    (pair,) = confirm_pairs([pred], [measured])
    assert pair["error"]["output_tok_s"] == pytest.approx(0.25)
    assert pair["error"]["ttft_ms.p50"] == pytest.approx(0.0)
    assert pair["error"]["tpot_ms.p50"] is None


def test_a_stored_twin_knows_its_gpu_memory_unless_the_gpu_was_unknown(tmp_path) -> None:
    import tomli_w

    from servescope.engine.twin import load_twin
    from servescope.engine.twinshape import NOMINAL_GPU, profile_to_dict

    p = load_profile("tiny")

    class _S:
        path = tmp_path

    (tmp_path / "twin").mkdir()
    for gpu, known in ((replace(NOMINAL_GPU, name="NVIDIA H100 80GB (nominal rates)"), True), (NOMINAL_GPU, False)):
        (tmp_path / "twin" / "profile.toml").write_text(tomli_w.dumps(profile_to_dict(replace(p, gpu=gpu))))
        twin = load_twin(_S())  # type: ignore[arg-type]
        assert twin is not None and twin.memory_known is known, gpu.name


def test_a_band_holds_the_predictions_own_spread_and_the_measured_cells_error() -> None:
    """Prompts drawn from 64-1,024 tokens: another draw of the same cell moves its TTFT p50, and the band says so
    (wider than the residual alone); at a load the session measured, the fitted cell's own error (20% here)
    counts where it is larger than the residual, and the cell runs as many requests as were measured."""
    p = load_profile("tiny")
    res = {"output_tok_s": 0.01, "ttft_ms.p50": 0.01, "tpot_ms.p50": 0.01}
    rng = {"prompt_tokens": [64, 1024], "output_tokens": [16, 16], "concurrency": [1, 8]}
    w = Workload("w", input_tokens=uniform(64, 1024), output_tokens=fixed(16))
    got = predict(Twin(p, res, rng, True), w, [Load(4)], requests=32)[0]
    lo, hi = got.band["ttft_ms"]
    assert math.log(hi / lo) / 2 > BAND_Z * 0.03 * 1.2  # more than the least band: the draws' spread
    rows = [{"cell": 0, "label": "w c=4", "workload": "w", "concurrency": 4, "requests": 24,
             "tpot_ms.p50": [10.0, 12.0]}]
    at = predict(Twin(p, res, rng, True, {"cells": rows}), w, [Load(4)])[0]
    assert at.requests == 24 and at.summary.requests_ok == 24
    lo, hi = at.band["tpot_ms"]
    assert math.log(hi / lo) / 2 >= BAND_Z * math.log(1.2) - 1e-9
    other = predict(Twin(p, res, rng, True, {"cells": rows}), w, [Load(8)])[0]  # not measured: 4 rounds of users
    assert other.requests == 64


@pytest.mark.slow  # ~3.4 s of the --fast lane on 2 busy cores (2026-12-08)
def test_the_fits_starts_side_by_side_give_the_same_fit() -> None:
    truth = load_profile("tiny")
    cells = _cells(CostModel(truth), 256, 8, [(1, 4), (4, 8)])
    shape = Shape(replace(truth, efficiency=EfficiencySpec()), "profile tiny", "profile", "profile", async_known=True)
    one = fit(shape, cells, workers=1)
    two = fit(shape, cells, workers=2)
    assert two.profile.efficiency == one.profile.efficiency and two.residuals == one.residuals
    assert two.evaluations == one.evaluations
    assert 0 < fit_seconds(cells) < fit_seconds(cells + cells)


def test_bands_hold_other_runs_of_the_cell_when_lengths_vary() -> None:
    """The twin as its own ground truth (the true profile, no fitting error): 10 runs of each cell with other
    requests (16 of them, prompts 64-1,024 and outputs 8-64 tokens drawn anew) land inside the prediction's
    bands, but for at most 5% of the 90 figures (the band is about 95%: BAND_Z x the combined spread). A band of
    the residual alone (+-3% here) misses most of them."""
    truth = load_profile("tiny")
    cost = CostModel(truth)
    w = Workload("w", input_tokens=uniform(64, 1024), output_tokens=uniform(8, 64))
    twin = Twin(truth, {}, {"prompt_tokens": [64, 1024], "output_tokens": [8, 64], "concurrency": [1, 16]}, True)
    misses, total = [], 0
    for c in (1, 4, 16):
        p = predict(twin, w, [Load(c)], requests=16)[0]
        for seed in range(1, 11):
            prompts, outputs = sample_lengths(w, 16, 1000 + seed)
            run = virtual_summary(run_virtual(cost, prompts, outputs, c, tokens=True))
            for name, key in (("output_tok_s", "output_tok_s"), ("ttft_ms", "ttft_ms.p50"), ("tpot_ms", "tpot_ms.p50")):
                lo, hi = p.band[name]
                v = run.value(key)
                total += 1
                if v is None or not lo <= v <= hi:
                    misses.append(f"c={c} run {seed} {key}: {v} outside [{lo:.4g}-{hi:.4g}]")
    assert len(misses) <= 0.05 * total, misses


def test_a_ramped_closed_loop_starts_its_users_apart_in_the_virtual_run() -> None:
    # the load's --ramp starts user u of N at u/N x ramp; the twin replays a ramped cell the same way, not as
    # users sent together (whose requests stay in lockstep and meet an SLO or miss it round by round)
    cost = CostModel(load_profile("tiny"))
    together = run_virtual(cost, [128] * 8, [16] * 8, 4)
    apart = run_virtual(cost, [128] * 8, [16] * 8, 4, ramp_s=2.0)
    assert max(together.sent[:4]) < 0.01
    assert [round(t, 2) for t in apart.sent[:4]] == [0.0, 0.5, 1.0, 1.5]
    ttft = [f - s for f, s in zip(apart.first, apart.sent, strict=True)]
    assert max(ttft[:4]) < max(f - s for f, s in zip(together.first[:4], together.sent[:4], strict=True))
