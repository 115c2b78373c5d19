"""A server whose `usage` lies (issue 44, item 17), through the real CLI, the session and the report: a usage that
says twice the tokens streamed (with and without /tokenize), and a server that stops after 2 of 8 tokens although
ignore_eos was sent. Each is counted against the stream and said: a warning on the terminal, the cell's
`output_check` in the session, a note in the report. The simulator lies too (`servescope sim --usage-factor 2`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from servescope.sessions.store import load_session
from tests.integration.helpers import servescope
from tests.support.loopthread import LoopThread
from tests.support.meta import stored

# the --fast lane leaves this module out: 3 tests, ~5 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

OUT = 8  # the workload's output tokens (max_tokens)
WORKLOAD = f'[workload]\nname = "tiny-out"\napi = "completions"\ninput_tokens = 24\noutput_tokens = {OUT}\n'


class LyingServer(LoopThread):
    """An OpenAI-shaped server in a thread. `lie`: "double" streams OUT tokens and says 2 x OUT in its final usage
    (no running usage); "short" streams 2 tokens, then [DONE], whatever ignore_eos asked. `tokenize`: a /tokenize and
    /detokenize that count words (each word a token), else 404."""

    def __init__(self, lie: str, tokenize: bool) -> None:
        self.lie, self.tokenize = lie, tokenize
        self.vocab: dict[str, int] = {}
        self.words: list[str] = []
        self.url = ""
        self.eos_sent: list[bool] = []
        super().__init__()

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_post("/tokenize", self.tok)
        app.router.add_post("/detokenize", self.detok)
        app.router.add_post("/v1/completions", self.complete)
        await self._serve_app(app)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "liar", "max_model_len": 4096}]})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    def _ids(self, text: str) -> list[int]:
        out = []
        for w in text.split():
            if w not in self.vocab:
                self.vocab[w] = len(self.words)
                self.words.append(w)
            out.append(self.vocab[w])
        return out

    async def tok(self, request: web.Request) -> web.Response:
        if not self.tokenize:
            return web.Response(status=404, text="no")
        body = await request.json()
        text = body.get("prompt") or " ".join(m["content"] for m in body.get("messages", []))
        ids = self._ids(text)
        return web.json_response({"count": len(ids), "tokens": ids})

    async def detok(self, request: web.Request) -> web.Response:
        if not self.tokenize:
            return web.Response(status=404, text="no")
        return web.json_response({"prompt": " ".join(self.words[i] for i in (await request.json())["tokens"])})

    async def complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n_in = len(str(body.get("prompt", "")).split())
        want = int(body.get("max_tokens", 1))
        if want > 1:
            self.eos_sent.append(bool(body.get("ignore_eos")))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        n = 2 if self.lie == "short" and want > 2 else want
        for i in range(n):
            await resp.write(b"data: " + json.dumps({"choices": [{"index": 0, "text": f" w{i}"}]}).encode() + b"\n\n")
        said = 2 * n if self.lie == "double" and want > 1 else n
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": n_in,
                                                                           "completion_tokens": said}}).encode()
                         + b"\n\n" + b"data: [DONE]\n\n")
        return resp


def _run(tmp_path: Path, url: str) -> tuple[dict[str, Any], str, Path]:
    (tmp_path / "w.toml").write_text(WORKLOAD)
    save = tmp_path / "s"
    p = servescope("run", "--url", url, "--model", "liar", "-w", str(tmp_path / "w.toml"), "-c", "2", "-n", "8",
                   "--telemetry-interval", "off", "--save", str(save), "--json", timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])["cells"][0], p.stderr, save


def _said_everywhere(save: Path, stderr: str, phrase: str) -> dict[str, Any]:
    """The phrase in a terminal warning, in the session's summary and events, and in the report's notes."""
    assert any(line.startswith("warning: cell 1 (") and phrase in line for line in stderr.splitlines()), stderr
    s = load_session(save)
    [summary] = s.summaries()
    assert summary is not None and summary.output_check is not None
    assert any(phrase in n for n in summary.output_check.notes), summary.output_check
    events = stored(s).get("events")
    assert isinstance(events, list) and any(phrase in str(e.get("text")) for e in events), events
    rep = servescope("report", str(save))
    assert rep.returncode == 0, rep.stderr
    notes = rep.stdout.split("## Notes", 1)[1]
    assert phrase.replace("_", "\\_") in notes, notes
    return summary.output_check.to_dict()


@pytest.mark.parametrize("tokenize", [False, True], ids=["no-tokenize", "tokenize"])
def test_a_usage_of_twice_the_tokens_streamed_is_said(tmp_path: Path, tokenize: bool) -> None:
    with LyingServer("double", tokenize) as srv:
        cell, err, save = _run(tmp_path, srv.url)
    assert cell["output_tokens_mean"] == 2 * OUT  # the server's count stands (and is said)
    check = _said_everywhere(save, err, "usage.completion_tokens differs from the tokens streamed on 8 of 8 requests")
    assert (check["said"], check["streamed"], check["usage_vs_stream"]) == (8 * 2 * OUT, 8 * OUT, 8)
    assert check["over_max_tokens"] == 8 and check["short"] == 0
    assert "(2.00x what was streamed)" in err and f"(up to {2 * OUT} for {OUT} asked)" in err


def test_a_server_that_stops_before_max_tokens_with_ignore_eos_is_said(tmp_path: Path) -> None:
    with LyingServer("short", tokenize=True) as srv:
        cell, err, save = _run(tmp_path, srv.url)
        assert srv.eos_sent and all(srv.eos_sent)  # ignore_eos was asked every time
    assert cell["output_tokens_mean"] == 2
    check = _said_everywhere(save, err, "8 of 8 requests ended before max_tokens although ignore_eos was sent")
    assert check["short"] == 8 and check["usage_vs_stream"] == 0 and check["over_max_tokens"] == 0
    assert "(mean 2.0 of 8.0 tokens)" in err


@pytest.mark.slow
def test_the_simulator_with_a_lying_usage_is_said(tmp_path: Path) -> None:
    save = tmp_path / "s"
    p = servescope("run", "--launch", "servescope sim --profile tiny --usage-factor 2", "-w", "sharegpt", "-c", "2",
                   "-n", "6", "--telemetry-interval", "off", "--save", str(save), "--json", timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    check = _said_everywhere(save, p.stderr, "usage.completion_tokens is above max_tokens on 6 of 6 requests")
    assert check["usage_vs_stream"] == 6 and check["said"] == 2 * check["streamed"]


@pytest.mark.slow
def test_an_honest_simulator_says_nothing(tmp_path: Path) -> None:
    save = tmp_path / "s"
    p = servescope("run", "--url", "sim://tiny", "-w", "sharegpt,sharegpt-think,chat-multiturn", "-c", "2", "-n", "4",
                   "--telemetry-interval", "off", "--save", str(save), "--json", timeout=180)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "usage.completion_tokens" not in p.stderr and "ignore_eos" not in p.stderr
    assert all(s is not None and s.output_check is None for s in load_session(save).summaries())
