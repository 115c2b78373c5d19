"""How much of a streamed token's client CPU is servescope's own code, and how much the floor under it.

    .venv/bin/python benchmarks/token_floor.py [--against /path/to/old/checkout] [--rounds 5] [--concurrency 8]
                                               [--requests 200]

Against one `servescope sim --profile tiny` (a process of its own; 256 in / 64 out, one token per event and read, as
vLLM streams), each in a fresh process of its own and interleaved round by round, the order reversed every other
round, reads this process's CPU (and voluntary context switches) per streamed token for:
- `floor`: the default transport (core/rawhttp.py) with a sink that only counts each read's events: the kernel's
  reads, wake-ups and ACKs, the event loop and the transport's own framing, with no SSE parse, decode or record;
- `stream`: the same with the request's real sink (core/tokenstream.py's `_Stream`: SSE, decode, record);
- `cell`: the whole measured part of a cell (core/load.py's `run_cell`: the closed loop's users, each request's
  timeout, its record and the client probe), as `servescope run` runs it, start-up and prompts apart (what exists
  before the count is collected and frozen first, as a cell does before its load).
With `--against DIR`, `stream` and `cell` are run from that checkout too (its code, with PYTHONPATH=DIR), in the same
rotation: a before/after of the per-token path in one interleaved run. Prints the medians (us per token) and ratios.
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
import asyncio, gc, json, resource, sys, time
url, c, n, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
import servescope
from servescope.core.client import ClientOptions, RequestSpec, _Stream, async_client, build_body
from servescope.core.load import Limits, Load, run_cell
from servescope.core.rawhttp import RawClient
from servescope.core.records import RequestRecord
from servescope.core.target import ServerTokenizer
from servescope.workloads.prompts import build_prompts
from servescope.workloads.spec import Workload, fixed


class Count:
    overflow = False

    def __init__(self):
        self.n = 0

    def feed(self, piece, now):
        self.n += piece.count(b"data:") - piece.count(b"data: [DONE]")

    def whole(self, piece, now):
        self.n += piece != b"data: [DONE]\n\n"
        return True


async def main():
    async with async_client(base_url=url) as h:
        ps = await build_prompts(Workload("floor", "completions", fixed(256), fixed(64)), n, mode + sys.argv[5],
                                 ServerTokenizer(h, "tiny"))
    specs = [RequestSpec("completions", p.text, p.input_tokens, p.output_tokens) for p in ps]
    opts = ClientOptions(base_url=url, model="tiny")
    gc.collect()  # what exists now is collected and frozen before the count starts, as a cell does before its load
    gc.freeze()
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
    if mode == "cell":
        run = await run_cell(opts, specs, Load(concurrency=c), Limits(requests=n))
        tokens = sum(len(r.chunk_ns) for r in run.records if r.status == "ok")
    else:
        bodies = [build_body(s, opts) for s in specs]
        http = RawClient(url, {"Content-Type": "application/json"}, c)
        tokens, left = 0, list(range(n))

        async def user():
            nonlocal tokens
            while left:
                i = left.pop()
                sink = Count() if mode == "floor" else _Stream(RequestRecord(i, 0, False, 256, 64, 0))
                await http.post_stream("v1/completions", bodies[i], sink, 65536)
                tokens += sink.n if mode == "floor" else len(sink.rec.chunk_ns)

        await asyncio.gather(*(user() for _ in range(c)))
        await http.close()
    cpu, r1 = time.process_time() - t0, resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"file": servescope.__file__, "us": cpu / tokens * 1e6, "tokens": tokens,
                      "wakeups": (r1.ru_nvcsw - r0.ru_nvcsw) / tokens}))


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
    ap.add_argument("--against", default="", help="another checkout whose stream and cell to run in the rotation")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=200)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from benchmarks.open_loop import cpu_model
    from servescope.sim.launcher import start_sim

    ways = [("floor", ROOT), ("stream", ROOT), ("cell", ROOT)]
    if args.against:
        old = Path(args.against).resolve()
        ways += [("stream", old), ("cell", old)]
    got: dict[tuple[str, Path], list[dict[str, float]]] = {w: [] for w in ways}
    load0 = os.getloadavg()
    with start_sim("tiny", []) as sim:
        for rnd in range(args.rounds):
            for mode, where in (ways if rnd % 2 == 0 else ways[::-1]):
                p = subprocess.run([sys.executable, "-c", CHILD, sim.url, str(args.concurrency), str(args.requests),
                                    mode, f"{rnd}-{where.name}"], capture_output=True, text=True, cwd="/",
                                   env={**os.environ, "PYTHONPATH": str(where)})
                if p.returncode != 0:
                    raise SystemExit(f"{mode} from {where} failed:\n{p.stderr[-3000:]}")
                d = json.loads(p.stdout.strip().splitlines()[-1])
                if not str(d["file"]).startswith(str(where)):
                    raise SystemExit(f"{mode} imported servescope from {d['file']}, not from {where}")
                got[(mode, where)].append(d)
                print(f"  round {rnd + 1} {mode} ({where}): {d['us']:.1f} us per token", file=sys.stderr)
    load1 = os.getloadavg()
    print(f"\nclient CPU per streamed token against `servescope sim --profile tiny`, c={args.concurrency}, "
          f"{args.requests} requests of 256 in / 64 out per run, medians of {args.rounds} interleaved rounds; "
          f"{time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores ({cpu_model()}), load average "
          f"{load0[0]:.2f} at the start, {load1[0]:.2f} at the end")
    print("| what | checkout | us per token, median (each round) | wake-ups per token | ratio to floor |")
    print("|---|---|---|---|---|")
    floor = statistics.median(d["us"] for d in got[("floor", ROOT)])
    for (mode, where), ds in got.items():
        us = statistics.median(d["us"] for d in ds)
        rounds = ", ".join(f"{d['us']:.1f}" for d in ds)
        wake = statistics.median(d["wakeups"] for d in ds)
        print(f"| {mode} | {'this' if where == ROOT else where} | {us:.1f} ({rounds}) | {wake:.3f} | {us / floor:.2f} |")
    if args.against:
        old = Path(args.against).resolve()
        for mode in ("stream", "cell"):
            new_us = statistics.median(d["us"] for d in got[(mode, ROOT)])
            old_us = statistics.median(d["us"] for d in got[(mode, old)])
            print(f"- {mode}: this checkout / {old}: {new_us / old_us:.2f} ({new_us:.1f} vs {old_us:.1f} us per token); "
                  f"servescope's own share over the floor: {new_us - floor:.1f} vs {old_us - floor:.1f} us")


if __name__ == "__main__":
    main()
