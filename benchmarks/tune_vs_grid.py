"""`servescope tune` against the full grid, on simulator profiles where the grid can be run.

For each profile: measure every cell of the grid (each --max-num-seqs value x each concurrency, a launched
`servescope sim` relaunched per setting), pick SLOs from the grid's own middle setting at its lowest load (TTFT
within 10x and TPOT within 1.5x of it, so that the optimum lies inside the grid), and take the grid's optimum:
the cell with the highest goodput (requests/s meeting every SLO). Then run `tune` live with a budget of a third
of the grid's cells (fresh measurements, its own model and path) and read its pick's goodput in the grid; and a
random search with the same budget (cells drawn from the grid's measurements, 200 draws): its pick's goodput.
Every cell goes through the same code (servescope.engine.tunerun.LiveMeasurer: each setting's probe, the ramp
over its E2E, three rounds of users).

A cell measured again can differ from its first measurement (by 10-40% when users started together and a busy
machine; within 0.1% started apart on a quiet one, docs/tune.md), so that a grid
measured once can have a lucky optimum: `--grid-repeat R` measures the whole grid R times (R passes, each
launching every setting once) and a cell's grid value is the mean of its R measurements; the script prints how
far a cell's measurements lay apart (the run-to-run spread). The table also judges each pick on the pooled
measurements: every cell's mean over the grid's measurements and every live tune run's measurements of it.

Selection and judgement on the same measurements favour whatever measured high by chance (the grid's optimum is
the highest of 30 noisy values; tune's pick, the highest of its own): `--verify K` then measures afresh, K times
each, the grid's optimum and every run's pick (each chosen before), and judges each pick by its fresh mean against
the grid optimum's fresh mean (`--verify-from results.json` does only this, for a run saved with `--out`).

Usage: .venv/bin/python benchmarks/tune_vs_grid.py [--profiles dense,moe,kv] [--runs 2] [--replays 1]
       [--grid-repeat 2] [--keep DIR] [--out results.json] [--verify 4] [--verify-from results.json]   (on a quiet machine: other work widens the spread)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from servescope.engine.spec import RunContext, SweepSpec  # noqa: E402
from servescope.engine.tune import Dim, Measured, Setting, Space, Tuner  # noqa: E402
from servescope.engine.tunemodel import TwinModel  # noqa: E402
from servescope.engine.tunerun import LiveMeasurer, measured_from, requests_for  # noqa: E402
from servescope.sessions.store import load_session  # noqa: E402
from servescope.workloads.spec import Workload  # noqa: E402

PROFILES = {
    "dense": "rtx-pro-6000/qwen3.5-27b-gptq-int4",  # dense 27B, RTX Pro 6000
    "moe": "dgx-spark/qwen3-coder-30b-a3b-awq",  # MoE 30B-A3B, DGX Spark
    "kv": "dgx-spark/gemma-4-31b-awq",  # dense 31B, DGX Spark, KV cache 12,752 tokens: the knee is memory
}
SEQS = ("4", "8", "16", "32", "64")
LOADS = (2, 4, 8, 16, 32, 64)
MIN_REQUESTS = 8
RANDOM_DRAWS = 200


def workload(d: Path) -> Workload:
    from servescope.workloads.spec import load_toml

    p = d / "bench.toml"
    p.write_text('[workload]\nname = "bench"\ninput_tokens = 256\noutput_tokens = 32\n')
    return load_toml(p)[0]


def base_spec(profile: str, w: Workload, slos: dict[str, float]) -> SweepSpec:
    return SweepSpec(launch=f"servescope sim --profile {profile}", workloads=(w,), slos=slos,
                     requests=MIN_REQUESTS, telemetry_interval_s=None)


def run_grid(profile: str, w: Workload, root: Path, space: Space,
             repeat: int) -> tuple[dict[tuple[int, int], list[str]], float]:
    """Every cell of the grid, measured `repeat` times in as many passes (or read back from `root`/grid.json when
    a run before kept it; a kept grid measured fewer times gets the passes it lacks). The wall time is one pass's
    (the mean over the passes measured here)."""
    index = root / "grid.json"
    paths: dict[tuple[int, int], list[str]] = {}
    walls: list[float] = []
    if index.is_file():
        data = json.loads(index.read_text())
        for k, v in data["cells"].items():
            paths[(int(k.split(",")[0]), int(k.split(",")[1]))] = [v] if isinstance(v, str) else list(v)
        walls = list(data.get("walls_s") or [data["wall_s"]])
    have = min((len(v) for v in paths.values()), default=0)
    if have >= repeat:
        return paths, statistics.fmean(walls)
    spec = base_spec(profile, w, {"ttft_ms": 1e9})
    m = LiveMeasurer(spec, RunContext(), root / f"pass-{have + 1}", "goodput", MIN_REQUESTS)
    try:
        for r in range(have, repeat):
            t0 = time.monotonic()
            for s, setting in enumerate(space.settings):
                for ld, c in enumerate(space.loads):
                    got = m.measure(setting, c)
                    paths.setdefault((s, ld), []).append(got.session)
                    print(f"  grid pass {r + 1} {setting.label} c={c}: {time.monotonic() - t0:.0f} s", file=sys.stderr,
                          flush=True)
            walls.append(time.monotonic() - t0)
            index.write_text(json.dumps({"cells": {f"{s},{ld}": p for (s, ld), p in paths.items()},
                                         "wall_s": statistics.fmean(walls), "walls_s": walls}))
    finally:
        m.close()
    return paths, statistics.fmean(walls)


class Replay:
    """A measurer that reads each cell from the grid's measurement (the same code reads it as a live cell)."""

    def __init__(self, paths: dict[tuple[int, int], list[str]], space: Space, slos: dict[str, float]) -> None:
        self.paths, self.space, self.slos = paths, space, slos
        self.running: str | None = None
        self.launches = 0

    def measure(self, setting: Setting, concurrency: int) -> Measured:
        if setting.text != self.running:
            self.running = setting.text
            self.launches += 1
        cell = (self.space.settings.index(setting), self.space.loads.index(concurrency))
        return measured_from(self.paths[cell][0], "goodput", self.slos, concurrency)

    @property
    def relaunches(self) -> int:
        return max(0, self.launches - 1)


def pick_slos(paths: dict[tuple[int, int], list[str]], space: Space) -> dict[str, float]:
    mid = len(space.settings) // 2
    s = load_session(paths[(mid, 0)][0]).summaries()[0]
    assert s is not None
    ttft, tpot = s.ttft_ms.p50, s.tpot_ms.p50
    assert ttft and tpot
    return {"ttft_ms": round(10 * ttft, 1), "tpot_ms": round(1.5 * tpot, 2)}


def parse_cell(label: str, space: Space) -> tuple[int, int]:
    """`--max-num-seqs 64 c=16` -> (setting index, load index)."""
    setting, c = label.rsplit(" c=", 1)
    return [st.label for st in space.settings].index(setting), space.loads.index(int(c))


def verify(row: dict, w: Workload, root: Path, k: int) -> None:  # type: ignore[type-arg]
    """Measure the grid's optimum and every run's pick K times afresh (rounds over the cells, each round grouped by
    setting, every other one reversed: the running setting first); add each cell's fresh values and each pick's
    ratio (its fresh mean over the grid optimum's) to `row`. Both cells were chosen before these measurements, so
    neither ratio's side is the highest of noisy values."""
    space = Space((Dim("--max-num-seqs", SEQS, log_scale=True),), LOADS)
    slos = row["slos"]
    opt = row["grid_optimum"]
    cells = [opt] + sorted({t["pick"] for t in row["tune"]} - {opt})
    order = sorted(cells, key=lambda c: parse_cell(c, space))
    spec = base_spec(row["name"], w, slos)
    m = LiveMeasurer(spec, RunContext(), root / f"verify-{int(time.time())}", "goodput", MIN_REQUESTS)
    fresh: dict[str, list[float]] = {c: [] for c in cells}
    try:
        for r in range(k):
            for c in (order if r % 2 == 0 else order[::-1]):
                s_i, l_i = parse_cell(c, space)
                fresh[c].append(m.measure(space.settings[s_i], space.loads[l_i]).value)
                print(f"  verify {r + 1}/{k} {c}: {fresh[c][-1]:.2f} req/s", file=sys.stderr, flush=True)
    finally:
        m.close()
    means = {c: statistics.fmean(v) for c, v in fresh.items()}
    row["verify"] = {"k": k, "fresh": fresh, "optimum": opt, "optimum_value": means[opt]}
    for t in row["tune"]:
        t["verified_at_pick"] = means[t["pick"]]
        t["verified_ratio"] = means[t["pick"]] / means[opt] if means[opt] > 0 else 1.0


def print_verify(rows: list) -> None:  # type: ignore[type-arg]
    print()
    print("| profile | measured afresh: mean (range) of K, req/s | the grid's optimum, afresh | tune's pick, afresh: "
          "its mean and the ratio to the grid optimum's |")
    print("|---|---|---|---|")
    for r in rows:
        v = r.get("verify")
        if not v:
            continue
        cells = "; ".join(f"{c}: {statistics.fmean(x):.2f} ({min(x):.2f}-{max(x):.2f})" for c, x in v["fresh"].items())
        for t in r["tune"]:
            print(f"| {r['profile']} | {cells} | {v['optimum']}: {v['optimum_value']:.2f} req/s (K={v['k']}) | "
                  f"{t['mode']}: {t['pick']}: {t['verified_at_pick']:.2f} req/s ({t['verified_ratio']:.1%}) |")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profiles", default="dense,moe,kv")
    ap.add_argument("--runs", type=int, default=1, help="live tune runs per profile")
    ap.add_argument("--out", default="")
    ap.add_argument("--keep", default="", help="keep the grids' sessions here (and reuse them when there)")
    ap.add_argument("--replays", type=int, default=0, help="tune runs reading the grid's cells instead of measuring")
    ap.add_argument("--verify", type=int, default=0, help="measure the grid's best cells and the picks K times afresh")
    ap.add_argument("--verify-from", default="", help="only verify: the results.json of a run (--out)")
    ap.add_argument("--grid-repeat", type=int, default=2, help="measure the grid this many times; a cell's value is "
                    "the mean")
    a = ap.parse_args()
    if a.verify_from:
        rows = json.loads(Path(a.verify_from).read_text())
        with tempfile.TemporaryDirectory(prefix="tune-verify-") as tmp:
            for row in rows:
                if row["profile"] in a.profiles.split(","):
                    verify(row, workload(Path(tmp)), Path(a.keep or tmp) / row["profile"], a.verify or 4)
        print_verify(rows)
        if a.out:
            Path(a.out).write_text(json.dumps(rows, indent=1))
        return 0
    rows = []
    for key in a.profiles.split(","):
        profile = PROFILES[key]
        with tempfile.TemporaryDirectory(prefix="tune-bench-") as tmp:
            root = Path(a.keep) / key if a.keep else Path(tmp)
            root.mkdir(parents=True, exist_ok=True)
            w = workload(root)
            space = Space((Dim("--max-num-seqs", SEQS, log_scale=True),), LOADS)
            print(f"{key} ({profile}): grid of {space.cells} cells", file=sys.stderr, flush=True)
            paths, grid_s = run_grid(profile, w, root / "grid", space, a.grid_repeat)
            slos = pick_slos(paths, space)
            measured = {c: [measured_from(p, "goodput", slos, space.loads[c[1]]).value for p in ps[:a.grid_repeat]]
                        for c, ps in paths.items()}
            values = {c: statistics.fmean(v) for c, v in measured.items()}
            # the run-to-run spread: how far apart one cell's measurements lay (relative to their mean), over the
            # cells with a goodput above zero
            spreads = sorted((max(v) - min(v)) / statistics.fmean(v) for v in measured.values()
                             if len(v) > 1 and statistics.fmean(v) > 0)
            opt_cell = max(values, key=lambda c: values[c])
            opt = values[opt_cell]
            budget = space.cells // 3
            runs = []
            pooled: dict[tuple[int, int], list[float]] = {c: list(v) for c, v in measured.items()}
            for r in range(a.runs + a.replays):
                live = r < a.runs
                spec = base_spec(profile, w, slos)
                m: LiveMeasurer | Replay = (LiveMeasurer(spec, RunContext(), root / f"tune-{int(time.time())}-{r}", "goodput",
                                                         MIN_REQUESTS)
                                            if live else Replay(paths, space, slos))
                model = TwinModel(space, w, slos, requests_for(MIN_REQUESTS), seed=r)
                t0 = time.monotonic()
                try:
                    res = Tuner(space, "goodput", budget, model, m).run()
                finally:
                    if isinstance(m, LiveMeasurer):
                        m.close()
                wall = time.monotonic() - t0
                assert res.best is not None
                if live:
                    for st in res.steps:
                        pooled[(st.setting, st.load)].append(st.value)
                runs.append({"mode": "live" if live else "replay",
                             "pick": f"{space.settings[res.best[0]].label} c={space.loads[res.best[1]]}",
                             "tune_value": res.best_value, "grid_value_at_pick": values[res.best],
                             "ratio": values[res.best] / opt, "cells": res.cells_measured,
                             "relaunches": res.relaunches, "confirmed": res.confirmed, "wall_s": round(wall, 1),
                             "fit_s": round(sum(f.seconds for f in model.fits), 1),
                             "path": [f"{space.settings[st.setting].label} c={st.concurrency}" for st in res.steps]})
                print(f"  tune run {r + 1}: {runs[-1]}", file=sys.stderr, flush=True)
            means = {c: statistics.fmean(v) for c, v in pooled.items()}
            pooled_opt = max(means, key=lambda c: means[c])
            for t in runs:
                cell = next(c for c in means if f"{space.settings[c[0]].label} c={space.loads[c[1]]}" == t["pick"])
                t["pooled_at_pick"] = means[cell]
                t["pooled_ratio"] = means[cell] / means[pooled_opt]
            rng = random.Random(0)
            cells = list(values)
            rand = []
            for _ in range(RANDOM_DRAWS):
                pick = max(rng.sample(cells, budget), key=lambda c: values[c])
                rand.append(values[pick] / opt)
            rows.append({"profile": key, "name": profile, "grid_cells": space.cells, "slos": slos,
                         "grid_optimum": f"{space.settings[opt_cell[0]].label} c={space.loads[opt_cell[1]]}",
                         "grid_value": opt, "grid_wall_s": round(grid_s, 1), "budget": budget, "tune": runs,
                         "pooled_optimum": f"{space.settings[pooled_opt[0]].label} c={space.loads[pooled_opt[1]]}",
                         "pooled_value": means[pooled_opt], "pooled_n": len(pooled[pooled_opt]),
                         "pooled_cells": {f"{space.settings[c[0]].label} c={space.loads[c[1]]}": v
                                          for c, v in pooled.items() if len(v) > 1},
                         "grid_repeat": a.grid_repeat,
                         "grid_means": {f"{space.settings[c[0]].label} c={space.loads[c[1]]}": v
                                        for c, v in values.items()},
                         "spread_median": statistics.median(spreads) if spreads else None,
                         "spread_p90": spreads[int(0.9 * (len(spreads) - 1))] if spreads else None,
                         "spread_at_optimum": ((max(measured[opt_cell]) - min(measured[opt_cell])) / opt
                                               if len(measured[opt_cell]) > 1 and opt > 0 else None),
                         "random_median_ratio": statistics.median(rand),
                         "random_within_5pct": sum(x >= 0.95 for x in rand) / len(rand)})
            if a.verify:
                verify(rows[-1], w, root, a.verify)
            print(json.dumps(rows[-1]), flush=True)
    print()
    print("| profile | grid: cells, wall per pass | grid optimum (goodput, mean of the passes) "
          "| tune pick: its goodput in the grid | optimum on pooled measurements | tune pick, pooled "
          "| tune: cells, relaunches, wall | random search, same budget: median, share within 5% "
          "| run-to-run spread: median, p90, at the optimum |")
    print("|---|---|---|---|---|---|---|---|---|")

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.0%}"

    for r in rows:
        for t in r["tune"]:
            print(f"| {r['profile']} ({r['name']}) | {r['grid_cells']} x {r['grid_repeat']}, {r['grid_wall_s']:.0f} s | "
                  f"{r['grid_optimum']}: {r['grid_value']:.2f} req/s | {t['mode']}: {t['pick']}: "
                  f"{t['grid_value_at_pick']:.2f} req/s ({t['ratio']:.1%}) | {r['pooled_optimum']}: "
                  f"{r['pooled_value']:.2f} req/s (mean of {r['pooled_n']}) | {t['pooled_at_pick']:.2f} req/s "
                  f"({t['pooled_ratio']:.1%}) | {t['cells']}, {t['relaunches']}, {t['wall_s']:.0f} s | "
                  f"{r['random_median_ratio']:.1%}, {r['random_within_5pct']:.0%} | {pct(r['spread_median'])}, "
                  f"{pct(r['spread_p90'])}, {pct(r['spread_at_optimum'])} |")
    if a.verify:
        print_verify(rows)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
