"""`servescope report ID --format csv` (issue 11, item 7): one flat row per cell with dotted columns, on every
kind of session (measured, with skipped cells, compared, imported)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pytest

from servescope.__main__ import main
from servescope.reports.report import render_report


def rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_csv_one_row_per_cell_dotted(fixed_pair: tuple[Any, Any]) -> None:
    a, _b = fixed_pair
    text = render_report(a, fmt="csv")
    rs = rows(text)
    assert len(rs) == a.cells.height == 6
    cols = list(rs[0])
    assert cols[:2] == ["session", "session_dir"]
    for c in ("workload", "concurrency", "status", "ttft_ms.p50", "ttft_ms.p99", "tpot_ms.mean", "e2e_ms.max",
              "output_tok_s", "requests_ok", "server.preemptions", "input_tokens_mismatch.max_abs"):
        assert c in cols, c
    assert not any(c.startswith("ttft_ms_") for c in cols)  # the parquet's flat copies are not repeated
    done = [r for r in rs if r["status"] == "done"]
    assert all(float(r["ttft_ms.p50"]) > 0 for r in done)
    c16 = next(r for r in done if r["workload"] == "sharegpt" and r["concurrency"] == "16")
    assert float(c16["server.preemptions"]) == 37.0 and c16["requests_failed"] == "2"
    assert "HTTP 500" in c16["errors"]  # a list: JSON text in one field
    skipped = next(r for r in rs if r["status"] == "skipped")
    assert skipped["ttft_ms.p50"] == "" and "max length" in skipped["reason"]


def test_csv_compare_has_both_sessions(fixed_pair: tuple[Any, Any]) -> None:
    a, b = fixed_pair
    rs = rows(render_report(a, [b], fmt="csv"))
    assert len(rs) == a.cells.height + b.cells.height
    assert len({r["session_dir"] for r in rs}) == 2


def test_cli_report_csv(fixed_pair: tuple[Any, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a, _ = fixed_pair
    out = tmp_path / "r.csv"
    assert main(["report", str(a.path), "--format", "csv", "-o", str(out)]) == 0
    capsys.readouterr()
    assert len(rows(out.read_text())) == a.cells.height


def test_csv_of_an_import(tmp_path: Path) -> None:
    from servescope.sessions.importers import import_files
    from servescope.sessions.store import load_session

    path = import_files([Path(__file__).parent / "data" / "vllm-bench-c1-detailed.json"],
                        sessions_dir=tmp_path / "sessions")
    rs = rows(render_report(load_session(path), fmt="csv"))
    assert len(rs) == 1 and float(rs[0]["ttft_ms.mean"]) > 0 and rs[0]["source"] == "vllm-bench-serve"
