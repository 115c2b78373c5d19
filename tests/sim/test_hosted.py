"""The simulator's hosted mode (`servescope sim --hosted`): no server-only paths, a tokens-per-minute limit
answered 429 with Retry-After, network latency, an API key, vLLM's fields refused on request, TLS."""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from servescope.sim.cli import build_parser, check_args, main
from servescope.sim.hosted import TokenBucket
from servescope.sim.launcher import SimHandle, SimStartError, start_sim, url_args
from tests.support.tlscerts import make_certs

QUIET = ["--net-latency-ms", "0", "--net-jitter-ms", "0"]


@pytest.fixture(scope="module")
def hosted() -> Iterator[SimHandle]:
    with start_sim("tiny", ["--hosted", *QUIET, "--tpm", "0"]) as h:
        yield h


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate chain, server key), PEM files made for 127.0.0.1 and localhost."""
    d = tmp_path_factory.mktemp("tls")
    return make_certs(d)


def _complete(c: httpx.Client, max_tokens: int, prompt: str = "hello world", **extra: object) -> httpx.Response:
    return c.post("/v1/completions", json={"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, **extra})


@pytest.mark.parametrize(("method", "path"), [("POST", "/tokenize"), ("POST", "/detokenize"), ("GET", "/metrics"),
                                              ("GET", "/health"), ("GET", "/version")])
def test_hosted_serves_none_of_the_server_paths(hosted: SimHandle, method: str, path: str) -> None:
    with httpx.Client(base_url=hosted.url) as c:
        r = c.request(method, path, json={"prompt": "hi"} if method == "POST" else None)
    assert r.status_code == 404
    assert r.json()["error"] == {"message": f"Invalid URL ({method} {path})", "type": "invalid_request_error",
                                 "param": None, "code": None}


def test_hosted_model_card_and_completion(hosted: SimHandle) -> None:
    with httpx.Client(base_url=hosted.url) as c:
        card = c.get("/v1/models").json()["data"][0]
        r = _complete(c, 8, ignore_eos=True)
    assert card["id"] == "tiny" and "max_model_len" not in card
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8


def test_normal_mode_keeps_the_server_paths(sim: SimHandle) -> None:
    with httpx.Client(base_url=sim.url) as c:
        assert c.post("/tokenize", json={"prompt": "hello world"}).status_code == 200
        assert c.get("/metrics").status_code == 200
        assert "max_model_len" in c.get("/v1/models").json()["data"][0]


@pytest.mark.slow  # ~3.8 s of the --fast lane on 2 busy cores (2026-12-08)
def test_tokens_per_minute_limit_answers_429_with_retry_after() -> None:
    # a minute holds 1,200 tokens: the first request (prompt + max_tokens ~1,003) is paid, the second waits
    # for ~800 tokens at 20 a second (~40 s)
    with start_sim("tiny", ["--hosted", *QUIET, "--tpm", "1200"]) as h, httpx.Client(base_url=h.url) as c:
        assert _complete(c, 1000).status_code == 200
        r = _complete(c, 1000)
        big = _complete(c, 1500)
    assert r.status_code == 429
    assert 30 <= int(r.headers["Retry-After"]) <= 41
    assert abs(int(r.headers["retry-after-ms"]) / 1000 - int(r.headers["Retry-After"])) < 1
    assert r.headers["x-ratelimit-limit-tokens"] == "1200"
    err = r.json()["error"]
    assert err["code"] == "rate_limit_exceeded" and err["type"] == "tokens"
    assert err["message"].startswith("Rate limit reached for tiny on tokens per min (TPM): Limit 1200")
    assert big.status_code == 429 and big.headers["Retry-After"] == "60"
    assert big.json()["error"]["message"].startswith("Request too large for tiny")


def test_no_limit_without_hosted_or_with_tpm_0(sim: SimHandle, hosted: SimHandle) -> None:
    for h in (sim, hosted):
        with httpx.Client(base_url=h.url) as c:
            # ~2,500 tokens each: a 1,200-token minute (above) would refuse every one
            assert [_complete(c, 4, "word " * 2500).status_code for _ in range(3)] == [200, 200, 200]


def test_hosted_defaults() -> None:
    from servescope.sim.cli import hosted_config
    from servescope.sim.hosted import DEFAULT_JITTER_MS, DEFAULT_LATENCY_MS, DEFAULT_TPM

    on = hosted_config(build_parser().parse_args(["--hosted"]))
    assert (on.tpm, on.latency_ms, on.jitter_ms) == (DEFAULT_TPM, DEFAULT_LATENCY_MS, DEFAULT_JITTER_MS)
    off = hosted_config(build_parser().parse_args([]))
    assert (off.hosted, off.tpm, off.delays, off.api_key) == (False, 0, False, None)
    mixed = hosted_config(build_parser().parse_args(["--tpm", "500", "--net-latency-ms", "5"]))
    assert (mixed.hosted, mixed.tpm, mixed.latency_ms, mixed.jitter_ms) == (False, 500, 5.0, 0.0)


def test_token_bucket() -> None:
    b = TokenBucket(600, now=0.0)  # 10 tokens a second
    assert b.take(500, 0.0) is None
    assert b.take(200, 0.0) == pytest.approx(10.0)  # 100 left: 100 more in 10 s
    assert b.take(200, 10.0) is None  # refilled meanwhile; the refused request was not charged
    assert b.remaining(10.0) == 0
    assert b.take(10, 1000.0) is None and b.remaining(1000.0) == 590  # never above one minute's tokens
    assert b.take(601, 1000.0) == 60.0


def test_network_latency_delays_every_request() -> None:
    with start_sim("tiny", ["--hosted", "--net-latency-ms", "400", "--net-jitter-ms", "0"]) as h, \
            httpx.Client(base_url=h.url) as c:
        c.get("/v1/models")  # the connection is made
        t0 = time.perf_counter()
        c.get("/v1/models")
        assert time.perf_counter() - t0 >= 0.4


def test_api_key_required_when_given() -> None:
    with start_sim("tiny", ["--api-key", "sk-sim-123"]) as h, httpx.Client(base_url=h.url) as c:
        missing = c.get("/v1/models")
        wrong = c.get("/v1/models", headers={"Authorization": "Bearer sk-other"})
        right = c.get("/v1/models", headers={"Authorization": "Bearer sk-sim-123"})
    assert missing.status_code == 401 and "You didn't provide an API key" in missing.json()["error"]["message"]
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    assert "sk-" not in wrong.text  # the key is never echoed
    assert right.status_code == 200


def test_reject_vllm_fields() -> None:
    with start_sim("tiny", ["--hosted", *QUIET, "--reject-vllm-fields"]) as h, httpx.Client(base_url=h.url) as c:
        eos = _complete(c, 4, ignore_eos=True)
        usage = _complete(c, 4, stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
        plain = _complete(c, 4, stream=True, stream_options={"include_usage": True})
    assert eos.status_code == 400
    assert eos.json()["error"]["message"] == "Unrecognized request argument supplied: ignore_eos"
    assert usage.status_code == 400 and "continuous_usage_stats" in usage.json()["error"]["message"]
    assert plain.status_code == 200


def test_tls(certs: tuple[Path, Path, Path]) -> None:
    ca, cert, key = certs
    with start_sim("tiny", ["--hosted", *QUIET, "--tls-cert", str(cert), "--tls-key", str(key)]) as h:
        assert h.url.startswith("https://127.0.0.1:")
        with httpx.Client(base_url=h.url, verify=ssl.create_default_context(cafile=str(ca))) as c:
            assert _complete(c, 4).status_code == 200
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"), httpx.Client(base_url=h.url) as c:
            c.get("/v1/models")


def test_tls_without_hosted(certs: tuple[Path, Path, Path]) -> None:
    ca, cert, key = certs
    with start_sim("tiny", ["--tls-cert", str(cert), "--tls-key", str(key)]) as h, \
            httpx.Client(base_url=h.url, verify=ssl.create_default_context(cafile=str(ca))) as c:
        assert c.post("/tokenize", json={"prompt": "hello"}).status_code == 200


@pytest.mark.parametrize(("argv", "message"), [
    (["--tls-cert", "x.pem"], "--tls-cert and --tls-key go together"),
    (["--tls-cert", "/no/such.pem", "--tls-key", "/no/such.key"], "--tls-cert /no/such.pem: no such file"),
    (["--tpm", "-1"], "--tpm -1: must be 0"),
    (["--net-latency-ms", "-5"], "--net-latency-ms -5: must be 0 or more"),
    (["--net-jitter-ms", "nan"], "--net-jitter-ms nan: must be 0 or more"),
    (["--api-key", " "], "--api-key: empty"),
])
def test_bad_flags_are_one_line(argv: list[str], message: str) -> None:
    bad = check_args(build_parser().parse_args(argv))
    assert bad is not None and bad.startswith(message) and "\n" not in bad


def test_a_certificate_that_does_not_load_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    assert main(["--tls-cert", str(junk), "--tls-key", str(junk), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("servescope sim: error: --tls-cert") and "cannot load the certificate" in err
    assert "\n" not in err


def test_sim_url_query() -> None:
    assert url_args("tiny") == ("tiny", [])
    assert url_args("tiny?hosted=1&tpm=5000") == ("tiny", ["--hosted", "--tpm", "5000"])
    assert url_args("tiny?hosted=0&net_latency_ms=20") == ("tiny", ["--net-latency-ms", "20"])
    with pytest.raises(SimStartError, match="unknown setting 'color'; the simulator's URL takes hosted"):
        url_args("tiny?color=red")
    with pytest.raises(SimStartError, match="hosted=maybe: give hosted=1"):
        url_args("tiny?hosted=maybe")


def test_sim_url_query_starts_a_hosted_simulator() -> None:
    with start_sim("tiny?hosted=1&net_latency_ms=0&net_jitter_ms=0") as h, httpx.Client(base_url=h.url) as c:
        assert c.post("/tokenize", json={"prompt": "hi"}).status_code == 404
        assert c.get("/v1/models").status_code == 200


def _connections(args: list[str]) -> int:
    """How many connections three requests on one keep-alive client needed."""
    opened: list[str] = []

    def trace(event: str, info: object) -> None:
        if event == "connection.connect_tcp.complete":
            opened.append(event)

    with start_sim("tiny", args) as h, httpx.Client(base_url=h.url) as c:
        for _ in range(3):
            r = c.post("/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 4, "stream": True},
                       extensions={"trace": trace})
            assert r.status_code == 200
            closing = r.headers.get("connection") == "close"
            assert closing == ("--close-connections" in args), r.headers
    return len(opened)


def test_close_connections() -> None:
    assert _connections(["--close-connections"]) == 3
    assert _connections([]) == 1
