"""Fixtures for the app's tests: a private SERVESCOPE_HOME, a shared tiny simulator, a fast workload."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

FAST_WORKLOAD = '[workload]\nname = "fast"\napi = "completions"\ninput_tokens = 32\noutput_tokens = 16\n'


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """SERVESCOPE_HOME in tmp, the working directory there too (paths show relative), no API key."""
    monkeypatch.setenv("SERVESCOPE_HOME", str(tmp_path))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    # the simulator runs as `python -m servescope.sim`: keep the package importable from the tmp cwd
    import os

    import servescope

    root = str(Path(servescope.__file__).resolve().parent.parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "workloads").mkdir()
    (tmp_path / "workloads" / "fast.toml").write_text(FAST_WORKLOAD)
    return tmp_path


@pytest.fixture(scope="session")
def sim_url() -> Iterator[str]:
    from servescope.sim.launcher import start_sim

    with start_sim("tiny") as h:
        yield h.url
