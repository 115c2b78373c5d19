"""The simulator over HTTP: vLLM's response shapes, token accounting, metrics, real-time c=1 timing."""

from __future__ import annotations

import asyncio
import statistics
import time

import aiohttp
import httpx
import pytest

from servescope.sim.launcher import SimHandle
from servescope.sim.profile import CostModel, load_profile
from tests.sim.sse import stream


def test_health_version_models(sim: SimHandle) -> None:
    with httpx.Client(base_url=sim.url) as c:
        assert c.get("/health").status_code == 200
        assert c.get("/version").json() == {"version": "0.32.0-sim"}
        models = c.get("/v1/models").json()
        assert models["object"] == "list"
        card = models["data"][0]
        assert card["id"] == "tiny" and card["object"] == "model" and card["owned_by"] == "servescope-sim"
        assert card["max_model_len"] == 8192


async def test_completions_stream_shape(sim: SimHandle) -> None:
    body = {"model": "tiny", "prompt": "hello " * 100, "max_tokens": 16, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    events, done, _ = await stream(sim.url, "/v1/completions", body)
    assert done
    tokens, usage = events[:-1], events[-1]
    assert len(tokens) == 16
    for i, ev in enumerate(tokens):
        assert ev["object"] == "text_completion" and ev["model"] == "tiny" and "created" in ev and ev["id"].startswith("cmpl-")
        ch = ev["choices"][0]
        assert ch["index"] == 0 and ch["logprobs"] is None and ch["text"]
        assert ch["finish_reason"] == ("length" if i == 15 else None)
        assert "usage" not in ev
    assert usage["choices"] == []
    assert usage["usage"] == {"prompt_tokens": 101, "completion_tokens": 16, "total_tokens": 117,
                              "prompt_tokens_details": {"cached_tokens": 0}}


async def test_continuous_usage_is_cumulative(sim: SimHandle) -> None:
    body = {"prompt": "a b c", "max_tokens": 5, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    events, done, _ = await stream(sim.url, "/v1/completions", body)
    assert done
    assert [e["usage"]["completion_tokens"] for e in events] == [1, 2, 3, 4, 5, 5]
    assert all(e["usage"]["prompt_tokens"] == 4 for e in events)


async def test_chat_stream_shape(sim: SimHandle) -> None:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 6,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    events, done, _ = await stream(sim.url, "/v1/chat/completions", body)
    assert done
    assert events[0]["object"] == "chat.completion.chunk"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    deltas = [e["choices"][0]["delta"] for e in events[1:-1]]
    assert len(deltas) == 6 and all(set(d) == {"content"} for d in deltas)
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["usage"]["completion_tokens"] == 6 and events[-1]["choices"] == []
    assert "completion_tokens_details" not in events[-1]["usage"]


async def test_chat_thinking_reasoning_first(sim: SimHandle) -> None:
    body = {"messages": [{"role": "user", "content": "think about it"}], "max_tokens": 40, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True},
            "chat_template_kwargs": {"enable_thinking": True}}
    events, done, _ = await stream(sim.url, "/v1/chat/completions", body)
    kinds = [next(iter(e["choices"][0]["delta"])) for e in events[1:-1]]
    assert kinds == ["reasoning_content"] * 30 + ["content"] * 10
    usage = events[-1]["usage"]
    assert usage["completion_tokens"] == 40 and usage["completion_tokens_details"] == {"reasoning_tokens": 30}


def test_non_streaming(sim: SimHandle) -> None:
    with httpx.Client(base_url=sim.url) as c:
        r = c.post("/v1/completions", json={"prompt": "one two", "max_tokens": 7, "ignore_eos": True}).json()
        assert r["object"] == "text_completion" and r["choices"][0]["finish_reason"] == "length"
        assert r["usage"] == {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10,
                              "prompt_tokens_details": {"cached_tokens": 0}}
        assert len(c.post("/tokenize", json={"prompt": r["choices"][0]["text"], "add_special_tokens": False}).json()["tokens"]) == 7
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 9,
                                                 "ignore_eos": True, "chat_template_kwargs": {"enable_thinking": True}}).json()
        msg = r["choices"][0]["message"]
        assert r["object"] == "chat.completion" and msg["role"] == "assistant" and msg["reasoning_content"] and msg["content"]
        assert r["usage"]["completion_tokens_details"]["reasoning_tokens"] == 6


def test_eos_stops_early_deterministically_and_respects_min_tokens(sim: SimHandle) -> None:
    with httpx.Client(base_url=sim.url) as c:
        lens = []
        for i in range(8):
            body = {"prompt": f"prompt number {i}", "max_tokens": 30, "min_tokens": 10}
            r1 = c.post("/v1/completions", json=body).json()
            r2 = c.post("/v1/completions", json=body).json()
            assert r1["usage"]["completion_tokens"] == r2["usage"]["completion_tokens"]
            n = r1["usage"]["completion_tokens"]
            assert 10 <= n <= 30
            assert r1["choices"][0]["finish_reason"] == ("length" if n == 30 else "stop")
            lens.append(n)
        assert min(lens) < 30  # some stop early


def test_usage_prompt_tokens_agree_with_tokenize(sim: SimHandle) -> None:
    with httpx.Client(base_url=sim.url) as c:
        text = "Summarise: the cat sat on the mat, twice.\nThen 12345 dogs came."
        tok = c.post("/tokenize", json={"prompt": text}).json()
        r = c.post("/v1/completions", json={"prompt": text, "max_tokens": 1}).json()
        assert r["usage"]["prompt_tokens"] == tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 8192
        msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": text}]
        tok = c.post("/tokenize", json={"messages": msgs, "add_generation_prompt": True}).json()
        r = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 1}).json()
        assert r["usage"]["prompt_tokens"] == tok["count"]
        r = c.post("/v1/completions", json={"prompt": list(range(100, 350)), "max_tokens": 1}).json()
        assert r["usage"]["prompt_tokens"] == 250


def test_cut_prompt_to_exact_token_count(sim: SimHandle) -> None:
    with httpx.Client(base_url=sim.url) as c:
        text = "Once upon a time, in a land far away, there lived a programmer who benchmarked servers. " * 20
        ids = c.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()["tokens"]
        for n in (1, 64, 200):
            cut = c.post("/detokenize", json={"tokens": ids[:n]}).json()["prompt"]
            again = c.post("/tokenize", json={"prompt": cut, "add_special_tokens": False}).json()
            assert again["tokens"] == ids[:n]
            r = c.post("/v1/completions", json={"prompt": cut, "max_tokens": 1}).json()
            assert r["usage"]["prompt_tokens"] == n + 1  # + BOS, as /tokenize with add_special_tokens


def test_errors_like_vllm(sim: SimHandle) -> None:
    with httpx.Client(base_url=sim.url) as c:
        r = c.post("/v1/completions", json={"model": "gpt-5", "prompt": "x"})
        assert r.status_code == 404
        assert r.json() == {"error": {"message": "The model `gpt-5` does not exist.", "type": "NotFoundError",
                                      "param": None, "code": 404}}
        r = c.post("/v1/completions", json={"prompt": "w " * 8000, "max_tokens": 500})
        assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"
        assert "maximum context length is 8192" in r.json()["error"]["message"]
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "w " * 9000}]})
        assert r.status_code == 400
        assert c.post("/v1/completions", content=b"{not json").status_code == 400


def test_metrics_names(sim: SimHandle) -> None:
    with httpx.Client(base_url=sim.url) as c:
        c.post("/v1/completions", json={"prompt": "warm up", "max_tokens": 3, "ignore_eos": True})
        text = c.get("/metrics").text
    for name in ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:num_preemptions_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
                 "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
        assert f'{name}{{engine="0",model_name="tiny"}}' in text
    assert 'vllm:request_success_total{engine="0",model_name="tiny",finished_reason="length"}' in text
    for h in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
              "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds"):
        assert f"# TYPE {h} histogram" in text and f'{h}_bucket{{engine="0",model_name="tiny",le="+Inf"}}' in text
    info = next(line for line in text.splitlines() if line.startswith("vllm:cache_config_info{"))
    for label in ("block_size=\"16\"", "num_gpu_blocks=", "cache_dtype=", "gpu_memory_utilization=",
                  "kv_cache_size_tokens=", "kv_cache_max_concurrency="):
        assert label in info


async def test_c1_realtime_timing_matches_prediction(sim: SimHandle) -> None:
    cost = CostModel(load_profile("tiny"))
    ttft_pred, tpot_pred = cost.predict_c1(257, 128)
    best = None
    async with aiohttp.ClientSession() as session:
        await stream(sim.url, "/v1/completions", {"prompt": "warm", "max_tokens": 1, "stream": True}, session)
        for attempt in range(4):  # the machine is shared: take the cleanest of four runs (new prompt each: no prefix-cache hit)
            body = {"prompt": list(range(1000 + 300 * attempt, 1257 + 300 * attempt)), "max_tokens": 128, "ignore_eos": True, "stream": True,
                    "seed": attempt}
            p0 = time.perf_counter()
            events, done, stamps = await stream(sim.url, "/v1/completions", body, session)
            ttft = stamps[0] - p0
            tpot = (stamps[-1] - stamps[0]) / (len(stamps) - 1)
            err = max(abs(tpot / tpot_pred - 1), abs(ttft / ttft_pred - 1))
            if best is None or err < best[0]:
                best = (err, ttft, tpot)
            if err < 0.05:
                break
    assert best is not None
    assert best[2] == pytest.approx(tpot_pred, rel=0.10), best
    assert best[1] == pytest.approx(ttft_pred, rel=0.10, abs=0.003), best


async def test_concurrent_load_batches() -> None:
    """16 users at once: aggregate throughput well above c=1, per-user slower (continuous batching)."""
    from servescope.sim.launcher import start_sim

    with start_sim("tiny") as h:
        async def one(session: aiohttp.ClientSession, i: int) -> float:
            t = asyncio.get_running_loop().time()
            async with session.post(h.url + "/v1/completions", json={"prompt": f"user {i} " * 50, "max_tokens": 64,
                                                                     "ignore_eos": True}) as r:
                assert (await r.json())["usage"]["completion_tokens"] == 64
            return asyncio.get_running_loop().time() - t

        async with aiohttp.ClientSession() as s:
            t0 = asyncio.get_running_loop().time()
            e2e = await asyncio.gather(*(one(s, i) for i in range(16)))
            wall = asyncio.get_running_loop().time() - t0
        agg = 16 * 64 / wall
        cost = CostModel(load_profile("tiny"))
        single = 64 / sum(cost.predict_c1(101, 64)[i] * (1 if i == 0 else 63) for i in (0, 1))
        assert agg > 4 * single
        assert statistics.fmean(e2e) < 16 * 64 * cost.predict_c1(101, 64)[1]


async def test_metrics_ttft_starts_when_the_engine_gets_the_request(sim: SimHandle) -> None:
    """As in vLLM, the server's TTFT (and end-to-end) histograms leave out the API server's own work before the
    engine sees the request (the profile's frontend_ms), which a client's TTFT includes."""
    from servescope.core.servermetrics import parse

    frontend_s = load_profile("tiny").efficiency.frontend_ms / 1e3
    ttft, e2e = "vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{sim.url}/metrics") as r:
            m0 = parse(await r.text())
        p0 = time.perf_counter()
        body = {"prompt": list(range(3000, 3200)), "max_tokens": 8, "ignore_eos": True, "stream": True}
        _, _, stamps = await stream(sim.url, "/v1/completions", body, session)
        client_ttft, client_e2e = stamps[0] - p0, stamps[-1] - p0
        async with session.get(f"{sim.url}/metrics") as r:
            m1 = parse(await r.text())
    assert m1[f"{ttft}_count"] - m0[f"{ttft}_count"] == 1
    server_ttft = m1[f"{ttft}_sum"] - m0[f"{ttft}_sum"]
    server_e2e = m1[f"{e2e}_sum"] - m0[f"{e2e}_sum"]
    assert 0 < server_ttft <= client_ttft - 0.9 * frontend_s
    assert 0 < server_e2e <= client_e2e - 0.9 * frontend_s
