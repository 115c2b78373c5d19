"""servescope vs `vllm bench serve` on one real vLLM server, alternating, same shape.

    .venv/bin/python benchmarks/vs_vllm_bench.py [--rounds 2] [--concurrency 1,8,32] [--requests 100]

Starts the real CPU vLLM (tiny dense model, prefix caching off, via tests/support/vllm_server.py), then
for each concurrency and round runs both tools on 256 in / 64 out, alternating which goes first, each
with a fresh prompt seed; servescope in vllm bench's regime (`--window whole --ramp 0`: users started together,
figures over the whole run). Prints, per concurrency, the medians of output tok/s, mean TTFT, mean TPOT, the
client's TTFT gap over vLLM's own server-side TTFT (from /metrics deltas around each run) and the client's
CPU per 1,000 streamed tokens (child CPU time minus a 1-request run's start-up CPU), with the ratio
servescope / vllm bench. These machines are noisy: read the ratios and medians, not single figures; the table's
header says the date, the CPU's model (lscpu) and the load average at the start and the end, and each run's line on
stderr the 1-minute load average when it ended. servescope runs with its default telemetry (/metrics every second)
unless `--servescope-args "--telemetry-interval off"`. For the client's CPU during the load alone, use
benchmarks/client_cpu.py: this script's CPU column counts each tool's whole run minus a 1-request run's CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from servescope.core.servermetrics import parse  # noqa: E402
from tests.support import vllm_server  # noqa: E402

IN_LEN, OUT_LEN = 256, 64


def scrape(url: str) -> dict[str, float]:
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return parse(r.read().decode())


def server_ttft_ms(before: dict[str, float], after: dict[str, float]) -> float:
    k = "vllm:time_to_first_token_seconds"
    n = after[k + "_count"] - before[k + "_count"]
    return (after[k + "_sum"] - before[k + "_sum"]) / n * 1000 if n else float("nan")


def timed_child(cmd: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    if p.returncode != 0:
        raise SystemExit(f"{cmd[:3]} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return p, cpu


def run_vllm_bench(srv: vllm_server.VLLMServer, conc: int, n: int, seed: int, out_dir: Path) -> dict[str, float]:
    fname = f"vb-{conc}-{seed}.json"
    cmd = [str(srv.venv / "bin" / "vllm"), "bench", "serve", "--backend", "vllm", "--base-url", srv.url,
           "--model", srv.model, "--dataset-name", "random", "--random-input-len", str(IN_LEN),
           "--random-output-len", str(OUT_LEN), "--num-prompts", str(n), "--max-concurrency", str(conc),
           "--ignore-eos", "--seed", str(seed), "--save-result", "--result-dir", str(out_dir),
           "--result-filename", fname]
    env = vllm_server.vllm_env(out_dir / "scratch")
    before = scrape(srv.url)
    _, cpu = timed_child(cmd, env)
    after = scrape(srv.url)
    d = json.loads((out_dir / fname).read_text())
    toks = float(d["total_output_tokens"])
    return {"output_tok_s": d["output_throughput"], "ttft_ms": d["mean_ttft_ms"], "tpot_ms": d["mean_tpot_ms"],
            "server_ttft_ms": server_ttft_ms(before, after), "cpu_s": cpu, "tokens": toks}


# vllm bench serve's regime: its users start together and its figures are over the whole run (ramp and drain in)
SERVESCOPE_ARGS: list[str] = ["--window", "whole", "--ramp", "0"]


def run_servescope(srv: vllm_server.VLLMServer, conc: int, n: int, seed: int, out_dir: Path) -> dict[str, float]:
    wl = out_dir / f"w-{seed}.toml"
    wl.write_text(f'[workload]\nname = "bench"\napi = "completions"\ninput_tokens = {IN_LEN}\n'
                  f"output_tokens = {OUT_LEN}\nseed = {seed}\n")
    cmd = [sys.executable, "-m", "servescope", "run", "--url", srv.url, "-w", str(wl), "-c", str(conc),
           "-n", str(n), "--json", "--sessions-dir", str(out_dir / "sessions"), *SERVESCOPE_ARGS]
    before = scrape(srv.url)
    p, cpu = timed_child(cmd)
    after = scrape(srv.url)
    [c] = json.loads(p.stdout.strip().splitlines()[-1])["cells"]
    toks = c["output_tokens_mean"] * c["requests_ok"]
    return {"output_tok_s": c["output_tok_s"], "ttft_ms": c["ttft_ms"]["mean"], "tpot_ms": c["tpot_ms"]["mean"],
            "server_ttft_ms": server_ttft_ms(before, after), "cpu_s": cpu, "tokens": toks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--servescope-args", default="", help='extra flags for servescope, e.g. "--telemetry-interval off"')
    args = ap.parse_args()
    from benchmarks.client_cpu import cpu_model

    load_start = os.getloadavg()
    SERVESCOPE_ARGS.extend(args.servescope_args.split())
    concs = [int(x) for x in args.concurrency.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="servescope-bench-"))
    print("starting vLLM (tiny dense model, --no-enable-prefix-caching) ...", file=sys.stderr)
    srv = vllm_server.start("dense", ["--no-enable-prefix-caching", "--max-model-len", "2048"])
    try:
        tools = {"vllm bench": run_vllm_bench, "servescope": run_servescope}
        # start-up CPU: one 1-request run of each
        startup = {name: fn(srv, 1, 1, 999, tmp)["cpu_s"] for name, fn in tools.items()}
        results: dict[tuple[str, int], list[dict[str, float]]] = {}
        seed = 1
        for conc in concs:
            # one untimed warm run so neither tool pays for the server's first-shape compile
            run_servescope(srv, conc, max(conc, 8), 10_000 + conc, tmp)
            for rnd in range(args.rounds):
                order = list(tools.items()) if rnd % 2 == 0 else list(tools.items())[::-1]
                for name, fn in order:
                    seed += 1
                    r = fn(srv, conc, args.requests, seed, tmp)
                    r["cpu_ms_per_1k"] = max(0.0, r["cpu_s"] - startup[name]) / r["tokens"] * 1e6
                    results.setdefault((name, conc), []).append(r)
                    print(f"  c={conc} round {rnd + 1} {name:<10} {r['output_tok_s']:8.1f} tok/s  "
                          f"TTFT {r['ttft_ms']:7.1f} ms (server {r['server_ttft_ms']:6.1f})  "
                          f"TPOT {r['tpot_ms']:6.2f} ms  CPU {r['cpu_ms_per_1k']:6.0f} ms/1k tok  "
                          f"load {os.getloadavg()[0]:.2f}", file=sys.stderr)
    finally:
        srv.stop()

    def med(name: str, conc: int, key: str) -> float:
        return statistics.median(r[key] for r in results[(name, conc)])

    def loads(xs: tuple[float, float, float]) -> str:
        return ", ".join(f"{x:.2f}" for x in xs)

    print(f"\nservescope vs vllm bench serve: {IN_LEN} in / {OUT_LEN} out, {args.requests} requests, "
          f"{args.rounds} rounds alternating, medians; {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores "
          f"({cpu_model()}); load average (1, 5, 15 min) at the start {loads(load_start)}, at the end "
          f"{loads(os.getloadavg())}")
    print(f"servescope flags: {' '.join(SERVESCOPE_ARGS) or '(defaults)'}")
    print(f"start-up CPU: vllm bench {startup['vllm bench']:.2f} s, servescope {startup['servescope']:.2f} s")
    print("| c | metric | vllm bench | servescope | ratio |")
    print("|---|---|---|---|---|")
    for conc in concs:
        for label, key in [("output tok/s", "output_tok_s"), ("mean TTFT ms", "ttft_ms"),
                           ("mean TPOT ms", "tpot_ms"), ("CPU ms per 1k tokens", "cpu_ms_per_1k")]:
            a, b = med("vllm bench", conc, key), med("servescope", conc, key)
            print(f"| {conc} | {label} | {a:,.2f} | {b:,.2f} | {b / a if a else float('nan'):.3f} |")
        ga = med("vllm bench", conc, "ttft_ms") - med("vllm bench", conc, "server_ttft_ms")
        gb = med("servescope", conc, "ttft_ms") - med("servescope", conc, "server_ttft_ms")
        print(f"| {conc} | TTFT gap over server ms | {ga:,.2f} | {gb:,.2f} | {gb / ga if ga else float('nan'):.3f} |")


if __name__ == "__main__":
    main()
