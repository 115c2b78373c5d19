"""HTTPS targets end to end: the simulator in hosted mode behind TLS with a certificate this test makes (a private
CA, trustme), reached with --ca-cert, with --insecure, and with neither (one line naming the certificate problem
and both flags); every transport (raw, aiohttp, httpx, worker processes) checks the certificate as the probe did,
keeps its connections alive (a cell of N requests at concurrency c opens c connections, not N) and times their TLS
handshakes apart from the TTFT."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest

from servescope.core import tls
from servescope.core.client import ClientOptions, RequestSpec
from servescope.core.errors import ServescopeError
from servescope.core.load import CellControl, Limits, Load
from servescope.core.records import RequestRecord
from servescope.core.target import probe
from servescope.core.tls import TlsSettings
from servescope.engine.connection import HttpTarget
from servescope.sim.launcher import SimHandle, start_sim
from tests.integration.helpers import servescope
from tests.support.tlscerts import make_certs

SPECS = [RequestSpec("completions", f"request {i}: " + "lorem ipsum dolor " * 20, 64, 8) for i in range(40)]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(CA certificate, server certificate chain, server key) for 127.0.0.1 and localhost."""
    d = tmp_path_factory.mktemp("tls")
    return make_certs(d)


@pytest.fixture(scope="module")
def hosted(certs: tuple[Path, Path, Path]) -> Iterator[SimHandle]:
    """The simulator as a hosted API behind TLS; no rate limit (the rate-limit tests set their own)."""
    _, cert, key = certs
    with start_sim("tiny", ["--hosted", "--tpm", "0", "--net-latency-ms", "5", "--net-jitter-ms", "2",
                            "--tls-cert", str(cert), "--tls-key", str(key)]) as h:
        assert h.url.startswith("https://")
        yield h


@pytest.fixture(autouse=True)
def _restore_setting() -> Iterator[None]:
    before = tls.current()
    yield
    tls._current = before


async def test_probe_with_the_ca(hosted: SimHandle, certs: tuple[Path, Path, Path]) -> None:
    info = await probe(hosted.url, tls=TlsSettings.load(str(certs[0])))
    assert [m.id for m in info.models] == ["tiny"]
    assert (info.tls_verify, info.tls_ca, info.metrics_available, info.engine) == (True, "ca.pem", False, "openai")
    assert info.tls_handshake_ms is not None and info.tls_handshake_ms > 0
    assert info.connect_ms is not None and info.connect_ms >= 0


async def test_probe_without_the_ca_is_one_line_naming_both_flags(hosted: SimHandle) -> None:
    with pytest.raises(ServescopeError) as e:
        await probe(hosted.url, tls=TlsSettings())
    assert e.value.message == (f"{hosted.url}: the server's TLS certificate is not trusted (unable to get local issuer "
                               "certificate); give its CA's certificate with --ca-cert PATH, or --insecure to skip "
                               "verification")


async def test_probe_insecure(hosted: SimHandle) -> None:
    info = await probe(hosted.url, tls=TlsSettings(verify=False))
    assert info.tls_verify is False and info.tls_handshake_ms is not None


async def test_probe_takes_the_process_setting(hosted: SimHandle, certs: tuple[Path, Path, Path]) -> None:
    tls._said_insecure = True  # quiet
    tls.configure(TlsSettings.load(str(certs[0])))
    assert (await probe(hosted.url)).tls_ca == "ca.pem"


async def _cell(target: HttpTarget, url: str, users: int, requests: int,
                transport: str = "raw") -> tuple[list[RequestRecord], HttpTarget]:
    async def before() -> None:
        pass

    opts = ClientOptions(base_url=url, model="tiny", transport=transport, timeout_s=60)
    run = await target.run_cell(opts, SPECS, Load(concurrency=users), Limits(requests=requests), lambda r: None,
                                CellControl(), 0, before)
    return run.records, target


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["raw", "aiohttp", "httpx"])
async def test_each_transport_verifies_and_reuses_connections(hosted: SimHandle, certs: tuple[Path, Path, Path],
                                                              transport: str) -> None:
    target = HttpTarget(None, tls=TlsSettings.load(str(certs[0])), workers=1)
    records, _ = await _cell(target, hosted.url, 3, 18, transport)
    assert [r.status for r in records] == ["ok"] * 18, {r.error for r in records}
    conns = target.cell_connections
    assert conns is not None and conns.opened == 3  # one per user: 18 requests over 3 kept-alive connections
    assert conns.connect_ms_p50 is not None and conns.connect_ms_p50 > 0
    if transport == "aiohttp":  # it times the connection and its handshake as one
        assert conns.tls_handshake_ms_p50 is None
    else:
        assert conns.tls_handshake_ms_p50 is not None and conns.tls_handshake_ms_p50 > 0


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["raw", "aiohttp", "httpx"])
async def test_each_transport_refuses_an_untrusted_certificate(hosted: SimHandle, transport: str) -> None:
    records, target = await _cell(HttpTarget(None, tls=TlsSettings(), workers=1), hosted.url, 2, 4, transport)
    assert {r.status for r in records} == {"error"}
    assert all("CERTIFICATE_VERIFY_FAILED" in (r.error or "") or "certificate verify failed" in (r.error or "")
               for r in records), {r.error for r in records}
    assert target.cell_connections is not None and target.cell_connections.opened == 0


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["raw", "aiohttp", "httpx"])
async def test_a_server_that_closes_every_connection_is_seen(certs: tuple[Path, Path, Path], transport: str) -> None:
    ca, cert, key = certs
    with start_sim("tiny", ["--hosted", "--tpm", "0", "--net-latency-ms", "0", "--net-jitter-ms", "0",
                            "--close-connections", "--tls-cert", str(cert), "--tls-key", str(key)]) as h:
        target = HttpTarget(None, tls=TlsSettings.load(str(ca)), workers=1)
        records, _ = await _cell(target, h.url, 2, 10, transport)
    assert [r.status for r in records] == ["ok"] * 10, {r.error for r in records}
    conns = target.cell_connections
    assert conns is not None and conns.opened == 10  # a new connection, and handshake, for every request
    assert tls.reuse_problem(conns.opened, 2, 10).startswith("opened 10 connections for 10 requests from 2 users")


@pytest.mark.slow
async def test_worker_processes_get_the_ca_and_send_their_connections_back(
        hosted: SimHandle, certs: tuple[Path, Path, Path]) -> None:
    # the CA travels as its text in the load's options: the worker processes read no file
    target = HttpTarget(None, tls=TlsSettings.load(str(certs[0])), workers=2)
    records, _ = await _cell(target, hosted.url, 4, 16)
    assert [r.status for r in records] == ["ok"] * 16, {r.error for r in records}
    conns = target.cell_connections
    assert conns is not None and conns.opened == 4 and conns.tls_handshake_ms_p50 is not None


@pytest.mark.slow
async def test_insecure_load(hosted: SimHandle) -> None:
    target = HttpTarget(None, tls=TlsSettings(verify=False), workers=1)
    records, _ = await _cell(target, hosted.url, 2, 4, "httpx")
    assert [r.status for r in records] == ["ok"] * 4


def _summary(session: Path) -> dict[str, object]:
    out: dict[str, object] = json.loads(pl.read_parquet(session / "cells.parquet")["summary_json"][0])
    return out


@pytest.mark.slow
def test_cli_run_with_ca_cert(hosted: SimHandle, certs: tuple[Path, Path, Path], tmp_path: Path) -> None:
    save = tmp_path / "s"
    p = servescope("run", "--url", hosted.url, "--ca-cert", str(certs[0]), "-c", "2", "-n", "8", "--save", str(save),
                   timeout=300)
    assert p.returncode == 0, p.stderr
    meta = tomllib.loads((save / "session.toml").read_text())
    t = meta["target"]
    assert t["tls_verify"] is True and t["tls_ca"] == "ca.pem" and t["tls_handshake_ms"] > 0
    assert meta["sweep"]["target"]["ca_cert"] == str(certs[0].resolve())
    conns = _summary(save)["connections"]
    assert isinstance(conns, dict) and conns["opened"] == 2, conns  # 8 requests, 2 users: 2 connections
    report = servescope("report", str(save), timeout=120)
    assert report.returncode == 0, report.stderr
    assert f"tiny on {hosted.url} (TLS handshake p50 " in report.stdout and ", CA ca.pem)" in report.stdout


@pytest.mark.slow
def test_cli_run_insecure_is_said_once_and_recorded(hosted: SimHandle, tmp_path: Path) -> None:
    save = tmp_path / "s"
    p = servescope("run", "--url", hosted.url, "--insecure", "-c", "1", "-n", "3", "--transport", "aiohttp",
                   "--save", str(save), timeout=300)
    assert p.returncode == 0, p.stderr
    said = [line for line in p.stderr.splitlines() if "--insecure" in line]
    assert len(said) == 1 and said[0].startswith("servescope: warning: --insecure:"), p.stderr
    meta = tomllib.loads((save / "session.toml").read_text())
    assert meta["target"]["tls_verify"] is False and meta["sweep"]["target"]["tls_verify"] is False
    report = servescope("report", str(save), timeout=120)
    assert "certificate not verified (--insecure))" in report.stdout


@pytest.mark.slow
def test_cli_run_without_the_ca_is_one_line(hosted: SimHandle, tmp_path: Path) -> None:
    p = servescope("run", "--url", hosted.url, "-c", "1", "-n", "2", "--sessions-dir", str(tmp_path / "s"),
                   timeout=300)
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(f"servescope run: error: {hosted.url}: the server's TLS certificate is not trusted (")
    assert "--ca-cert PATH" in lines[0] and "--insecure" in lines[0]


def test_cli_bad_ca_cert_is_one_line(tmp_path: Path) -> None:
    p = servescope("run", "--url", "https://127.0.0.1:9", "--ca-cert", str(tmp_path / "nope.pem"), timeout=120)
    assert p.returncode == 2 and p.stderr.strip() == (
        f"servescope run: error: --ca-cert {tmp_path / 'nope.pem'}: no such file; give the PEM file of the CA that "
        "signed the server's certificate")
