"""Does the open loop keep its schedule? For each asked rate: the rate achieved, how late sends went, the client verdict.

    .venv/bin/python benchmarks/open_loop.py [--rates 1000,2000,5000] [--workers 1,auto] [--duration 5]
                                             [--rounds 1] [--url canned] [--in 32 --out 16]

Runs `servescope run --url URL --rate R --arrival constant --duration D` (a workload of `--in` tokens in, `--out`
out) once per asked rate and `--workers` value, the rates interleaved
and the order reversed every other round, and prints per run: the rate asked, the load processes the cell ran
(`--workers auto` decides per cell, and says why), the rate achieved (requests sent over the duration), sends late
against their schedule (p50 is not saved: p99 and the share past 5 ms come from the session's requests), the client
verdict with its reasons, the busiest load process's CPU (share of one core, and its wait for a CPU) and the load
average before and after. The send schedule is drawn before the cell and kept against a monotonic clock; late sends
mean the client, or the machine under it, could not keep up.

The target is the client's sender, so the server is by default the cheapest one that still streams real responses:
`canned` starts benchmarks/canned_server.py in a process of its own (no model, no scheduler: each request's first
token at once, then one token per stream every millisecond, each its own HTTP chunk and write, [DONE] with the last),
a few us of CPU per request. `--url sim://max-speed` runs against the simulator instead (a fictional GPU whose
steps take no time, each run starting its own): its own CPU per request is much larger, and on a machine of few
cores it, not the client, is then what limits the rate: where it cannot serve the rate, the requests outstanding
reach the open loop's bound and the schedule waits (read its TTFT p99 beside the verdict). Any other URL is used
as it is.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_one(rate: float, workers: str, args: argparse.Namespace, tmp: Path, url: str) -> dict[str, object]:
    wl = tmp / "w.toml"
    wl.write_text(f'[workload]\nname = "open-loop"\napi = "completions"\ninput_tokens = {args.in_tokens}\n'
                  f"output_tokens = {args.out_tokens}\n")
    sessions = tmp / f"s-{rate:g}-{workers}-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "servescope", "run", "--url", url, "--rate", f"{rate:g}", "--arrival", "constant",
           "--duration", f"{args.duration:g}s", "-w", str(wl), "--workers", workers, "--json",
           "--sessions-dir", str(sessions), *args.extra.split()]
    load0 = os.getloadavg()[0]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    load1 = os.getloadavg()[0]
    if p.returncode != 0:
        raise SystemExit(f"servescope failed ({p.returncode}):\n{p.stderr[-3000:]}")
    [cell] = json.loads(p.stdout.strip().splitlines()[-1])["cells"]
    client = cell.get("client") or {}
    sent = sum(int(cell.get(k) or 0) for k in ("requests_ok", "requests_failed", "requests_bad_usage",
                                                  "requests_rate_limited"))
    late = late_figures(sessions)
    notes = [ln.split(": ", 2)[-1] for ln in p.stderr.splitlines() if "--workers auto" in ln]
    return {"rate": rate, "workers": workers, "processes": client.get("workers"), "achieved": sent / args.duration,
            "late_p99": client.get("send_late_p99_ms"), "late_over_5ms": late, "verdict": client.get("verdict"),
            "reasons": client.get("reasons") or [], "cpu": client.get("cpu_util"), "wait": client.get("cpu_wait_share"),
            "ttft_p99": (cell.get("ttft_ms") or {}).get("p99"), "load": (load0, load1), "notes": notes}


@contextlib.contextmanager
def server(args: argparse.Namespace) -> Iterator[str]:
    """The URL to load: `canned` starts benchmarks/canned_server.py (its own process) for the whole run."""
    if args.url != "canned":
        yield args.url
        return
    p = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "canned_server.py"), "--out", str(args.out_tokens)],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        if not line.startswith("listening on "):
            raise SystemExit(f"the canned server did not start: {line!r}")
        yield line.split()[-1]
    finally:
        p.terminate()
        p.wait(10)


def late_figures(sessions: Path) -> float | None:
    """The share of sends more than 5 ms after their schedule, from the session's saved requests."""
    import polars as pl

    files = list(sessions.glob("*/requests/*.parquet"))
    if not files:
        return None
    df = pl.read_parquet(files, columns=["scheduled_ns", "sent_ns"]).filter(pl.col("sent_ns") > 0)
    if df.height == 0:
        return None
    late_ms = (df["sent_ns"] - df["scheduled_ns"]) / 1e6
    return float((late_ms > 5.0).sum()) / df.height


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "?"
    name = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "?")
    return f"{name}, {'with' if 'avx512f' in out else 'no'} AVX-512"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="1000,2000,5000")
    ap.add_argument("--workers", default="1,auto", help="--workers values to run each rate with (default 1,auto)")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--url", default="canned", help="canned (the default: benchmarks/canned_server.py), sim://max-speed, "
                    "or any server's URL")
    ap.add_argument("--in", dest="in_tokens", type=int, default=32)
    ap.add_argument("--out", dest="out_tokens", type=int, default=16)
    ap.add_argument("--servescope-args", dest="extra", default="", help="more flags for servescope run")
    args = ap.parse_args()
    rates = [float(x) for x in args.rates.split(",")]
    workers = args.workers.split(",")
    runs = [(r, w) for r in rates for w in workers]
    results = []
    with tempfile.TemporaryDirectory(prefix="servescope-open-loop-") as d, server(args) as url:
        for rnd in range(args.rounds):
            for rate, w in (runs if rnd % 2 == 0 else runs[::-1]):
                r = run_one(rate, w, args, Path(d), url)
                results.append(r)
                print(f"  round {rnd + 1}: {rate:,.0f}/s --workers {w}: achieved {r['achieved']:,.0f}/s, late p99 "
                      f"{fmt(r['late_p99'])} ms, {r['verdict']}", file=sys.stderr)
    print(f"\nopen loop on {args.url}, {args.in_tokens} in / {args.out_tokens} out, constant arrivals, "
          f"{args.duration:g} s per cell; {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores ({cpu_model()})")
    print("| asked req/s | --workers | processes | achieved req/s | sends late p99 ms | sends late > 5 ms | "
          "client verdict | busiest process CPU (+ wait) | TTFT p99 ms | load average before, after |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        cpu = f"{r['cpu'] * 100:.0f}%" if isinstance(r["cpu"], float) else "-"
        if isinstance(r["wait"], float):
            cpu += f" (+{r['wait'] * 100:.0f}%)"
        share = f"{r['late_over_5ms'] * 100:.1f}%" if isinstance(r["late_over_5ms"], float) else "-"
        print(f"| {r['rate']:,.0f} | {r['workers']} | {r['processes']} | {r['achieved']:,.0f} | {fmt(r['late_p99'])} | "
              f"{share} | {r['verdict']} | {cpu} | {fmt(r['ttft_p99'])} | {r['load'][0]:.2f}, {r['load'][1]:.2f} |")
    for r in results:
        for why in r["reasons"]:
            print(f"- {r['rate']:,.0f}/s --workers {r['workers']}: {why}")
        for note in r["notes"]:
            print(f"- {r['rate']:,.0f}/s --workers {r['workers']}: {note}")


def fmt(v: object) -> str:
    return f"{v:,.2f}" if isinstance(v, float) else "-"


if __name__ == "__main__":
    main()
