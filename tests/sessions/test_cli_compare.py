"""The CLI wiring of sessions/compare/report/import, and its one-line errors on bad input."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from servescope.cli import args as cli_args
from servescope.cli import compare as cli_compare
from servescope.core.errors import ServescopeError
from servescope.sessions.store import load_session

from .conftest import DATA, CellSpec, SessionSpec, build_session, fp8_spec, gptq_spec
from .mdcheck import tables


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="servescope")
    sub = p.add_subparsers(dest="cmd")
    for name in ("sessions", "compare", "report", "import"):
        getattr(cli_args, f"add_{name}_args")(sub.add_parser(name))
    return p.parse_args(argv)


def run(argv: list[str]) -> int:
    args = parse(argv)
    return int(getattr(cli_compare, f"{args.cmd}_command")(args))


def one_line_error(argv: list[str]) -> str:
    with pytest.raises(ServescopeError) as e:
        run(argv)
    msg = str(e.value)
    assert msg and "\n" not in msg
    return msg


@pytest.fixture
def home(tmp_path: Path) -> Path:
    d = tmp_path / "sessions"
    build_session(d, gptq_spec(), "20261201-120000-gptq")
    build_session(d, fp8_spec(), "20261201-130000-fp8")
    return d


def test_sessions_lists_ids(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["sessions", "--sessions-dir", str(home)]) == 0
    out = capsys.readouterr().out
    assert "20261201-120000" in out and "20261201-130000" in out and "quant=GPTQ-Int4" in out
    assert run(["sessions", "--sessions-dir", str(home), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in rows] == ["20261201-120000", "20261201-130000"]
    assert rows[0]["workloads"] == ["longin", "sharegpt", "sharegpt-think"]


def test_sessions_default_home_and_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["sessions"]) == 0  # SERVESCOPE_HOME is a temporary dir in tests
    assert "no sessions in" in capsys.readouterr().out


def test_short_ids_grow_until_unique(tmp_path: Path) -> None:
    a, b = tmp_path / "20261201-120000-a", tmp_path / "20261201-120000-b"
    ids = cli_compare.short_ids([a, b])
    assert ids[a] == "20261201-120000-a" and ids[b] == "20261201-120000-b"


def test_compare_by_id_and_path(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cmp.md"
    assert run(["compare", "20261201-12", str(home / "20261201-130000-fp8"), "--sessions-dir", str(home),
                "--label", "quant", "-o", str(out)]) == 0
    md = out.read_text()
    assert md.startswith("# Comparison: GPTQ-Int4 vs FP8")
    tables(md)
    assert run(["compare", "20261201-12", "20261201-13", "--sessions-dir", str(home), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [s["label"] for s in doc["sessions"]] == ["gptq", "fp8"]


def test_report_formats(home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["report", "20261201-12", "--compare", "20261201-13", "--sessions-dir", str(home)]) == 0
    md = capsys.readouterr().out
    assert "## Comparison: gptq vs fp8" in md
    for fmt in ("csv", "json"):
        out = tmp_path / f"r.{fmt}"
        assert run(["report", str(home / "20261201-120000-gptq"), "--format", fmt, "-o", str(out)]) == 0
        assert out.stat().st_size > 100


def test_import_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["import", str(DATA / "vllm-bench-c1-detailed.json"), "--sessions-dir", str(tmp_path),
                "--tag", "run=old"]) == 0
    out = capsys.readouterr().out
    assert "imported 1 cell(s) from vllm bench serve as session" in out and "this import lacks:" in out
    assert "ttfo_ms" in out
    (d,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert load_session(d).meta["tags"]["run"] == "old"


# ---- bad input: one clear line each ----------------------------------------------------------------------
def test_missing_session(home: Path) -> None:
    msg = one_line_error(["report", "nope", "--sessions-dir", str(home)])
    assert "no session 'nope'" in msg and "servescope sessions" in msg
    msg = one_line_error(["compare", str(home / "missing-dir"), "20261201-13", "--sessions-dir", str(home)])
    assert "missing-dir" in msg


def test_directory_that_is_not_a_session(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert "not a servescope session" in one_line_error(["report", str(tmp_path / "empty")])


def test_ambiguous_id(home: Path) -> None:
    assert "names 2 sessions" in one_line_error(["report", "20261201", "--sessions-dir", str(home)])


def test_newer_schema(home: Path) -> None:
    toml = home / "20261201-130000-fp8" / "session.toml"
    meta = load_session(toml.parent).meta
    meta["schema_version"] = 99
    toml.write_text(tomli_w.dumps(meta))
    msg = one_line_error(["compare", "20261201-12", "20261201-13", "--sessions-dir", str(home)])
    assert "schema_version 99 is newer" in msg and "upgrade servescope" in msg


def test_no_common_cells(tmp_path: Path) -> None:
    a = build_session(tmp_path, SessionSpec("a", [CellSpec("sharegpt", 1)]))
    b = build_session(tmp_path, SessionSpec("b", [CellSpec("sharegpt", 2)]))
    assert "share no cell" in one_line_error(["compare", str(a), str(b)])


def test_compare_needs_two(home: Path) -> None:
    assert "at least two sessions" in one_line_error(["compare", "20261201-12", "--sessions-dir", str(home)])


def test_unknown_import_format(tmp_path: Path) -> None:
    f = tmp_path / "x.json"
    f.write_text('{"results": []}')
    assert "unknown import format" in one_line_error(["import", str(f), "--sessions-dir", str(tmp_path)])


def test_bad_slo(home: Path) -> None:
    assert "bad SLO" in one_line_error(["report", "20261201-12", "--sessions-dir", str(home), "--slo", "ttft=3"])


def test_wired_into_servescope_cli(home: Path) -> None:
    """Through `python -m servescope`: the commands are there, and bad input is exit 2 and one line on stderr."""
    r = subprocess.run([sys.executable, "-m", "servescope", "compare", "--help"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("usage: servescope compare"), r.stdout[-1000:] + r.stderr[-2000:]
    r = subprocess.run([sys.executable, "-m", "servescope", "report", "nope", "--sessions-dir", str(home)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "no session 'nope'" in r.stderr
