"""Two servescope checkouts against one real vLLM, alternating: did a change cost the client anything?

    .venv/bin/python benchmarks/ab_checkouts.py --base /path/to/old/checkout [--new .] [--rounds 3]
        [--concurrency 1,8,32] [--requests 100] [--servescope-args "--telemetry-interval off"]

Starts the real CPU vLLM (as benchmarks/vs_vllm_bench.py does), then for each concurrency and round runs
`python -m servescope run` from each checkout (the same Python and venv; the checkout is the working
directory, so its package is the one imported), alternating which goes first. Prints the medians of output
tok/s, mean TTFT, the TTFT gap over vLLM's own server-side TTFT and the client CPU per 1,000 streamed tokens
(child CPU time minus that checkout's 1-request start-up CPU), with the ratio new / base.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.vs_vllm_bench import IN_LEN, OUT_LEN, scrape, server_ttft_ms  # noqa: E402
from tests.support import vllm_server  # noqa: E402


def run(checkout: Path, url: str, conc: int, n: int, seed: int, out: Path, extra: list[str]) -> dict[str, float]:
    import resource
    import subprocess

    wl = out / f"w-{seed}.toml"
    wl.write_text(f'[workload]\nname = "bench"\napi = "completions"\ninput_tokens = {IN_LEN}\n'
                  f"output_tokens = {OUT_LEN}\nseed = {seed}\n")
    cmd = [sys.executable, "-m", "servescope", "run", "--url", url, "-w", str(wl), "-c", str(conc), "-n", str(n),
           "--json", "--sessions-dir", str(out / "sessions"), *extra]
    before = scrape(url)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=checkout)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    after = scrape(url)
    if p.returncode != 0:
        raise SystemExit(f"{checkout}: servescope failed ({p.returncode}):\n{p.stderr[-3000:]}")
    [c] = json.loads(p.stdout.strip().splitlines()[-1])["cells"]
    return {"output_tok_s": c["output_tok_s"], "ttft_ms": c["ttft_ms"]["mean"],
            "gap_ms": c["ttft_ms"]["mean"] - server_ttft_ms(before, after),
            "cpu_s": (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime),
            "tokens": c["output_tokens_mean"] * c["requests_ok"]}


class _Sim:
    def __init__(self, profile: str) -> None:
        import subprocess
        import urllib.request

        port = vllm_server.free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "servescope", "sim", "--profile", profile, "--port",
                                      str(port), "--no-enable-prefix-caching"], cwd=ROOT,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1)
                return
            except OSError:
                time.sleep(0.1)
        raise SystemExit("the simulator did not start")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def start_sim(profile: str) -> _Sim:
    print(f"starting the simulator ({profile}) ...", file=sys.stderr)
    return _Sim(profile)


def start_vllm() -> vllm_server.VLLMServer:
    print("starting vLLM (tiny dense model, --no-enable-prefix-caching) ...", file=sys.stderr)
    return vllm_server.start("dense", ["--no-enable-prefix-caching", "--max-model-len", "2048"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the checkout to compare against (e.g. a git worktree)")
    ap.add_argument("--new", default=str(ROOT), help="the checkout under test (default: this one)")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--servescope-args", default="--telemetry-interval off")
    ap.add_argument("--sim", metavar="PROFILE",
                    help="against the simulator (`servescope sim --profile PROFILE`, started once) instead of vLLM")
    args = ap.parse_args()
    extra = args.servescope_args.split()
    sides = {"base": Path(args.base).resolve(), "new": Path(args.new).resolve()}
    tmp = Path(tempfile.mkdtemp(prefix="servescope-ab-"))
    srv = start_sim(args.sim) if args.sim else start_vllm()
    res: dict[tuple[str, int], list[dict[str, float]]] = {}
    target = f"the simulator ({args.sim})" if args.sim else "vLLM (tiny dense model)"
    try:
        startup = {k: statistics.median(run(d, srv.url, 1, 1, 900 + i, tmp, extra)["cpu_s"] for i in range(2))
                   for k, d in sides.items()}
        seed = 1
        for conc in [int(x) for x in args.concurrency.split(",")]:
            run(sides["new"], srv.url, conc, max(conc, 8), 10_000 + conc, tmp, extra)  # warm the server's shapes
            for rnd in range(args.rounds):
                for k in (["base", "new"] if rnd % 2 == 0 else ["new", "base"]):
                    seed += 1
                    r = run(sides[k], srv.url, conc, args.requests, seed, tmp, extra)
                    r["cpu_ms_per_1k"] = max(0.0, r["cpu_s"] - startup[k]) / r["tokens"] * 1e6
                    res.setdefault((k, conc), []).append(r)
                    print(f"  c={conc} round {rnd + 1} {k:<4} {r['output_tok_s']:8.1f} tok/s  TTFT {r['ttft_ms']:7.1f} ms"
                          f" (gap {r['gap_ms']:5.1f})  CPU {r['cpu_ms_per_1k']:6.0f} ms/1k tok", file=sys.stderr)
    finally:
        srv.stop()
    print(f"\nservescope {sides['new']} vs {sides['base']}: {IN_LEN} in / {OUT_LEN} out, {args.requests} requests, "
          f"{args.rounds} rounds alternating, medians, against {target}; {time.strftime('%Y-%m-%d')}; "
          f"flags: {' '.join(extra)}")
    print(f"start-up CPU: base {startup['base']:.2f} s, new {startup['new']:.2f} s")
    print("| c | metric | base | new | new / base |")
    print("|---|---|---|---|---|")
    for conc in sorted({c for _, c in res}):
        for key, label in (("output_tok_s", "output tok/s"), ("ttft_ms", "mean TTFT ms"),
                           ("gap_ms", "TTFT gap over server ms"), ("cpu_ms_per_1k", "client CPU ms per 1k tokens")):
            a = statistics.median(r[key] for r in res[("base", conc)])
            b = statistics.median(r[key] for r in res[("new", conc)])
            print(f"| {conc} | {label} | {a:,.1f} | {b:,.1f} | {b / a if a else float('nan'):.2f} |")


if __name__ == "__main__":
    main()
