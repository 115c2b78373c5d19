"""A disk that fills up during `servescope run` (issue 32, item 4): the run ends with one line saying which file
could not be written and why, exit status 1; the cells finished before are kept, readable, and session.toml says
the session failed and why. Run for real against the simulator, on a small tmpfs where this machine lets the test
mount one, else under a file-size limit (RLIMIT_FSIZE: a write past it fails with EFBIG)."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from servescope.sessions.store import load_session
from tests.integration.helpers import ROOT
from tests.support.meta import stored

# the --fast lane leaves this module out: 1 tests, ~31 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

# cell 1 (sharegpt) writes ~20 KB of requests and a ~60 KB cells.parquet; cell 2 (longout: 2048 tokens each)
# ~97 KB of requests, past the limits below
ARGS = ("run", "--url", "sim://tiny", "-w", "sharegpt,longout", "-c", "16", "-n", "16")


def run(save: Path, home: Path, fsize: int | None = None) -> subprocess.CompletedProcess[str]:
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG), never kills
        if fsize is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))

    env = {**os.environ, "SERVESCOPE_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "servescope", *ARGS, "--save", str(save)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=ROOT, preexec_fn=limit)


def check(p: subprocess.CompletedProcess[str], save: Path, why: str, todo: str) -> None:
    assert p.returncode == 1, p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    [line] = [x for x in p.stderr.splitlines() if x.startswith("servescope run: error:")]
    assert line.startswith(f"servescope run: error: cannot write {save}/"), line
    assert f"({why}); {todo}" in line, line
    assert f"the cells finished before are kept in {save}" in line and f"servescope resume {save}" in line, line
    s = load_session(save)  # whole: not `broken`
    done = s.cells.filter(s.cells["status"] == "done")
    assert done.height >= 1, s.cells
    for i in done["index"].to_list():
        assert s.requests(i).height == 16  # each kept cell's requests, all of them
    if "session.toml could not be marked failed either" not in line:
        assert stored(s)["status"] == "failed"
        assert str(stored(s)["message"]).startswith(f"cannot write {save}/") and why in str(stored(s)["message"])
    assert not list(save.rglob("*.tmp")), "a temporary file was left taking the space"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_FSIZE semantics are Linux's")
def test_a_file_size_limit_mid_run_is_one_line_and_keeps_the_finished_cells(tmp_path: Path) -> None:
    save = tmp_path / "sessions" / "s"
    p = run(save, tmp_path / "home", fsize=80_000)
    check(p, save, "File too large", "a file-size limit (ulimit -f) stops it: raise the limit or free space")


@pytest.mark.slow
def test_a_full_tmpfs_mid_run_is_one_line_and_keeps_the_finished_cells(tmp_path: Path) -> None:
    mnt = tmp_path / "small"
    mnt.mkdir()
    if not shutil.which("mount") or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160k", "tmpfs", str(mnt)],
                                                   capture_output=True).returncode != 0:
        pytest.skip("this machine does not let the test mount a tmpfs (the file-size-limit test covers it)")
    try:
        save = mnt / "sessions" / "s"
        p = run(save, tmp_path / "home")
        check(p, save, "No space left on device", "the disk is full: free space")
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
