"""Ctrl-C while a launched server is still loading its model ends `servescope run` then, with a one-line error,
instead of after the launch timeout (minutes for a real model)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.helpers import wait_for

# the --fast lane leaves this module out: 1 tests, ~1 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow


def test_ctrl_c_while_the_server_loads_ends_the_run(tmp_path: Path) -> None:
    script = tmp_path / "vllm"  # a server that never answers /health (a model that takes forever to load)
    script.write_text("#!/bin/sh\necho loading weights\nsleep 120 &\nwait\n")
    script.chmod(0o755)
    session = tmp_path / "s"
    p = subprocess.Popen([sys.executable, "-m", "servescope", "run", "--launch", f"{script} serve m",
                          "--launch-timeout", "900", "-c", "1", "-n", "1", "--save", str(session)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        log = session / "server-0.log"
        wait_for(lambda: log.exists() and "loading weights" in log.read_text(), 120, "the server's first log line")
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)  # the launch timeout is 900 s: ending here means the stop ended the wait
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode != 0
    assert "stopped while the server was starting" in err, err
