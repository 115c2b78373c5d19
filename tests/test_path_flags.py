"""One check of the paths every command is given (issue 32, item 4): --save and --sessions-dir name directories,
-o/--output and --save-baseline files. A file where a directory goes, a directory where a file goes, a path under
a file, the kernel's /proc, or a read-only disk is one line naming the flag, exit status 2, before any work (these
were FileExistsError, NotADirectoryError, FileNotFoundError and OSError [Errno 30] tracebacks)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from servescope.__main__ import main
from tests.sessions.conftest import build_session, gptq_spec

RUN = ["run", "--url", "sim://tiny", "-w", "sharegpt", "-c", "1", "-n", "1"]
DETAILED = str(Path(__file__).parent / "sessions" / "data" / "vllm-bench-c1-detailed.json")


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def afile(tmp_path: Path) -> Path:
    f = tmp_path / "afile"
    f.write_text("x")
    return f


@pytest.fixture
def session(tmp_path: Path) -> Path:
    return build_session(tmp_path / "sessions", gptq_spec())


CASES = {
    "run --save a file": (lambda f, s: [*RUN, "--save", str(f)], "--save {f}: a file is there, not a directory"),
    "run --sessions-dir a file": (lambda f, s: [*RUN, "--sessions-dir", str(f)],
                                  "--sessions-dir {f}: a file is there, not a directory"),
    "run --sessions-dir under a file": (lambda f, s: [*RUN, "--sessions-dir", str(f / "sub")],
                                        "--sessions-dir {f}/sub: {f} is a file, not a directory"),
    "sessions --sessions-dir a file": (lambda f, s: ["sessions", "--sessions-dir", str(f)],
                                       "--sessions-dir {f}: a file is there"),
    "quality --save a file": (lambda f, s: ["quality", "--url", "sim://tiny", "--save", str(f)],
                              "--save {f}: a file is there"),
    "import --save a file": (lambda f, s: ["import", DETAILED, "--save", str(f)], "--save {f}: a file is there"),
    "report -o a directory": (lambda f, s: ["report", str(s), "-o", str(f.parent)],
                              "-o {d}: a directory is there; -o names a file"),
    "report -o under no directory": (lambda f, s: ["report", str(s), "-o", str(f.parent / "no" / "r.md")],
                                     "-o {d}/no/r.md: {d}/no is not a directory"),
    "compare -o a directory": (lambda f, s: ["compare", str(s), str(s), "-o", str(f.parent)],
                               "-o {d}: a directory is there"),
    "gate --save-baseline a directory": (lambda f, s: ["gate", str(s), "--save-baseline", str(f.parent)],
                                         "--save-baseline {d}: a directory is there"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_path_is_one_line_before_any_work(afile: Path, session: Path, case: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    argv, want = CASES[case]
    args = argv(afile, session)
    assert main(args) == 2
    line = one_line(capsys)
    assert line.startswith(f"servescope {args[0]}: error: ") and want.format(f=afile, d=afile.parent) in line, line
    assert not (afile.parent / "home").exists()  # nothing was started or written


@pytest.mark.skipif(not os.path.isdir("/proc") or os.statvfs("/proc").f_blocks != 0, reason="no procfs here")
def test_save_under_proc_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*RUN, "--save", "/proc/x"]) == 2
    assert "--save /proc/x: /proc is a virtual filesystem" in one_line(capsys)


@pytest.fixture
def read_only(tmp_path: Path, session: Path) -> Iterator[Path]:
    """A read-only tmpfs holding a copy of `session` (completed) and of it marked running (interrupted), where
    this machine lets the test mount one."""
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if not shutil.which("mount") or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)],
                                                   capture_output=True).returncode != 0:
        pytest.skip("this machine does not let the test mount a tmpfs")
    try:
        shutil.copytree(session, mnt / "done")
        shutil.copytree(session, mnt / "cut")
        toml = mnt / "cut" / "session.toml"
        text = toml.read_text().replace('status = "completed"', 'status = "running"', 1)
        toml.write_text(text[::-1].replace('"enod" = sutats', '"dennalp" = sutats', 1)[::-1])  # its last cell
        assert subprocess.run(["mount", "-o", "remount,ro", str(mnt)]).returncode == 0
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=False)


def test_a_read_only_disk_is_one_line(read_only: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ro = read_only
    assert main([*RUN, "--sessions-dir", str(ro)]) == 2
    assert f"--sessions-dir {ro}: cannot write in {ro} (a read-only disk, or no permission)" in one_line(capsys)
    assert main(["quality", "--url", "sim://tiny", "--save", str(ro / "done")]) == 2
    assert f"--save {ro}/done: cannot write in {ro}/done (a read-only disk" in one_line(capsys)
    assert main(["report", str(ro / "done"), "-o", str(ro / "r.md")]) == 2
    assert f"-o {ro}/r.md: cannot write in {ro}" in one_line(capsys)
    assert main(["twin", "fit", str(ro / "done")]) == 2
    assert f"twin fit: cannot write in {ro}/done (a read-only disk" in one_line(capsys)
    assert main(["resume", str(ro / "cut")]) == 2
    assert f"resume: cannot write in {ro}/cut (a read-only disk" in one_line(capsys)


def test_a_runner_lock_that_cannot_be_made_is_one_line(afile: Path) -> None:
    from servescope.core.errors import ServescopeError
    from servescope.sessions.live import RunnerLock

    with pytest.raises(ServescopeError, match=rf"^cannot write {afile}/s \(Not a directory\); check the folder"):
        RunnerLock.acquire(afile / "s")
