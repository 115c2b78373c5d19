"""The open loop's sender alone: its wake-ups per send, its CPU and its sends' lateness, in this process.

    .venv/bin/python benchmarks/sender_wakeups.py [--rates 1000,2000] [--duration 4] [--rounds 3]
                                                  [--against /path/to/old/checkout]

Starts benchmarks/canned_server.py (a process of its own: each request's 16 tokens streamed a millisecond apart), then
for each rate runs the measured part of an open-loop cell (core/load.py `run_cell`, constant arrivals, `--duration`
s; no start-up, prompts, telemetry or session) in a fresh process, and prints the requests sent, the sender's
wake-ups (its `_Alarm` sleeps) per send, the process's CPU over the load as a share of one core, and the sends'
lateness against their schedule (p50, p99). With `--against DIR`, the same from that checkout (PYTHONPATH=DIR) in the
same rotation, the order reversed every other round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r'''
import asyncio, json, sys, time
import servescope
from servescope.core import load as L
from servescope.core.client import ClientOptions, RequestSpec
url, rate, duration = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
sleeps = []
close = L._Alarm.close


def counted(self):
    sleeps.append(self.sleeps)
    close(self)


L._Alarm.close = counted


async def main():
    specs = [RequestSpec("completions", "hello " * 30, 32, 16)] * 10
    opts = ClientOptions(base_url=url, model="canned")
    t0 = time.process_time()
    run = await L.run_cell(opts, specs, L.Load(rate=rate, arrival="constant"), L.Limits(requests=None, duration_s=duration))
    cpu = time.process_time() - t0
    late = sorted((r.sent_ns - r.scheduled_ns) / 1e6 for r in run.records if r.sent_ns)
    print(json.dumps({"file": servescope.__file__, "sent": run.sent, "wakeups": sum(sleeps) / max(1, run.sent),
                      "cpu": cpu / duration, "p50": late[len(late) // 2], "p99": late[int(len(late) * 0.99)],
                      "ok": sum(r.status == "ok" for r in run.records)}))


try:
    import uvloop
    factory = uvloop.new_event_loop
except ImportError:
    factory = None
with asyncio.Runner(loop_factory=factory) as r:
    r.run(main())
'''


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="1000,2000")
    ap.add_argument("--duration", type=float, default=4.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--against", default="", help="another checkout to run in the same rotation")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from benchmarks.open_loop import cpu_model

    where = [ROOT] + ([Path(args.against).resolve()] if args.against else [])
    rates = [float(x) for x in args.rates.split(",")]
    ways = [(r, w) for r in rates for w in where]
    got: dict[tuple[float, Path], list[dict[str, float]]] = {w: [] for w in ways}
    load0 = os.getloadavg()[0]
    server = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "canned_server.py")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().split()[-1]
        for rnd in range(args.rounds):
            for rate, w in (ways if rnd % 2 == 0 else ways[::-1]):
                p = subprocess.run([sys.executable, "-c", CHILD, url, f"{rate:g}", f"{args.duration:g}"], cwd="/",
                                   capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(w)})
                if p.returncode != 0:
                    raise SystemExit(f"{w} at {rate:g}/s failed:\n{p.stderr[-3000:]}")
                d = json.loads(p.stdout.strip().splitlines()[-1])
                if not str(d["file"]).startswith(str(w)):
                    raise SystemExit(f"imported servescope from {d['file']}, not from {w}")
                got[(rate, w)].append(d)
    finally:
        server.terminate()
        server.wait(10)
    print(f"\nthe open loop's sender against benchmarks/canned_server.py, constant arrivals, {args.duration:g} s per run, "
          f"{args.rounds} rounds interleaved; {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores ({cpu_model()}), "
          f"load average {load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    print("| req/s | checkout | sent (each round) | wake-ups per send, median | CPU, share of a core (each round) | "
          "late p50 ms (each round) | late p99 ms (each round) |")
    print("|---|---|---|---|---|---|---|")
    for (rate, w), ds in got.items():
        def each(k: str, f: str, ds: list[dict[str, float]] = ds) -> str:
            return ", ".join(format(d[k], f) for d in ds)
        print(f"| {rate:,.0f} | {'this' if w == ROOT else w} | {each('sent', ',')} | "
              f"{statistics.median(d['wakeups'] for d in ds):.2f} | {each('cpu', '.0%')} | {each('p50', '.2f')} | "
              f"{each('p99', '.2f')} |")


if __name__ == "__main__":
    main()
