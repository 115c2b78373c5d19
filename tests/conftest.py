"""Shared fixtures and the suite's tiers.

Real servers are expensive on 2 cores (a CPU vLLM takes 20-40 s to start), so each distinct server is started
once per test session, the first time a test asks for it, and stopped when the session ends
(tests/support/pool.py). Tiers are pytest markers: `vllm`, `llamacpp`, `tmux`, `ray` (tests that need that real
program) and `slow` (a test over ~2.5 s on this 2-core machine,
or a module whose tests average over 1 s: docs/developer.md). `./scripts/test.sh --fast` runs the
rest; `.ci/run` runs everything. Markers come from a test's own decorators, and also from here: a test that uses a
real-server fixture gets that server's marker, and a module named `test_tmux_*`, `test_llamacpp_*` or
`test_ray_*` marks its tests so.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.pool import ServerPool

# the real vLLM's server arguments; --enable-prompt-tokens-details puts cached_tokens in usage
VLLM_EXTRA_ARGS = ["--max-model-len", "8192", "--enable-prompt-tokens-details"]
# For the servers whose answers no test needs bit-exact: the CPU build of vLLM 0.32 redoes torch.compile at
# every start (30-120 s on 2 cores: its saved compilation fails to load with this torch), and --enforce-eager skips
# it. The main server keeps it: compiled, the same request gives the same logits to the last bit (the quality and
# probe tests check exactly that); eager, they moved by ~1e-8 nats from run to run.
EAGER = ["--enforce-eager"]

# fixture -> the tier marker of any test that uses it (directly or through another fixture)
FIXTURE_MARKERS = {
    "vllm_server": "vllm",
    "vllm_server_perturbed": "vllm",
    "vllm_bench_files": "vllm",
    "llamacpp_f16": "llamacpp",
    "peer_runs": "slow",  # GuideLLM and AIPerf, run once per test session
}
# fixture -> the group of processes' tests that share its server (the first that applies)
FIXTURE_GROUPS = {"vllm_server": "vllm-pool", "vllm_server_perturbed": "vllm-pool", "vllm_bench_files": "vllm-pool",
                  "llamacpp_f16": "llamacpp-pool", "peer_runs": "peers-pool"}
# module name prefix -> marker
MODULE_MARKERS = {"test_tmux_": "tmux", "test_llamacpp_": "llamacpp", "test_ray_": "ray"}
# module name prefix -> one group of processes' tests: two Ray clusters on one host at once refuse each other's
# nodes (a `ray start --address` then fails its GCS handshake), so every Ray test runs in one process
MODULE_GROUPS = {"test_ray_": "ray-clusters"}


def pytest_configure(config: pytest.Config) -> None:
    # The Textual tests allocate many short-lived objects, and at Python's default (a collection every 700 net
    # allocations) the cyclic collector took about a sixth of their CPU: tests/tui/test_draw.py with
    # test_snapshots.py in one process, 47 s of CPU at the default against 40 s at 10,000 (peak memory 258 MB
    # against 319 MB). Only the youngest generation's threshold moves; what is collected stays the same.
    # SERVESCOPE_TEST_GC=default keeps Python's (benchmarks/suite_procs.py --base-env compares the two).
    if os.environ.get("SERVESCOPE_TEST_GC") != "default":
        gc.set_threshold(10_000, 10, 10)


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        for fixture, marker in FIXTURE_MARKERS.items():
            if fixture in names:
                item.add_marker(marker)
        module = item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
        for prefix, marker in MODULE_MARKERS.items():
            if module.startswith(prefix):
                item.add_marker(marker)
        # Run in two processes (scripts/test.sh: pytest-xdist, --dist loadgroup), a group goes to one process:
        # every user of a shared real server to the process that starts it (one start per server, not per
        # process), every other test with its module (a module's fixtures are built once).
        pool = next((FIXTURE_GROUPS[f] for f in FIXTURE_GROUPS if f in names), None)
        pool = pool or next((g for prefix, g in MODULE_GROUPS.items() if module.startswith(prefix)), None)
        item.add_marker(pytest.mark.xdist_group(pool or item.nodeid.split("::", 1)[0]))


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions written by tests go to a temporary SERVESCOPE_HOME, never the user's."""
    monkeypatch.setenv("SERVESCOPE_HOME", str(tmp_path / "home"))


def _skip_vllm() -> None:
    if os.environ.get("SERVESCOPE_SKIP_VLLM") == "1":
        pytest.skip("SERVESCOPE_SKIP_VLLM=1: real-vLLM tests skipped on purpose")


def _skip_llamacpp() -> None:
    if os.environ.get("SERVESCOPE_SKIP_LLAMACPP") == "1":
        pytest.skip("SERVESCOPE_SKIP_LLAMACPP=1: real llama.cpp tests skipped on purpose")


@pytest.fixture(scope="session")
def server_pool() -> Iterator[ServerPool]:
    """Every real server of the test session, one per distinct program, model and flags."""
    pool = ServerPool()
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture(scope="session")
def vllm_server(server_pool: ServerPool) -> object:
    """A real CPU vLLM serving the tiny dense model, shared by every test of the session."""
    _skip_vllm()
    return server_pool.vllm("dense", VLLM_EXTRA_ARGS)


@pytest.fixture(scope="session")
def vllm_server_perturbed(server_pool: ServerPool) -> object:
    """A second real CPU vLLM serving dense-perturbed: the dense model's weights plus seeded noise (a stand-in
    for a lossy quantization; see tests/support/build_tiny_model.py), with prefix caching off. Same tokenizer as
    vllm_server. Its served model name (srv.model) is its folder's path, so it differs from vllm_server's.

    One server stands for both ways the suite needs a second vLLM: other weights (the quality tests compare its
    answers with vllm_server's; prefix caching changes no logprob) and no prefix cache (the conversation tests
    compare its hit rates and TTFTs with vllm_server's; the weights, random in both, change no timing)."""
    _skip_vllm()
    return server_pool.vllm("dense-perturbed", [*VLLM_EXTRA_ARGS, *EAGER, "--no-enable-prefix-caching"])


@pytest.fixture(scope="session")
def llamacpp_f16(server_pool: ServerPool) -> object:
    """A real llama.cpp server with the tiny model as f16 GGUF: 4 slots of 1,024 tokens (-c 4096)."""
    _skip_llamacpp()
    return server_pool.llamacpp("tiny-f16.gguf", ctx=4096, parallel=4)


@pytest.fixture(scope="session")
def peer_runs(tmp_path_factory: pytest.TempPathFactory) -> object:
    """One servescope session, one GuideLLM run and one AIPerf run of the same fixed-length workload and concurrencies
    against one simulator, made once per test session and shared by the tests that import them
    (tests/support/peers.py; the tools' venvs come from .ci/setup_peers.sh). SERVESCOPE_SKIP_PEERS=1 skips them."""
    if os.environ.get("SERVESCOPE_SKIP_PEERS") == "1":
        pytest.skip("SERVESCOPE_SKIP_PEERS=1: the GuideLLM and AIPerf tests skipped on purpose")
    from tests.support import peers

    return peers.same_load_runs(tmp_path_factory.mktemp("peers"))
