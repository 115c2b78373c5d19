"""HTTPS through Ray actors (`--ray`): the load's options carry the TLS setting, the CA as its text, so an actor
on any node checks the server's certificate without a file there, and sends back the connections it opened.
Needs the `ray` extra; skipped without it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from servescope.core.client import ClientOptions, RequestSpec
from servescope.core.load import CellControl, Limits, Load
from servescope.core.tls import TlsSettings
from servescope.engine.connection import HttpTarget
from servescope.sim.launcher import SimHandle
from tests.support.tlscerts import tls_simulator

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'servescope[ray]'")

SPECS = [RequestSpec("completions", f"request {i}: " + "lorem ipsum " * 30, 64, 8) for i in range(24)]


@pytest.fixture(scope="module")
def tls_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SimHandle, Path]]:
    # a CA of the test's own, and the server's certificate
    with tls_simulator(tmp_path_factory.mktemp("tls"), ["--hosted", "--tpm", "0", "--net-latency-ms", "0",
                                                         "--net-jitter-ms", "0"]) as served:
        yield served


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A local cluster with Ray's token auth off, said explicitly: with the mode unset, a new local cluster turns
    it on and writes ~/.ray/auth_token, which a later `ray start` (tests/integration/test_ray_cluster.py) trips on."""
    auth_before = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield
    finally:
        ray.shutdown()
        if auth_before is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = auth_before


@pytest.mark.slow
async def test_ray_actors_check_the_certificate_with_the_ca_text(tls_sim: tuple[SimHandle, Path],
                                                                 local_ray: None) -> None:
    sim, ca = tls_sim

    async def before() -> None:
        pass

    target = HttpTarget(None, tls=TlsSettings.load(str(ca)), workers=2, ray="auto")
    opts = ClientOptions(base_url=sim.url, model="tiny", timeout_s=60)
    run = await target.run_cell(opts, SPECS, Load(concurrency=4), Limits(requests=16), lambda r: None,
                                CellControl(), 0, before)
    assert [r.status for r in run.records] == ["ok"] * 16, {r.error for r in run.records}
    conns = target.cell_connections
    assert conns is not None and conns.opened == 4 and conns.tls_handshake_ms_p50 is not None
