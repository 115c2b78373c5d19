"""A run or a tune that measured nothing leaves no session behind (issue 44, item 20): a server that cannot start
(no such program, one that exits before /health, a simulator given an unknown profile or flag) fails the run in one
line and its folder goes, the log that says why kept where the line says; tune reads a simulator's launch at each
setting with the simulator's own parser before it makes its session. A run that measured cells before it failed
keeps them (tests/engine/test_runner_fakes.py)."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from tests.integration.helpers import servescope

# the --fast lane leaves this module out: 7 tests, ~9 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

SHORT = '[workload]\nname = "short"\ninput_tokens = 32\noutput_tokens = 4\n'
# a `vllm` that says why it cannot serve, then exits before /health answers
FAILING_VLLM = """#!{python}
import sys
print("ValueError: the model cannot be loaded: out of memory (a failing server's last words)", flush=True)
sys.exit(3)
"""


def _empty(d: Path) -> bool:
    return not d.exists() or not any(d.iterdir())


def _kept_log(line: str) -> Path | None:
    """The server log an error line names (moved out of the removed session), after removing its folder from the
    temporary directory (the test's own litter); None when the line names none."""
    if "log: " not in line:
        return None
    log = Path(line.rsplit("log: ", 1)[1])
    text = log.read_text() if log.is_file() else None
    if log.parent.name.startswith("servescope-") and log.parent.parent == Path(tempfile.gettempdir()):
        shutil.rmtree(log.parent, ignore_errors=True)
    return log if text is not None else None


@pytest.mark.parametrize("cmd, says, before", [
    (["run", "--launch", "servescope sim --profile nosuch", "-n", "1"], "servescope sim: error: unknown profile 'nosuch'", False),
    (["run", "--launch", "servescope sim --profile tiny", "--server-variant", "--bogus-flag 3", "-n", "1"],
     "unrecognized arguments: --bogus-flag 3", False),
    (["tune", "--launch", "servescope sim --profile nosuch", "-c", "2,4", "-n", "4"],
     "--launch: servescope sim: unknown profile 'nosuch'", True),
    (["tune", "--launch", "servescope sim --profile tiny", "--search", "max-num-seqs=0|4", "-c", "2,4", "-n", "4"],
     "--launch with --max-num-seqs 0: the simulator's --max-num-seqs 0: must be 1 or more", True),
], ids=["run-profile", "run-variant-flag", "tune-profile", "tune-setting"])
def test_a_simulator_launch_it_refuses_leaves_nothing(tmp_path: Path, cmd: list[str], says: str,
                                                      before: bool) -> None:
    # tune reads the launch at each setting with the simulator's own parser before it makes its session; run
    # starts the server, which refuses, and removes the folder it made
    p = servescope(*cmd, "--sessions-dir", str(tmp_path / "sessions"), timeout=60)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], lines
    if before:
        assert p.stdout == ""  # nothing started: no `tune: ...` line either
    else:
        assert _kept_log(lines[0]) is not None  # the log that says why is kept where the line says
    assert _empty(tmp_path / "sessions")


def _failing_vllm(tmp_path: Path) -> Path:
    script = tmp_path / "bin" / "vllm"
    script.parent.mkdir()
    script.write_text(FAILING_VLLM.format(python=sys.executable))
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("command", ["tune", "run"])
def test_a_server_that_cannot_start_leaves_no_session_and_its_log_is_kept(tmp_path: Path, command: str) -> None:
    (tmp_path / "w.toml").write_text(SHORT)
    sessions = tmp_path / "sessions"
    extra = ["-c", "2,4", "-n", "4"] if command == "tune" else ["-c", "1", "-n", "1"]
    p = servescope(command, "--launch", f"{_failing_vllm(tmp_path)} serve m", "-w", str(tmp_path / "w.toml"), *extra,
                   "--sessions-dir", str(sessions), timeout=120)
    assert p.returncode == 2, p.stderr
    err = p.stderr.strip().splitlines()[-1]
    assert "the server exited with code 3 before /health answered" in err and "out of memory" in err, err
    assert _empty(sessions), list(sessions.rglob("*"))
    log = Path(err.rsplit("log: ", 1)[1])
    assert log.is_file() and "out of memory" in log.read_text() and sessions not in log.parents
    _kept_log(err)


def test_a_program_that_is_not_there_leaves_no_session(tmp_path: Path) -> None:
    p = servescope("run", "--launch", "/nonexistent/vllm serve m", "-n", "1", "--sessions-dir",
                   str(tmp_path / "sessions"), timeout=60)
    assert p.returncode == 2 and "cannot start '/nonexistent/vllm'" in p.stderr
    assert _empty(tmp_path / "sessions")
