"""Do viewers slow a sweep down? Runs the same detached sweep against one simulator with no viewer and with N
viewers following it (`servescope watch`, or `servescope attach` apps in tmux at 160x48 with live charts),
alternating none/N/none/N, and prints TTFT p50 and p99 and output tok/s of each run and the with/without
ratios (medians over rounds). Target: TTFT within 2%.

    python benchmarks/viewers.py [--viewers 3] [--kind attach|watch] [--rounds 3] [--concurrency 8]
                                 [--requests 200] [--profile tiny]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORKLOAD = """
[workload]
name = "viewers"
input_tokens = 256
output_tokens = 64
"""


def start_sim(profile: str) -> tuple[subprocess.Popen[bytes], str]:
    from servescope.sim.launcher import start_sim as start

    h = start(profile, ["--no-enable-prefix-caching"])  # every run sends the same prompts: no cache hits between runs
    return h.proc, str(h.url)


def run_once(url: str, wl: Path, home: Path, c: int, n: int, viewers: int, kind: str) -> dict[str, float]:
    from servescope.sessions.live import runner_state
    from servescope.sessions.store import load_session

    env = {**os.environ, "SERVESCOPE_HOME": str(home), "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "servescope", "run", "--url", url, "-w", str(wl), "-c", str(c), "-n",
                        str(n), "--warmup", "8", "--detach"], capture_output=True, text=True, env=env, timeout=60,
                       cwd=ROOT)
    if p.returncode != 0:
        raise SystemExit(f"run --detach failed: {p.stderr.strip()[-400:]}")
    path = Path(p.stdout.strip().splitlines()[-1])
    procs: list[subprocess.Popen[bytes]] = []
    tmux_names: list[str] = []
    for _ in range(viewers):
        if kind == "watch":
            procs.append(subprocess.Popen([sys.executable, "-m", "servescope", "watch", str(path)], env=env, cwd=ROOT,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        else:
            name = f"viewer-{uuid.uuid4().hex[:8]}"
            cmd = f"'{sys.executable}' -m servescope attach '{path}'; sleep 5"
            subprocess.run(["tmux", "-L", "servescope-bench", "new-session", "-d", "-s", name, "-x", "160", "-y", "48",
                            "-e", f"SERVESCOPE_HOME={home}", "-e", f"PYTHONPATH={ROOT}", cmd], check=True, env=env)
            tmux_names.append(name)
    deadline = time.monotonic() + 900
    time.sleep(1.0)
    while runner_state(path).running and time.monotonic() < deadline:
        time.sleep(0.2)
    for pr in procs:
        pr.terminate()
        pr.wait(timeout=10)
    for name in tmux_names:
        subprocess.run(["tmux", "-L", "servescope-bench", "kill-session", "-t", name], check=False)
    s = [x for x in load_session(path).summaries() if x is not None][0]
    ttft = s.dist("ttft_ms")
    assert ttft is not None
    return {"ttft_p50": float(ttft.p50 or 0), "ttft_p99": float(ttft.p99 or 0), "tok_s": float(s.output_tok_s or 0)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--viewers", type=int, default=3)
    ap.add_argument("--kind", choices=["attach", "watch"], default="attach")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--profile", default="tiny")
    a = ap.parse_args(argv)
    if a.kind == "attach" and shutil.which("tmux") is None:
        raise SystemExit("--kind attach needs tmux; use --kind watch")
    home = Path(tempfile.mkdtemp(prefix="servescope-viewers-"))
    wl = home / "w.toml"
    wl.write_text(WORKLOAD)
    sim, url = start_sim(a.profile)
    rows: dict[int, list[dict[str, float]]] = {0: [], a.viewers: []}
    try:
        for r in range(a.rounds):
            for v in (0, a.viewers):
                res = run_once(url, wl, home, a.concurrency, a.requests, v, a.kind)
                rows[v].append(res)
                print(f"round {r + 1} viewers={v}: TTFT p50 {res['ttft_p50']:.2f} ms, p99 {res['ttft_p99']:.2f} ms, "
                      f"output {res['tok_s']:.1f} tok/s", flush=True)
    finally:
        sim.terminate()
        shutil.rmtree(home, ignore_errors=True)

    def med(v: int, k: str) -> float:
        return statistics.median(x[k] for x in rows[v])

    print(f"\nsim://{a.profile}, 256 in / 64 out, c={a.concurrency}, {a.requests} requests, {a.rounds} rounds, "
          f"{a.viewers} `{a.kind}` viewers (medians)")
    print("| figure | no viewer | with viewers | ratio |")
    print("|---|---|---|---|")
    for k, label in (("ttft_p50", "TTFT p50 ms"), ("ttft_p99", "TTFT p99 ms"), ("tok_s", "output tok/s")):
        a0, a1 = med(0, k), med(a.viewers, k)
        print(f"| {label} | {a0:.2f} | {a1:.2f} | {a1 / a0:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
