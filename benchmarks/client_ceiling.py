"""Where one client process becomes the bottleneck, and how far worker processes carry the load past it.

    .venv/bin/python benchmarks/client_ceiling.py [--streams 64,256,1024,4096] [--workers 1,2,auto]
        [--rounds 1] [--output-tokens 64]

Starts servescope's simulator once with its `max-speed` profile (steps take no modelled time: it streams as fast
as its own process can) and runs `servescope run` against it at each concurrency with each worker count
(requests = 2 x streams, 256 in / 64 out, `--telemetry-interval off`), alternating the worker counts. From each
cell's `--json` it prints the client-side streamed output tok/s, the client's CPU per 1,000 streamed tokens
during the measured part (the `client` part's `cpu_s`: every worker's process CPU, over the cell's output
tokens), the busiest worker's CPU as a share of one core, the event-loop lag p99 and the verdict with its
reasons. Medians over `--rounds`. On a 2-core machine the simulator shares the cores with the client, so the
ceiling printed here is the machine's, not the client's alone: read where `bound` appears and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from servescope.core.load import open_file_room  # noqa: E402
from servescope.sim.launcher import start_sim  # noqa: E402


def run(url: str, streams: int, workers: str, out_tokens: int, tmp: Path, seed: int) -> dict[str, Any]:
    wl = tmp / "w.toml"
    wl.write_text(f'[workload]\nname = "ceiling"\ninput_tokens = 256\noutput_tokens = {out_tokens}\n')
    cmd = [sys.executable, "-m", "servescope", "run", "--url", url, "-w", str(wl), "-c", str(streams),
           "-n", str(2 * streams), "--workers", workers, "--seed", str(seed), "--telemetry-interval", "off",
           "--sessions-dir", str(tmp / "s"), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"servescope failed at c={streams}, workers {workers}:\n{p.stderr[-2000:]}")
    cell: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])["cells"][0]
    return cell


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", default="64,256,1024,4096")
    ap.add_argument("--workers", default="1,2,auto")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--output-tokens", type=int, default=64)
    args = ap.parse_args()
    streams = [int(x) for x in args.streams.split(",")]
    workers = args.workers.split(",")
    open_file_room(max(streams) + 1024)  # before the simulator starts: it inherits the limit
    import compileall

    compileall.compile_dir(str(ROOT / "servescope"), quiet=1)  # as a wheel install has them
    rows: dict[tuple[int, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="servescope-ceiling-") as d, \
            start_sim("max-speed", ["--no-enable-prefix-caching"]) as sim:
        tmp = Path(d)
        seed = 0
        for s in streams:
            for rnd in range(args.rounds):
                order = workers[rnd % len(workers):] + workers[:rnd % len(workers)]
                for w in order:
                    seed += 1
                    cell = run(sim.url, s, w, args.output_tokens, tmp, seed)
                    rows.setdefault((s, w), []).append(cell)
                    c = cell.get("client") or {}
                    print(f"c={s} workers={w}: {cell['output_tok_s']:,.0f} tok/s, client {c.get('verdict')} "
                          f"(workers {c.get('workers')}, CPU {c.get('cpu_util', 0):.0%})", file=sys.stderr)
    print(f"client ceiling vs sim://max-speed (256 in / {args.output_tokens} out, requests = 2 x streams, "
          f"{args.rounds} round(s), medians; {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores shared with the "
          "simulator)")
    print("| streams | workers | output tok/s | client CPU ms / 1k tok | busiest worker CPU | loop lag p99 ms | "
          "verdict |")
    print("|---|---|---|---|---|---|---|")
    for (s, w), cells in rows.items():
        clients = [c.get("client") or {} for c in cells]
        tps = statistics.median(float(c["output_tok_s"]) for c in cells)
        per_1k = statistics.median(
            float(cl.get("cpu_s") or 0.0) / max(1.0, float(c.get("output_tokens_mean") or 0.0) * int(c["requests_ok"]))
            * 1e6
            for c, cl in zip(cells, clients, strict=True))
        util = statistics.median(float(cl.get("cpu_util") or 0.0) for cl in clients)
        lag = statistics.median(float((cl.get("loop_lag_ms") or {}).get("p99") or 0.0) for cl in clients)
        verdicts = ", ".join(sorted({str(cl.get("verdict")) for cl in clients}))
        reasons = "; ".join(sorted({r for cl in clients for r in cl.get("reasons") or []}))
        n = ", ".join(sorted({str(cl.get("workers")) for cl in clients}))
        print(f"| {s} | {w} ({n}) | {tps:,.0f} | {per_1k:.1f} | {util:.0%} | {lag:.1f} | {verdicts}"
              f"{': ' + reasons if reasons else ''} |")


if __name__ == "__main__":
    main()
