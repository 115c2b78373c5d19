"""`--workers` has a hard cap that names the number that fits: at most this machine's cores x 4 (issue 32:
`--workers 100000` started 100 processes for `-c 100`, 2.5 GB in 4 s, and the session stored 100000)."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servescope.core.client import ClientOptions, RequestSpec
from servescope.core.errors import ServescopeError
from servescope.core.load import Limits, Load
from servescope.core.workercount import WORKERS_PER_CORE, cores, max_workers
from servescope.core.workers import run_cell_workers
from servescope.engine import fields


def test_the_parser_refuses_more_workers_than_cores_x_4_and_names_the_number_that_fits() -> None:
    cap = max_workers()
    assert cap == cores() * WORKERS_PER_CORE
    assert fields.workers(str(cap), "--workers") == cap
    with pytest.raises(ServescopeError) as e:
        fields.workers("100000", "--workers")
    assert e.value.message == (f"--workers: 100000 processes is more than this machine runs usefully; give at most "
                               f"{cap} ({cores()} cores x {WORKERS_PER_CORE}), or auto")
    with pytest.raises(ServescopeError, match=rf"\[client\] workers: {cap + 1} processes .* at most {cap} "):
        fields.workers(cap + 1, "[client] workers")  # a sweep file's value, the same rule


def test_a_caller_that_skipped_the_parser_starts_no_process() -> None:
    before = multiprocessing.active_children()
    specs = [RequestSpec("completions", "p", 4, 4)] * 200
    with pytest.raises(ServescopeError, match=f"give at most {max_workers()} "):
        asyncio.run(run_cell_workers(ClientOptions(base_url="http://127.0.0.1:9", model="m"), specs,
                                     Load(concurrency=100), Limits(requests=200), workers=100_000))
    assert multiprocessing.active_children() == before


def test_run_refuses_it_in_one_line_before_any_session_is_made(tmp_path: Path) -> None:
    env = {**os.environ, "SERVESCOPE_HOME": str(tmp_path)}
    p = subprocess.run([sys.executable, "-m", "servescope", "run", "--url", "sim://tiny", "--workers", "100000",
                        "-c", "100", "-n", "1"], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and f"give at most {max_workers()} " in lines[0], p.stderr
    assert not (tmp_path / "sessions").exists() or not any((tmp_path / "sessions").iterdir())
