"""How well the capacity twin predicts cells it never saw: fit on a measured sweep, predict other cells, run them.

Default mode, the real CPU vLLM (tiny dense model, via tests/support/vllm_server.py): each round fits the twin
on a sweep at c=1,2,4,8 (256 in / 64 out), predicts c=32 at 256 in and c=4 at 1,024 in, runs those two cells
for real and prints each figure's error (predicted / measured - 1); the summary is the median over the rounds
of each error. `--sim`: the simulator as ground truth, for a dense and a MoE profile: fit on c=1,4,16 at 1K
in, predict c=48 at 1K and c=8 at 8K in. Everything goes through the command line, as a user runs it:
`servescope run --json`, `servescope whatif --json`.

Usage: python benchmarks/twin_accuracy.py [--rounds 3] [--sim] [--requests N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import vllm_server  # noqa: E402

FIGS = (("output_tok_s", None), ("ttft_ms", "p50"), ("tpot_ms", "p50"))


RUN_FLAGS = ["--warmup", "8", "--telemetry-interval", "60s"]  # /metrics at the cell boundaries only: see below


def servescope(*args: str, home: Path) -> dict:
    env = dict(os.environ, SERVESCOPE_HOME=str(home))
    out = subprocess.run([sys.executable, "-m", "servescope", *args], capture_output=True, text=True, env=env,
                         cwd=ROOT)
    if out.returncode != 0:
        raise SystemExit(f"servescope {' '.join(args)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def workload(d: Path, name: str, inp: int, out: int) -> str:
    p = d / f"{name}.toml"
    p.write_text(f'[workload]\nname = "{name}"\ninput_tokens = {inp}\noutput_tokens = {out}\n')
    return str(p)


def fig(cell: dict, name: str, stat: str | None) -> float:
    v = cell[name] if stat is None else cell[name][stat]
    return float(v)


def one_round(url: str, d: Path, fit_levels: str, fit_n: int, shape: tuple[int, int],
              asks: list[tuple[str, int, int, int]]) -> list[tuple[str, str, float, float]]:
    """Fit on `fit_levels` at `shape`, then for each ask (label, input, concurrency, requests): predicted vs run."""
    d.mkdir(parents=True, exist_ok=True)
    w = workload(d, "fit", *shape)
    servescope("run", "--url", url, "-w", w, "-c", fit_levels, "-n", str(fit_n), "--save", str(d / "fit"), "--json",
               *RUN_FLAGS, home=d)
    rows = []
    for label, inp, c, n in asks:
        wa = workload(d, f"ask{inp}", inp, shape[1])
        pred = servescope("whatif", str(d / "fit"), "-w", wa, "-c", str(c), "-n", str(n), "--json", home=d)["cells"][0]
        real = servescope("run", "--url", url, "-w", wa, "-c", str(c), "-n", str(n), "--save", str(d / f"run-{label}"),
                          "--json", *RUN_FLAGS, home=d)["cells"][0]
        for name, stat in FIGS:
            key = name if stat is None else f"{name} {stat}"
            rows.append((label, key, fig(pred, name, stat), fig(real, name, stat)))
    return rows


def report(title: str, rounds: list[list[tuple[str, str, float, float]]]) -> None:
    print(f"\n{title}")
    print(f"  {'cell':<26} {'figure':<14} {'predicted':>10} {'measured':>10}  errors by round       median")
    for i, (label, key, _, _) in enumerate(rounds[0]):
        errs = [r[i][2] / r[i][3] - 1 for r in rounds]
        pred = statistics.median(r[i][2] for r in rounds)
        meas = statistics.median(r[i][3] for r in rounds)
        by = " ".join(f"{e:+6.1%}" for e in errs)
        print(f"  {label:<26} {key:<14} {pred:>10.4g} {meas:>10.4g}  {by:<20} {statistics.median(errs):+6.1%}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--sim", action="store_true", help="the simulator as ground truth (dense and MoE profiles)")
    ap.add_argument("--requests", type=int, default=0, help="requests per fitted cell (default 64 vLLM, 32 sim)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="twin-acc-"))
    if args.sim:
        for prof in ("rtx-pro-6000/qwen3.5-27b-gptq-int4", "rtx-pro-6000/qwen3.5-35b-a3b-gptq-int4"):
            rounds = [one_round(f"sim://{prof}", tmp / f"{prof.replace('/', '_')}-{r}", "1,4,16", args.requests or 32,
                                (1024, 128), [("c=48, 1K in", 1024, 48, 96), ("c=8, 8K in", 8192, 8, 32)])
                      for r in range(args.rounds)]
            report(f"simulator {prof}: fit c=1,4,16 at 1K in / 128 out", rounds)
        return
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0"
    srv = vllm_server.start("dense", ["--no-enable-prefix-caching", "--max-model-len", "2048"], tmp / "scratch")
    # the engine core beside its worker on core 0 (2 cores): the API server and the client keep up on core 1
    vllm_server.engine_apart({0} if os.cpu_count() == 2 else None)
    try:
        print(f"real CPU vLLM at {srv.url} ({srv.model}); {args.rounds} rounds", flush=True)
        rounds = [one_round(srv.url, tmp / f"vllm-{r}", "1,2,4,8", args.requests or 64, (256, 64),
                            [("c=32, 256 in", 256, 32, 128), ("c=4, 1024 in", 1024, 4, 64)])
                  for r in range(args.rounds)]
        report("real CPU vLLM (tiny dense model): fit c=1,2,4,8 at 256 in / 64 out", rounds)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
