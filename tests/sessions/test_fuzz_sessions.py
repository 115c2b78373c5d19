"""Fuzz (Hypothesis): session directories with one file truncated at a random length. Loading, listing,
reporting (md, csv, json) and comparing never raise anything but a one-line ServescopeError; a session with a
truncated Parquet file is listed as broken naming that file; loading never changes a file, and a session
that still loads has every finished cell it had. Bounded: 40 examples (each copies a small session)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from servescope.core.errors import ServescopeError
from servescope.reports.report import render_report
from servescope.sessions.compare import compare_sessions
from servescope.sessions.store import load_session, scan_sessions
from tests.sessions.conftest import CellSpec, SessionSpec, build_session

# the --fast lane leaves this module out: 1 tests, ~2 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

EXAMPLES = 40


def small(name: str, quant: str) -> SessionSpec:
    return SessionSpec(name, tags={"quant": quant}, slos={"ttft_ms": 1000.0}, cells=[
        CellSpec("sharegpt", 1, requests=4, out_tokens=8, failed=1),
        CellSpec("sharegpt", 4, requests=4, out_tokens=8, server={"preemptions": 1.0, "kv_cache_tokens": 900.0}),
        CellSpec("longin", 1, skipped="too long"),
    ])


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("pristine") / "sessions"
    build_session(base, small("a", "FP8"))
    build_session(base, small("b", "INT4"))
    return base


def files_of(session: Path) -> list[str]:
    return sorted(str(f.relative_to(session)) for f in session.rglob("*") if f.is_file())


def snapshot(base: Path) -> dict[Path, bytes]:
    return {f: f.read_bytes() for f in base.rglob("*") if f.is_file()}


def check_one_line(e: ServescopeError) -> None:
    assert e.message and "\n" not in e.message, e.message


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_truncated_session_files(pristine: Path, data: st.DataObject) -> None:
    a_name = next(d.name for d in sorted(pristine.iterdir()) if d.name.endswith("-a"))
    rel = data.draw(st.sampled_from(files_of(pristine / a_name)), label="file")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "sessions"
        shutil.copytree(pristine, base)
        a, b = base / a_name, next(d for d in base.iterdir() if d.name.endswith("-b"))
        target = a / rel
        raw = target.read_bytes()
        cut = data.draw(st.integers(0, max(0, len(raw) - 1)), label="keep bytes")
        if rel == "session.toml" and data.draw(st.booleans(), label="at a line end"):
            cut = raw.rfind(b"\n", 0, cut) + 1  # whole lines kept: it still parses, with tables missing
        target.write_bytes(raw[:cut])
        cells_before = load_session(pristine / a_name).cells.height
        before = snapshot(base)

        entries = {e.path.name: e for e in scan_sessions(base)}
        assert entries[b.name].broken is None  # one damaged session never hides another
        if rel.endswith(".parquet"):
            broken = entries[a.name].broken
            assert broken is not None and rel.split("/")[-1] in broken, broken
        loaded = None
        try:
            loaded = load_session(a)
        except ServescopeError as e:
            check_one_line(e)
            assert entries[a.name].broken == e.message
        event(f"{rel.split('/')[0]}: {'loads' if loaded is not None else 'broken'}")
        if loaded is not None:
            assert entries[a.name].broken is None
            assert loaded.cells.height == cells_before  # no finished cell lost by loading
            other = load_session(b)
            for fmt in ("md", "csv", "json"):
                try:
                    text = render_report(loaded, fmt=fmt)
                    assert text.strip()
                except ServescopeError as e:
                    check_one_line(e)
            try:
                compare_sessions([other, loaded])
            except ServescopeError as e:
                check_one_line(e)
        assert snapshot(base) == before  # loading, listing and reporting never write
