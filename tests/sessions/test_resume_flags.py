"""`servescope resume` reads its flags as `run` does: a flag given empty is one line (exit 2), never "not given"."""

from __future__ import annotations

from pathlib import Path

import pytest

from servescope.__main__ import main

from .conftest import CellSpec, SessionSpec, build_session


@pytest.fixture
def interrupted(tmp_path: Path) -> Path:
    spec = SessionSpec("cut", [CellSpec("sharegpt", 1), CellSpec("sharegpt", 4)], status="interrupted",
                       message="stopped by the user")
    return build_session(tmp_path, spec)


@pytest.mark.parametrize(("flags", "needle"), [
    (["--url", ""], "--url"),
    (["--launch", ""], "--launch"),
    (["--api-key", ""], "--api-key"),
    (["--recover-timeout", ""], "--recover-timeout"),
    (["--api-key-env", ""], "--api-key-env"),
    (["--url", "http://[::1"], "--url"),
])
def test_an_empty_or_malformed_flag_is_one_line(interrupted: Path, flags: list[str], needle: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["resume", str(interrupted), *flags])
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("servescope resume: error: ") and needle in err, err
    assert "Traceback" not in err
