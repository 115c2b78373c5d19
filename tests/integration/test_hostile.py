"""Hostile servers, runaway loads and kill -9, through the real CLI (issue 11).

`HostileServer` is a small aiohttp server started by the test, OpenAI-shaped enough for servescope to probe it,
whose completions misbehave in a seeded order: huge, negative and wrong-typed usage, an HTML page with
HTTP 200, a 401 that echoes the Authorization header, errors full of escape sequences, cut streams."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from aiohttp import web

from servescope.core.launchspec import free_port
from servescope.sessions.store import load_session
from tests.integration.helpers import ROOT, metrics, servescope
from tests.support.loopthread import LoopThread

KEY = "sk-hostile-test-key-6f1e2d3c4b5a"
MODEL = "hostile\x1b[31m-model\x1b]0;pwned\x07"  # escape sequences in the served model id

BAD_USAGE = {
    "huge_completion": '{"prompt_tokens": 7, "completion_tokens": 1000000000000}',
    "huge_prompt": '{"prompt_tokens": 100000000000000000000, "completion_tokens": 3}',
    "negative": '{"prompt_tokens": 7, "completion_tokens": -32}',
    "wrong_type": '{"prompt_tokens": 7, "completion_tokens": "n"}',
}
FAILING = ("html", "echo_401", "escapes_500", "cut")
# issue 32: streams that end oddly. after_done: 16 tokens, [DONE], then one more chunk (its usage says 21); only_done:
# a 200 stream of `data: [DONE]` alone; cr_only: lines ending in a lone CR (valid SSE); cr_split: CRLF line ends
# with each CR the last byte of one write and its LF the first of the next
ODD_ENDS = ("after_done", "only_done", "cr_only", "cr_split")


def _chunk(chat: bool, i: int, usage: str) -> bytes:
    choice = f'{{"index": 0, "delta": {{"content": "w{i} "}}}}' if chat else f'{{"index": 0, "text": "w{i} "}}'
    return f'data: {{"choices": [{choice}], "usage": {usage}}}\n\n'.encode()


class HostileServer(LoopThread):
    """Runs in a thread with its own event loop. `plan` is the behaviour of each completion request, in order
    (requests past its end are ok); `tokenize` is what POST /tokenize answers (None: 404)."""

    def __init__(self, plan: list[str], tokenize: Any = None, model: str = MODEL) -> None:
        self.plan = plan
        self.tokenize = tokenize
        self.model = model
        self.n = 0
        self.url = ""
        super().__init__()

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_post("/tokenize", self.tok)
        app.router.add_post("/v1/completions", self.complete)
        app.router.add_post("/v1/chat/completions", self.complete)
        await self._serve_app(app)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.model, "max_model_len": 8192}]})

    async def tok(self, request: web.Request) -> web.Response:
        if self.tokenize is None:
            return web.Response(status=404, text="no tokenizer here")
        return web.json_response(self.tokenize)

    async def complete(self, request: web.Request) -> web.StreamResponse:
        if (await request.json()).get("max_tokens") == 1:  # the length calibration's probes (no /tokenize): no plan
            kind = "ok"
        else:
            kind = self.plan[self.n] if self.n < len(self.plan) else "ok"
            self.n += 1
        chat = request.path.endswith("chat/completions")
        if kind == "html":
            return web.Response(text="<html><body><h1>Welcome to nginx!</h1></body></html>", content_type="text/html")
        if kind == "echo_401":
            auth = request.headers.get("Authorization", "")
            return web.json_response({"error": {"message": f"invalid key: {auth}"}}, status=401)
        if kind == "escapes_500":
            return web.json_response({"error": {"message": "boom \x1b[2J\x1b[31mred\x1b]52;c;Zm9v\x07 end"}},
                                     status=500)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if kind in ODD_ENDS:
            await self._odd_end(resp, kind, chat)
            return resp
        for i in range(3):
            usage = BAD_USAGE[kind] if kind in BAD_USAGE and i == 1 else \
                json.dumps({"prompt_tokens": 7, "completion_tokens": i + 1})
            await resp.write(_chunk(chat, i, usage))
            if kind == "cut" and i == 1:
                return resp  # ends without [DONE]
        await resp.write(b"data: [DONE]\n\n")
        return resp


    @staticmethod
    async def _odd_end(resp: web.StreamResponse, kind: str, chat: bool) -> None:
        def usage(n: int) -> str:
            return json.dumps({"prompt_tokens": 7, "completion_tokens": n})

        if kind == "only_done":
            await resp.write(b"data: [DONE]\n\n")
        elif kind == "after_done":
            for i in range(16):
                await resp.write(_chunk(chat, i, usage(i + 1)))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write(_chunk(chat, 16, usage(21)))
        elif kind == "cr_only":
            for i in range(3):
                await resp.write(_chunk(chat, i, usage(i + 1)).replace(b"\n", b"\r"))
            await resp.write(b"data: [DONE]\r\r")
        else:  # cr_split
            for i in range(3):
                head, _, _ = _chunk(chat, i, usage(i + 1)).partition(b"\n")
                await resp.write(head + b"\r")
                await asyncio.sleep(0.005)  # its own read, most likely: the LF arrives apart from its CR
                await resp.write(b"\n\r\n")
            await resp.write(b"data: [DONE]\r")
            await asyncio.sleep(0.005)
            await resp.write(b"\n\r\n")


def _plan(seed: int) -> list[str]:
    """Every hostile behaviour once, in a seeded order, each followed by an ok request (so the cell never
    stops early on failures in a row)."""
    kinds = [*BAD_USAGE, *FAILING]
    random.Random(seed).shuffle(kinds)
    return [x for k in kinds for x in (k, "ok")]


def _no_key_anywhere(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            assert KEY.encode() not in p.read_bytes(), p


@pytest.mark.parametrize("seed", [0, 1])
def test_a_hostile_server_is_measured_not_believed(tmp_path: Path, seed: int) -> None:
    plan = _plan(seed)
    save = tmp_path / "s"
    with HostileServer(plan) as srv:
        p = servescope("run", "--url", srv.url, "--model", MODEL, "-w", "sharegpt", "-c", "1", "-n", str(len(plan)),
                       "--telemetry-interval", "off", "--save", str(save), "--api-key-env", "HOSTILE_KEY", "--json",
                       env={"HOSTILE_KEY": KEY}, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["status"] == "completed"
    (cell,) = out["cells"]
    n_ok = plan.count("ok")
    assert cell["requests_ok"] == n_ok and cell["requests_failed"] == len(plan) - n_ok
    assert cell["requests_bad_usage"] == len(BAD_USAGE)
    assert cell["output_tokens_mean"] == 3 and cell["input_tokens_mean"] == 7  # only the ok requests count
    assert cell["goodput_req_s"] == pytest.approx(cell["request_s"])
    for m in ("ttft_ms", "tpot_ms", "e2e_ms", "per_user_tok_s"):
        assert all(v is None or v >= 0 for v in cell[m].values())
    # what the terminal shows: no escape sequence from the server, no key
    assert "\x1b" not in p.stdout + p.stderr and "\x07" not in p.stdout + p.stderr
    assert KEY not in p.stdout + p.stderr
    assert "model hostile-model" in p.stderr  # the header line, cleaned
    # what is stored: every request, with its reason; the raw usage kept; no key anywhere
    s = load_session(save)
    assert s.status == "completed"
    req = s.requests(0)
    assert req.height == len(plan)
    by = {k: req.filter(pl.col("index") == i).row(0, named=True) for i, k in enumerate(plan) if k != "ok"}
    for k in BAD_USAGE:
        assert by[k]["status"] == "bad_usage" and by[k]["first_token_ns"] > 0 and len(by[k]["chunk_ns"]) == 3
    assert "1000000000000" in by["huge_completion"]["error"] and "-32" in by["negative"]["error"]
    assert '"n"' in by["wrong_type"]["error"] and "21 digits" in by["huge_prompt"]["error"]
    assert by["html"]["status"] == "error" and "Content-Type text/html" in by["html"]["error"]
    assert by["echo_401"]["error"].startswith("HTTP 401: invalid key: Bearer ••••")
    assert by["escapes_500"]["error"] == "HTTP 500: boom red end"
    assert by["cut"]["status"] == "cut"
    assert req.filter(pl.col("error").str.contains(KEY, literal=True)).height == 0
    _no_key_anywhere(save)


def test_garbage_tokenize_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with HostileServer([], tokenize={"count": "many", "tokens": [1]}, model="m") as srv:
        p = servescope("run", "--url", srv.url, "-w", "sharegpt", "-c", "1", "-n", "2", "--telemetry-interval", "off",
                       env={"SERVESCOPE_HOME": str(home)}, timeout=60)
        assert srv.n == 0  # no request was sent
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("servescope run: error: ")
    assert '/tokenize answered "many" where a token count belongs' in lines[0] and "--tokenizer PATH" in lines[0]
    assert not list(home.rglob("session.toml"))  # no session left behind as `running`


def test_unknown_sim_profile_says_so_at_once() -> None:
    t0 = time.monotonic()
    p = servescope("run", "--url", "sim://nope", "-c", "1", "-n", "1", timeout=60)
    took = time.monotonic() - t0
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("servescope run: error: sim://nope: unknown profile 'nope'")
    assert "tiny" in lines[0]  # the profiles are listed
    assert "did not listen" not in lines[0]
    # at once: about as soon as a flag refused before anything starts (the same start-up, measured now on this
    # host), not after a simulator was started and waited for
    t0 = time.monotonic()
    base = servescope("run", "--url", "sim://tiny", "-c", "", timeout=60)
    base_s = time.monotonic() - t0
    assert base.returncode == 2 and "--concurrency: empty" in base.stderr
    assert took < 3 * base_s + 3, (took, base_s)


@pytest.mark.parametrize("args, says", [
    (["-c", ""], "--concurrency: empty"),
    (["--rate", ""], "--rate: empty"),
    (["-n", ""], "--requests: empty"),
    (["--max-concurrency", "0", "--rate", "2"], "--max-concurrency: must be an integer of at least 1"),
    (["--slo", "ttft_ms=nan"], "ttft_ms must be a number above 0"),
    (["--slo", "ttft_ms=-5"], "ttft_ms must be a number above 0"),
    (["--slo", "ttft_ms=inf"], "ttft_ms must be a number above 0"),
    (["--electricity-price", "-3"], "--electricity-price: must be a price of 0 or more"),
    (["--electricity-price", "nan"], "--electricity-price: must be a price of 0 or more"),
])
def test_bad_bounds_are_refused_up_front(args: list[str], says: str) -> None:
    from servescope.__main__ import _parser
    from servescope.core.errors import ServescopeError
    from servescope.engine.spec import SweepSpec

    ns = _parser().parse_args(["run", "--url", "http://127.0.0.1:9", *args])
    with pytest.raises(ServescopeError) as e:
        SweepSpec.from_args(ns)
    assert says in e.value.message


def _children_cpu_s() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


@pytest.mark.slow  # ~4.7 s of the --fast lane on 2 busy cores (2026-12-08)
def test_a_hundred_million_users_for_two_requests(tmp_path: Path) -> None:
    cpu0 = _children_cpu_s()
    p = servescope("run", "--url", "sim://tiny", "-w", "sharegpt", "-c", "100000000", "-n", "2",
                   "--telemetry-interval", "off", "--save", str(tmp_path / "s"), "--json", timeout=300)
    cpu = _children_cpu_s() - cpu0  # servescope and the simulator it started and reaped: CPU time, not wall
    assert p.returncode == 0, p.stderr[-2000:]
    (cell,) = json.loads(p.stdout.strip().splitlines()[-1])["cells"]
    assert cell["requests_ok"] == 2 and cell["concurrency"] == 100000000
    # two users started, not 10**8: the whole run costs seconds of CPU (10**8 tasks or slots would cost minutes)
    assert cpu < 30, f"{cpu:.1f} s of CPU"


def _limit_open_files(n: int) -> Any:
    def pre() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

    return pre


def test_more_users_than_open_files_is_refused_with_the_number_that_fits(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {**os.environ, "SERVESCOPE_HOME": str(home)}
    p = subprocess.run([sys.executable, "-m", "servescope", "run", "--url", "sim://tiny", "-c", "2048", "-n", "2048"],
                       capture_output=True, text=True, timeout=60, env=env, cwd=ROOT,
                       preexec_fn=_limit_open_files(1024))  # noqa: PLW1509 (the test's own child, no threads)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "use at most 960" in lines[0] and "ulimit -n" in lines[0]
    assert not list(home.rglob("session.toml"))  # never `completed` with nothing measured


# ---- kill -9 of servescope: its children go too --------------------------------------------------------------
def _refused(url: str) -> bool:
    try:
        urllib.request.urlopen(url + "/health", timeout=1).close()
        return False
    except urllib.error.HTTPError:
        return False
    except OSError:
        return True


def _wait(cond: Any, limit_s: float) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return False


def _kill_9_midway(args: list[str], url_of: Any, tmp_path: Path) -> str:
    """Start `servescope run ARGS` in a session of its own, wait until its server answers and a cell runs,
    kill -9 servescope alone (not its group), and return the server's URL."""
    save = tmp_path / "s"
    proc = subprocess.Popen([sys.executable, "-m", "servescope", "run", *args, "-w", "longout", "-c", "2", "-n", "200",
                             "--telemetry-interval", "off", "--save", str(save)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines: list[str] = []

    def read() -> None:
        for line in proc.stderr or []:
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    try:
        url = ""
        assert _wait(lambda: bool(url_of(lines)), 120), lines
        url = url_of(lines)
        assert _wait(lambda: metrics(url).get("vllm:num_requests_running", 0.0) > 0, 120), lines  # in flight
        assert proc.poll() is None, lines
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(10)
    return url


def test_kill_9_during_a_sim_run_stops_the_simulator(tmp_path: Path) -> None:
    def url_of(lines: list[str]) -> str:
        m = next((re.search(r"started the simulator \(sim://tiny\) at (\S+)", x) for x in lines
                  if "started the simulator" in x), None)
        return m.group(1) if m else ""

    url = _kill_9_midway(["--url", "sim://tiny"], url_of, tmp_path)
    assert _wait(lambda: _refused(url), 60), f"the simulator still answers at {url}"


@pytest.mark.slow  # ~2.6 s of the --fast lane on 2 busy cores (2026-12-08)
def test_kill_9_during_a_launched_run_stops_the_launched_server(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    launch = f"{sys.executable} -m servescope.sim --profile tiny --port {port}"
    _kill_9_midway(["--launch", launch], lambda lines: url if not _refused(url) else "", tmp_path)
    assert _wait(lambda: _refused(url), 60), f"the launched server still answers at {url}"


def test_wide_numbers_in_the_cli_table_stay_separated() -> None:
    from types import SimpleNamespace

    from servescope.cli.run import format_cell
    from servescope.core.results import CellResult

    wide = {"mean": 149971.83, "p50": 181907.92, "p90": 246017.73, "p99": 12345678.9, "max": 99999999.99}
    s = CellResult.from_dict({"requests_ok": 1, "per_user_tok_s": wide, "ttft_ms": wide, "requests_bad_usage": 2})
    ev = SimpleNamespace(cell=SimpleNamespace(index=0, label="w c=1"), summary=s, status="done", reason="")
    text = format_cell(ev, 1)
    row = next(x for x in text.splitlines() if x.strip().startswith("TTFT ms"))
    assert row.split()[-5:] == ["149,971.83", "181,907.92", "246,017.73", "12,345,678.90", "99,999,999.99"]
    assert "1 ok, 0 failed (2 with bad usage)" in text


# ---- issue 32: streams that end oddly, through every transport and through the CLI ------------------------------
@pytest.mark.parametrize("transport", ["raw", "aiohttp", "httpx"])
async def test_odd_stream_ends_through_each_transport(transport: str) -> None:
    from servescope.core.client import ClientOptions, RequestSpec, make_http_client, stream_request
    from servescope.core.records import RequestRecord

    got: dict[str, RequestRecord] = {}
    with HostileServer(list(ODD_ENDS)) as srv:
        opts = ClientOptions(base_url=srv.url, model=MODEL, timeout_s=20, transport=transport)
        async with make_http_client(opts, 1) as http:
            for kind in ODD_ENDS:
                rec = RequestRecord(0, 0, False, 7, 16, scheduled_ns=time.perf_counter_ns())
                got[kind] = await stream_request(http, opts, RequestSpec("completions", "hi", 7, 16), rec)
            after = RequestRecord(0, 0, False, 7, 3, scheduled_ns=time.perf_counter_ns())
            await stream_request(http, opts, RequestSpec("completions", "hi", 7, 3), after)  # an ok one next
    a = got["after_done"]
    assert (a.status, a.output_tokens, len(a.chunk_ns)) == ("ok", 16, 16)  # not 21 tokens and 17 chunks
    assert a.error == "ignored 1 event the server sent after [DONE] (the stream ends there)"
    assert a.chunk_ns[-1] <= a.end_ns
    e = got["only_done"]
    assert e.status == "error" and e.error.startswith("empty stream: no token before [DONE]")
    assert e.output_tokens == 0 and not e.chunk_ns
    for kind in ("cr_only", "cr_split"):
        r = got[kind]
        assert (r.status, r.error, r.output_tokens, len(r.chunk_ns)) == ("ok", "", 3, 3), kind
    assert after.status == "ok" and after.output_tokens == 3  # the connection after a stream cut at [DONE]


def test_odd_stream_ends_in_a_run_count_only_what_came_before_done(tmp_path: Path) -> None:
    plan = [x for k in ODD_ENDS for x in (k, "ok")]
    save = tmp_path / "s"
    with HostileServer(plan) as srv:
        # --window whole: the rates over the cell's wall time, as request_s = requests_ok / wall_s below reads them
        p = servescope("run", "--url", srv.url, "--model", MODEL, "-w", "sharegpt", "-c", "1", "-n", str(len(plan)),
                       "--telemetry-interval", "off", "--window", "whole", "--save", str(save), "--json", timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    (cell,) = json.loads(p.stdout.strip().splitlines()[-1])["cells"]
    assert cell["requests_ok"] == len(plan) - 1 and cell["requests_failed"] == 1  # only_done is the one failure
    # 16 + 3 + 3 tokens and four ok requests of 3: the chunk after [DONE] (usage 21) counts nowhere
    assert cell["output_tokens_mean"] == pytest.approx((16 + 3 + 3 + 4 * 3) / cell["requests_ok"])
    assert cell["request_s"] == pytest.approx(cell["requests_ok"] / cell["wall_s"])
    req = load_session(save).requests(0)
    by = {k: req.filter(pl.col("index") == i).row(0, named=True) for i, k in enumerate(plan) if k != "ok"}
    assert by["only_done"]["status"] == "error" and "empty stream" in by["only_done"]["error"]
    assert by["after_done"]["output_tokens"] == 16 and len(by["after_done"]["chunk_ns"]) == 16
    assert "after [DONE]" in by["after_done"]["error"]
    assert by["cr_only"]["status"] == by["cr_split"]["status"] == "ok"
