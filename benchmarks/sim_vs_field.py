"""Simulated vs field figures for every calibrated profile (issue 3), with the ratio sim / field.

Runs the simulator's scheduler on a virtual clock (no HTTP, no sleeping: a few seconds in all), with the
same closed-loop load a benchmark client would apply: `c` users, each sending its next request when the
previous one ends. Usage: python benchmarks/sim_vs_field.py [--markdown]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servescope.sim.engine import run_closed_loop  # noqa: E402
from servescope.sim.profile import CostModel, load_profile  # noqa: E402

P6K_INT4 = "rtx-pro-6000/qwen3.5-35b-a3b-gptq-int4"
P6K_FP8 = "rtx-pro-6000/qwen3.5-35b-a3b-fp8"
P6K_27B = "rtx-pro-6000/qwen3.5-27b-gptq-int4"
SPARK_27B = "dgx-spark/qwen3.6-27b-fp8"
SPARK_GEMMA = "dgx-spark/gemma-4-31b-awq"


def c1(cost: CostModel, prompt: int, out: int = 256) -> tuple[float, float, float]:
    """(TTFT s, TPOT s, E2E s) of one lone request."""
    res, _ = run_closed_loop(cost, 1, 1, prompt, out)
    r = res[0]
    return r.ttft, r.tpot, r.e2e


def sweep(cost: CostModel, c: int, prompt: int | tuple[int, int], out: int = 256, rounds: int = 4) -> tuple[float, float]:
    """(aggregate output tok/s, mean per-user tok/s) for a closed loop at concurrency c."""
    rng = random.Random(0)
    lengths = [prompt if isinstance(prompt, int) else rng.randint(*prompt) for _ in range(c * rounds)]
    res, wall = run_closed_loop(cost, c, len(lengths), lambda i: lengths[i], out)
    agg = sum(r.output_len for r in res) / wall
    per_user = statistics.fmean(r.output_len / r.e2e for r in res)
    return agg, per_user


def rows() -> list[tuple[str, str, float, float, str]]:
    out: list[tuple[str, str, float, float, str]] = []

    def add(profile: str, figure: str, sim: float, field: float, unit: str) -> None:
        out.append((profile, figure, sim, field, unit))

    cost = CostModel(load_profile(P6K_INT4))
    for prompt, ttft, tpot, e2e in ((1024, 104, 6.1, 1.7), (8192, 275, 6.2, 1.9), (32768, 1104, 6.3, 2.7)):
        t, p, e = c1(cost, prompt)
        add(P6K_INT4, f"TTFT c=1 {prompt // 1024}K in", t * 1e3, ttft, "ms")
        add(P6K_INT4, f"TPOT c=1 {prompt // 1024}K in", p * 1e3, tpot, "ms")
        add(P6K_INT4, f"E2E c=1 {prompt // 1024}K in / 256 out", e, e2e, "s")
    for c, agg, user in ((1, 184, 184), (10, 800, 80), (50, 3373, 67)):
        a, u = sweep(cost, c, 1024)
        add(P6K_INT4, f"aggregate tok/s c={c} (1K in / 256 out)", a, agg, "tok/s")
        if c > 1:
            add(P6K_INT4, f"per-user tok/s c={c}", u, user, "tok/s")
    add(P6K_INT4, "weights VRAM", cost.weights_gib(), 21.0, "GiB")

    cost = CostModel(load_profile(P6K_FP8))
    a, _ = sweep(cost, 1, 1024)
    add(P6K_FP8, "aggregate tok/s c=1 (1K in / 256 out)", a, 162.3, "tok/s")
    add(P6K_FP8, "weights VRAM", cost.weights_gib(), 34.2, "GiB")

    cost = CostModel(load_profile(P6K_27B))
    a, _ = sweep(cost, 1, 1024)
    add(P6K_27B, "aggregate tok/s c=1 (1K in / 256 out)", a, 52.0, "tok/s")

    cost = CostModel(load_profile(SPARK_27B))
    a, _ = sweep(cost, 1, (200, 512), rounds=3)
    add(SPARK_27B, "aggregate tok/s c=1 (200-512 in / 256 out)", a, 7.8, "tok/s")
    a, u = sweep(cost, 64, (200, 512), rounds=2)
    add(SPARK_27B, "aggregate tok/s c=64", a, 218.0, "tok/s")
    add(SPARK_27B, "per-user tok/s c=64", u, 3.40, "tok/s")

    cost = CostModel(load_profile(SPARK_GEMMA))
    add(SPARK_GEMMA, "GPU KV cache size", cost.kv_cache_tokens, 12752, "tokens")
    add(SPARK_GEMMA, "max concurrency at 32,768 tokens", cost.max_concurrency(32768), 2.41, "x")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = ap.parse_args(argv)
    table = rows()
    if args.markdown:
        print("| profile | figure | sim | field | ratio |")
        print("|---|---|---|---|---|")
        for prof, fig, sim, field, unit in table:
            print(f"| {prof} | {fig} | {sim:,.3g} {unit} | {field:,.4g} {unit} | {sim / field:.2f} |")
    else:
        width = max(len(f) for _, f, *_ in table)
        last = ""
        for prof, fig, sim, field, unit in table:
            if prof != last:
                print(f"\n{prof}")
                last = prof
            print(f"  {fig:<{width}}  sim {sim:>10,.4g}  field {field:>10,.4g} {unit:<6} ratio {sim / field:5.2f}")
    ratios = [s / f for _, _, s, f, _ in table]
    print(f"\n{len(ratios)} figures; ratio sim/field: min {min(ratios):.2f}, max {max(ratios):.2f}, "
          f"geometric mean {statistics.geometric_mean(ratios):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
