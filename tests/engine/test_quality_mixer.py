"""The probe questions mixed into a speed cell (`--quality-share`): a probe the server refuses is counted as
failed and its reason kept (cleaned: a server's text is data), and the probe client closes idle connections
before the server would (a request written into a connection the server just dropped fails)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from servescope.core.client import KEEPALIVE_S
from servescope.core.probe import Trace
from servescope.core.target import ModelInfo
from servescope.engine.quality import QualityMixer
from servescope.workloads.quality import DIVERGENCE_PROMPTS


def _completion() -> dict[str, Any]:
    toks = [" a", " b"]
    return {"choices": [{"text": "".join(toks), "logprobs": {
        "tokens": toks, "token_logprobs": [-0.1, -0.2], "top_logprobs": [{" a": -0.1}, {" b": -0.2}]}}]}


def _mixer(handler: Any, share: float) -> QualityMixer:
    """A mixer whose probes go to `handler` (the server faked at the HTTP boundary), idle traces for every prompt."""
    mixer = QualityMixer("http://127.0.0.1:9", ModelInfo("m"), None, share=share)
    mixer.idle = {p: Trace(prompt=p, tokens=[" a", " b"], top=[{" a": -0.1}, {" b": -0.2}])
                  for p in DIVERGENCE_PROMPTS}
    transport = httpx.MockTransport(handler)
    mixer._client = lambda: httpx.AsyncClient(base_url=mixer.url, transport=transport)  # type: ignore[method-assign]
    return mixer


def test_a_refused_probe_is_counted_with_its_reason() -> None:
    calls: list[int] = []

    six = asyncio.Event()

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) >= 6:
            six.set()
        if len(calls) % 2 == 1:  # every other probe refused, its message carrying a terminal escape
            return httpx.Response(500, json={"error": {"message": "engine \x1b[31mbusy\x1b[0m, try later"}})
        return httpx.Response(200, json=_completion())

    mixer = _mixer(handler, 0.5)

    async def go() -> None:
        done = [0]
        task = asyncio.create_task(mixer.during(lambda: done[0]))
        done[0] = 40  # the cell finished 40 requests: the mixer owes it probes (share 0.5: one per request)
        await asyncio.wait_for(six.wait(), 30)  # 6 probes answered or refused
        await mixer.finish(task, limit_s=30)

    asyncio.run(go())
    out = mixer.take()
    assert out is not None
    assert out.failed >= 3 and out.prompts is not None and out.prompts >= 1  # the answered probes were compared with the idle traces
    assert out.kl_mean == 0.0
    (why,) = out.errors or []  # one distinct reason, once
    assert "HTTP 500" in why and "busy" in why and "\x1b" not in why
    assert mixer.take() is None  # the next cell starts over


def test_a_cell_whose_every_probe_failed_keeps_the_count_and_reason() -> None:
    """No answer at all is still a measurement: the failures are saved with the cell, not dropped."""
    three = asyncio.Event()
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) >= 3:
            three.set()
        return httpx.Response(503, json={"error": {"message": "overloaded"}})

    mixer = _mixer(handler, 0.5)

    async def go() -> None:
        done = [0]
        task = asyncio.create_task(mixer.during(lambda: done[0]))
        done[0] = 40
        await asyncio.wait_for(three.wait(), 30)
        await mixer.finish(task, limit_s=30)

    asyncio.run(go())
    out = mixer.take()
    assert out is not None, "a cell whose probes all failed lost its quality figures"
    assert out.n == 0 and out.failed >= 3 and any("overloaded" in e for e in out.errors or [])
    from servescope.cli.run import quality_text

    assert quality_text(out) == f"{out.failed} probe requests failed"
    assert mixer.take() is None  # the next cell starts over


def test_probe_clients_close_idle_connections_before_the_server() -> None:
    mixer = QualityMixer("http://127.0.0.1:9", ModelInfo("m"), None, share=0.2)

    async def expiry() -> float | None:
        async with mixer._client() as http:
            pool = http._transport._pool  # type: ignore[attr-defined]
            return float(pool._keepalive_expiry)

    assert KEEPALIVE_S < 5.0  # uvicorn (vLLM) and llama.cpp's server drop an idle connection after 5 s
    assert asyncio.run(expiry()) == KEEPALIVE_S


def test_the_probe_out_when_the_load_ends_finishes_and_no_new_one_starts() -> None:
    calls: list[int] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        gate["started"].set()
        await gate["release"].wait()  # the probe is out when the cell's load ends
        return httpx.Response(200, json=_completion())

    gate: dict[str, asyncio.Event] = {}
    mixer = _mixer(handler, 0.5)

    async def go() -> None:
        gate["started"], gate["release"] = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(mixer.during(lambda: 40))
        await asyncio.wait_for(gate["started"].wait(), 30)
        ending = asyncio.create_task(mixer.finish(task, limit_s=30))
        gate["release"].set()
        await asyncio.wait_for(ending, 30)
        assert task.done()

    asyncio.run(go())
    out = mixer.take()
    assert out is not None and out.prompts == 1 and out.failed == 0  # the probe out was kept
    assert len(calls) == 1  # and none was sent after the load ended


def test_a_sweep_stopped_while_the_last_probe_finishes_is_still_stopped() -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        gate["started"].set()
        await asyncio.Event().wait()  # a probe that never answers
        raise AssertionError("unreachable")

    gate: dict[str, asyncio.Event] = {}
    mixer = _mixer(handler, 0.5)

    async def go() -> None:
        gate["started"] = asyncio.Event()
        task = asyncio.create_task(mixer.during(lambda: 40))
        await asyncio.wait_for(gate["started"].wait(), 30)
        ending = asyncio.create_task(mixer.finish(task, limit_s=600))
        await asyncio.sleep(0)  # finish() is waiting on the probe
        ending.cancel()  # the sweep is stopped (Ctrl-C, x) meanwhile
        try:
            await asyncio.wait_for(ending, 30)
        except asyncio.CancelledError:
            pass
        else:
            raise AssertionError("finish() swallowed the cancellation of its caller")
        assert task.done()  # and the probe task is cancelled too, not left running

    asyncio.run(go())


def test_the_question_and_trace_lanes_take_turns() -> None:
    """A trace lane whose probe ends just as the cell's pace allows one more probe does not take every turn:
    the questions go out too (the trace lane took them all, and a short cell had traces and no question)."""
    import json

    from servescope.core.quality import TaskItem

    sent = {"trace": 0, "question": 0}
    done = [4]  # the cell's finished requests: room for one probe at share 0.2
    five = asyncio.Event()

    def handler(request: httpx.Request) -> httpx.Response:
        kind = "trace" if "logprobs" in json.loads(request.content) else "question"
        sent[kind] += 1
        if sum(sent.values()) <= 12:
            done[0] += 4  # the load finishes 4 requests while each probe is out: one more probe is owed
        if sent["trace"] >= 5:
            five.set()
        if kind == "trace":
            return httpx.Response(200, json=_completion())
        return httpx.Response(200, json={"choices": [{"text": "4"}]})

    mixer = _mixer(handler, 0.2)
    mixer.items = [TaskItem(task="arithmetic", prompt="2+2=", answer="4")]

    async def go() -> None:
        task = asyncio.create_task(mixer.during(lambda: done[0]))
        await asyncio.wait_for(five.wait(), 30)
        await mixer.finish(task, limit_s=30)

    asyncio.run(go())
    out = mixer.take()
    assert out is not None and out.n >= 4 and out.correct == out.n, (sent, out)
    assert sent["question"] >= sent["trace"] - 1, sent
