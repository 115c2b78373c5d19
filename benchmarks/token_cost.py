"""Where a streamed token's client CPU goes: `perf` samples of `servescope run` against a simulator, split by where
the CPU was (the kernel: syscalls, TCP, wake-ups; the interpreter; uvloop; msgspec; the rest) and by what.

    .venv/bin/python benchmarks/token_cost.py [--concurrency 8] [--duration 20] [--out 64] [--profile tiny]
                                              [--servescope-args "--telemetry-interval off"]

Needs `perf` and the right to profile (root, or kernel.perf_event_paranoid <= 1). Starts `servescope sim` in a
process of its own, then runs `servescope run` against it (256 in / `--out` out, `--concurrency` users for
`--duration` s, telemetry off unless the flags say otherwise) under `perf record -F 999 -k CLOCK_MONOTONIC`
(the client and any child it starts, not the simulator), and reads the samples of the load alone: from its first
request sent to its last answer's end, from the session's saved stamps (CLOCK_MONOTONIC, as perf's). Prints the client's CPU (s) and its tokens, so CPU per token
(us), then the share of the samples per shared object (the kernel, libpython, uvloop's and msgspec's extension
modules...) and the kernel's and the interpreter's top symbols with their shares: a breakdown of that CPU per token.
The simulator shares the machine's cores; the client's CPU per token is not vLLM's client figure
(benchmarks/client_cpu.py), its split is what this prints.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.client_cpu import cpu_model, own_window  # noqa: E402
from servescope.sim.launcher import start_sim  # noqa: E402


def perf_split(data: Path, key: str, window: tuple[float, float]) -> list[tuple[str, float]]:
    """perf report's share of the samples (%) per `key` (dso or sym) within `window` (CLOCK_MONOTONIC s), from its
    plain text output."""
    p = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "--sort", key, "--stdio", "-q",
                        "--percent-limit", "0.5", "--time", f"{window[0]:.6f},{window[1]:.6f}"],
                       capture_output=True, text=True, check=True)
    out: list[tuple[str, float]] = []
    for line in p.stdout.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(.*\S)", line)
        if m:
            out.append((m.group(2), float(m.group(1))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--out", type=int, default=64)
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--servescope-args", default="--telemetry-interval off")
    args = ap.parse_args()
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="servescope-token-cost-") as d, start_sim(args.profile, []) as sim:
        tmp = Path(d)
        wl = tmp / "w.toml"
        wl.write_text(f'[workload]\nname = "cost"\napi = "completions"\ninput_tokens = 256\n'
                      f"output_tokens = {args.out}\n")
        data = tmp / "perf.data"
        cmd = ["perf", "record", "-q", "-k", "CLOCK_MONOTONIC", "-F", "999", "-o", str(data), "--",
               sys.executable, "-m", "servescope", "run", "--url", sim.url, "-w", str(wl), "-c",
               str(args.concurrency), "--duration", f"{args.duration:g}s", "--sessions-dir", str(tmp / "s"), "--json",
               *shlex.split(args.servescope_args)]
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if p.returncode != 0:
            raise SystemExit(f"servescope failed ({p.returncode}):\n{p.stderr[-3000:]}")
        [cell] = json.loads(p.stdout.strip().splitlines()[-1])["cells"]
        tokens = int(cell["output_tokens_mean"] * cell["requests_ok"])
        cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)  # perf's own CPU is in it too
        client = cell.get("client") or {}
        win = own_window(tmp / "s")
        if win is None:
            raise SystemExit("servescope saved no request")
        by_dso, by_sym = perf_split(data, "dso", win[:2]), perf_split(data, "dso,sym", win[:2])
    print(f"\nwhere a token's client CPU goes: servescope run against `servescope sim --profile {args.profile}`, "
          f"c={args.concurrency}, 256 in / {args.out} out, {args.duration:g} s, flags {args.servescope_args!r}; "
          f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores ({cpu_model()}); load average at the start "
          f"{', '.join(f'{x:.2f}' for x in load0)}, at the end {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{tokens:,} tokens; the client's load CPU (its own count, cpu_s) {client.get('cpu_s', float('nan')):.2f} s "
          f"= {client.get('cpu_s', float('nan')) / tokens * 1e6:.1f} us per token; the whole run under perf "
          f"(start-up, preparation and perf's own included) {cpu:.2f} s")
    print(f"perf samples from the first request sent to the last answer's end ({win[1] - win[0]:.1f} s)")
    print("| where (shared object) | share of the client's samples |")
    print("|---|---|")
    for name, pct in by_dso:
        print(f"| {name} | {pct:.1f}% |")
    print("| top symbols (shared object, symbol) | share |")
    print("|---|---|")
    for name, pct in by_sym[:25]:
        print(f"| {' '.join(name.split())} | {pct:.1f}% |")


if __name__ == "__main__":
    main()
