"""Shared fixtures. The real vLLM is started once per test session (see tests/support/vllm_server.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# the real vLLM's server arguments; --enable-prompt-tokens-details puts cached_tokens in usage
VLLM_EXTRA_ARGS = ["--max-model-len", "8192", "--enable-prompt-tokens-details"]


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sessions written by tests go to a temporary SERVESCOPE_HOME, never the user's."""
    monkeypatch.setenv("SERVESCOPE_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[object]:
    """A real CPU vLLM serving the tiny dense model, shared by every test of the session."""
    if os.environ.get("SERVESCOPE_SKIP_VLLM") == "1":
        pytest.skip("SERVESCOPE_SKIP_VLLM=1: real-vLLM tests skipped on purpose")
    from tests.support import vllm_server as vs

    srv = vs.start("dense", VLLM_EXTRA_ARGS)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")  # stopped after the module that uses it: two vLLMs share 2 cores
def vllm_server_perturbed() -> Iterator[object]:
    """A second real CPU vLLM serving dense-perturbed: the dense model's weights plus seeded noise (a stand-in
    for a lossy quantization; see tests/support/build_tiny_model.py). Same tokenizer and server arguments as
    vllm_server. Its served model name (srv.model) is its folder's path, so it differs from vllm_server's."""
    if os.environ.get("SERVESCOPE_SKIP_VLLM") == "1":
        pytest.skip("SERVESCOPE_SKIP_VLLM=1: real-vLLM tests skipped on purpose")
    from tests.support import vllm_server as vs

    srv = vs.start("dense-perturbed", VLLM_EXTRA_ARGS)
    try:
        yield srv
    finally:
        srv.stop()
