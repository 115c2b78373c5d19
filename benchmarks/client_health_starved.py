"""The client's health figures as its CPU is taken away: the figures behind the thresholds of
servescope/core/health.py (`ok | strained | bound`), measured on this host.

    .venv/bin/python benchmarks/client_health_starved.py [--concurrency 64] [--requests 64]
        [--output-tokens 128] [--settings 0:0,1:0,3:10,3:19] [--rounds 2]

Each setting LOOPS:NICE runs one `servescope run` cell against the simulator, the client pinned to one CPU and
the simulator to another; once the simulator has every request (the prompts are built at full speed), LOOPS
busy loops join the client on its CPU and the client drops to NICE (0:0 is the client alone). Once the client
has waited --starve-s seconds for a CPU and the simulator has finished every request, the loops stop and the
client gets its priority back where the host allows it: it reads the rest at full speed (its summaries and
files too: at nice 19 beside three loops they would take minutes), as in the test. An idle event loop in this process runs beside it: its timer lag is what the host alone did to a loop
meanwhile. Prints per setting and round: the verdict, the client's CPU and its wait for a CPU (shares of the
cell's wall time), its event-loop lag p50/p99/max, the share of tokens read together, the cell's wall time
and the idle loop's lag p99. The test (tests/integration/test_client_health.py) asserts only the verdicts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from servescope.core.health import ClientProbe  # noqa: E402
from servescope.sim.launcher import start_sim  # noqa: E402
from tests.integration.helpers import metrics  # noqa: E402


class IdleLoop:
    """An idle event loop in a thread: `start()`, then `stop()` returns its ClientProbe figures."""

    def __init__(self) -> None:
        self.part: dict[str, Any] = {}
        self._ready = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._probe()), daemon=True)

    async def _probe(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        p = ClientProbe()
        p.start()
        self._ready.set()
        await self._stop.wait()
        self.part = await p.stop()

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(30)

    def stop(self) -> dict[str, Any]:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(30)
        return self.part


def run_queue_wait_s(pid: int) -> float:
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def renice(pid: int, nice: int) -> None:
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)


def one(url: str, cpu: int, loops: int, nice: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    tmp.mkdir(parents=True)
    wl = tmp / "w.toml"
    wl.write_text(f'[workload]\nname = "short"\napi = "completions"\ninput_tokens = 32\n'
                  f"output_tokens = {args.output_tokens}\n")
    n = args.requests
    done0 = metrics(url).get("vllm:request_success_total", 0.0)  # the simulator serves every setting and round
    proc = subprocess.Popen([sys.executable, "-m", "servescope", "run", "--url", url, "-w", str(wl), "-c",
                             str(args.concurrency), "-n", str(n), "--warmup", "0", "--telemetry-interval", "off",
                             "--sessions-dir", str(tmp / "s"), "--json"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, preexec_fn=lambda: os.sched_setaffinity(0, {cpu}))
    idle = IdleLoop()
    busy: list[subprocess.Popen[bytes]] = []
    t0 = time.monotonic()
    try:
        while proc.poll() is None:
            m = metrics(url)
            if sum(m.get(k, 0.0) for k in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                                            "vllm:request_success_total")) - done0 >= n:
                break
            time.sleep(0.02)
        idle.start()
        wait0 = run_queue_wait_s(proc.pid)
        if proc.poll() is None and nice:
            renice(proc.pid, nice)
        busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                 preexec_fn=lambda: os.sched_setaffinity(0, {cpu})) for _ in range(loops)]
        while proc.poll() is None and not (run_queue_wait_s(proc.pid) - wait0 >= args.starve_s
                                           and metrics(url).get("vllm:request_success_total", 0.0) - done0 >= n):
            time.sleep(0.05)
    finally:
        for b in busy:
            b.kill()
            b.wait()
        part = idle.stop()
        if proc.poll() is None:
            renice(proc.pid, 0)  # where allowed
    try:
        stdout, _ = proc.communicate(timeout=1800)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (cell,) = json.loads(stdout.strip().splitlines()[-1])["cells"]
    c = cell["client"]
    return {"verdict": c["verdict"], "cpu": c["cpu_util"], "wait": c.get("cpu_wait_share") or 0.0,
            "lag": c["loop_lag_ms"], "bunched": c.get("bunched_share") or 0.0, "wall_s": c.get("wall_s") or 0.0,
            "total_s": time.monotonic() - t0, "idle_p99": (part.get("loop_lag_ms") or {}).get("p99", float("nan"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--settings", default="0:0,1:0,3:10,3:19", help="LOOPS:NICE,... (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--starve-s", type=float, default=2.0,
                    help="end the starvation once the client has waited this long for a CPU and the simulator has "
                         "finished (default %(default)s)")
    args = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        sys.exit("needs two CPUs: one for the simulator, one for the client and the busy loops")
    settings = [tuple(int(x) for x in s.split(":")) for s in args.settings.split(",")]
    print(f"c={args.concurrency} n={args.requests} output {args.output_tokens} tokens; client on CPU {cpus[0]}, "
          f"simulator on CPU {cpus[1]}; load average {os.getloadavg()[0]:.1f}")
    print(f"{'loops:nice':>10} {'verdict':>8} {'CPU%':>6} {'wait%':>6} {'lag p50':>8} {'lag p99':>9} {'lag max':>9} "
          f"{'bunched%':>9} {'cell s':>7} {'total s':>8} {'idle p99':>9}")
    with start_sim("tiny") as sim, tempfile.TemporaryDirectory() as d:
        os.sched_setaffinity(sim.proc.pid, {cpus[1]})
        for r in range(args.rounds):
            for loops, nice in settings:
                x = one(sim.url, cpus[0], loops, nice, args, Path(d) / f"{r}-{loops}-{nice}")
                lag = x["lag"]
                print(f"{loops:>5}:{nice:<4} {x['verdict']:>8} {x['cpu'] * 100:6.1f} {x['wait'] * 100:6.1f} "
                      f"{lag['p50']:8.1f} {lag['p99']:9.1f} {lag['max']:9.1f} {x['bunched'] * 100:9.1f} "
                      f"{x['wall_s']:7.2f} {x['total_s']:8.1f} {x['idle_p99']:9.1f}", flush=True)


if __name__ == "__main__":
    main()
