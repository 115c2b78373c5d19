"""How much load one core can simulate faithfully.

Starts the simulator (one process, one core's worth of Python) and drives it from this process with c
streaming users (aiohttp, chunks counted, not parsed). For each c it compares the streamed output tok/s
with what the same scheduler predicts on a virtual clock (no CPU limits), and reads the simulator's
own lag counters and CPU time. "Faithful" = within 5% of the prediction with under 1% late steps.
Usage: python benchmarks/sim_capacity.py [--profile tiny] [--concurrency 8,32,64,128] [--seconds 6]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import re
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servescope.sim.engine import run_closed_loop  # noqa: E402
from servescope.sim.launcher import start_sim  # noqa: E402
from servescope.sim.profile import CostModel, load_profile  # noqa: E402

PROMPT_TOKENS = 256
OUTPUT_TOKENS = 128


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


_SENT = itertools.count(1)


async def drive(url: str, c: int, seconds: float) -> tuple[int, float, float, float]:
    """c closed-loop users for `seconds`; returns (tokens, wall, late steps, steps estimate)."""
    tokens = 0
    stop_at = time.perf_counter() + seconds
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as s:
        async with s.get(url + "/metrics") as r:
            before = await r.text()

        async def user() -> None:
            nonlocal tokens
            while time.perf_counter() < stop_at:
                n = next(_SENT)  # a distinct first token across every cell of the run: no prefix-cache hits
                prompt = [1000 + n % 20000, *range(2000, 2000 + PROMPT_TOKENS - 1)]
                body = {"prompt": prompt, "max_tokens": OUTPUT_TOKENS, "ignore_eos": True, "stream": True}
                async with s.post(url + "/v1/completions", json=body) as r:
                    async for piece in r.content.iter_any():
                        tokens += piece.count(b'"text"')

        t0 = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(c)))
        wall = time.perf_counter() - t0
        async with s.get(url + "/metrics") as r:
            after = await r.text()
    late = _metric(after, "servescope_sim:late_steps_total") - _metric(before, "servescope_sim:late_steps_total")
    lag = _metric(after, "servescope_sim:lag_seconds_total") - _metric(before, "servescope_sim:lag_seconds_total")
    return tokens, wall, late, lag


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="tiny")
    ap.add_argument("--concurrency", default="8,32,64,128")
    ap.add_argument("--seconds", type=float, default=6.0)
    args = ap.parse_args(argv)
    cost = CostModel(load_profile(args.profile))
    print(f"profile {args.profile}: {PROMPT_TOKENS} in / {OUTPUT_TOKENS} out, closed loop, {args.seconds:g} s per cell")
    print(f"{'c':>5} {'predicted tok/s':>16} {'streamed tok/s':>15} {'ratio':>6} {'late steps':>11} "
          f"{'lag s':>7} {'sim CPU %':>10} {'sim CPU ms/1k tok':>18}")
    with start_sim(args.profile) as h:
        for c in (int(x) for x in args.concurrency.split(",")):
            res, wall_v = run_closed_loop(cost, c, c * 4, PROMPT_TOKENS, OUTPUT_TOKENS)
            predicted = sum(r.output_len for r in res) / wall_v
            cpu0 = _cpu_seconds(h.proc.pid)
            tokens, wall, late, lag = asyncio.run(drive(h.url, c, args.seconds))
            cpu = _cpu_seconds(h.proc.pid) - cpu0
            rate = tokens / wall
            print(f"{c:>5} {predicted:>16,.0f} {rate:>15,.0f} {rate / predicted:>6.2f} {late:>11.0f} {lag:>7.2f} "
                  f"{100 * cpu / wall:>10.0f} {1e3 * cpu / max(tokens, 1) * 1e3:>18.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
