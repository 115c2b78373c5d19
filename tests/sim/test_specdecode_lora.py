"""Speculative decoding and LoRA adapters in the simulator: vLLM's flags read, drafts accepted at the traffic's
rate, the verify cost making speculation pay at low load and cost at high load, adapters swapped through
`--max-loras` slots, vLLM's spec-decode and `vllm:lora_requests_info` names in `/metrics`, and
`POST /reset_prefix_cache`."""

from __future__ import annotations

import random
import re
import statistics
from collections.abc import Iterator
from dataclasses import replace

import httpx
import pytest

from servescope.sim.cli import main as sim_main
from servescope.sim.engine import VirtualRunner, run_closed_loop
from servescope.sim.launcher import SimHandle, start_sim
from servescope.sim.lora import LoraSlots, parse_lora_modules
from servescope.sim.profile import CostModel, Profile, load_profile
from servescope.sim.request import SimRequest
from servescope.sim.specdecode import SpecConfigError, expected_accepted, parse_spec_config


def _tiny(**engine: object) -> Profile:
    p = load_profile("tiny")
    return replace(p, engine=replace(p.engine, **engine))


def test_spec_config_reads_vllm_json_and_refuses_what_vllm_refuses() -> None:
    c = parse_spec_config('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}')
    assert (c.method, c.num_speculative_tokens, c.drafts_always) == ("ngram", 3, False)
    assert parse_spec_config('{"model": "small-draft", "num_speculative_tokens": 5}').method == "draft_model"
    for bad, says in (("ngram", "not JSON"), ('{"method": "magic", "num_speculative_tokens": 3}', "method 'magic'"),
                      ('{"method": "eagle"}', "num_speculative_tokens"), ("[1]", "JSON object"),
                      ('{"method": "ngram", "num_speculative_tokens": true}', "whole number")):
        with pytest.raises(SpecConfigError, match=re.escape(says)):
            parse_spec_config(bad)


def test_lora_modules_read_as_vllm_reads_them() -> None:
    assert parse_lora_modules(["sql=/a/sql", '{"name": "chat", "path": "/b"}']) == {"sql": "/a/sql", "chat": "/b"}
    with pytest.raises(ValueError, match="NAME=PATH"):
        parse_lora_modules(["=/a"])


@pytest.mark.parametrize("argv, says", [
    (["--lora-modules", "a=/x"], "--lora-modules needs --enable-lora"),
    (["--speculative-config", '{"method": "ngram"}'], "num_speculative_tokens"),
    (["--enable-lora", "--max-loras", "0"], "--max-loras 0"),
    (["--spec-acceptance", "0.5"], "--spec-acceptance needs --speculative-config"),
])
def test_bad_flags_are_one_line_and_exit_2(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert sim_main(["--profile", "tiny", "--port", "0", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err


def test_accepted_drafts_follow_the_requests_acceptance() -> None:
    """Each request's drafts are accepted at its own rate: the counters' acceptance is that rate, and every request
    still gets exactly its output tokens."""
    prof = _tiny(speculative_method="eagle", num_speculative_tokens=4)
    for p in (0.3, 0.8):
        runner = VirtualRunner(CostModel(prof))
        for i in range(40):
            runner.submit(SimRequest(i, 128, 200, accept_p=p), 0.0)
        runner.run()
        assert [r.output_len for r in runner.results] == [200] * 40
        sc = runner.sched.spec_counters
        assert sc is not None and sc.drafts > 1000
        per_draft = sc.accepted / sc.drafts  # E[accepted of 4] at p, a truncated geometric
        assert per_draft == pytest.approx(expected_accepted(p, 4), rel=0.08)
        assert sc.accepted_per_pos == sorted(sc.accepted_per_pos, reverse=True)  # a later position needs the earlier
        # tokens out of the engine: 1 + accepted per decode step, the first from the prefill
        assert runner.sched.generation_tokens_total == 40 * 200


def _tpot_ms(prof: Profile, c: int) -> float:
    res, _ = run_closed_loop(CostModel(prof), c, max(3 * c, 24), 256, 128)
    return statistics.median(r.tpot for r in res) * 1e3


def test_speculation_lowers_tpot_at_low_load_and_raises_it_at_high_load() -> None:
    """The verify cost: a memory-bound step at one user verifies 3 drafts almost for free, a compute-bound step at
    128 users pays for every drafted row (and n-gram turns async scheduling off)."""
    off, on = _tiny(), _tiny(speculative_method="ngram", num_speculative_tokens=3)
    assert _tpot_ms(on, 1) < 0.9 * _tpot_ms(off, 1)
    assert _tpot_ms(on, 128) > 1.1 * _tpot_ms(off, 128)


def _lora_tok_s(adapters: list[str], weights: list[float], max_loras: int = 1, c: int = 16, n: int = 160) -> float:
    prof = _tiny(enable_lora=True, max_loras=max_loras)
    runner = VirtualRunner(CostModel(prof))
    rng = random.Random(1)
    sent = 0

    def make(i: int) -> SimRequest:
        return SimRequest(i, 256, 128, adapter=rng.choices(adapters, weights)[0])

    def on_done(req: SimRequest, t: float) -> None:
        nonlocal sent
        if sent < n:
            runner.submit(make(sent), t)
            sent += 1

    runner.on_done = on_done
    for _ in range(c):
        runner.submit(make(sent), 0.0)
        sent += 1
    runner.run()
    return sum(r.output_len for r in runner.results) / runner.now


def test_ten_adapters_through_one_slot_cost_more_than_one_adapter() -> None:
    zipf = [k ** -1.1 for k in range(1, 11)]
    names = [f"lora-{k}" for k in range(1, 11)]
    one = _lora_tok_s(["lora-1"], [1.0])
    ten = _lora_tok_s(names, zipf)
    assert ten < 0.7 * one  # batches split by adapter, and adapters swapped in and out of the one slot
    assert _lora_tok_s(names, zipf, max_loras=10) > 1.5 * ten  # ten slots: every adapter in one batch


def test_slots_swap_the_least_recently_used_idle_adapter() -> None:
    s = LoraSlots(2)
    assert s.use("a", set()) and s.use("b", set()) and not s.use("a", set())
    assert s.use("c", {"a"}) and list(s.loaded) == ["a", "c"] and s.swaps == 3  # b went: a was in use


@pytest.fixture(scope="module")
def spec_lora_sim() -> Iterator[SimHandle]:
    with start_sim("tiny", ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}',
                            "--enable-lora", "--lora-modules", "sql=/adapters/sql", "chat=/adapters/chat",
                            "--max-loras", "1"]) as h:
        yield h


def _metric(text: str, name: str, labels: str = "") -> float:
    m = re.search(rf"^{re.escape(name)}{{[^}}]*{re.escape(labels)}[^}}]*}} (\S+)$", text, re.M)
    assert m, f"{name} {labels} not in /metrics"
    return float(m.group(1))


async def test_http_adapters_speculation_metrics_and_models(spec_lora_sim: SimHandle) -> None:
    async with httpx.AsyncClient(base_url=spec_lora_sim.url, timeout=60) as c:
        models = (await c.get("/v1/models")).json()["data"]
        assert [(m["id"], m["parent"]) for m in models] == [("tiny", None), ("sql", "tiny"), ("chat", "tiny")]
        before = (await c.get("/metrics")).text
        for model, p in (("sql", 1.0), ("chat", 0.0), ("tiny", 1.0)):
            r = await c.post("/v1/completions", json={"model": model, "prompt": "hello there", "max_tokens": 40,
                                                      "ignore_eos": True, "vllm_xargs": {"spec_acceptance": p}})
            assert r.status_code == 200 and r.json()["model"] == model and r.json()["usage"]["completion_tokens"] == 40
        r = await c.post("/v1/completions", json={"model": "nope", "prompt": "x", "max_tokens": 2})
        assert r.status_code == 404 and "nope" in r.json()["error"]["message"]
        after = (await c.get("/metrics")).text
    d = {k: _metric(after, f"vllm:spec_decode_num_{k}_total") - _metric(before, f"vllm:spec_decode_num_{k}_total")
         for k in ("drafts", "draft_tokens", "accepted_tokens")}
    # acceptance 1 for two requests (every drafted token accepted, n-gram drafting at every step), 0 for one (it
    # never drafts: an n-gram proposer that finds no match)
    assert d["drafts"] > 0 and d["accepted_tokens"] == d["draft_tokens"]
    assert _metric(after, "vllm:spec_decode_num_accepted_tokens_per_pos_total", 'position="2"') > 0
    info = re.findall(r'^vllm:lora_requests_info\{max_lora="1",running_lora_adapters="([^"]*)"', after, re.M)
    assert {"sql", "chat"} <= set(info)


async def test_reset_prefix_cache_empties_the_cache(sim: SimHandle) -> None:
    prompt = " ".join(f"w{i}" for i in range(200))
    async with httpx.AsyncClient(base_url=sim.url, timeout=60) as c:
        for _ in range(2):
            await c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1})
        hits = _metric((await c.get("/metrics")).text, "vllm:prefix_cache_hits_total")
        assert hits > 0  # the second saw the first's blocks
        r = await c.post("/reset_prefix_cache")
        assert r.status_code == 200 and r.json() == {"success": True}
        await c.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1})
        assert _metric((await c.get("/metrics")).text, "vllm:prefix_cache_hits_total") == hits  # nothing cached
