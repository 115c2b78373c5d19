"""The report of an https session: the target line carries the TLS handshake and connect time measured apart from
the TTFT and how the certificate was checked; a cell whose load opened far more connections than it had users
(keep-alive did not hold) gets a note."""

from __future__ import annotations

from pathlib import Path

import msgspec

from servescope.core.metrics import summarize
from servescope.core.results import CellConnections
from servescope.reports.report import render_report
from servescope.sessions.store import load_session
from tests.support.meta import set_meta

from .synth import WORKLOAD, cell_frame, plan, sweep_session

URL = "https://api.example"


def _session(base: Path, opened: tuple[int, ...], **target: object) -> Path:
    planned = plan([(WORKLOAD, 4, 100) for _ in opened])
    w, ran = sweep_session(base / "s", "s", planned, model="m", max_model_len=4096, tokenizer="server", url=URL)
    for cell, n in zip(planned, opened, strict=True):
        df, wall = cell_frame(seed=cell.index, n=100, c=4)
        summary = msgspec.structs.replace(summarize(df, wall), connections=CellConnections(
            opened=n, connect_ms_p50=1.0, tls_handshake_ms_p50=5.0))
        w.write_cell({**cell.row(), **ran, "status": "done", "reason": ""}, df, summary)
    w.update(target=msgspec.structs.replace(w.meta.target, **target))
    w.finish("completed")
    set_meta(w, host="gpu-box", servescope_version="0.1.0")
    return base / "s"


def test_target_line_and_connection_reuse(tmp_path: Path) -> None:
    path = _session(tmp_path, (4, 100), tls_verify=True, tls_handshake_ms=5.25, connect_ms=1.5, tls_ca="ca.pem")
    md = render_report(load_session(path))
    assert f"m on {URL} (TLS handshake p50 5.2 ms, connect p50 1.5 ms, CA ca.pem): 2 cells" in md
    notes = md.split("## Notes", 1)[1]
    assert "chat c=4: opened 100 connections for 100 requests from 4 users: the server did not keep them alive" \
        in notes
    assert notes.count("connections for") == 1  # the cell that kept 4 connections is fine
    # the summary keeps the figures
    first = load_session(path).summaries()[0]
    assert first is not None
    assert first.connections == CellConnections(opened=4, connect_ms_p50=1.0, tls_handshake_ms_p50=5.0)


def test_insecure_target_line(tmp_path: Path) -> None:
    path = _session(tmp_path, (4,), tls_verify=False, tls_handshake_ms=3.0)
    md = render_report(load_session(path))
    assert f"m on {URL} (TLS handshake p50 3.0 ms, certificate not verified (--insecure)): 1 cell" in md


def test_plain_http_target_line_is_unchanged(tmp_path: Path) -> None:
    path = _session(tmp_path, (4,))
    md = render_report(load_session(path))
    assert f"m on {URL}: 1 cell" in md
