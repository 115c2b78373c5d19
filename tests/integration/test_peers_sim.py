"""The real GuideLLM 0.8.1 and AIPerf 0.13.0 (installed from the package registry by .ci/setup_peers.sh) against
the simulator, with the same fixed-length workload and concurrencies as a servescope session of it (`peer_runs`:
one run of each per test session): each import holds the cells and requests the tool ran, and compare puts output
tok/s and TPOT p50 within 10% of servescope's at every load, its comparability table naming each definition that
differs (GuideLLM keeps no per-chunk times: its ITL; AIPerf's records keep every chunk's gap: none). inference-perf
0.7.0 (where a Python 3.12 is found to install it) runs the same loads as concurrent stages: its reports folder (with
the partial llm-d reports it writes beside them) imports with each stage's requests, its TPOT p50 within 10% of
servescope's, and the table names its TTFT definition (first content chunk); its output tok/s is not held to 10% (its
workers start the stage's requests late on a busy host). The servescope session is run in the peers' regime
(`--ramp 0 --window whole`), so the table has no measurement-window row; a second servescope session over its default
steady window has one, which leaves the rates unjudged and the per-request figures judged."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from servescope.reports.compare_doc import comparison_markdown
from servescope.sessions.comparability import WINDOW_STEADY, WINDOW_WHOLE
from servescope.sessions.compare import compare_sessions
from servescope.sessions.importers import import_files
from servescope.sessions.store import Session, load_session
from servescope.sim.launcher import start_sim
from tests.sessions.mdcheck import tables
from tests.support import peers

pytestmark = pytest.mark.slow


def _compare(ours: Session, theirs: Session, keys: tuple[str, ...] = ("output_tok_s", "tpot_ms.p50")) -> dict[str, Any]:
    comp = compare_sessions([ours, theirs])
    assert [c.load for c in comp.cells] == [f"c={c}" for c in peers.CONCURRENCY]
    for c in comp.cells:
        for key in keys:
            a, b = c.values[key]
            assert a is not None and b is not None
            assert abs(b / a - 1) < 0.10, (c.load, key, a, b)  # the same server, measured by two tools
    md = comparison_markdown(comp)
    tables(md)
    assert "## How the sessions were measured" in md
    return comp.to_dict()


@pytest.mark.parametrize("tool", ["guidellm", "aiperf"])
def test_real_peer_imports_agree_with_servescope(peer_runs: Any, tmp_path: Path, tool: str) -> None:
    runs: peers.SameLoad = peer_runs
    files = runs.guidellm if tool == "guidellm" else runs.aiperf
    s = load_session(import_files([files], sessions_dir=tmp_path, workload=peers.WORKLOAD, name=tool))
    src = s.info.source
    assert src is not None and src.tool == tool and src.rebuilt and src.token_basis == "server usage"
    assert s.cells["load_label"].to_list() == [f"c={c}" for c in peers.CONCURRENCY]
    for i in range(len(peers.CONCURRENCY)):
        summ = s.summaries()[i]
        assert summ is not None and summ.requests_ok == peers.REQUESTS and summ.requests_failed == 0
        assert s.requests(i).height == peers.REQUESTS
        assert summ.output_tokens_mean == peers.OUTPUT_TOKENS  # the server's usage: exactly what was asked
    doc = _compare(load_session(runs.servescope), s)
    comp = doc["comparability"]
    assert isinstance(comp, dict) and comp["shown"] is True
    assert [t["tool"] for t in comp["tools"]] == ["servescope 0.1.0", f"{src.tool_name}"]
    differ = {d["fact"] for d in comp["differences"]}
    assert differ == ({"tool", "itl"} if tool == "guidellm" else {"tool"})  # both over the whole run: no window row
    if tool == "guidellm":
        assert set(comp["not_judged"]) == {"itl_ms.p99"}
    json.dumps(doc)


def test_real_inference_perf_imports_and_compares(peer_runs: Any, tmp_path: Path) -> None:
    runs: peers.SameLoad = peer_runs
    if runs.inference_perf is None:
        pytest.skip("no Python 3.12 here: .ci/setup_peers.sh did not install inference-perf")
    s = load_session(import_files([runs.inference_perf], sessions_dir=tmp_path, workload=peers.WORKLOAD, name="ip"))
    src = s.info.source
    assert src is not None and src.tool == "inference-perf" and src.rebuilt and src.loop == "closed"
    assert s.cells["load_label"].to_list() == [f"c={c}" for c in peers.CONCURRENCY]
    for i in range(len(peers.CONCURRENCY)):
        summ = s.summaries()[i]
        assert summ is not None and summ.requests_ok == peers.REQUESTS and summ.requests_failed == 0
        assert summ.output_tokens_mean == peers.OUTPUT_TOKENS
    comp = _compare(load_session(runs.servescope), s, keys=("tpot_ms.p50",))["comparability"]
    assert {d["fact"] for d in comp["differences"]} == {"tool", "ttft"}
    assert comp["not_judged"]["ttft_ms.p50"] == ["TTFT definition"]


def test_a_steady_window_beside_the_peers_whole_run(peer_runs: Any, tmp_path: Path) -> None:
    """servescope's default window (steady) beside GuideLLM's whole run of the same loads against the simulator: the
    table's measurement-window row names each, the rates are shown but not judged, and TPOT p50, a per-request
    figure, is not touched by it and within 10% of GuideLLM's (with --ramp 0 the steady window holds every request)."""
    runs: peers.SameLoad = peer_runs
    gl = load_session(import_files([runs.guidellm], sessions_dir=tmp_path, workload=peers.WORKLOAD, name="gl"))
    wl = tmp_path / f"{peers.WORKLOAD}.toml"
    wl.write_text(f'[workload]\nname = "{peers.WORKLOAD}"\napi = "completions"\ninput_tokens = {peers.INPUT_TOKENS}\n'
                  f"output_tokens = {peers.OUTPUT_TOKENS}\n")
    with start_sim("tiny", ["--no-enable-prefix-caching"]) as h:
        r = subprocess.run([sys.executable, "-m", "servescope", "run", "--url", h.url, "-w", str(wl), "-c",
                            ",".join(map(str, peers.CONCURRENCY)), "-n", str(peers.REQUESTS), "--warmup", "0",
                            "--ramp", "0", "--tokenizer", str(peers.TOKENIZER), "--save", str(tmp_path / "steady"),
                            "--json"], capture_output=True, text=True, timeout=600, cwd=peers.ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    ours = load_session(tmp_path / "steady")
    comp = compare_sessions([ours, gl])
    assert [c.load for c in comp.cells] == [f"c={c}" for c in peers.CONCURRENCY]
    assert comp.comparability is not None
    rows = {row.fact.key: row for row in comp.comparability.rows}
    assert rows["window"].values == [WINDOW_STEADY, WINDOW_WHOLE] and "output_tok_s" in rows["window"].figures
    for c in comp.cells:
        assert "measurement window" in c.why("output_tok_s") and "measurement window" not in c.why("tpot_ms.p50")
        a, b = c.values["tpot_ms.p50"]
        assert a is not None and b is not None and abs(b / a - 1) < 0.10, (c.load, a, b)
    md = comparison_markdown(comp)
    tables(md)
    assert f"| measurement window | {WINDOW_STEADY} | {WINDOW_WHOLE} |" in md
