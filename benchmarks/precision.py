"""Does `--precision` hold what it says, and what does it save? The stop rule on the simulator's profiles.

    nice .venv/bin/python benchmarks/precision.py [--profiles dense,moe,kv] [--loads 1,4,16,64] [--seeds 20]
                                                  [--jobs 2] [--markdown]

For each profile (dense: rtx-pro-6000/qwen3.5-27b-gptq-int4, moe: rtx-pro-6000/qwen3.5-35b-a3b-gptq-int4, kv: the
KV-limited dgx-spark/gemma-4-31b-awq) and each load (closed-loop users), with a workload of 200-512 tokens in and
64-512 out (uniform), the target `output_tok_s:2%,ttft_ms.p50:5%`:

1. 20 seeds (each its own request lengths and client timing) of the cell with the stop rule, a ceiling of
   `CEILING` requests: the requests each used, the precision each reached and its two intervals;
2. the cell's long-run value: the cell once with 20x the most requests any seed used, no stop rule, its steady
   window's figures;
3. coverage: in how many of the 20 seeds each interval holds the long-run value (the target: at least 18);
4. the requests of the whole adaptive sweep (the sum over its cells, per seed) against a fixed `-n` sized so its worst
   cell reaches the same precision: the 18th smallest of the 20 requests counts that cell's rule stopped at (a fixed
   -n that large is precise in at least 18 of 20 seeds), checked by running that worst cell with it for the 20
   seeds, without the rule, and counting the seeds it made precise.

A cell runs on the simulator's scheduler on a virtual clock (servescope.sim.engine.VirtualRunner: the HTTP
simulator's own engine, without its real-time clock, so 20 seeds x 4 loads x 3 profiles take minutes, not days): the
load is the closed loop `servescope run` drives, its users started one by one over one request's E2E (--ramp auto),
each sending its next request 0.2-3 ms after its last ended (a client's turnaround on a busy host). Every figure,
window, interval and the stop decision come from servescope's own code: core.precision.PrecisionRule (looked at
every 0.5 s of the cell, as engine/cell.py looks after each live batch), core.steady and engine.measure.cell_figures,
the function `servescope run` saves a cell's summary with.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import platform
import random
import statistics
import subprocess
import sys
import time
from array import array
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servescope.core.load import CellRun, Load  # noqa: E402
from servescope.core.metrics import records_frame, summarize  # noqa: E402
from servescope.core.records import RequestRecord  # noqa: E402
from servescope.core.steady import ramp_from_probe, steady_span  # noqa: E402
from servescope.engine.measure import CellMeasure, Stopper, cell_figures  # noqa: E402
from servescope.engine.plan import Cell  # noqa: E402
from servescope.sim.engine import VirtualRunner  # noqa: E402
from servescope.sim.profile import CostModel, load_profile  # noqa: E402
from servescope.sim.request import SimRequest  # noqa: E402
from servescope.workloads.spec import LengthDist, Workload  # noqa: E402

PROFILES = {"dense": "rtx-pro-6000/qwen3.5-27b-gptq-int4", "moe": "rtx-pro-6000/qwen3.5-35b-a3b-gptq-int4",
            "kv": "dgx-spark/gemma-4-31b-awq"}
WORKLOAD = Workload("bench", input_tokens=LengthDist("uniform", min=200, max=512),
                    output_tokens=LengthDist("uniform", min=64, max=512), source="inline")
TARGETS = (("output_tok_s", 0.02), ("ttft_ms.p50", 0.05))
CEILING = 4000  # requests per cell at most
LONG_FACTOR = 20  # the long run: this many times the most requests a seed used
LOOK_S = 0.5  # the rule looks every this long (engine/cell.py's LIVE_BATCH_S)
CLIENT_GAP_S = (0.0002, 0.003)  # a user's next request leaves this long after its last one ended


@dataclass
class CellOut:
    requests: int
    precise: bool
    reached: float | None
    intervals: dict[str, tuple[float, float, float]]  # figure -> (value, low, high)


def _filler(n: int) -> list[int]:
    return [64] * n


def probe_e2e(cost: CostModel, seed: int) -> float:
    """One request of the workload alone: its E2E (s), the ramp's length (--ramp auto)."""
    rng = random.Random(f"probe:{seed}")
    p, o = WORKLOAD.input_tokens.sample(rng), WORKLOAD.output_tokens.sample(rng)
    runner = VirtualRunner(cost)
    req = SimRequest(0, p, o, prompt_ids=[-1, *range(64, 63 + p)], out_ids=_filler)
    runner.submit(req, 0.0)
    runner.run()
    return req.done_t - req.arrival


def run_cell(profile: str, users: int, seed: int, ceiling: int, rule: bool) -> CellOut:
    """One cell as `servescope run -c USERS` measures it (the module's text), on the virtual clock."""
    cost = CostModel(load_profile(profile))
    ramp = ramp_from_probe(probe_e2e(cost, seed)) if users > 1 else None
    load = Load(concurrency=users, ramp_s=ramp)
    cell = Cell(0, WORKLOAD, load, ceiling, None, 0)
    measure = CellMeasure(window="steady", targets=TARGETS if rule else (), slos={})
    stopper = Stopper(measure, cell) if rule else None
    rng = random.Random(f"cell:{profile}:{users}:{seed}")
    runner = VirtualRunner(cost)
    ns = 1_000_000_000
    sent: dict[int, float] = {}
    records: list[RequestRecord] = []
    nxt = 0
    draining = False
    tokens: dict[int, list[float]] = {}

    def make(i: int, at: float) -> None:
        p, o = WORKLOAD.input_tokens.sample(rng), WORKLOAD.output_tokens.sample(rng)
        req = SimRequest(i, p, o, prompt_ids=[i + seed * 10_000_000, *range(64, 63 + p)], out_ids=_filler,
                         on_tokens=lambda r, n, _f, t: tokens[r.rid].extend([t] * n))
        tokens[i] = []
        sent[i] = at
        runner.submit(req, at)

    def on_done(req: SimRequest, t: float) -> None:
        nonlocal nxt
        s = sent[req.rid]
        stamps = tokens.pop(req.rid)
        rec = RequestRecord(req.rid, -1, False, req.prompt_len, req.max_tokens, int(s * ns), sent_ns=int(s * ns),
                            first_token_ns=int(req.first_token_t * ns), first_content_ns=int(req.first_token_t * ns),
                            end_ns=int(t * ns), prompt_tokens=req.prompt_len, output_tokens=req.num_output,
                            usage_reported=True, chunk_ns=array("q", [int(x * ns) for x in stamps]),
                            chunk_tokens=array("i", [1] * len(stamps)))
        records.append(rec)
        if stopper is not None:
            stopper.add(rec)
        if not draining and nxt < ceiling:
            make(nxt, t + rng.uniform(*CLIENT_GAP_S))
            nxt += 1

    runner.on_done = on_done
    for u in range(min(users, ceiling)):
        make(nxt, (ramp or 0.0) * u / users)
        nxt += 1
    t = 0.0
    while runner.sched.has_work() or runner._arrivals:
        t += LOOK_S
        runner.run(until=t)
        if stopper is not None and not draining and stopper.look():
            draining = True  # CellControl.request_finish: no more sends, the ones out finish
    run = CellRun(records, min(r.scheduled_ns for r in records), max(r.end_ns for r in records))
    span = steady_span(records, load, ceiling, stopper.end_ns if stopper is not None and stopper.fired else None)
    df = records_frame(records)
    whole = summarize(df, (run.end_ns - run.start_ns) / 1e9, {})
    summary, _ = cell_figures(whole, df, run, cell, CellMeasure(window="steady", targets=TARGETS), {}, None, stopper,
                              None, span)
    ivs = {iv.figure: (iv.estimate or math.nan, iv.low if iv.low is not None else math.nan,
                       iv.high if iv.high is not None else math.nan) for iv in summary.intervals}
    p = summary.precision
    return CellOut(len(records), bool(stopper is not None and stopper.fired), p.reached if p is not None else None,
                   ivs)


def _job(args: tuple[str, int, int, int, bool]) -> CellOut:
    return run_cell(*args)


def precise_enough(out: CellOut) -> bool:
    shares = dict(TARGETS)
    for fig, (v, lo, hi) in out.intervals.items():
        if not (math.isfinite(lo) and math.isfinite(hi)) or v == 0 or (hi - lo) / 2 / abs(v) > shares[fig]:
            return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", default="dense,moe,kv")
    ap.add_argument("--loads", default="1,4,16,64")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args(argv)
    loads = [int(x) for x in a.loads.split(",")]
    names = a.profiles.split(",")
    t_start = time.monotonic()
    rows: list[str] = []
    verdicts: list[str] = []
    # spawned, not forked: a process forked after polars started its threads can hang in them
    with ProcessPoolExecutor(a.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for name in names:
            prof = PROFILES[name]
            used: dict[int, list[int]] = {}
            outs: dict[int, list[CellOut]] = {}
            for c in loads:
                outs[c] = list(pool.map(_job, [(prof, c, s, CEILING, True) for s in range(a.seeds)]))
                used[c] = [o.requests for o in outs[c]]
            longs = list(pool.map(_job, [(prof, c, 10_000 + c, LONG_FACTOR * max(used[c]), False) for c in loads]))
            worst = max(loads, key=lambda c: sorted(used[c])[min(len(used[c]) - 1, math.ceil(0.9 * a.seeds) - 1)])
            fixed_n = sorted(used[worst])[min(len(used[worst]) - 1, math.ceil(0.9 * a.seeds) - 1)]
            fixed = list(pool.map(_job, [(prof, worst, s, fixed_n, False) for s in range(a.seeds)]))
            fixed_ok = sum(precise_enough(o) for o in fixed)
            for c, long in zip(loads, longs, strict=True):
                cover = {}
                for fig, _ in TARGETS:
                    truth = long.intervals[fig][0]
                    cover[fig] = sum(1 for o in outs[c] if o.intervals[fig][1] <= truth <= o.intervals[fig][2])
                precise = sum(o.precise for o in outs[c])
                reached = [o.reached for o in outs[c] if o.reached is not None]
                rows.append(f"| {name} | {c} | {statistics.median(used[c]):,.0f} ({min(used[c]):,}-{max(used[c]):,}) | "
                            f"{precise}/{a.seeds} | {statistics.median(reached) * 100:.2f}% | "
                            f"{long.intervals['output_tok_s'][0]:,.1f} | {cover['output_tok_s']}/{a.seeds} | "
                            f"{long.intervals['ttft_ms.p50'][0]:,.1f} | {cover['ttft_ms.p50']}/{a.seeds} | "
                            f"{long.requests:,} |")
            per_seed = [sum(used[c][s] for c in loads) for s in range(a.seeds)]
            fixed_total = fixed_n * len(loads)
            verdicts.append(f"- {name}: adaptive sweep {statistics.mean(per_seed):,.0f} requests (mean over seeds; "
                            f"most {max(per_seed):,}) against a fixed -n {fixed_n:,} x {len(loads)} cells = "
                            f"{fixed_total:,} ({statistics.mean(per_seed) / fixed_total:.2f}x; most "
                            f"{max(per_seed) / fixed_total:.2f}x); the fixed -n {fixed_n:,} made the worst cell "
                            f"(c={worst}) precise in {fixed_ok} of {a.seeds} seeds")
            print(f"[{name} done, {time.monotonic() - t_start:.0f} s]", file=sys.stderr, flush=True)
    cpu = _cpu()
    print(f"precision benchmark: target {', '.join(f'{f} {s * 100:g}%' for f, s in TARGETS)}; workload in 200-512 / "
          f"out 64-512 (uniform); {a.seeds} seeds per cell; ceiling {CEILING:,}; long run {LONG_FACTOR}x the most "
          f"requests a seed used; {time.strftime('%Y-%m-%d')}, {cpu}, {time.monotonic() - t_start:.0f} s")
    print()
    print("| profile | users | requests used: median (range) | stopped precise | reached (median) | long-run output "
          "tok/s | its coverage | long-run TTFT p50 ms | its coverage | long-run requests |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()
    print("\n".join(verdicts))
    return 0


def _cpu() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


if __name__ == "__main__":
    raise SystemExit(main())
