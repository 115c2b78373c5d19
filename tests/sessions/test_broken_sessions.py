"""Corrupt sessions (issue 11, items 1 and 12): a damaged file is one line naming it and what to do, the
session is listed as `broken: <reason>` and never hides the others, and report/compare/resume refuse it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from servescope.__main__ import main
from servescope.core.errors import ServescopeError
from servescope.sessions.store import load_session, scan_sessions
from tests.sessions.conftest import build_session, fp8_spec, gptq_spec


@pytest.fixture
def two(tmp_path: Path) -> tuple[Path, Path]:
    base = tmp_path / "sessions"
    return build_session(base, gptq_spec()), build_session(base, fp8_spec())


def truncate(f: Path, keep: float = 0.5) -> None:
    data = f.read_bytes()
    f.write_bytes(data[: int(len(data) * keep)])


def one_line(text: str) -> str:
    lines = [x for x in text.splitlines() if x.strip()]
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


DAMAGES = {
    "cells.parquet truncated": lambda p: truncate(p / "cells.parquet"),
    "requests parquet truncated": lambda p: truncate(p / "requests" / "cell-0000.parquet"),
    "requests parquet emptied": lambda p: (p / "requests" / "cell-0001.parquet").write_bytes(b""),
    "cells.parquet is text": lambda p: (p / "cells.parquet").write_text("not parquet"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_damaged_parquet_is_one_line_naming_the_file(two: tuple[Path, Path], damage: str) -> None:
    a, _b = two
    DAMAGES[damage](a)
    with pytest.raises(ServescopeError) as e:
        load_session(a)
    msg = e.value.message
    assert "\n" not in msg and "cannot be read" in msg and "restore it" in msg
    assert ("cells.parquet" in msg) == damage.startswith("cells")
    assert ("cell-000" in msg) == damage.startswith("requests")


@pytest.mark.parametrize("text, needle", [
    ("", "the file is empty, not a session"),
    ("   \n\n", "the file is empty, not a session"),
    ('name = "x"\n', "no schema_version: not a servescope session.toml"),
    ("schema_version = 99\n", "newer than this servescope understands"),
    ('schema_version = "2"\n', "is not a session schema version"),
    ("schema_version = true\n", "is not a session schema version"),
    ("schema_version = 2\nstatus = [1\n", "TOML error"),
    ("schema_version = 2\nmodel = 5\n", "model: expected str, got int"),
    ("schema_version = 2\n[[cells]]\nstatus = \"done\"\n", "cells[0].index"),
])
def test_bad_session_toml(tmp_path: Path, text: str, needle: str) -> None:
    d = tmp_path / "s"
    d.mkdir()
    (d / "session.toml").write_text(text)
    with pytest.raises(ServescopeError, match=r".") as e:
        load_session(d)
    assert needle in e.value.message and "\n" not in e.value.message
    assert "None is newer" not in e.value.message  # item 12: an empty file is not "schema_version None"


def test_non_utf8_session_toml(tmp_path: Path) -> None:
    d = tmp_path / "s"
    d.mkdir()
    (d / "session.toml").write_bytes(b"\xff\xfe\x00schema")
    with pytest.raises(ServescopeError, match="session.toml: cannot be read"):
        load_session(d)


def test_scan_lists_broken_and_keeps_the_others(two: tuple[Path, Path]) -> None:
    a, b = two
    truncate(a / "cells.parquet")
    entries = {e.path.name: e for e in scan_sessions(a.parent)}
    assert entries[a.name].broken is not None and "cells.parquet" in entries[a.name].broken
    assert entries[a.name].session is None
    assert entries[b.name].broken is None and entries[b.name].session is not None
    assert [e.path for e in scan_sessions(a.parent, newest_first=True)] == sorted([a, b], reverse=True)


def test_cli_sessions_lists_broken(two: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    a, b = two
    truncate(a / "requests" / "cell-0000.parquet")
    assert main(["sessions", "--sessions-dir", str(a.parent)]) == 0
    out = capsys.readouterr().out
    [line] = [x for x in out.splitlines() if "broken:" in x]
    assert line.startswith(a.name[:17]) and "cell-0000.parquet: cannot be read" in line
    assert any(x.startswith(b.name[:17]) and "completed" in x for x in out.splitlines()) and "1 broken" in out
    assert main(["sessions", "--sessions-dir", str(a.parent), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by = {Path(r["dir"]).name: r for r in rows}
    assert by[a.name]["status"] == "broken" and "cell-0000.parquet" in by[a.name]["broken"]
    assert by[b.name]["status"] == "completed"


@pytest.mark.parametrize("cmd", ["report", "report-csv", "compare", "report-compare", "resume"])
def test_commands_refuse_a_broken_session_with_one_line(two: tuple[Path, Path], cmd: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    a, b = two
    truncate(a / "cells.parquet", 0.3)
    argv = {"report": ["report", str(a)], "report-csv": ["report", str(a), "--format", "csv"],
            "compare": ["compare", str(b), str(a)], "report-compare": ["report", str(b), "--compare", str(a)],
            "resume": ["resume", str(a)]}[cmd]
    assert main(argv) == 2
    err = one_line(capsys.readouterr().err)
    assert err.startswith(f"servescope {argv[0]}: error: ") and "cells.parquet: cannot be read" in err


def test_loading_never_changes_the_files(two: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    a, b = two
    truncate(a / "requests" / "cell-0002.parquet")
    before = {f: f.read_bytes() for f in a.parent.rglob("*") if f.is_file()}
    scan_sessions(a.parent)
    main(["sessions", "--sessions-dir", str(a.parent)])
    main(["report", str(a)])
    main(["compare", str(a), str(b)])
    capsys.readouterr()
    assert {f: f.read_bytes() for f in a.parent.rglob("*") if f.is_file()} == before


def test_a_restored_file_makes_the_session_whole_again(two: tuple[Path, Path], tmp_path: Path) -> None:
    a, _ = two
    keep = tmp_path / "keep.parquet"
    shutil.copy(a / "cells.parquet", keep)
    n = load_session(a).cells.height
    truncate(a / "cells.parquet")
    with pytest.raises(ServescopeError):
        load_session(a)
    shutil.copy(keep, a / "cells.parquet")
    assert load_session(a).cells.height == n


async def test_the_app_lists_a_broken_session_and_keeps_running(two: tuple[Path, Path],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 1: one truncated cells.parquet made the app exit with a traceback when F4 opened."""
    from servescope.tui.app import make_app

    a, b = two
    monkeypatch.setenv("SERVESCOPE_HOME", str(a.parent.parent))
    truncate(a / "cells.parquet")
    app = make_app(sessions_dir=str(a.parent))
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        screen = app.screen
        assert type(screen).__name__ == "SessionsScreen"
        rows = {str(k): v for k, v in getattr(screen, "rows", {}).items()}
        assert rows, "the sessions list is empty"
        broken = rows[str(a)]
        assert "broken" in broken and any("cells.parquet: cannot be read" in str(x) for x in broken)
        assert "broken" not in rows[str(b)]
        await pilot.press("enter")  # opening it says why, in a notice, and the app stays
        await pilot.pause()
        assert app.is_running


# ---- issue 32, item 2: a session is broken unless every file its session.toml promises is there ---------------
def wrong_columns(p: Path) -> None:
    import polars as pl

    pl.DataFrame({"a": [1, 2], "b": ["x", "y"]}).write_parquet(p / "requests" / "cell-0000.parquet")


PROMISED = {
    "cells.parquet deleted": (lambda p: (p / "cells.parquet").unlink(), "cells.parquet: cannot be read",
                              "cells.parquet is missing"),
    "requests file deleted": (lambda p: (p / "requests" / "cell-0000.parquet").unlink(),
                              "cell-0000.parquet: cannot be read", "it is missing: cell 0 is done"),
    "requests folder deleted": (lambda p: shutil.rmtree(p / "requests"), "requests: cannot be read",
                                "it is missing: cell 0 is done"),
    "requests of other columns": (wrong_columns, "cell-0000.parquet: cannot be read",
                                  "no 'index' column: not a servescope requests file"),
}


@pytest.mark.slow  # ~2.6 s of the --fast lane on 2 busy cores (2026-12-08)
@pytest.mark.parametrize("damage", list(PROMISED))
def test_a_missing_or_foreign_file_is_broken_everywhere(two: tuple[Path, Path], damage: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """cells.parquet deleted read as `completed 2/2` with 0 cells; a deleted requests file or folder was not
    flagged; a requests file of other columns crashed the app and `twin fit` (ColumnNotFoundError)."""
    a, b = two
    act, where, why = PROMISED[damage]
    act(a)
    with pytest.raises(ServescopeError) as e:
        load_session(a)
    assert where in e.value.message and why in e.value.message and "\n" not in e.value.message
    assert main(["sessions", "--sessions-dir", str(a.parent)]) == 0
    [line] = [x for x in capsys.readouterr().out.splitlines() if "broken:" in x]
    assert line.startswith(a.name[:15]) and where in line
    gate = ["--fail-on", "output_tok_s:-5%"]
    for argv in (["report", str(a)], ["twin", "fit", str(a)], ["gate", str(b), str(a), *gate],
                 ["gate", str(a), str(b), *gate]):
        assert main(argv) == 2, argv  # gate passed with the cell `not judged`
        err = one_line(capsys.readouterr().err)
        assert where in err and why in err, (argv, err)


def test_a_requests_file_of_a_wrong_type_is_broken(two: tuple[Path, Path]) -> None:
    import polars as pl

    a, _ = two
    f = a / "requests" / "cell-0001.parquet"
    pl.read_parquet(f).with_columns(pl.col("warmup").cast(pl.Int64)).write_parquet(f)
    with pytest.raises(ServescopeError, match=r"cell-0001.parquet: cannot be read \(column 'warmup' is Int64, "
                                              r"not Boolean\)"):
        load_session(a)


def test_an_aggregate_import_needs_no_requests_file(tmp_path: Path) -> None:
    from servescope.sessions.importers import import_files

    data = json.loads((Path(__file__).parent / "data" / "vllm-bench-c1-detailed.json").read_text())
    for k in ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors"):
        data.pop(k, None)
    f = tmp_path / "agg.json"
    f.write_text(json.dumps(data))
    s = load_session(import_files([str(f)], save=tmp_path / "imp"))
    assert s.info.source is not None and s.info.source.rebuilt is False and s.cells.height == 1
    assert not list((s.path / "requests").glob("*.parquet"))


def test_session_toml_that_is_a_directory_is_listed_broken(two: tuple[Path, Path],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Item 7: the session vanished from `sessions`."""
    a, _ = two
    (a / "session.toml").unlink()
    (a / "session.toml").mkdir()
    assert {e.path.name: e.broken is not None for e in scan_sessions(a.parent)} == {a.name: True, _.name: False}
    assert main(["sessions", "--sessions-dir", str(a.parent)]) == 0
    [line] = [x for x in capsys.readouterr().out.splitlines() if "broken:" in x]
    assert "session.toml: a directory, not a file" in line
    assert main(["report", str(a)]) == 2
    assert "session.toml: a directory, not a file" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize("cmd", ["sessions", "report", "resume"])
def test_an_unknown_session_status_is_a_damaged_file(two: tuple[Path, Path], cmd: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Item 7: `status = "exploded"` was shown as is and `resume` took it."""
    a, _ = two
    toml = a / "session.toml"
    toml.write_text(toml.read_text().replace('status = "completed"', 'status = "exploded"', 1))
    argv = {"sessions": ["sessions", "--sessions-dir", str(a.parent)], "report": ["report", str(a)],
            "resume": ["resume", str(a)]}[cmd]
    rc = main(argv)
    cap = capsys.readouterr()
    text = [x for x in cap.out.splitlines() if "broken:" in x][0] if cmd == "sessions" else one_line(cap.err)
    assert rc == (0 if cmd == "sessions" else 2)
    assert "status 'exploded' is not a session status (running, completed, interrupted, failed" in text


async def test_the_app_lists_a_session_with_foreign_requests_broken_and_keeps_running(
        two: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Item 2: a requests file of other columns made the app exit (ColumnNotFoundError: "warmup" not found)."""
    from servescope.tui.app import make_app

    a, b = two
    monkeypatch.setenv("SERVESCOPE_HOME", str(a.parent.parent))
    wrong_columns(a)
    app = make_app(sessions_dir=str(a.parent))
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.press("f4")
        await pilot.pause()
        rows = {str(k): v for k, v in getattr(app.screen, "rows", {}).items()}
        assert any("cell-0000.parquet: cannot be read" in str(x) for x in rows[str(a)])
        assert "broken" not in rows[str(b)]
        await pilot.press("enter")
        await pilot.pause()
        assert app.is_running


def test_session_toml_says_which_cells_have_requests_files(two: tuple[Path, Path]) -> None:
    """Each written cell's [[cells]] entry says whether its requests file was written (`requests_file`); a
    session written before that key promises one for each done or stopped cell that servescope measured."""
    import re

    a, _ = two
    toml = a / "session.toml"
    text = toml.read_text()
    assert "requests_file = true" in text
    (a / "requests" / "cell-0000.parquet").unlink()
    toml.write_text(re.sub(r"requests_file = true\n", "", text))  # an older session: still promised
    with pytest.raises(ServescopeError, match=r"cell-0000.parquet: cannot be read \(it is missing"):
        load_session(a)
    toml.write_text(text.replace("requests_file = true", "requests_file = false", 1))  # not written: not promised
    assert load_session(a).requests(0).height == 0
