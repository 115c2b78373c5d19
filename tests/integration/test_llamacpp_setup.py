"""The real llama.cpp server of the test suite (.ci/setup_llamacpp.sh, tests/support/llamacpp_server.py), and the
facts about its HTTP API that servescope's llama.cpp adapter relies on, checked against both tiny GGUFs.

A cold .ci/setup_llamacpp.sh builds llama.cpp (about 8 minutes on 2 cores): hence the long timeout.
SERVESCOPE_SKIP_LLAMACPP=1 skips these tests on purpose.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import llamacpp_server
from tests.support.llamacpp_server import LlamaCppServer

pytestmark = pytest.mark.timeout(1800)

ROOT = Path(__file__).resolve().parents[2]
CTX, PARALLEL = 4096, 4
PROMPT = "def main():\n    return"


@pytest.fixture(scope="module")
def built() -> tuple[Path, Path]:
    if os.environ.get("SERVESCOPE_SKIP_LLAMACPP") == "1":
        pytest.skip("SERVESCOPE_SKIP_LLAMACPP=1: real llama.cpp tests skipped on purpose")
    return llamacpp_server.setup()


@pytest.fixture(scope="module", params=["tiny-f16.gguf", "tiny-q4_k_m.gguf"])
def server(request: pytest.FixtureRequest, built: tuple[Path, Path]) -> Iterator[LlamaCppServer]:
    _, models = built
    with llamacpp_server.running(models / request.param, ctx=CTX, parallel=PARALLEL) as srv:
        yield srv


def _get(srv: LlamaCppServer, path: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(srv.url + path, timeout=30) as r:
        return r.status, r.read()


def _get_json(srv: LlamaCppServer, path: str) -> Any:
    status, body = _get(srv, path)
    assert status == 200, (path, status, body[:500])
    return json.loads(body)


def _post_json(srv: LlamaCppServer, path: str, payload: dict[str, Any]) -> Any:
    req = urllib.request.Request(srv.url + path, data=json.dumps(payload).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200
        return json.loads(r.read())


def _stream(srv: LlamaCppServer, path: str, payload: dict[str, Any]) -> list[dict[str, Any]]:
    """POST with stream=true; return the SSE `data:` chunks (JSON) up to `data: [DONE]`."""
    req = urllib.request.Request(srv.url + path, data=json.dumps({**payload, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    chunks: list[dict[str, Any]] = []
    done = False
    with urllib.request.urlopen(req, timeout=60) as r:
        assert r.status == 200
        assert r.headers.get("Content-Type", "").startswith("text/event-stream")
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                done = True
                break
            chunks.append(json.loads(data))
    assert done, "the stream ended without data: [DONE]"
    return chunks


def _metrics(srv: LlamaCppServer) -> dict[str, float]:
    status, body = _get(srv, "/metrics")
    assert status == 200
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        m = re.fullmatch(r"(llamacpp:[A-Za-z_:0-9]+)(?:\{[^}]*\})? (\S+)", line.strip())
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def _model_id(srv: LlamaCppServer) -> str:
    return str(_get_json(srv, "/v1/models")["data"][0]["id"])


def test_setup_is_cached_idempotent_and_prints_two_lines(built: tuple[Path, Path]) -> None:
    binary, models = built
    t0 = time.monotonic()
    out = subprocess.run(["bash", str(ROOT / ".ci" / "setup_llamacpp.sh")], capture_output=True, text=True,
                         check=True)
    elapsed = time.monotonic() - t0
    assert out.stdout.strip().splitlines()[-2:] == [str(binary), str(models)]
    assert elapsed < 60, f"a cached setup_llamacpp.sh took {elapsed:.0f} s"
    assert binary.name == "llama-server" and os.access(binary, os.X_OK)
    assert not binary.resolve().is_relative_to(ROOT) and not models.resolve().is_relative_to(ROOT)
    f16, q4 = models / "tiny-f16.gguf", models / "tiny-q4_k_m.gguf"
    for f in (f16, q4):
        assert f.read_bytes()[:4] == b"GGUF", f
    assert q4.stat().st_size < f16.stat().st_size
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30)
    assert version.returncode == 0, version.stderr
    assert "version" in version.stdout + version.stderr


def test_health_and_models(server: LlamaCppServer) -> None:
    status, body = _get(server, "/health")
    assert status == 200 and json.loads(body) == {"status": "ok"}
    models = _get_json(server, "/v1/models")
    assert models["object"] == "list" and len(models["data"]) == 1
    entry = models["data"][0]
    # without --alias the model id is the -m argument, the GGUF's path as given
    assert entry["id"] == str(server.model) and entry["object"] == "model" and entry["owned_by"] == "llamacpp"
    meta = entry["meta"]
    # meta.n_ctx is one slot's context: -c / --parallel
    assert meta["n_ctx"] == CTX // PARALLEL and meta["n_ctx_train"] == 8192 and meta["n_vocab"] == 8192
    assert meta["ftype"] == {"tiny-f16.gguf": "F16", "tiny-q4_k_m.gguf": "Q4_K - Medium"}[server.model.name]
    # the Ollama-style list next to the OpenAI one
    assert [m["model"] for m in models["models"]] == [str(server.model)]


def test_streamed_completion_exact_tokens_usage_timings_and_metrics(server: LlamaCppServer) -> None:
    before = _metrics(server)
    chunks = _stream(server, "/v1/completions", {
        "model": _model_id(server), "prompt": PROMPT, "max_tokens": 8, "ignore_eos": True, "temperature": 0,
        "stream_options": {"include_usage": True},
    })
    assert all(c["object"] == "text_completion" for c in chunks)
    # one chunk per generated token, then a final chunk: text "", finish_reason, usage and timings
    assert len(chunks) == 9
    assert all(c["choices"][0]["finish_reason"] is None and "usage" not in c for c in chunks[:-1])
    final = chunks[-1]
    assert final["choices"][0]["finish_reason"] == "length" and final["choices"][0]["text"] == ""
    usage = final["usage"]
    assert usage["completion_tokens"] == 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + 8
    # the tiny vocabulary adds no BOS: /tokenize counts the prompt as the server does
    n_prompt = len(_post_json(server, "/tokenize", {"content": PROMPT, "add_special": True})["tokens"])
    assert usage["prompt_tokens"] == n_prompt
    # llama.cpp's own timings ride on the final chunk; usage.prompt_tokens includes the cached prefix
    timings = final["timings"]
    assert timings["predicted_n"] == 8 and timings["prompt_n"] + timings["cache_n"] == n_prompt
    assert usage["prompt_tokens_details"]["cached_tokens"] == timings["cache_n"]
    for k in ("prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_ms",
              "predicted_per_token_ms", "predicted_per_second"):
        assert isinstance(timings[k], (int, float)), k
    text = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
    assert text, "no text streamed"
    after = _metrics(server)
    assert after["llamacpp:tokens_predicted_total"] - before.get("llamacpp:tokens_predicted_total", 0) == 8
    assert after["llamacpp:prompt_tokens_total"] - before.get("llamacpp:prompt_tokens_total", 0) == timings["prompt_n"]
    for name in ("llamacpp:prompt_tokens_cached_total", "llamacpp:prompt_seconds_total",
                 "llamacpp:tokens_predicted_seconds_total", "llamacpp:n_decode_total",
                 "llamacpp:requests_processing", "llamacpp:requests_deferred"):
        assert name in after, name


def test_streamed_chat_usage_only_with_include_usage(server: LlamaCppServer) -> None:
    body = {"model": _model_id(server), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
            "ignore_eos": True, "temperature": 0}
    with_usage = _stream(server, "/v1/chat/completions", {**body, "stream_options": {"include_usage": True}})
    last = with_usage[-1]
    # chat (unlike /v1/completions) follows OpenAI: usage only on request, in an extra chunk with no choices
    assert last["object"] == "chat.completion.chunk"
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 8
    assert last["timings"]["predicted_n"] == 8
    assert with_usage[-2]["choices"][0]["finish_reason"] == "length"
    without = _stream(server, "/v1/chat/completions", body)
    assert not any("usage" in c for c in without)
    assert without[-1]["choices"][0]["finish_reason"] == "length" and without[-1]["timings"]["predicted_n"] == 8


def test_completion_usage_without_include_usage(server: LlamaCppServer) -> None:
    chunks = _stream(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "ignore_eos": True})
    assert chunks[-1]["usage"]["completion_tokens"] == 8


def test_tokenize_detokenize(server: LlamaCppServer) -> None:
    plain = _post_json(server, "/tokenize", {"content": PROMPT})
    assert set(plain) == {"tokens"} and all(isinstance(t, int) for t in plain["tokens"]) and plain["tokens"]
    special = _post_json(server, "/tokenize", {"content": PROMPT, "add_special": True})["tokens"]
    assert len(special) >= len(plain["tokens"])
    pieces = _post_json(server, "/tokenize", {"content": PROMPT, "with_pieces": True})["tokens"]
    assert [p["id"] for p in pieces] == plain["tokens"]
    assert "".join(p["piece"] for p in pieces) == PROMPT
    back = _post_json(server, "/detokenize", {"tokens": plain["tokens"]})
    assert back == {"content": PROMPT}


def test_props_and_slots(server: LlamaCppServer) -> None:
    props = _get_json(server, "/props")
    assert props["total_slots"] == PARALLEL
    assert props["model_path"] == str(server.model)
    assert props["model_alias"] == str(server.model)
    # one slot's context (-c / --parallel), the KV budget of one user
    assert props["default_generation_settings"]["n_ctx"] == CTX // PARALLEL
    assert props["endpoint_metrics"] is True and props["endpoint_slots"] is True
    assert props["bos_token"] == "<s>" and props["eos_token"] == "</s>"
    assert isinstance(props["build_info"], str) and "chat_template" in props
    slots = _get_json(server, "/slots")
    assert [s["id"] for s in slots] == list(range(PARALLEL))
    assert all(s["n_ctx"] == CTX // PARALLEL and s["is_processing"] is False for s in slots)


def test_prompt_over_the_slot_context_is_a_400(server: LlamaCppServer) -> None:
    req = urllib.request.Request(server.url + "/v1/completions", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"prompt": "x " * 2000, "max_tokens": 8}).encode())
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=60)
    assert err.value.code == 400
    body = json.loads(err.value.read())
    assert body["error"]["type"] == "exceed_context_size_error" and body["error"]["n_ctx"] == CTX // PARALLEL
