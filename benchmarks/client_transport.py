"""Client CPU per streamed token of each transport (raw, aiohttp, httpx), in one run, alternating.

    .venv/bin/python benchmarks/client_transport.py [--transports raw,aiohttp,httpx] [--concurrency 1,8,32]
        [--requests 100] [--rounds 3]

Runs the load part of a cell (prompts built beforehand, outside the measurement) in this process against
the simulator (`sim://tiny`, a separate process), and reads this process's CPU time around it. Prints the
median CPU ms per 1,000 streamed tokens of each transport and its ratio to the first one listed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servescope.core.client import ClientOptions, RequestSpec, async_client  # noqa: E402
from servescope.core.load import Limits, Load, run_cell  # noqa: E402
from servescope.core.target import ServerTokenizer  # noqa: E402
from servescope.sim.launcher import start_sim  # noqa: E402
from servescope.workloads.prompts import build_prompts  # noqa: E402
from servescope.workloads.spec import Workload, fixed  # noqa: E402


async def prompts(url: str, n: int, key: str) -> list[RequestSpec]:
    async with async_client(base_url=url) as h:
        ps = await build_prompts(Workload("bench", "completions", fixed(256), fixed(64)), n, key, ServerTokenizer(h, "tiny"))
    return [RequestSpec("completions", p.text, p.input_tokens, p.output_tokens) for p in ps]


async def measure(url: str, specs: list[RequestSpec], c: int, transport: str) -> tuple[float, float]:
    opts = ClientOptions(base_url=url, model="tiny", transport=transport)
    t0 = time.process_time()
    run = await run_cell(opts, specs, Load(concurrency=c), Limits(requests=len(specs)))
    cpu = time.process_time() - t0
    toks = sum(r.output_tokens for r in run.records if r.status == "ok")
    wall = (run.end_ns - run.start_ns) / 1e9
    return cpu / toks * 1e6, toks / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--transports", default="raw,aiohttp,httpx")
    args = ap.parse_args()
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:
        factory = None
    res: dict[tuple[str, int], list[tuple[float, float]]] = {}
    with start_sim("tiny") as sim:
        for c in [int(x) for x in args.concurrency.split(",")]:
            for rnd in range(args.rounds):
                names = args.transports.split(",")
                order = names[rnd % len(names):] + names[:rnd % len(names)]  # each goes first in turn
                for tr in order:
                    with asyncio.Runner(loop_factory=factory) as r:
                        specs = r.run(prompts(sim.url, args.requests, f"{tr}-{c}-{rnd}"))
                        res.setdefault((tr, c), []).append(r.run(measure(sim.url, specs, c, tr)))
    names = args.transports.split(",")
    print(f"client CPU per 1,000 streamed tokens vs sim://tiny (256 in / 64 out, {args.requests} requests, "
          f"{args.rounds} rounds alternating, medians; {time.strftime('%Y-%m-%d')})")
    print("| c | " + " | ".join(f"{t} ms/1k tok" for t in names) + " | "
          + " | ".join(f"{t} / {names[0]}" for t in names[1:]) + " | " + " | ".join(f"{t} tok/s" for t in names) + " |")
    print("|---" * (1 + 3 * len(names) - 1) + "|")
    for c in sorted({c for _, c in res}):
        cpu = {t: statistics.median(x[0] for x in res[(t, c)]) for t in names}
        tps = {t: statistics.median(x[1] for x in res[(t, c)]) for t in names}
        print(f"| {c} | " + " | ".join(f"{cpu[t]:.0f}" for t in names) + " | "
              + " | ".join(f"{cpu[t] / cpu[names[0]]:.2f}" for t in names[1:]) + " | "
              + " | ".join(f"{tps[t]:,.0f}" for t in names) + " |")


if __name__ == "__main__":
    main()
