"""Issue 36's end-to-end case in one run: the simulator as a hosted API (no /tokenize, no /metrics, a
tokens-per-minute limit) behind TLS with a self-signed CA made here, reached with --ca-cert: the run completes,
input lengths calibrated on the API's usage land within 3% of requested, and the 429s are counted as
`requests_rate_limited`, apart from the failures."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from servescope.sim.launcher import SimHandle
from tests.integration.helpers import servescope
from tests.support.tlscerts import tls_simulator

WL = '[workload]\nname = "chat300"\napi = "chat"\ninput_tokens = 300\noutput_tokens = 16\n'


@pytest.fixture(scope="module")
def limited_tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimHandle, Path]]:
    # a CA of the test's own and the server's certificate; 8,000 tokens a minute: the probes and the first ~20
    # requests of ~316 tokens fit, the rest get 429
    with tls_simulator(tmp_path_factory.mktemp("tls-limits"), ["--hosted", "--tpm", "8000", "--net-latency-ms", "5",
                                                                "--net-jitter-ms", "2"]) as served:
        yield served


@pytest.mark.slow
def test_hosted_api_behind_tls_lengths_within_3pct_and_429s_counted(limited_tls: tuple[SimHandle, Path],
                                                                     tmp_path: Path) -> None:
    sim, ca = limited_tls
    assert sim.url.startswith("https://")
    (tmp_path / "chat300.toml").write_text(WL)
    save = tmp_path / "s"
    p = servescope("run", "--url", sim.url, "--ca-cert", str(ca), "-w", str(tmp_path / "chat300.toml"),
                   "-c", "4", "-n", "40", "--telemetry-interval", "off", "--save", str(save), "--json", timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["status"] == "completed"
    (cell,) = out["cells"]
    assert cell["input_lengths"] == "calibrated"  # no /tokenize: sized on the API's own usage counts
    assert cell["requests_ok"] > 0
    assert abs(cell["input_tokens_mean"] / cell["input_tokens_requested"] - 1) <= 0.03, cell
    assert cell["requests_rate_limited"] > 0  # the limit was hit ...
    assert cell["requests_failed"] <= 4  # ... and its 429s are not failures (at most the in-flight cancelled)
    meta = tomllib.loads((save / "session.toml").read_text())
    assert meta["target"]["tls_verify"] is True and meta["target"]["tls_ca"] == "ca.pem"
