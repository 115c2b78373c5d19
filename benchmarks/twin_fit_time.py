"""How long the capacity twin's fit takes, against what `fit_time_estimate` promises.

Runs a sweep on the simulator (its default profile, the sharegpt preset) for each concurrency list given, or
takes existing sessions, then times `fit_session` on each: the wall time and this process's CPU time, the
virtual runs the fit made, and the estimate the app shows before a fit. On a busy machine the wall time runs
above the CPU time; the estimate's range is the CPU time to twice it.

Usage: python benchmarks/twin_fit_time.py [--concurrency 1,4 --concurrency 1,2,4,8,16,32,64] [--requests 32]
       python benchmarks/twin_fit_time.py --session DIR [--session DIR ...]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from servescope.engine.twin import fit_seconds, fit_session, fit_time_estimate, measured_cells  # noqa: E402
from servescope.sessions.store import load_session  # noqa: E402


def _record(levels: str, requests: int, where: Path) -> Path:
    save = where / f"c{levels.replace(',', '-')}"
    p = subprocess.run([sys.executable, "-m", "servescope", "run", "-c", levels, "-n", str(requests), "--save",
                        str(save), "--json"], capture_output=True, text=True, cwd=ROOT, check=False)
    if p.returncode != 0:
        sys.exit(f"servescope run -c {levels} failed:\n{p.stderr[-2000:]}")
    return save


def _cpu() -> float:
    """CPU seconds of this process and its finished children (the fit's worker processes)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", action="append", help="a sweep to record and fit (default: 1,4 and 1,2,...,64)")
    ap.add_argument("--requests", type=int, default=32, help="requests per cell of a recorded sweep (default 32)")
    ap.add_argument("--session", action="append", type=Path, help="fit an existing session instead")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sessions = list(args.session or [])
        if not sessions:
            for levels in args.concurrency or ["1,4", "1,2,4,8,16,32,64"]:
                sessions.append(_record(levels, args.requests, Path(tmp)))
        print(f"{'session':<40} {'cells':>5} {'requests':>8} {'runs':>5} {'wall s':>7} {'CPU s':>6} "
              f"{'model CPU s':>11}  estimate")
        for path in sessions:
            s = load_session(path)
            cells = measured_cells(s)
            estimate = fit_time_estimate(s)
            t0, c0 = time.perf_counter(), _cpu()
            r = fit_session(s)
            wall, cpu = time.perf_counter() - t0, _cpu() - c0
            print(f"{str(path)[-40:]:<40} {len(cells):>5} {sum(len(c.prompts) for c in cells):>8} "
                  f"{r.evaluations:>5} {wall:>7.1f} {cpu:>6.1f} {fit_seconds(cells, r.shape.async_known):>11.1f}  "
                  f"{estimate}")
            print(json.dumps({"session": str(path), "cells": len(cells), "wall_s": round(wall, 2),
                              "cpu_s": round(cpu, 2), "estimate": estimate, "residuals": r.residuals}))


if __name__ == "__main__":
    main()
