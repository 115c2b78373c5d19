"""`-c 4 -n 100000000 --duration 1s` against the simulator: the prompts are built for the load, not for the count,
so the run stays small and quick and the session is completed with the requests it sent (issue 32: 3.1 GB and 77 s
building 10**8 prompts, then HTTP 413 from /tokenize and a failed session)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import ROOT

# the --fast lane leaves this module out: 1 tests, ~8 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

MAX_RSS_MB = 500

# runs the command as a child and prints the largest resident set among its waited-for processes (the CLI and the
# simulator it starts), so the figure is this run's alone
_MEASURE = ("import resource, subprocess, sys\n"
            "p = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=240)\n"
            "sys.stderr.write(p.stderr)\n"
            "print(p.returncode)\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"  # KiB on Linux
            "print(p.stdout.strip().splitlines()[-1] if p.stdout.strip() else '{}')\n")


def test_a_huge_count_with_a_duration_runs_in_little_memory(tmp_path: Path) -> None:
    env = {**os.environ, "SERVESCOPE_HOME": str(tmp_path / "home")}
    save = tmp_path / "s"
    p = subprocess.run([sys.executable, "-c", _MEASURE, sys.executable, "-m", "servescope", "run", "--url",
                        "sim://tiny", "-w", "random", "-c", "4", "-n", "100000000", "--duration", "1s",
                        "--telemetry-interval", "off", "--json", "--save", str(save)],
                       capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    rc, rss_kib, last = p.stdout.strip().splitlines()[-3:]
    assert rc == "0", p.stderr[-3000:]
    assert int(rss_kib) < MAX_RSS_MB * 1024, f"peak RSS {int(rss_kib) / 1024:.0f} MB"
    out = json.loads(last)
    [cell] = out["cells"]
    assert cell["status"] == "done", cell
    assert cell["requests_ok"] > 0 and cell["requests_failed"] == 0
    assert "status = \"completed\"" in (save / "session.toml").read_text()
