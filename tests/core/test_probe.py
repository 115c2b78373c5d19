"""The quality probe's HTTP side against a scripted local server answering as vLLM 0.32 and llama.cpp do (their
shapes copied from the real servers; tests/integration/test_probe_real.py checks the real ones)."""

from __future__ import annotations

import math
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from servescope.core.errors import ServescopeError
from servescope.core.probe import ContextTooLong, _parse_logprobs, answer, greedy, prompt_logprobs, split_text

Reply = Callable[[dict[str, Any]], web.Response]
Start = Callable[[Reply], Awaitable[str]]
KEY = "sk-secret-123"


@pytest.fixture
async def server() -> AsyncIterator[tuple[Start, list[dict[str, Any]]]]:
    """start(reply) -> base URL; every request body lands in `seen`."""
    runners: list[web.AppRunner] = []
    seen: list[dict[str, Any]] = []

    async def start(reply: Reply) -> str:
        async def handler(request: web.Request) -> web.Response:
            body = await request.json()
            seen.append({**body, "_path": request.path, "_auth": request.headers.get("Authorization")})
            return reply(body)

        app = web.Application()
        app.router.add_route("POST", "/v1/completions", handler)
        runner = web.AppRunner(app, shutdown_timeout=0.2)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}"

    yield start, seen
    for r in runners:
        await r.cleanup()


def client(key: str | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(timeout=5, headers={"Authorization": f"Bearer {key}"} if key else {})


def completion(choice: dict[str, Any]) -> web.Response:
    return web.json_response({"id": "cmpl-1", "object": "text_completion", "model": "m",
                              "choices": [{"index": 0, "finish_reason": "length", **choice}]})


# what vLLM 0.32 answered for `"logprobs": 3` (the sampled token is always in top_logprobs)
VLLM_LOGPROBS = {
    "text_offset": [0, 6, 12],
    "token_logprobs": [-7.712442874908447, -7.697124481201172, -9.5],
    "tokens": [" recom", " recom", "\n"],
    "top_logprobs": [
        {" recom": -7.712442874908447, "unittest": -7.814005374908447, " duplic": -7.931192874908447},
        {" recom": -7.697124481201172, "certfile": -7.954936981201172, " mode": -7.954936981201172},
        {"a": -1.0, "b": -2.0, "c": -3.0, "\n": -9.5},  # the sampled token beyond the top-3 (temperature > 0)
    ],
}


def llama_entry(tok: str, lp: float, top: list[tuple[str, float]]) -> dict[str, Any]:
    def one(t: str, v: float) -> dict[str, Any]:
        return {"id": abs(hash(t)) % 9000, "token": t, "bytes": list(t.encode()), "logprob": v}

    return {**one(tok, lp), "top_logprobs": [one(t, v) for t, v in top]}


# what llama.cpp answered for `"logprobs": 3` on /v1/completions: the chat-style `content` list
LLAMA_LOGPROBS = {"content": [
    llama_entry(" entire", -7.71, [(" entire", -7.71), ("CS", -7.80), (" codes", -7.93)]),
    llama_entry("\ufffd", -8.0, [("\ufffd", -8.0), ("\ufffd", -8.5), ("x", -8.6)]),  # two byte tokens, one text
    llama_entry(" z", -9.0, [("p", -7.0), ("q", -7.5)]),  # the chosen token missing from the top list
]}


# --------------------------------------------------------------------------------------------------------
# greedy
# --------------------------------------------------------------------------------------------------------


async def test_greedy_reads_vllm_legacy_logprobs(server: Any) -> None:
    start, seen = server
    url = await start(lambda b: completion({"text": " recom recom\n", "logprobs": VLLM_LOGPROBS}))
    async with client() as c:
        text, trace = await greedy(c, url + "/v1/", "m", "The capital of France is", 3, top_k=3)
    assert text == " recom recom\n"
    assert trace.prompt == "The capital of France is"
    assert trace.tokens == [" recom", " recom", "\n"]
    assert trace.top == VLLM_LOGPROBS["top_logprobs"]
    body = seen[0]
    assert body["_path"] == "/v1/completions"  # a base URL ending in /v1/ is not doubled
    assert body["temperature"] == 0 and body["logprobs"] == 3 and body["max_tokens"] == 3
    assert body["stream"] is False and body["model"] == "m"


async def test_greedy_reads_llamacpp_content_logprobs(server: Any) -> None:
    start, _ = server
    url = await start(lambda b: completion({"text": " entire\ufffd z", "logprobs": LLAMA_LOGPROBS}))
    async with client() as c:
        text, trace = await greedy(c, url, "m", "hi", 3, top_k=3)
    assert text == " entire\ufffd z"
    assert trace.tokens == [" entire", "\ufffd", " z"]
    assert trace.top[0] == {" entire": -7.71, "CS": -7.80, " codes": -7.93}
    assert trace.top[1] == {"\ufffd": -8.0, "x": -8.6}  # two ids with one text keep the larger value
    assert trace.top[2] == {"p": -7.0, "q": -7.5, " z": -9.0}  # the chosen token is always in the map


async def test_greedy_without_logprobs_says_so(server: Any) -> None:
    start, _ = server
    url = await start(lambda b: completion({"text": "hello"}))  # a server that ignores `logprobs`
    async with client() as c:
        with pytest.raises(ServescopeError, match="does not return logprobs.*divergence"):
            await greedy(c, url, "m", "hi", 3)
    url2 = await start(lambda b: completion({"text": "hello", "logprobs": None}))
    async with client() as c:
        with pytest.raises(ServescopeError, match="does not return logprobs"):
            await greedy(c, url2, "m", "hi", 3)


@pytest.mark.parametrize("lp", [
    {"tokens": ["a", "b"], "token_logprobs": [-1.0], "top_logprobs": [{}, {}]},  # lengths differ
    {"tokens": ["a"], "token_logprobs": [-1.0], "top_logprobs": ["x"]},
    {"content": [{"logprob": -1.0}]},
    {"content": [{"token": "a", "logprob": -1, "top_logprobs": "many"}]},
    {"something": "else"},
    "\x1b[31mred",
])
async def test_greedy_rejects_malformed_logprobs_in_one_line(server: Any, lp: Any) -> None:
    start, _ = server
    url = await start(lambda b: completion({"text": "x", "logprobs": lp}))
    async with client() as c:
        with pytest.raises(ServescopeError) as e:
            await greedy(c, url, "m", "hi", 3)
    assert "\x1b" not in str(e.value) and "\n" not in str(e.value) and "belongs" in str(e.value)


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                                 max_size=4), max_leaves=20)
_entry = st.fixed_dictionaries({"token": st.text(max_size=4) | _json, "logprob": st.floats() | _json},
                               optional={"top_logprobs": st.lists(st.fixed_dictionaries(
                                   {"token": st.text(max_size=4), "logprob": st.floats() | _json}), max_size=4) | _json})
_hostile_logprobs = (
    _json
    | st.fixed_dictionaries({"content": st.lists(_entry, max_size=5)})
    | st.fixed_dictionaries({"tokens": st.lists(st.text(max_size=4), max_size=4),
                             "token_logprobs": st.lists(st.floats() | st.none(), max_size=4) | _json,
                             "top_logprobs": st.lists(st.none() | st.dictionaries(st.text(max_size=4), st.floats()
                                                                                 | _json, max_size=4), max_size=4)})
)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(_hostile_logprobs)
def test_any_logprobs_give_a_trace_of_finite_values_or_one_servescope_error(lp: Any) -> None:
    try:
        tokens, top = _parse_logprobs(lp, "http://h:1", None)
    except ServescopeError as e:
        assert "\n" not in str(e)
        return
    assert len(tokens) == len(top) and all(isinstance(t, str) for t in tokens)
    for m in top:
        assert all(isinstance(k, str) and isinstance(v, float) and math.isfinite(v) for k, v in m.items())


# --------------------------------------------------------------------------------------------------------
# answer
# --------------------------------------------------------------------------------------------------------


async def test_answer_is_the_greedy_text(server: Any) -> None:
    start, seen = server
    url = await start(lambda b: completion({"text": "42\n", "logprobs": None}))
    async with client(KEY) as c:
        assert await answer(c, url, "m", "6*7=", 4) == "42\n"
    assert seen[0]["temperature"] == 0 and seen[0]["max_tokens"] == 4 and "logprobs" not in seen[0]
    assert seen[0]["_auth"] == f"Bearer {KEY}"  # the caller's client, headers and all


# --------------------------------------------------------------------------------------------------------
# prompt_logprobs
# --------------------------------------------------------------------------------------------------------


def vllm_prompt_logprobs(body: dict[str, Any]) -> web.Response:
    """vLLM 0.32's shape: [null, {"<id>": {"logprob", "rank", "decoded_token"}}, ...] plus prompt_token_ids; here
    the top-k come FIRST in each map, so only the ids can tell the prompt's token."""
    ids = [1718, 2819, 297, 287]
    plp: list[Any] = [None]
    for i, tid in enumerate(ids[1:]):
        plp.append({"686": {"logprob": -7.5, "rank": 1, "decoded_token": "ssage"},
                    str(tid): {"logprob": -9.0 - i, "rank": 8000, "decoded_token": "x"}})
    return completion({"text": " recom", "logprobs": None, "token_ids": [7158], "prompt_logprobs": plp,
                       "prompt_token_ids": ids if body.get("return_token_ids") else None})


async def test_prompt_logprobs_picks_the_prompts_own_token_by_id(server: Any) -> None:
    start, seen = server
    url = await start(vllm_prompt_logprobs)
    async with client() as c:
        assert await prompt_logprobs(c, url, "m", "The capital") == [-9.0, -10.0, -11.0]
    body = seen[0]
    assert body["prompt_logprobs"] == 0 and body["max_tokens"] == 1 and body["return_token_ids"] is True


async def test_prompt_logprobs_without_ids_reads_single_entry_maps(server: Any) -> None:
    start, _ = server
    plp = [None, {"5": {"logprob": -2.5, "rank": 3}}, {"6": {"logprob": -1.25, "rank": 1}}]
    url = await start(lambda b: completion({"text": "x", "prompt_logprobs": plp}))
    async with client() as c:
        assert await prompt_logprobs(c, url, "m", "abc") == [-2.5, -1.25]
    # several entries and no ids: the prompt's token cannot be told apart, and it is not guessed
    plp2 = [None, {"5": {"logprob": -2.5}, "7": {"logprob": -1.0}}]
    url2 = await start(lambda b: completion({"text": "x", "prompt_logprobs": plp2}))
    async with client() as c:
        with pytest.raises(ServescopeError, match="prompt_token_ids"):
            await prompt_logprobs(c, url2, "m", "abc")


async def test_a_one_token_text_has_no_logprob(server: Any) -> None:
    start, _ = server
    url = await start(lambda b: completion({"text": "x", "prompt_logprobs": [None], "prompt_token_ids": [9]}))
    async with client() as c:
        assert await prompt_logprobs(c, url, "m", "a") == []


async def test_llamacpp_ignoring_prompt_logprobs_is_none(server: Any) -> None:
    start, _ = server
    # llama.cpp 0.3.36 answers 200 with logprobs null and no prompt_logprobs key at all
    url = await start(lambda b: completion({"text": " recom", "logprobs": None}))
    async with client() as c:
        assert await prompt_logprobs(c, url, "m", "abc") is None


async def test_a_server_rejecting_the_parameter_is_none(server: Any) -> None:
    start, _ = server
    url = await start(lambda b: web.json_response(
        {"error": {"message": "Unrecognized request argument supplied: prompt_logprobs", "code": 400}}, status=400))
    async with client() as c:
        assert await prompt_logprobs(c, url, "m", "abc") is None


@pytest.mark.parametrize("plp", [
    "nope", [], [None, "x"], [None, {}], [None, {"9": {"logprob": "low"}}], [None, {"9": {"logprob": True}}],
])
async def test_malformed_prompt_logprobs_are_one_error(server: Any, plp: Any) -> None:
    start, _ = server
    url = await start(lambda b: completion({"text": "x", "prompt_logprobs": plp, "prompt_token_ids": [1, 9]}))
    async with client() as c:
        with pytest.raises(ServescopeError):
            await prompt_logprobs(c, url, "m", "ab")


# --------------------------------------------------------------------------------------------------------
# HTTP errors
# --------------------------------------------------------------------------------------------------------


async def test_a_server_error_names_the_status_and_its_message_cleaned(server: Any) -> None:
    start, _ = server
    msg = "\x1b[2J\x1b[31mboom\x1b[0m\nengine dead; key " + KEY + " " + "x" * 500
    url = await start(lambda b: web.json_response({"error": {"message": msg, "type": "InternalServerError"}},
                                                  status=500))
    async with client(KEY) as c:
        with pytest.raises(ServescopeError) as e:
            await answer(c, url, "m", "hi", 3)
    text = str(e.value)
    assert "HTTP 500" in text and "boom engine dead" in text and url in text
    assert KEY not in text and "\x1b" not in text and "\n" not in text
    assert len(text) < 320  # the server's part is cut to 200 characters


async def test_a_plain_text_error_body_is_shown(server: Any) -> None:
    start, _ = server
    url = await start(lambda b: web.Response(status=502, text="Bad Gateway"))
    async with client() as c:
        with pytest.raises(ServescopeError, match=r"HTTP 502\): Bad Gateway"):
            await answer(c, url, "m", "hi", 3)


async def test_an_unknown_model_is_the_servers_message(server: Any) -> None:
    start, _ = server
    url = await start(lambda b: web.json_response(
        {"error": {"message": "The model `nope` does not exist.", "type": "NotFoundError", "code": 404}}, status=404))
    async with client() as c:
        with pytest.raises(ServescopeError, match=r"HTTP 404\): The model `nope` does not exist"):
            await greedy(c, url, "nope", "hi", 3)


@pytest.mark.parametrize("err", [
    {"message": "This model's maximum context length is 8192 tokens. However, your prompt contains at least 8193 "
                "input tokens, which exceeds this limit even without any output tokens. Please reduce the length "
                "of the input prompt. (parameter=input_tokens, value=8193)", "type": "BadRequestError",
     "param": "input_tokens", "code": 400},  # vLLM 0.32
    {"code": 400, "message": "request (3001 tokens) exceeds the available context size (2048 tokens), try "
                             "increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": 3001,
     "n_ctx": 2048},  # llama.cpp
])
async def test_a_prompt_too_long_is_context_too_long(server: Any, err: dict[str, Any]) -> None:
    start, _ = server
    url = await start(lambda b: web.json_response({"error": err}, status=400))
    async with client() as c:
        with pytest.raises(ContextTooLong, match="does not fit the server's context"):
            await prompt_logprobs(c, url, "m", "word " * 9000)


async def test_a_refused_key_says_how_to_give_one(server: Any) -> None:
    start, _ = server
    url = await start(lambda b: web.json_response({"error": {"message": "Unauthorized"}}, status=401))
    async with client("wrong") as c:
        with pytest.raises(ServescopeError, match=r"refused the API key \(HTTP 401\).*--api-key"):
            await answer(c, url, "m", "hi", 3)


async def test_not_json_is_one_error(server: Any) -> None:
    start, _ = server
    url = await start(lambda b: web.Response(text="<html>hello</html>"))
    async with client() as c:
        with pytest.raises(ServescopeError, match="where a JSON completion belongs"):
            await answer(c, url, "m", "hi", 3)
    url2 = await start(lambda b: web.json_response({"choices": []}))
    async with client() as c:
        with pytest.raises(ServescopeError, match="where a completion with choices belongs"):
            await answer(c, url2, "m", "hi", 3)


async def test_connection_refused_names_the_url() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: nothing answers there
        async with client() as c:
            with pytest.raises(ServescopeError) as e:
                await greedy(c, f"http://127.0.0.1:{port}", "m", "hi", 3)
    text = str(e.value)
    assert f"http://127.0.0.1:{port}/v1/completions" in text and "is the server running" in text
    assert "\n" not in text


async def test_a_url_with_credentials_is_not_shown() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        async with client() as c:
            with pytest.raises(ServescopeError) as e:
                await answer(c, f"http://user:pw@127.0.0.1:{port}", "m", "hi", 3)
    assert "pw" not in str(e.value)


# --------------------------------------------------------------------------------------------------------
# split_text
# --------------------------------------------------------------------------------------------------------


def test_split_text_prefers_paragraphs_then_sentences() -> None:
    para1 = "First sentence here. Second one follows."
    para2 = "Another paragraph. " * 5
    text = para1 + "\n\n" + para2.strip() + "\n\nShort end."
    chunks = split_text(text, 60)
    assert chunks[0] == para1 + "\n\n"  # a whole paragraph
    assert all(len(c) <= 60 for c in chunks)
    assert all(re.search(r"[.!?]\s*$", c) for c in chunks)  # every cut at a sentence end or better
    assert "".join(chunks) == text
    assert split_text(text, 10_000) == [text]
    assert split_text("", 10) == [] and split_text("  \n\n ", 10) == []


def test_split_text_cuts_words_then_characters() -> None:
    assert split_text("alpha beta gamma delta", 11) == ["alpha beta ", "gamma delta"]
    assert split_text("abcdefghij", 4) == ["abcd", "efgh", "ij"]
    with pytest.raises(ValueError):
        split_text("abc", 0)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab .!?\n\t\u3002\""), max_size=300), st.integers(1, 80))
def test_split_text_keeps_every_character_within_the_limit(text: str, max_chars: int) -> None:
    chunks = split_text(text, max_chars)
    assert all(0 < len(c) <= max_chars and c.strip() for c in chunks)
    assert re.sub(r"\s", "", "".join(chunks)) == re.sub(r"\s", "", text)
    if text.strip() and len(text) <= max_chars:
        assert chunks == [text]



def test_a_connection_dropped_before_the_answer_is_asked_once_more() -> None:
    """A pooled connection the server had just closed (keep-alive) fails the request before any answer: the probe
    asks again on a new connection, once; a second drop is the one-line error."""
    import asyncio as _asyncio

    import httpx as _httpx

    from servescope.core import probe as _probe
    from servescope.core.errors import ServescopeError as _Err

    def client(drops: int) -> tuple[_httpx.AsyncClient, list[int]]:
        calls: list[int] = []

        def handler(request: _httpx.Request) -> _httpx.Response:
            calls.append(1)
            if len(calls) <= drops:
                raise _httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
            return _httpx.Response(200, json={"choices": [{"text": " 42"}]})

        return _httpx.AsyncClient(transport=_httpx.MockTransport(handler)), calls

    async def ask(drops: int) -> tuple[str | None, str, int]:
        c, calls = client(drops)
        async with c:
            try:
                return await _probe.answer(c, "http://127.0.0.1:9", "m", "6*7=", 4), "", len(calls)
            except _Err as e:
                return None, e.message, len(calls)

    assert _asyncio.run(ask(1)) == (" 42", "", 2)
    text, err, n = _asyncio.run(ask(2))
    assert text is None and n == 2 and err.startswith(
        "http://127.0.0.1:9/v1/completions dropped the connection (Server disconnected without sending a response.); "
        "is the server restarting or overloaded?"), err
    assert "RemoteProtocolError" not in err  # a Python class name is no reason a user reads


def test_a_connection_dropped_mid_answer_says_so_not_check_the_url() -> None:
    """A reset mid-stream said `cannot talk to ...: ; check --url` (an empty reason, and the URL was right)."""
    import httpx as _httpx

    from servescope.core.target import request_failed

    req = _httpx.Request("POST", "http://h:1/v1/completions")
    for exc in (_httpx.ReadError("", request=req), _httpx.RemoteProtocolError("", request=req)):
        msg = request_failed("http://h:1/v1/completions", exc, "", "").message
        assert ": ;" not in msg and "check --url" not in msg, msg
        assert "dropped the connection (the connection was closed mid-answer" in msg and "\n" not in msg, msg
    other = request_failed("http://h:1/x", _httpx.UnsupportedProtocol("", request=req), "", "").message
    assert other == "cannot talk to http://h:1/x: unsupported protocol; check --url"
