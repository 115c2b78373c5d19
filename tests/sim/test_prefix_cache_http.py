"""The prefix cache over HTTP: usage's `prompt_tokens_details.cached_tokens` against `/metrics`, a
conversation's history hitting, eviction under KV pressure, caching off."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx

from servescope.sim.launcher import SimHandle, start_sim
from tests.sim.sse import stream

BS = 16


async def _counters(c: httpx.AsyncClient) -> tuple[float, float]:
    text = (await c.get("/metrics")).text
    out = []
    for name in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
        m = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)
        assert m, name
        out.append(float(m.group(1)))
    return out[0], out[1]


def _words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{chr(97 + i % 26)}{chr(97 + i // 26 % 26)}" for i in range(n))


async def _post(c: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = await c.post(path, json=body)
    assert r.status_code == 200, r.text
    usage: dict[str, Any] = r.json()["usage"]
    return usage


async def test_usage_cached_tokens_match_metrics_hits(sim: SimHandle) -> None:
    usages: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=sim.url, timeout=60) as c:
        q0, h0 = await _counters(c)
        # a conversation: turn 2 resends turn 1's prompt and answer, so it hits their full blocks
        msgs: list[dict[str, Any]] = [{"role": "system", "content": "Be terse. " + _words("sys", 300)},
                                      {"role": "user", "content": _words("ask", 50)}]
        r = (await c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 40, "ignore_eos": True})).json()
        usages.append(r["usage"])
        answer = r["choices"][0]["message"]["content"]
        assert r["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        p1 = r["usage"]["prompt_tokens"]
        msgs2 = [*msgs, {"role": "assistant", "content": answer}, {"role": "user", "content": _words("more", 30)}]
        t1 = (await c.post("/tokenize", json={"messages": msgs})).json()["tokens"]
        t_ans = (await c.post("/tokenize", json={"prompt": answer, "add_special_tokens": False})).json()["tokens"]
        t2 = (await c.post("/tokenize", json={"messages": msgs2})).json()["tokens"]
        assert t2[:p1 + 40] == t1 + t_ans and len(t_ans) == 40
        events, done, _ = await stream(sim.url, "/v1/chat/completions", {
            "messages": msgs2, "max_tokens": 8, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
        assert done
        usage = events[-1]["usage"]
        usages.append(usage)
        # the history's KV up to the answer's last computed token (its last token's KV never is), in full blocks
        assert usage["prompt_tokens_details"] == {"cached_tokens": (p1 + 40 - 1) // BS * BS}
        assert all("prompt_tokens_details" not in e["usage"] for e in events[:-1])  # only the final usage
        # completions: a repeated prompt hits all its full blocks but the one with its last token
        body = {"prompt": _words("doc", 400), "max_tokens": 4, "ignore_eos": True}
        usages.append(await _post(c, "/v1/completions", body))
        again = await _post(c, "/v1/completions", body)
        usages.append(again)
        assert again["prompt_tokens_details"]["cached_tokens"] == (again["prompt_tokens"] - 1) // BS * BS
        events, done, _ = await stream(sim.url, "/v1/completions", {**body, "stream": True,
                                                                    "stream_options": {"include_usage": True}})
        usages.append(events[-1]["usage"])
        assert events[-1]["usage"]["prompt_tokens_details"] == again["prompt_tokens_details"]
        q1, h1 = await _counters(c)
    assert h1 - h0 == sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages) > 0
    assert q1 - q0 == sum(u["prompt_tokens"] for u in usages)


async def test_kv_pressure_evicts_the_cached_prefix() -> None:
    with start_sim("tiny", ["--kv-cache-tokens", "1024"]) as h:
        async with httpx.AsyncClient(base_url=h.url, timeout=60) as c:
            prefix = list(range(1000, 1320))  # 20 blocks
            first = await _post(c, "/v1/completions", {"prompt": prefix + [7000], "max_tokens": 1})
            assert first["prompt_tokens_details"]["cached_tokens"] == 0
            hit = await _post(c, "/v1/completions", {"prompt": prefix + [7001], "max_tokens": 1})
            assert hit["prompt_tokens_details"]["cached_tokens"] == 320

            async def filler(i: int) -> None:  # four at once: 15-16 blocks each, the cache is 64
                body = {"prompt": list(range(2000 + 300 * i, 2240 + 300 * i)), "max_tokens": 16, "ignore_eos": True}
                await _post(c, "/v1/completions", body)

            await asyncio.gather(*(filler(i) for i in range(4)))
            miss = await _post(c, "/v1/completions", {"prompt": prefix + [7002], "max_tokens": 1})
            assert miss["prompt_tokens_details"]["cached_tokens"] == 0


def test_caching_off_sends_no_details_and_counts_nothing() -> None:
    with start_sim("tiny", ["--no-enable-prefix-caching"]) as h, httpx.Client(base_url=h.url, timeout=60) as c:
        body = {"prompt": _words("doc", 400), "max_tokens": 2}
        for _ in range(2):
            r = c.post("/v1/completions", json=body)
            assert r.status_code == 200 and "prompt_tokens_details" not in r.json()["usage"]
        text = c.get("/metrics").text
    assert re.search(r"^vllm:prefix_cache_queries_total{[^}]*} 0.0$", text, re.M)
    assert re.search(r"^vllm:prefix_cache_hits_total{[^}]*} 0.0$", text, re.M)
    assert 'enable_prefix_caching="False"' in text
