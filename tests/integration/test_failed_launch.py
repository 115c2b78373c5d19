"""A run or a tune that measured nothing leaves no session behind (issue 44, item 20): a launch the simulator's own
parser refuses (an unknown profile, a flag it does not take) is bad input, one line before anything starts; a server
that cannot start (no such program, one that exits before /health) fails the run and its folder goes, the log that
says why kept where the error line says. A run that measured some cells before it failed keeps them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.integration.helpers import servescope

SHORT = '[workload]\nname = "short"\ninput_tokens = 32\noutput_tokens = 4\n'
# a `vllm` that says why it cannot serve, then exits before /health answers
FAILING_VLLM = """#!{python}
import sys
print("ValueError: the model cannot be loaded: out of memory (a failing server's last words)", flush=True)
sys.exit(3)
"""


def _empty(d: Path) -> bool:
    return not d.exists() or not any(d.iterdir())


@pytest.mark.parametrize("cmd, says", [
    (["run", "--launch", "servescope sim --profile nosuch", "-n", "1"], "servescope sim: unknown profile 'nosuch'"),
    (["run", "--launch", "servescope sim --profile tiny", "--server-variant", "--bogus-flag 3", "-n", "1"],
     "the server variant '--bogus-flag 3': the simulator takes no '--bogus-flag'"),
    (["run", "--launch", "servescope sim --profile tiny --max-num-seqs abc", "-n", "1"],
     "argument --max-num-seqs: invalid int value: 'abc'"),
    (["tune", "--launch", "servescope sim --profile nosuch", "-c", "2,4", "-n", "4"],
     "servescope sim: unknown profile 'nosuch'"),
], ids=["profile", "variant-flag", "flag-value", "tune-profile"])
def test_a_simulator_launch_it_refuses_is_one_line_before_anything(tmp_path: Path, cmd: list[str], says: str) -> None:
    p = servescope(*cmd, "--sessions-dir", str(tmp_path / "sessions"), timeout=60)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], lines
    assert p.stdout == ""  # nothing started: no `tune: ...` line either
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


def test_a_program_that_is_not_there_leaves_no_session(tmp_path: Path) -> None:
    p = servescope("run", "--launch", "/nonexistent/vllm serve m", "-n", "1", "--sessions-dir",
                   str(tmp_path / "sessions"), timeout=60)
    assert p.returncode == 2 and "cannot start '/nonexistent/vllm'" in p.stderr
    assert _empty(tmp_path / "sessions")
