"""The capacity twin against the simulator as ground truth: fit on a measured sweep (c=1,4,16 at 1K in), predict
cells that were not run (c=48 at 1K, c=4 at 8K in), run them for real and compare; capacity and --confirm
end to end; bad input. Everything through the command line, as a user runs it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from servescope.sessions.store import load_session
from tests.integration.helpers import metrics, run_json, servescope

# the --fast lane leaves this module out: 2 tests, ~22 s on 2 busy cores (2026-12-08)
pytestmark = pytest.mark.slow

TINY = Path(__file__).resolve().parents[2] / "servescope/sim/profiles/tiny.toml"
DENSE = "rtx-pro-6000/qwen3.5-27b-gptq-int4"  # dense (tiny's steps are so short that its own CPU per 8K prompt shows)
MOE = "rtx-pro-6000/qwen3.5-35b-a3b-gptq-int4"  # 256 experts, top-8


def _workload(d: Path, name: str, inp: int, out: int = 64) -> str:
    p = d / f"{name}.toml"
    p.write_text(f'[workload]\nname = "{name}"\ninput_tokens = {inp}\noutput_tokens = {out}\n')
    return str(p)


def _whatif(*args: str) -> dict[str, Any]:
    p = servescope("whatif", *args, "--json")
    assert p.returncode == 0, f"exit {p.returncode}\nstdout: {p.stdout[-2000:]}\nstderr: {p.stderr[-3000:]}"
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def _figs(cell: dict[str, Any]) -> dict[str, float]:
    return {"output_tok_s": cell["output_tok_s"], "ttft_ms": cell["ttft_ms"]["p50"], "tpot_ms": cell["tpot_ms"]["p50"]}


def _misses(pred: dict[str, Any], real: dict[str, Any], rel: float = 0.15) -> list[str]:
    """The figures of a predicted cell more than `rel` off the measured one. The 10% target is measured by
    benchmarks/twin_accuracy.py --sim (medians of 3 longer runs); these short runs on a busy 2-core machine
    guard against a twin gone wrong."""
    want, got = _figs(real), _figs(pred)
    return [f"{k}: twin {got[k]:.4g}, run {want[k]:.4g}" for k in want if abs(got[k] / want[k] - 1) > rel]


def _late_steps(url: str) -> float:
    return metrics(url).get("servescope_sim:late_steps_total", 0.0)


def _run_until(url: str, *args: str, ok: Callable[[dict[str, Any]], list[str]], save: Path | None = None,
               seed: int = 0, undisturbed_first: bool = False, attempts: int = 3) -> dict[str, Any]:
    """`servescope run` against the simulator until `ok(result)` finds nothing wrong, `attempts` runs at most (the last
    is returned either way: the caller's assertion says what is off). On a busy 2-core test machine a run is
    disturbed now and then: steps of the simulator end late (its CPU lags behind the modelled time), the client
    is bound, or a stall neither shows (a slow request intake) moves a short run by 20%; a twin gone wrong misses
    every run. With `undisturbed_first` (an `ok` that costs more than a run: a fit) a run with late steps or a
    client-bound cell is run again without asking `ok`, unless it is the last. Each attempt sends other prompts
    (its own --seed): the simulator's prefix cache holds the earlier ones."""
    for attempt in range(attempts):
        before = _late_steps(url)
        if save is not None:
            shutil.rmtree(save, ignore_errors=True)
        out = run_json("--url", url, *args, "--seed", str(seed + attempt),
                       *(("--save", str(save)) if save is not None else ()))
        assert all(c["prefix_cache_hit_rate"] < 0.05 for c in out["cells"])  # a block or two the prompts share
        late = _late_steps(url) - before
        bound = [c for c in out["cells"] if (c.get("client") or {}).get("verdict") == "bound"]
        how = f"late steps {late:g}, client-bound cells {len(bound)}"
        if undisturbed_first and (late > 2 or bound) and attempt < attempts - 1:
            print(f"run {args} #{attempt + 1}: disturbed ({how})")
            continue
        wrong = ok(out)
        if not wrong:
            return out
        print(f"run {args} #{attempt + 1}: {wrong} ({how})")
    return out


@pytest.mark.slow  # real-time runs of a 27B/35B model, a fit: 1-4 min on this 2-core machine under load
@pytest.mark.parametrize("profile, long_in", [(DENSE, 8192), (MOE, 8192)], ids=["dense", "moe"])
def test_twin_predicts_unseen_cells_of_the_simulator(profile: str, long_in: int, tmp_path: Path) -> None:
    from servescope.sim.launcher import start_sim

    # 64 output tokens, not fewer: at c=16 the first 8 users' decode waits out the other 8 prefills (a 1.5 s step
    # on the dense model), so TPOT p50 sits between two groups of users, and a slow request intake on a busy
    # machine moves it: by 15% with 32 tokens (31 gaps to spread the step over), by 8% with 64
    w1k = _workload(tmp_path, "in1k", 1024)
    w8k = _workload(tmp_path, "in8k", long_in)
    fit_dir = tmp_path / "fit"
    info: dict[str, Any] = {}

    def fitted(_: dict[str, Any]) -> list[str]:
        """The twin fitted on the run, [] when it fits the run's cells."""
        fit = servescope("twin", "fit", str(fit_dir), "--json")
        assert fit.returncode == 0, fit.stderr
        info.update(json.loads(fit.stdout))
        worst = max(info["residual_rms_ln"][k] for k in ("output_tok_s", "ttft_ms.p50", "tpot_ms.p50"))
        return [f"the fit's residual {worst:.3f}"] if worst >= 0.15 else []

    with start_sim(profile) as sim:  # one server: its late-step counter tells a disturbed run
        url = sim.url
        # up to five fits: a twin fitted on a disturbed run (late steps) misses every run after it, and in a suite
        # of three processes on 2 cores the first runs can all be disturbed
        _run_until(url, "-w", w1k, "-c", "1,4,16", "-n", "16", ok=fitted, save=fit_dir, undisturbed_first=True,
                   attempts=5)
        # a simulator started apart is recognised by its served model name
        assert info["shape_from"] == f"simulator profile {profile}"
        assert (fit_dir / "twin" / "profile.toml").is_file()
        assert max(info["residual_rms_ln"][k] for k in ("output_tok_s", "ttft_ms.p50", "tpot_ms.p50")) < 0.15

        pred = {}
        real = {}
        # two rounds of users each; 4 users at 8K (not 8): the dense model's 8K prefills are some 1.5 s each
        for label, w, c, n in (("c48", w1k, 48, 96), ("8k", w8k, 4, 8)):
            p = pred[label] = _whatif(str(fit_dir), "-w", w, "-c", str(c), "-n", str(n))["cells"][0]
            # other prompts than the fit's (another seed): the simulator's prefix cache holds those
            real[label] = _run_until(url, "-w", w, "-c", str(c), "-n", str(n), seed=7,
                                     ok=lambda out, p=p: _misses(p, out["cells"][0]))["cells"][0]
    for label in pred:
        p, r = pred[label], real[label]
        print(f"{profile} {label}: twin / run - 1: " + ", ".join(f"{k} {_figs(p)[k] / v - 1:+.1%}"
                                                                 for k, v in _figs(r).items()))
        assert p["status"] == "predicted" and p["extrapolated"] is True and p["requests_ok"] == r["requests_ok"]
        assert not _misses(p, r), f"{profile} {label}: {_misses(p, r)}"
        for key in _figs(r):
            lo, hi = p["band"][key]
            assert lo < _figs(p)[key] < hi
    assert "c=48 outside the measured c=1..16" in pred["c48"]["reason"]
    assert f"prompt tokens {long_in}-{long_in} outside the measured 1024-1024" in pred["8k"]["reason"]


@pytest.mark.slow  # a fit and a confirming run: 40-65 s on this 2-core machine under load
def test_capacity_confirm_and_the_track_record(tmp_path: Path) -> None:
    from servescope.sim.launcher import start_sim

    # tiny with a 30 ms API front end instead of 4 ms: its TTFT was a few ms, so a few ms of scheduling delay on a
    # busy machine moved the twin's error at c=2 from -3% to -20% run to run. The twin fits the front end like
    # any other cost, and recognises the model by its served name (tiny). One server for the fit and the confirming
    # run, its prefix cache on: the confirming run sends prompts of its own (it sent the session's again, and the
    # cache served them)
    profile = tmp_path / "tiny-frontend.toml"
    profile.write_text(TINY.read_text().replace("\nfrontend_ms = 4\n", "\nfrontend_ms = 30\n", 1))
    assert "frontend_ms = 30" in profile.read_text()
    w = _workload(tmp_path, "short", 256, 32)
    with start_sim(str(profile)) as sim:
        run_json("--url", sim.url, "-w", w, "-c", "1,4", "-n", "16", "--save", str(tmp_path / "s"))
        out = _whatif(str(tmp_path / "s"), "-c", "2,8", "-n", "24", "--confirm")  # fits first: no twin yet
    assert (tmp_path / "s" / "twin" / "profile.toml").is_file()
    assert [c["concurrency"] for c in out["cells"]] == [2, 8]
    assert out["cells"][0]["extrapolated"] is False and out["cells"][1]["extrapolated"] is True
    for c in out["cells"]:
        assert c["measured"]["output_tok_s"] > 0
        # the errors are the twin's against this run (accuracy itself is the ground-truth test's; a twin fitted
        # on two short real-time cells is off by some percent, a twin gone wrong by far more)
        for k in ("ttft_ms.p50", "tpot_ms.p50"):
            assert abs(c["error"][k]) < 0.5, (c["concurrency"], k, c["error"][k])
            name, stat = k.split(".")
            assert c["error"][k] == pytest.approx(c[name][stat] / c["measured"][k] - 1)
        got = c["output_tok_s"] / c["measured"]["output_tok_s"] - 1
        assert c["error"]["output_tok_s"] == pytest.approx(got)
    (confirm_session,) = out["confirm"]["sessions"]
    assert Path(confirm_session, "session.toml").is_file()
    hits = [s.prefix_cache_hit_rate for s in load_session(confirm_session).summaries() if s is not None]
    assert hits and all(h is not None and h < 0.05 for h in hits), hits  # nothing the session sent was sent again
    record = [json.loads(x) for x in (tmp_path / "s" / "twin" / "confirm.jsonl").read_text().splitlines()]
    assert [r["concurrency"] for r in record] == [2, 8] and all(r["confirm_session"] == confirm_session for r in record)
    # the track record is in the session's report
    rep = servescope("report", str(tmp_path / "s"))
    assert rep.returncode == 0, rep.stderr
    assert "## Capacity twin" in rep.stdout and "the model's shape from simulator profile tiny" in rep.stdout
    rows = [ln for ln in rep.stdout.splitlines() if ln.startswith("| ") and "| c=8 | as measured | TTFT p50 ms |" in ln]
    assert len(rows) == 1 and f"{record[1]['error']['ttft_ms.p50']:+.1%}" in rows[0]

    cap = _whatif(str(tmp_path / "s"), "-w", w, "--capacity", "--slo", "tpot_ms=9")
    row = cap["capacity"]["short"]
    assert row["concurrency"] is not None and row["concurrency"] >= 1 and cap["slos"] == {"tpot_ms": 9.0}
    assert row["at_capacity"]["slo_met_fraction"] >= 0.9 and row["knee"] is not None
    assert cap["cells"] == []  # --capacity alone predicts the capacity levels, no table of cells
    text = servescope("whatif", str(tmp_path / "s"), "--capacity", "--slo", "tpot_ms=9")
    assert text.returncode == 0, text.stderr
    assert "capacity at the SLOs (tpot_ms <= 9; >= 90% of requests), predicted:" in text.stdout
    assert "coding-assistant-96k" in text.stdout and "no answer: workload 'coding-assistant-96k'" in text.stdout
    assert "code-completion-1k          c=" in text.stdout


def test_whatif_bad_input_is_one_line(tmp_path: Path) -> None:
    w = _workload(tmp_path, "short", 128, 8)
    run_json("--url", "sim://tiny", "-w", w, "-c", "1", "-n", "4", "--save", str(tmp_path / "s"))
    cases = [
        (["whatif", str(tmp_path / "nope")], "not a session directory"),
        (["whatif", str(tmp_path / "s"), "-w", "no-such-workload"], "no-such-workload"),
        (["whatif", str(tmp_path / "s"), "-c", "8", "--kv-cache-dtype", "int3"], "--kv-cache-dtype 'int3': unknown"),
        (["whatif", str(tmp_path / "s"), "-c", "8", "--kv-cache-dtype", "fp8", "--confirm"], "cannot confirm"),
        (["whatif", str(tmp_path / "s"), "-c", "2", "--rate", "3"], "give --concurrency or --rate, not both"),
        (["whatif", str(tmp_path / "s"), "-w", _workload(tmp_path, "huge", 9000)], "do not fit the server's max_model_len"),
    ]
    for args, want in cases:
        p = servescope(*args)
        assert p.returncode != 0, args
        lines = p.stderr.strip().splitlines()
        assert lines[-1].startswith("servescope whatif: error: ") and want in lines[-1], (args, p.stderr)
        assert "Traceback" not in p.stderr


def test_whatif_at_each_measured_load_holds_the_measured_figures(tmp_path: Path) -> None:
    """Asked for a load the session measured, the twin runs that cell as it was measured (its request count: 16
    users over 16 requests is one round, not the 64 requests of an unmeasured load) and its band holds what was
    measured: all 3 figures of all 3 cells. With fixed lengths the prediction draws the measured cell's requests,
    so what parts them is the twin's error at that cell, which the band holds twice over: a miss is a wrong band,
    not bad luck (the spread of other draws is tests/engine/test_twin.py's). The simulator's tiny profile keeps
    the run and the fit short."""
    run = run_json("--url", "sim://tiny", "-w", _workload(tmp_path, "short", 256, 16), "-c", "1,4,16", "-n", "16",
                   "--save", str(tmp_path / "s"))
    out = _whatif(str(tmp_path / "s"))  # the session's workload and loads; fits first
    assert [c["concurrency"] for c in out["cells"]] == [1, 4, 16]
    misses = []
    for pred, real in zip(out["cells"], run["cells"], strict=True):
        if pred["requests_ok"] != real["requests_ok"]:  # the measured cell's request count
            misses.append(f"c={pred['concurrency']}: {pred['requests_ok']} requests, measured {real['requests_ok']}")
        for key, v in _figs(real).items():
            lo, hi = pred["band"][key]
            if not lo <= v <= hi:
                misses.append(f"c={pred['concurrency']} {key}: measured {v:.4g}, twin {_figs(pred)[key]:.4g} "
                              f"[{lo:.4g}-{hi:.4g}]")
    assert not misses, misses
