"""Significance and the gate where the truth is known, on the simulator: runs of one profile differ only by noise
(the gate passes, compare calls the differences within noise), and a decode 25% slower (the simulator's
`--slow-decode 0.25`) is caught by the same gate, `--fail-on output_tok_s:-5%,tpot_ms.p50:+5%`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from servescope.__main__ import main
from servescope.sessions.compare import compare_sessions
from servescope.sessions.store import load_session
from tests.integration.helpers import run_json, servescope

# 15 rounds of 4 users, 32 tokens each (48 before: two thirds of the time). Not shorter: a run a busy machine
# stalls as a whole is truly different (see below), and a short run is more often stalled as a whole; with 40
# requests of 24 tokens one such run gave 5 false alarms in 90 (ITL p99 from ~900 gaps moves with one stall)
WL = '[workload]\nname = "g"\ninput_tokens = 128\noutput_tokens = 32\n'
SLOW_DECODE = 0.25  # the regression: decode-only steps 25% slower (TPOT about +24%, output tok/s about -14%)
FAIL_ON = "output_tok_s:-5%,tpot_ms.p50:+5%"


@pytest.fixture(scope="module")
def sims() -> Iterator[tuple[str, str]]:
    """One simulator as it is, one with a slower decode (the same profile otherwise)."""
    from servescope.sim.launcher import start_sim

    with start_sim("tiny", ["--no-enable-prefix-caching"]) as a, \
            start_sim("tiny", ["--no-enable-prefix-caching", "--slow-decode", str(SLOW_DECODE)]) as b:
        yield a.url, b.url


def _run(url: str, tmp_path: Path, seed: int, repeat: int = 1) -> str:
    (tmp_path / "g.toml").write_text(WL)
    out: dict[str, Any] = run_json("--url", url, "-w", str(tmp_path / "g.toml"), "-c", "4", "-n", "60",
                                   "--seed", str(seed), "--repeat", str(repeat), "--telemetry-interval", "off",
                                   "--sessions-dir", str(tmp_path / "s"))
    return str(out["session"])


@pytest.mark.slow  # 5 runs of 3 cells: 70-95 s on this 2-core machine under load
def test_the_same_server_twice_is_within_noise_and_passes_the_gate(sims: tuple[str, str], tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    # three repeats each: the interval then covers the noise between runs (a busy machine's), not only between
    # requests; with one repeat a short cell's p99 is called different far more often than 5% of the time.
    # Five runs, every pair compared (90 verdicts): a run that a busy machine slowed as a whole (it is then
    # truly different, not noise) costs one figure in the 4 pairs it is in, 4 of 90, still under 5%; with
    # three runs it would cost 2 of 27. The comparisons and gates run in this process (the same commands as
    # `servescope compare --json` and `servescope gate`; the other test runs the gate as its own process).
    runs = [_run(sims[0], tmp_path, seed, repeat=3) for seed in (1, 2, 3, 4, 5)]
    sessions = [load_session(Path(r)) for r in runs]
    verdicts = []
    for i, a in enumerate(runs):
        for j in range(i + 1, len(runs)):
            if i == 0:  # the gate on the first run against each other one
                rc = main(["gate", a, runs[j], "--fail-on", FAIL_ON])
                out = capsys.readouterr()
                assert rc == 0, out.out[-1500:] + out.err[-800:]
            cmp = compare_sessions([sessions[i], sessions[j]]).to_dict()
            for name, m in cmp["cells"][0]["metrics"].items():
                verdicts += [(i, j, name, d["verdict"], round(d["delta_pct"], 2), [round(x, 2) for x in d["ci"]])
                             for d in m.get("deltas", []) if d and d.get("verdict") is not None]
    assert len(verdicts) >= 80, verdicts
    # Central figures (rates, means, medians) must be called different less than 5% of the time. A p99 of a
    # few-ms gap or latency is the host's stalls, which come in episodes of seconds: on a busy CI machine two
    # of five runs had an ITL p99 twice the others' in all three of their repeats (so the difference was real,
    # of the machine, not of the server): 5 alarms in 90, all ITL p99 (5 of the 20 p99 verdicts). Tails only
    # must not be called different in most pairs (tests/sessions/test_significance.py checks their intervals).
    # The ITL p99 is left out of that bound: in the whole suite's fresh-cache run (2026-12-07, vLLM's tests in the
    # other process) it was called different in all 10 of its pairs while every TTFT p99 was within noise: its
    # ~900 gaps per cell make it the host's stall counter, not the server's.
    central = [v for v in verdicts if not v[2].endswith(".p99")]
    tails = [v for v in verdicts if v[2].endswith(".p99") and v[2] != "itl_ms.p99"]
    assert tails, verdicts
    alarms = [v for v in central if v[3] != "within noise"]
    assert len(alarms) / len(central) < 0.05, f"{len(alarms)} false alarms in {len(central)} verdicts: {alarms}"
    tail_alarms = [v for v in tails if v[3] != "within noise"]
    assert len(tail_alarms) / max(len(tails), 1) < 0.5, \
        f"{len(tail_alarms)} false alarms in {len(tails)} p99 verdicts: {tail_alarms}"


@pytest.mark.slow
def test_a_decode_25_percent_slower_is_caught(sims: tuple[str, str], tmp_path: Path) -> None:
    base, slow = _run(sims[0], tmp_path, 1), _run(sims[1], tmp_path, 1)
    g = servescope("gate", base, slow, "--fail-on", FAIL_ON, "--json", timeout=120)
    assert g.returncode == 1, g.stdout[-1500:] + g.stderr[-800:]
    res = json.loads(g.stdout)
    failed = {r["figure"] for r in res["rows"] if r["failed"]}
    assert {"tpot_ms.p50", "output_tok_s"} <= failed, res["rows"]
    tpot = next(r for r in res["rows"] if r["figure"] == "tpot_ms.p50")
    # about +24% here; steps that also prefill a new request are not slowed, and a busy machine adds its own
    assert 12 < tpot["delta_pct"] < 40 and tpot["verdict"] == "worse", tpot
    assert "FAIL" in g.stderr.splitlines()[0]
