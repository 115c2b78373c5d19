"""A tokenizer that does not count (a /tokenize that always answers 3) is one line that says so, early (issue 32:
14 s of ever longer /tokenize requests, then an HTTP 413 line that never said the counts were wrong); 1,000 served
models are named as a few and "and 994 more" (they made one ~6,000-character line)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from aiohttp import web

from servescope.core.errors import ServescopeError
from servescope.core.target import ModelInfo, ServerTokenizer, TargetInfo, has_tokenize
from servescope.workloads.prompts import build_prompts
from servescope.workloads.spec import LengthDist, Workload

NOT_COUNTING = ("the server's /tokenize answered 3 tokens for texts of 1 to 200 words: it is not counting this "
                "model's tokens; use --tokenizer PATH (a local tokenizer of the served model)")


@pytest.fixture
async def tokenize_server() -> AsyncIterator[Callable[..., Any]]:
    runners: list[web.AppRunner] = []

    async def start(answer: dict[str, Any], seen: list[int]) -> str:
        async def tokenize(request: web.Request) -> web.Response:
            body = await request.json()
            seen.append(len(str(body.get("prompt", body.get("messages", "")))))
            return web.json_response(answer)

        app = web.Application()
        app.router.add_route("POST", "/tokenize", tokenize)
        runner = web.AppRunner(app, shutdown_timeout=0.2)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]

    yield start
    for r in runners:
        await r.cleanup()


async def test_a_tokenize_that_always_answers_3_is_refused_at_connect_in_one_line(tokenize_server) -> None:
    seen: list[int] = []
    url = await tokenize_server({"count": 3, "tokens": [1, 2, 3]}, seen)
    async with httpx.AsyncClient(base_url=url) as http:
        with pytest.raises(ServescopeError) as e:
            await has_tokenize(http, "m")
    assert e.value.message == NOT_COUNTING
    assert len(seen) == 2 and max(seen) < 2000  # two small requests, not 14 s of growing ones


async def test_the_prompt_builder_stops_a_tokenizer_that_does_not_count(tokenize_server) -> None:
    """The same check where prompts are built (a tokenizer given by a Target that skipped `has_tokenize`):
    a couple of small requests, never texts doubling until the server refuses them."""
    seen: list[int] = []
    url = await tokenize_server({"count": 3, "tokens": [1, 2, 3]}, seen)
    w = Workload("t", "completions", LengthDist("fixed", value=1000), LengthDist("fixed", value=8), seed=1)
    async with httpx.AsyncClient(base_url=url) as http:
        with pytest.raises(ServescopeError, match=r"^the server's /tokenize answered 3 tokens for texts of 10 to "
                                                  r"200 words: it is not counting this model's tokens; use "
                                                  r"--tokenizer PATH"):
            await build_prompts(w, 4, "cell0", ServerTokenizer(http, "m"))
    assert len(seen) == 2 and max(seen) < 2000


class _EncodeOnlyBroken:
    """Counts right, but encodes every text to 3 tokens: the corpus would double forever."""

    exact = True
    name = "local /tok"

    async def encode(self, text: str) -> list[int]:
        return [1, 2, 3]

    async def decode(self, ids: list[int]) -> str:
        return "w " * len(ids)

    async def count_prompt(self, text: str) -> int:
        return 1 + len(text.split())

    async def count_chat(self, text: str) -> int:
        return 5 + len(text.split())


async def test_an_encoder_that_does_not_grow_is_stopped_at_the_second_try() -> None:
    w = Workload("t", "completions", LengthDist("fixed", value=1000), LengthDist("fixed", value=8), seed=1)
    with pytest.raises(ServescopeError, match=r"^the tokenizer \(local /tok\) answered 3 tokens for texts of "
                                              r"[\d,]+ to [\d,]+ words: it is not counting"):
        await build_prompts(w, 4, "cell0", _EncodeOnlyBroken())


def test_a_thousand_served_models_are_a_few_and_how_many_more() -> None:
    info = TargetInfo("http://h:8000", [ModelInfo(f"org/model-{i:04d}") for i in range(1000)])
    with pytest.raises(ServescopeError) as e:
        info.model(None)
    msg = e.value.message
    assert msg == ("http://h:8000 serves several models (org/model-0000, org/model-0001, org/model-0002, "
                   "org/model-0003, org/model-0004, org/model-0005 and 994 more); choose one with --model")
    with pytest.raises(ServescopeError) as e:
        info.model("nope")
    assert e.value.message.endswith("serves: org/model-0000, org/model-0001, org/model-0002, org/model-0003, "
                                    "org/model-0004, org/model-0005 and 994 more")
    assert len(e.value.message) < 200


def test_a_served_model_id_is_data_one_line_and_cut() -> None:
    info = TargetInfo("http://h", [ModelInfo("a\nb\x1b[31mred"), ModelInfo("x" * 500)])
    with pytest.raises(ServescopeError) as e:
        info.model(None)
    msg = e.value.message
    assert "\n" not in msg and "\x1b" not in msg and "a bred" in msg
    assert "x" * 77 + "..." in msg and "x" * 78 not in msg
