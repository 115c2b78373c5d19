"""Shared fixtures. The real vLLM is started once per test session (see tests/support/vllm_server.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


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

    srv = vs.start("dense", ["--max-model-len", "8192", "--enable-prompt-tokens-details"])  # cached_tokens in usage
    try:
        yield srv
    finally:
        srv.stop()
