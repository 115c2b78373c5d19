"""Sessions written by an earlier servescope still open, report, compare and gate with the same figures.

tests/sessions/old/v2/ holds real sessions (schema 2) made against the simulator with servescope 0.1.0 (at commit
394f52b, before the result model was reshaped): two runs of the same GPTQ sweep, an FP8 one, an open-loop
sweep with quality probes under load, a multi-turn chat. Beside them, the Markdown that release wrote for them.
A change that moves a figure, a statistic or a row fails here; a change meant to alter the Markdown rewrites the
expected files with SERVESCOPE_UPDATE_GOLDEN=1 and says why in its commit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from servescope.sessions.store import load_session
from tests.sessions.mdcheck import tables

OLD = Path(__file__).parent / "old"
SESSIONS = OLD / "v2"
ROOT = Path(__file__).resolve().parents[2]
GATE = ["--fail-on", "output_tok_s:-5%,ttft_ms.p99:+10%,tpot_ms.p50:+5%"]

CASES = {  # expected file -> the command (run in a copy of SESSIONS, so sessions are named by their folders)
    "report-gptq.md": ["report", "gptq"],
    "report-tiny-open.md": ["report", "tiny-open"],
    "report-tiny-chat.md": ["report", "tiny-chat"],
    "compare-gptq-fp8.md": ["compare", "gptq", "fp8", "--label", "quant"],
    "gate-gptq-again.md": ["gate", "gptq", "gptq-again", *GATE, "--markdown", "gate.md"],
}


@pytest.fixture(scope="module")
def sessions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("golden") / "v2"
    shutil.copytree(SESSIONS, where)  # nothing the commands write lands in the repository
    return where


def _run(cwd: Path, args: list[str]) -> str:
    p = subprocess.run([sys.executable, "-m", "servescope", *args], capture_output=True, text=True, timeout=120,
                       cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}, check=False)
    assert p.returncode == 0, f"servescope {' '.join(args)}: exit {p.returncode}\n{p.stderr[-3000:]}"
    return (cwd / "gate.md").read_text() if "--markdown" in args else p.stdout


@pytest.mark.parametrize("expected", sorted(CASES))
def test_an_old_session_gives_the_same_markdown(sessions: Path, expected: str) -> None:
    got = _run(sessions, CASES[expected])
    path = OLD / expected
    if os.environ.get("SERVESCOPE_UPDATE_GOLDEN") == "1":
        path.write_text(got)
    assert tables(got), expected  # well-formed tables, and some
    assert got == path.read_text(), f"{expected} differs from what servescope wrote for these sessions"


def test_old_sessions_open_with_their_cells(sessions: Path) -> None:
    cells = {}
    for d in sorted(SESSIONS.iterdir()):
        s = load_session(sessions / d.name)
        assert s.status == "completed"
        assert all(x is not None and x.requests_ok > 0 for x in s.summaries()), d.name
        cells[d.name] = s.cells.height
    assert cells == {"fp8": 2, "gptq": 2, "gptq-again": 2, "tiny-chat": 1, "tiny-open": 2}


@pytest.mark.parametrize("name", ["gptq", "tiny-open"])
def test_reopening_an_old_session_moves_its_plan_into_session_toml(tmp_path: Path, name: str) -> None:
    """Resuming (reopening for writing) an older session brings it to this schema: each cell's load is then stored
    once, in its [[cells]] plan, the [load] table is gone, and the session reads and reports exactly as before."""
    import tomllib

    import polars as pl

    from servescope.sessions.store import SCHEMA_VERSION, SessionWriter

    where = tmp_path / "v2"
    shutil.copytree(SESSIONS, where)
    before = load_session(where / name).cells
    expected = (OLD / f"report-{name}.md").read_text()
    SessionWriter.open(where / name)
    meta = tomllib.loads((where / name / "session.toml").read_text())
    assert meta["schema_version"] == SCHEMA_VERSION and "load" not in meta
    on_disk = pl.read_parquet(where / name / "cells.parquet").columns
    assert not {"concurrency", "rate", "load_label", "workload"} & set(on_disk), on_disk
    after = load_session(where / name).cells
    assert after.select(before.columns).to_dicts() == before.to_dicts()
    assert _run(where, ["report", name]) == expected
