"""Does the app slow the measurement down? Runs the same sweep against the simulator headless
(`servescope run --sweep`, in its own process) and inside the app (driven by Pilot, live charts redrawing), alternating
A/B/A/B, and prints output tok/s and mean TTFT of both and the app/headless ratio. Target: within 2%.
The app runs its engine in a separate process where two or more CPUs are usable, else in a thread;
`--engines process,thread` measures both (SERVESCOPE_ENGINE), alternating with headless runs.

    python benchmarks/tui_overhead.py [--profile tiny] [--concurrency 8,32] [--requests 96] [--repeat 2]
                                      [--engines process,thread]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from servescope.core.results import CellResult

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def sweep_dict(url: str, concurrency: str, requests: int, workload: str, file: Path) -> Any:
    """The sweep for the app (a SweepSpec), and the same sweep written to `file` for the headless run."""
    from servescope.engine.spec import SweepSpec
    from servescope.workloads.spec import resolve

    spec = SweepSpec(url=url, workloads=tuple(resolve(workload)), concurrency=tuple(int(c) for c in concurrency.split(",")),
                     requests=requests, name="overhead")
    spec.save(file)
    return spec


def results(session_dir: Path) -> list[CellResult]:
    from servescope.sessions.store import load_session

    return [s for s in load_session(session_dir).summaries() if s is not None]


def headless(sweep_file: Path, session: Path) -> Path:
    """`servescope run --sweep` in its own process, exactly as a user runs it headless."""
    import subprocess

    p = subprocess.run([sys.executable, "-m", "servescope", "run", "--sweep", str(sweep_file), "--save", str(session),
                        "--json"], cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise SystemExit(f"servescope run failed ({p.returncode}): {p.stderr.strip()[-500:]}")
    return session


async def in_app(sweep: Any, sessions: Path) -> Path:
    from servescope.tui.app import make_app

    app = make_app(url=sweep.url, sessions_dir=str(sessions))
    async with app.run_test(size=(120, 40)) as pilot:
        app.start_sweep(sweep)
        while app.sweep_worker is None:
            await pilot.pause(0.05)
        await app.sweep_worker.wait()
        await pilot.pause(0.2)
        assert app.last_session is not None, f"the sweep did not finish: {app.sweep_worker.result}"
    return app.last_session


def agg(rows: list[list[CellResult]]) -> tuple[float, float]:
    tok = [sum(s.output_tokens_total or 0 for s in r) / sum(s.wall_s or 0.0 for s in r) for r in rows]
    ttft = [statistics.fmean(s.ttft_ms.mean or 0.0 for s in r) for r in rows]
    return statistics.fmean(tok), statistics.fmean(ttft)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--workload", default="sharegpt")
    ap.add_argument("--concurrency", default="8,32")
    ap.add_argument("--requests", type=int, default=96)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--engines", default="process,thread", help="app engine modes to measure: process,thread")
    args = ap.parse_args()
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    modes = ["headless", *(f"app-{e}" for e in engines)]

    from servescope.sim.launcher import start_sim

    # prefix caching off: every run sends the same prompts, and later runs must not get cache hits
    with start_sim(args.profile, ["--no-enable-prefix-caching"]) as sim, tempfile.TemporaryDirectory() as tmp:
        sweep_file = Path(tmp) / "sweep.toml"
        sweep = sweep_dict(sim.url, args.concurrency, args.requests, args.workload, sweep_file)
        runs: dict[str, list[list[CellResult]]] = {mode: [] for mode in modes}
        for i in range(args.repeat):
            for mode in modes:
                d = Path(tmp) / f"{mode}-{i}"
                t0 = time.monotonic()
                if mode == "headless":
                    path = headless(sweep_file, d)
                else:
                    os.environ["SERVESCOPE_ENGINE"] = mode.removeprefix("app-")
                    path = asyncio.run(in_app(sweep, d))
                runs[mode].append(results(path))
                print(f"run {i + 1} {mode:<8} {time.monotonic() - t0:6.1f} s", file=sys.stderr)
        print(f"sim://{args.profile}, {args.workload}, c={args.concurrency}, {args.requests} requests/cell, "
              f"{args.repeat} runs each (alternating)")
        h_runs = runs["headless"]
        for mode in modes[1:]:
            a_runs = runs[mode]
            print(f"\n{mode}: {'cell':<8}{'headless tok/s':>16}{'app tok/s':>12}{'headless TTFT':>15}{'app TTFT':>11}")
            for ci, c in enumerate(args.concurrency.split(",")):
                h = [r[ci] for r in h_runs]
                a = [r[ci] for r in a_runs]
                print(f"{'':<{len(mode) + 2}}c={c:<6}{statistics.fmean(s.output_tok_s or 0.0 for s in h):>16,.1f}"
                      f"{statistics.fmean(s.output_tok_s or 0.0 for s in a):>12,.1f}"
                      f"{statistics.fmean(s.ttft_ms.mean or 0.0 for s in h):>13,.2f}ms"
                      f"{statistics.fmean(s.ttft_ms.mean or 0.0 for s in a):>9,.2f}ms")
            ht, hf = agg(h_runs)
            at, af = agg(a_runs)
            print(f"overall   output tok/s headless {ht:,.1f}  app {at:,.1f}  ratio app/headless {at / ht:.3f}")
            print(f"          mean TTFT    headless {hf:,.2f} ms  app {af:,.2f} ms  ratio app/headless {af / hf:.3f}")
            ok = abs(at / ht - 1) <= 0.02 and abs(af / hf - 1) <= 0.02
            print("within 2% on throughput and TTFT" if ok else "NOT within 2% on both throughput and TTFT")
    return 0


if __name__ == "__main__":
    sys.exit(main())
