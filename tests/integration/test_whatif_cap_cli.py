"""`whatif SESSION -c 99999999999999` ends in one line naming the largest concurrency the twin predicts, with
little memory (issue 32: it grew ~143 MB/s until the kernel's OOM killer stopped it at 20 GB). Run under a 3 GB
address-space limit, so the old behaviour fails fast (MemoryError) instead of eating the machine."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import run_json

# the --fast lane leaves this module out: 1 tests, ~3 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))


def test_whatif_with_a_huge_concurrency_is_one_line_and_bounded(tmp_path: Path) -> None:
    w = tmp_path / "short.toml"
    w.write_text('[workload]\nname = "short"\ninput_tokens = 64\noutput_tokens = 4\n')
    run_json("--url", "sim://tiny", "-w", str(w), "-c", "1,2", "-n", "4", "--save", str(tmp_path / "s"))
    p = subprocess.run([sys.executable, "-m", "servescope", "whatif", str(tmp_path / "s"), "-c", "99999999999999"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT, env=dict(os.environ),
                       preexec_fn=_limited)
    assert p.returncode != 0
    last = p.stderr.strip().splitlines()[-1]
    assert "Traceback" not in p.stderr, p.stderr[-2000:]
    assert last.startswith("servescope whatif: error: --concurrency 99,999,999,999,999: the twin's server runs at most "), last
    assert "give at most 256" in last  # the tiny profile: max_num_seqs 128
