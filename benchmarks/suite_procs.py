"""Does running the tests in more processes pay on this machine? pytest over the same selection, in B processes
(`--base`, default 1) and in N (pytest-xdist, `--dist loadgroup`, as scripts/test.sh runs it), interleaved (B, N,
B, N, ...), printing each run's wall time and pass count, the medians and their ratio.

The default selection is the `--fast` lane (no real vLLM or llama.cpp is started); `-m ""` with setup done
(`bash .ci/setup_vllm.sh`) times everything. Run it on a quiet machine: a figure taken while something else runs
is an upper bound.

    python benchmarks/suite_procs.py [--rounds 1] [--base 1] [--procs 2] [--base-env K=V] [-m MARKEXPR] [PYTEST_ARGS...]

`--base-env K=V` (repeatable) sets an environment variable for the base runs only: with `--base 3 --procs 3
--base-env SERVESCOPE_TEST_GC=default` it compares the suite with Python's default garbage-collector threshold
(the base) against the one tests/conftest.py sets.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAST = "not (vllm or llamacpp or tmux or ray or slow)"


def run(procs: int, mark: str, extra: list[str], more_env: dict[str, str] | None = None) -> tuple[float, str]:
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", "-m", mark, *extra]
    if procs > 1:
        cmd += ["-n", str(procs), "--dist", "loadgroup"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | (more_env or {})
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    wall = time.monotonic() - t0
    tail = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr[-300:]
    if p.returncode != 0:
        print(f"  (exit {p.returncode}: {tail})")
        for line in p.stdout.splitlines():
            if line.startswith(("FAILED", "ERROR")):
                print(f"  {line}")
    return wall, re.sub(r"=+", "", tail).strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--base", type=int, default=1, help="the processes to compare with (default 1)")
    ap.add_argument("-m", dest="mark", default=FAST, help=f"pytest marker expression (default: {FAST!r})")
    ap.add_argument("--base-env", action="append", default=[], metavar="K=V",
                    help="an environment variable for the base runs only (repeatable)")
    args, extra = ap.parse_known_args()
    base_env = dict(kv.split("=", 1) for kv in args.base_env)
    base_name = f"{args.base} process{'es' if args.base > 1 else ''}" + (
        f" ({', '.join(args.base_env)})" if base_env else "")
    one: list[float] = []
    many: list[float] = []
    for r in range(args.rounds):
        for procs, into, env in ((args.base, one, base_env), (args.procs, many, {})):
            wall, tail = run(procs, args.mark, extra, env)
            into.append(wall)
            name = base_name if into is one else f"{procs} process{'es' if procs > 1 else ''}"
            print(f"round {r + 1}, {name}: {wall:7.1f} s  ({tail})", flush=True)
    m1, mn = statistics.median(one), statistics.median(many)
    print(f"median wall time: {base_name} {m1:.1f} s, {args.procs} processes "
          f"{mn:.1f} s; "
          f"ratio {mn / m1:.2f} ({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the end)")


if __name__ == "__main__":
    main()
