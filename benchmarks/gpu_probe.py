"""Sample the NVIDIA GPUs of this machine for a few seconds with servescope's GpuSampler and print what it
read: per-GPU readings, and the energy/cost arithmetic over the whole window.

    python benchmarks/gpu_probe.py [--seconds 5] [--interval 0.5] [--price 0.20] [--tokens 1000000]

On a machine without NVML (no driver, no GPU, pynvml missing) it prints why and exits 0: that is the
path servescope takes there too. Exit 1 only if NVML is present but nothing could be read.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servescope.core.telemetry import GpuSampler  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--seconds", type=float, default=5.0, help="how long to sample (default 5)")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between samples (default 0.5)")
    ap.add_argument("--price", type=float, default=0.20, help="electricity price in USD per kWh (default 0.20)")
    ap.add_argument("--tokens", type=int, default=1_000_000,
                    help="pretend this many output tokens were produced in the window (default 1M)")
    ap.add_argument("--json", action="store_true", help="print the window summary as JSON too")
    args = ap.parse_args(argv)

    g = GpuSampler(interval_s=args.interval)
    if not g.available:
        print(f"NVML absent: {g.reason}")
        print("servescope would report: GPU telemetry not available on this machine (nothing fails).")
        return 0
    print(f"{len(g.names)} GPU(s): " + ", ".join(f"[{i}] {n}" for i, n in zip(g.indices, g.names, strict=True)))
    t0 = time.perf_counter_ns()
    g.start()
    time.sleep(args.seconds)
    g.stop()
    t1 = time.perf_counter_ns()
    df = g.frame()
    g.close()
    if df.height == 0:
        print("NVML is present but no sample was read")
        return 1
    print(f"\n{df.height} readings over {(t1 - t0) / 1e9:.1f} s (errors on unsupported fields: {g.errors})")
    try:
        import polars as pl

        with pl.Config(tbl_rows=12, tbl_cols=12, tbl_width_chars=160):
            print(df.drop("t_ns").head(12))
    except Exception:  # noqa: BLE001 - printing is best effort
        print(df.head(12))
    w = g.window_summary(t0, t1, output_tokens=args.tokens, price_usd_per_kwh=args.price)

    def f(v: object, spec: str) -> str:
        return "n/a" if v is None else format(v, spec)

    print(f"\nwindow {w['duration_s']:.2f} s, {w['samples']} sample times, energy coverage {f(w['energy_coverage'], '.0%')}")
    print(f"energy (trapezoid of power, all GPUs): {f(w['energy_wh'], '.4f')} Wh"
          f"   (NVML energy counter: {f(w['energy_wh_counter'], '.4f')} Wh)")
    print(f"power mean {f(w['power_w_mean'], '.1f')} W, peak {f(w['power_w_peak'], '.1f')} W; "
          f"utilisation mean {f(w['util_pct_mean'], '.1f')} %; SM clock mean {f(w['sm_clock_mhz_mean'], '.0f')} MHz; "
          f"temperature max {f(w['temp_c_max'], '.0f')} C")
    print(f"memory peak {f(w['mem_used_gib_peak'], '.2f')} GiB of {f(w['mem_total_gib'], '.2f')} GiB")
    print(f"if {args.tokens:,} output tokens had been produced: {f(w['wh_per_1m_output_tokens'], '.3f')} Wh per 1M "
          f"output tokens, ${f(w['cost_usd_per_1m_output_tokens'], '.5f')} per 1M at ${args.price}/kWh")
    for p in w["per_gpu"]:
        print(f"  GPU {p['index']} {p['name']}: {f(p['energy_wh'], '.4f')} Wh, power mean {f(p['power_w_mean'], '.1f')} W, "
              f"util {f(p['util_pct_mean'], '.1f')} %, mem peak {f(p['mem_used_gib_peak'], '.2f')} / "
              f"{f(p['mem_total_gib'], '.2f')} GiB, temp max {f(p['temp_c_max'], '.0f')} C")
    if args.json:
        print(json.dumps(w, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
