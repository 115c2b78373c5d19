"""A cell's load from Ray actors on two nodes (`--ray`): a real two-node Ray cluster started here (two `ray start`
processes on this host, 1 CPU each, so one actor fits per node), against the simulator. The requests come from
both nodes (the cell's client part counts them per node), every stamp is in the driver's clock, and the cell
states its clock error bound.

Needs the `ray` extra (`pip install 'servescope[ray]'`); skipped without it. Teardown stops exactly the process
groups this module started (SIGTERM, then SIGKILL): `ray stop --force` would end every Ray process of the user
on the host, a cluster some other program runs included."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servescope.core.client import ClientOptions, RequestSpec
from servescope.core.load import CellControl, Limits, Load
from servescope.core.orphanguard import start_guard, stop_guard
from servescope.core.records import RequestRecord

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'servescope[ray]'")

RAY = str(Path(sys.executable).with_name("ray"))
START_S = 120.0


# Ray's token auth off, said explicitly: a local `ray.init()` elsewhere (tests/integration/test_ray_https.py, or
# the user's own) writes ~/.ray/auth_token, and with the mode unset a later `ray start` then turns token auth on
# for some processes of the cluster and not others, whose nodes cannot join
NO_TOKEN_AUTH = "disabled"


def _start(args: list[str], log: Path, guards: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """`ray start ... --block` in a process group of its own (its raylet, GCS and agents join it), with an
    orphan guard that ends the group should this test process die without its teardown (kill -9)."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": NO_TOKEN_AUTH}
    with log.open("wb") as out:
        proc = subprocess.Popen([RAY, "start", "--block", "--disable-usage-stats", "--num-cpus=1",
                                 "--object-store-memory=100000000", *args],
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    guard = start_guard(proc.pid)
    if guard is not None:
        guards.append(guard)
    return proc


def _wait_for(log: Path, proc: subprocess.Popen[bytes], pattern: str) -> re.Match[str]:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        m = re.search(pattern, text)
        if m:
            return m
        if proc.poll() is not None:
            pytest.fail(f"ray start exited ({proc.returncode}): {text[-1500:]}")
        time.sleep(0.2)
    pytest.fail(f"ray start did not come up in {START_S:g}s: {log.read_text(errors='replace')[-1500:]}")


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        proc.poll()
        time.sleep(0.2)
    else:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[str, dict[str, str]]]:
    """(address, {"node_a": node ID, "node_b": node ID}) of a two-node cluster on this host."""
    tmp = Path(tempfile.mkdtemp(prefix="ssray", dir="/tmp"))  # short: Ray's unix socket paths must fit 107 bytes
    procs: list[subprocess.Popen[bytes]] = []
    guards: list[subprocess.Popen[bytes]] = []
    auth_before = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = NO_TOKEN_AUTH  # the driver's ray.init too
    try:
        procs.append(_start(["--head", "--port=0", '--resources={"node_a": 1}', f"--temp-dir={tmp / 't'}",
                             "--include-dashboard=false"], tmp / "head.log", guards))
        addr = _wait_for(tmp / "head.log", procs[0], r"--address='([^']+)'").group(1)
        _wait_for(tmp / "head.log", procs[0], r"--block")
        procs.append(_start([f"--address={addr}", '--resources={"node_b": 1}'], tmp / "node.log", guards))
        _wait_for(tmp / "node.log", procs[1], r"--block")
        ray.init(address=addr, log_to_driver=False, configure_logging=False)
        deadline = time.monotonic() + START_S
        ids: dict[str, str] = {}
        while time.monotonic() < deadline and len(ids) < 2:
            ids = {r: n["NodeID"] for n in ray.nodes() if n.get("Alive")
                   for r in ("node_a", "node_b") if r in n.get("Resources", {})}
            time.sleep(0.2)
        assert len(ids) == 2, ray.nodes()
        yield addr, ids
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        for p in reversed(procs):
            _stop_group(p)
        for g in guards:
            stop_guard(g)
        shutil.rmtree(tmp, ignore_errors=True)
        if auth_before is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = auth_before


@pytest.fixture(scope="module")
def sim() -> Iterator[tuple[str, str]]:
    import httpx

    from servescope.sim.launcher import start_sim

    with start_sim("tiny", ["--no-enable-prefix-caching"]) as s:
        yield s.url, httpx.get(s.url + "/v1/models").json()["data"][0]["id"]


SPECS = [RequestSpec("completions", f"request {i}: " + "lorem ipsum " * 50, 128, 16) for i in range(44)]


async def _cell(sim: tuple[str, str], address: str, nodes: tuple[str, ...] = ()):  # type: ignore[no-untyped-def]
    from servescope.core.rayworkers import run_cell_ray

    seen: list[RequestRecord] = []
    run = await run_cell_ray(ClientOptions(base_url=sim[0], model=sim[1]), SPECS, Load(concurrency=4),
                             Limits(requests=40, warmup=4), seen.append, CellControl(), seed=0,
                             address=address, nodes=nodes, workers=2)
    assert len(run.records) == 40 and len(seen) == 40
    assert all(r.status == "ok" for r in run.records), {r.error for r in run.records}
    assert sorted(r.index for r in run.records) == list(range(40))
    assert sorted({r.user for r in run.records}) == [0, 1, 2, 3]
    # every stamp in the driver's clock: inside the cell's window, in order
    for r in run.records:
        assert run.start_ns - 50_000_000 <= r.scheduled_ns <= r.sent_ns < r.first_token_ns <= r.end_ns <= run.end_ns
        assert r.chunk_ns[0] >= r.first_token_ns - 1 and r.chunk_ns[-1] <= r.end_ns
    client = run.client
    assert client is not None and client.workers == 2
    assert 0 <= client.clock_error_ms < 100  # the bound is stated (a loaded 2-core host: a few ms)
    return client


async def test_a_cell_spread_over_two_nodes_counts_requests_per_node(cluster: tuple[str, dict[str, str]],
                                                                     sim: tuple[str, str]) -> None:
    client = await _cell(sim, cluster[0])
    nodes = client.nodes
    assert len(nodes) == 2 and sum(nodes.values()) == 40 and min(nodes.values()) > 0, nodes
    # both nodes share this host's IP: each is named IP/node-ID prefix
    assert {k.split("/")[1] for k in nodes} == {v[:8] for v in cluster[1].values()}, nodes


async def test_workers_pinned_by_node_id(cluster: tuple[str, dict[str, str]], sim: tuple[str, str]) -> None:
    ids = cluster[1]
    client = await _cell(sim, cluster[0], nodes=(ids["node_b"][:12], ids["node_a"]))
    assert {k.split("/")[1] for k in client.nodes} == {ids["node_a"][:8], ids["node_b"][:8]}
