"""Fault flags, KV pressure over HTTP, the launcher and the command line."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time

import aiohttp
import httpx
import pytest

from servescope.sim.cli import main
from servescope.sim.launcher import SimStartError, list_profiles, start_sim
from tests.sim.sse import stream


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


async def test_preemptions_with_a_tiny_kv_cache() -> None:
    with start_sim("tiny", ["--kv-cache-tokens", "512", "--max-model-len", "512"]) as h:
        async with aiohttp.ClientSession() as s:
            async def one(i: int) -> int:
                async with s.post(h.url + "/v1/completions", json={"prompt": f"user {i} " * 12, "max_tokens": 96,
                                                                   "ignore_eos": True}) as r:
                    return int((await r.json())["usage"]["completion_tokens"])

            assert await asyncio.gather(*(one(i) for i in range(8))) == [96] * 8
            async with s.get(h.url + "/metrics") as r:
                text = await r.text()
    assert _metric(text, "vllm:num_preemptions_total") > 0
    assert 'kv_cache_size_tokens="512"' in text
    assert _metric(text, "vllm:kv_cache_usage_perc") == 0.0  # everything freed at the end


def test_error_rate() -> None:
    with start_sim("tiny", ["--error-rate", "0.5", "--seed", "3"]) as h, httpx.Client(base_url=h.url) as c:
        answers = [c.post("/v1/completions", json={"prompt": "x", "max_tokens": 1}) for _ in range(30)]
        codes = [r.status_code for r in answers]
        assert set(codes) == {200, 500} and 5 <= codes.count(500) <= 25
        body = next(r for r in answers if r.status_code == 500).json()
        assert body["error"]["code"] == 500 and body["error"]["type"] == "InternalServerError"


async def test_cut_stream_rate() -> None:
    with start_sim("tiny", ["--cut-stream-rate", "1"]) as h:
        events, done, _ = await stream(h.url, "/v1/completions",
                                       {"prompt": "x", "max_tokens": 20, "ignore_eos": True, "stream": True,
                                        "stream_options": {"include_usage": True}})
        assert not done and 1 <= len(events) < 20
        assert all(e["choices"] for e in events)  # no usage event either
        async with aiohttp.ClientSession() as s, s.get(h.url + "/health") as r:
            assert r.status == 200  # the server lives on


def test_exit_after_requests() -> None:
    with start_sim("tiny", ["--exit-after-requests", "2"]) as h, httpx.Client(base_url=h.url) as c:
        for _ in range(2):
            assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
        assert h.proc.wait(5) != 0


def test_exit_at() -> None:
    t = time.monotonic()
    with start_sim("tiny", ["--exit-at", "0.5"]) as h:
        assert h.proc.wait(60) != 0  # it ends by itself, abruptly (a generous limit: it returns at the exit)
        lived = time.monotonic() - t
        assert "exiting abruptly (--exit-at)" in "\n".join(h.log_tail())  # at its timer, not for another reason
    assert lived >= 0.5  # not before its time (how soon after it is benchmarks/loop_timings.py's figure)


def test_unknown_profile_fails_with_actionable_message() -> None:
    with pytest.raises(SimStartError) as e:
        start_sim("no-such-profile", timeout_s=10)
    msg = e.value.message
    assert "\n" not in msg and "no-such-profile" in msg and "tiny" in msg


def test_cli_list_and_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(list_profiles()) >= 7
    assert any(line.startswith("tiny ") for line in out)
    assert main(["--profile", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "available:" in err and "tiny" in err


def test_startup_lines() -> None:
    """What the simulator prints as it starts (how soon: benchmarks/loop_timings.py)."""
    proc = subprocess.Popen([sys.executable, "-m", "servescope.sim", "--profile", "dgx-spark/gemma-4-31b-awq",
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        assert re.fullmatch(r"servescope-sim listening on http://127\.0\.0\.1:\d+\n", line)
        log = "".join(proc.stderr.readline() for _ in range(4))
        assert "GPU KV cache size: 12,752 tokens" in log
        assert "Maximum concurrency for 32,768 tokens per request: 2.4" in log
    finally:
        proc.terminate()
        proc.wait(60)
