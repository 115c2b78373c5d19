"""`run` against a server whose /tokenize always answers 3: one line that says the counts are wrong, within
seconds, before any session is made (issue 32: 14 s of ever longer /tokenize requests, then an HTTP 413 line)."""

from __future__ import annotations

import time
from pathlib import Path

from tests.integration.helpers import servescope
from tests.integration.test_hostile import HostileServer


def test_a_tokenize_that_always_answers_3_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    home = tmp_path / "home"
    t0 = time.monotonic()
    with HostileServer([], tokenize={"count": 3, "tokens": [1, 2, 3]}, model="m") as srv:
        p = servescope("run", "--url", srv.url, "-w", "random", "-c", "4", "-n", "8", "--telemetry-interval", "off",
                       env={"SERVESCOPE_HOME": str(home)}, timeout=60)
        assert srv.n == 0  # no completion request was sent
    assert time.monotonic() - t0 < 30
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert lines == ["servescope run: error: the server's /tokenize answered 3 tokens for texts of 1 to 200 words: it is "
                     "not counting this model's tokens; use --tokenizer PATH (a local tokenizer of the served model)"]
    assert not list(home.rglob("session.toml"))
