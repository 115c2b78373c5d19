"""Two runs with one seed against one server: the second sends the first's prompts again, and the server's prefix
cache serves them (a TTFT that reads low). servescope cannot keep a server from remembering, but it says so: a cell
of distinct prompts whose prefix cache hits are high gets a one-line warning that names the cause and the way out.
The simulator's prefix cache stands in for vLLM's (on by default in vLLM V1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servescope.sim.launcher import start_sim
from tests.integration.helpers import servescope

# the --fast lane leaves this module out: 1 tests, ~5 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

WARNING = "the server has seen these prompts before (a run with the same --seed against it)"


def test_a_second_run_with_the_same_seed_is_said_to_be_served_from_the_prefix_cache(tmp_path: Path) -> None:
    w = tmp_path / "short.toml"
    w.write_text('[workload]\nname = "short"\ninput_tokens = 256\noutput_tokens = 8\n')
    with start_sim("tiny") as sim:
        def run(*extra: str) -> str:
            p = servescope("run", "--url", sim.url, "-w", str(w), "-c", "2", "-n", "8",
                           "--sessions-dir", str(tmp_path / "sessions"), *extra)
            assert p.returncode == 0, p.stderr[-3000:]
            return p.stdout + p.stderr

        first = run()
        assert WARNING not in first  # the server had not seen them
        again = run()
        assert WARNING in again, again[-3000:]
        assert "give another --seed or restart the server" in again
        assert WARNING not in run("--seed", "7")  # another seed: prompts of its own
