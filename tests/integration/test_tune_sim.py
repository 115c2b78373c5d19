"""`servescope tune` end to end against the simulator, as a user runs it: a small budget-bounded search over
--max-num-seqs and the load (a launched `servescope sim`, relaunched per setting), its --json contract, its
session (kind "tune") and the report's tune section; and bad input, each a one-line error before anything
starts."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from servescope.engine.tunerun import measured_from
from tests.integration.helpers import servescope

# the --fast lane leaves this module out: 8 tests, ~18 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow


def _workload(d: Path) -> str:
    p = d / "short.toml"
    p.write_text('[workload]\nname = "short"\ninput_tokens = 128\noutput_tokens = 16\n')
    return str(p)


@pytest.mark.slow
def test_small_tune_against_the_simulator(tmp_path: Path) -> None:
    wl = _workload(tmp_path)
    p = servescope("tune", "--launch", "servescope sim --profile tiny", "--search", "max-num-seqs=2|16",
                   "-w", wl, "-c", "2..16", "-n", "8", "--slo", "ttft_ms=2000,tpot_ms=100", "--budget", "5",
                   "--sessions-dir", str(tmp_path / "sessions"), "--json", timeout=110)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert set(out) == {"session", "best", "cells_measured", "relaunches", "confirmed"}
    assert set(out["best"]) == {"server_args", "objective", "ci"}
    assert out["best"]["server_args"] in ("--max-num-seqs 2", "--max-num-seqs 16")
    assert out["best"]["objective"] > 0
    lo, hi = out["best"]["ci"]
    assert lo <= hi
    assert 3 <= out["cells_measured"] <= 5
    assert 1 <= out["relaunches"] < out["cells_measured"]  # two settings; cells of one setting share a launch
    assert isinstance(out["confirmed"], bool)
    session = Path(out["session"])
    meta = tomllib.loads((session / "session.toml").read_text())
    assert meta["kind"] == "tune" and meta["status"] == "completed"
    # the server as its cells met it (the app's head says "vLLM <version>", not "vLLM ?")
    assert meta["target"]["engine"] == "vllm" and meta["target"]["version"], meta["target"]
    tune = meta["tune"]
    assert len(tune["path"]) == out["cells_measured"]
    assert tune["best"]["serve"].startswith("servescope sim --profile tiny --max-num-seqs ")
    assert all((session / st["cell"] / "session.toml").is_file() for st in tune["path"])
    assert "serve it: servescope sim --profile tiny --max-num-seqs" in p.stderr  # the text goes to stderr with --json
    # the printed answer is the report's and the app's (reports.tunereport.tune_summary), word for word
    from servescope.reports.tunereport import tune_summary
    from servescope.sessions.meta import read_meta

    for line in tune_summary(read_meta(session / "session.toml").tune):
        assert line in p.stderr, line
    # a cell is judged by the SLOs asked, from its requests, not by those it ran with (the benchmark re-judges a grid)
    first = str(session / tune["path"][0]["cell"])
    c = tune["path"][0]["concurrency"]
    assert measured_from(first, "goodput", {"ttft_ms": 2000.0, "tpot_ms": 100.0}, c).value > 0
    assert measured_from(first, "goodput", {"ttft_ms": 0.001}, c).value == 0
    assert measured_from(first, "capacity", {"ttft_ms": 0.001}, c).meets is False
    rep = servescope("report", str(session))
    assert rep.returncode == 0, rep.stderr
    assert "## Tune: the best server setting" in rep.stdout
    assert "### Search path" in rep.stdout
    assert "Serve it: `servescope sim --profile tiny --max-num-seqs" in rep.stdout
    assert "searched (see the tune section" in rep.stdout and "did not launch the server" not in rep.stdout


@pytest.mark.parametrize("args, says", [
    (["--search", "max-num-seqs=64..16"], "0 < LOW < HIGH"),
    (["--search", "max-num-seqs"], "give FLAG=LOW..HIGH"),
    (["--search", "no-such-flag=1|2"], "the server takes no --no-such-flag flag"),
    (["--search", "max-num-seqs=2|4", "--budget", "2"], "--budget 2: the first design alone takes"),
    (["--search", "max-num-seqs=2|4", "-c", "0,4"], "give levels of 1 or more"),
])
def test_bad_tune_input_is_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    p = servescope("tune", "--launch", "servescope sim --profile tiny", *args,
                   "--sessions-dir", str(tmp_path / "sessions"), timeout=60)
    assert p.returncode != 0
    err = p.stderr.strip()
    assert says in err, err
    assert len(err.splitlines()) == 1, err
    assert not (tmp_path / "sessions").exists() or not any((tmp_path / "sessions").iterdir())


def test_search_without_launch_is_refused(tmp_path: Path) -> None:
    p = servescope("tune", "--url", "http://127.0.0.1:9", "--search", "max-num-seqs=2|4",
                   "--sessions-dir", str(tmp_path / "sessions"), timeout=60)
    assert p.returncode != 0
    assert "--search changes server flags: give --launch" in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_each_measurement_of_a_search_sends_its_own_prompts(tmp_path: Path) -> None:
    # every cell of a search is cell 0 of a one-cell sweep; with the search's seed alone, a cell measured after
    # another on the same server sent that cell's prompts again and the server's prefix cache served them (goodput
    # up to 1.6 times the same cell measured first): the second measurement here must find nothing cached
    from servescope.engine.spec import RunContext, SweepSpec
    from servescope.engine.tune import Setting
    from servescope.engine.tunerun import LiveMeasurer
    from servescope.sessions.store import load_session
    from servescope.workloads.spec import load_toml

    w = load_toml(Path(_workload(tmp_path)))[0]
    spec = SweepSpec(launch="servescope sim --profile tiny", workloads=(w,), slos={"ttft_ms": 2000.0}, requests=8,
                     telemetry_interval_s=None)
    m = LiveMeasurer(spec, RunContext(), tmp_path / "tune", "goodput", 8)
    try:
        first = m.measure(Setting((("--max-num-seqs", "8"),)), 4)
        again = m.measure(Setting((("--max-num-seqs", "8"),)), 4)
    finally:
        m.close()
    assert m.relaunches == 0  # one server served both
    rates = []
    for got in (first, again):
        [s] = load_session(got.session).summaries()
        assert s is not None and s.prefix_cache_hit_rate is not None, got.session
        rates.append(s.prefix_cache_hit_rate)
    assert rates[1] < 0.05, rates  # nothing the first measurement sent was sent again


def test_a_search_starts_each_cells_users_apart_over_its_settings_probe(tmp_path: Path) -> None:
    # users started together stay in lockstep, and where an SLO cuts through a round the same cell's goodput
    # jumps between measurements: each setting's first cell is preceded by one request alone, whose E2E is the
    # ramp its cells' users start over; the model replays and predicts the cells with the same ramp
    from servescope.engine.spec import RunContext, SweepSpec
    from servescope.engine.tune import Dim, Setting, Space
    from servescope.engine.tunemodel import TwinModel
    from servescope.engine.tunerun import LiveMeasurer, requests_for
    from servescope.sessions.store import load_session
    from servescope.workloads.spec import load_toml

    w = load_toml(Path(_workload(tmp_path)))[0]
    spec = SweepSpec(launch="servescope sim --profile tiny", workloads=(w,), slos={"ttft_ms": 2000.0}, requests=8,
                     telemetry_interval_s=None)
    a, b = Setting((("--max-num-seqs", "4"),)), Setting((("--max-num-seqs", "8"),))
    m = LiveMeasurer(spec, RunContext(), tmp_path / "tune", "goodput", 8)
    try:
        got = {(a, 4): m.measure(a, 4), (a, 2): m.measure(a, 2), (b, 1): m.measure(b, 1), (b, 4): m.measure(b, 4)}
    finally:
        m.close()
    probes = sorted((tmp_path / "tune" / "probes").iterdir())
    assert len(probes) == 2, probes  # one per setting, not one per cell
    for p in probes:
        [s] = load_session(str(p)).summaries()
        assert s is not None and s.requests_ok == 1
    assert set(m.probes) == {a.text, b.text} and all(r and r > 0 for r in m.probes.values()), m.probes
    for (setting, c), meas in got.items():
        row = load_session(meas.session).cells.to_dicts()[0]
        assert row["requests_planned"] == requests_for(8)(c)
        if c == 1:
            assert not row.get("ramp_s")  # one user: nothing to start apart
        else:
            assert row["ramp_s"] == m.probes[setting.text], (setting.text, c, row.get("ramp_s"))
    space = Space((Dim("--max-num-seqs", ("4", "8")),), (1, 2, 4))
    model = TwinModel(space, w, {"ttft_ms": 2000.0}, requests_for(8))
    model.update({(0, 2): got[(a, 4)], (0, 1): got[(a, 2)], (1, 0): got[(b, 1)], (1, 2): got[(b, 4)]})
    assert model.ramps == {0: m.probes[a.text], 1: m.probes[b.text]}
