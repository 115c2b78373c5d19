"""`servescope quality` against an https target: the simulator served over TLS with a certificate this test makes
(a private CA, trustme), reached with --ca-cert, with --insecure (said once on stderr, recorded in the session), and
with neither (one line naming the certificate problem and both flags), as `servescope run` reaches it."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servescope.sim.launcher import SimHandle, start_sim
from tests.integration.helpers import servescope
from tests.support.tlscerts import make_certs

# the --fast lane leaves this module out: 4 tests, ~5 s on 2 busy cores (2026-12-08)
pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

FAST = ("--tasks", "arithmetic,json", "-n", "3", "--json")


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate chain, server key) for 127.0.0.1 and localhost."""
    d = tmp_path_factory.mktemp("tls")
    return make_certs(d)


@pytest.fixture(scope="module")
def https(certs: tuple[Path, Path, Path]) -> Iterator[SimHandle]:
    """The simulator (prompt log-probabilities and all, for the perplexity) served over TLS."""
    _, cert, key = certs
    with start_sim("tiny", ["--tls-cert", str(cert), "--tls-key", str(key)]) as h:
        assert h.url.startswith("https://")
        yield h


def _quality(*args: str) -> tuple[dict[str, Any], str]:
    p = servescope("quality", *args, *FAST, timeout=300)
    assert p.returncode == 0, f"exit {p.returncode}\nstdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-3000:]}"
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return out, p.stderr


def _target(session: Path) -> dict[str, Any]:
    target: dict[str, Any] = tomllib.loads((session / "session.toml").read_text())["target"]
    return target


def test_quality_with_the_ca(https: SimHandle, certs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    out, err = _quality("--url", https.url, "--ca-cert", str(certs[0]), "--save", str(tmp_path / "q"))
    assert out["tasks"] == {"arithmetic": {"accuracy": 1.0, "n": 3}, "json": {"accuracy": 1.0, "n": 3}}
    assert out["perplexity"] > 1  # the prompt log-probabilities came over the same TLS setting
    assert "--insecure" not in err
    target = _target(tmp_path / "q")
    assert (target["url"], target["tls_verify"], target["tls_ca"]) == (https.url, True, "ca.pem")


def test_quality_insecure_is_said_once_and_recorded(https: SimHandle, tmp_path: Path) -> None:
    out, err = _quality("--url", https.url, "--insecure", "--no-perplexity", "--save", str(tmp_path / "q"))
    assert out["tasks"]["arithmetic"] == {"accuracy": 1.0, "n": 3}
    assert err.count("--insecure: the server's TLS certificate is not verified") == 1
    target = _target(tmp_path / "q")
    assert target["tls_verify"] is False and "tls_ca" not in target


def test_quality_without_the_ca_is_one_line_naming_both_flags(https: SimHandle, tmp_path: Path) -> None:
    p = servescope("quality", "--url", https.url, *FAST, "--save", str(tmp_path / "q"), timeout=120)
    assert p.returncode != 0 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [
        f"servescope quality: error: {https.url}: the server's TLS certificate is not trusted (unable to get local issuer "
        "certificate); give its CA's certificate with --ca-cert PATH, or --insecure to skip verification"]
    assert not (tmp_path / "q").exists()


def test_quality_ca_cert_and_insecure_together_is_one_line(certs: tuple[Path, Path, Path]) -> None:
    p = servescope("quality", "--url", "https://127.0.0.1:9", "--ca-cert", str(certs[0]), "--insecure", timeout=60)
    assert p.returncode == 2
    assert p.stderr.strip() == ("servescope quality: error: --ca-cert and --insecure: give --ca-cert PATH (verify the server "
                                "with this CA) or --insecure (verify nothing), not both")
