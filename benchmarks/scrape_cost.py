"""What one `/metrics` scrape costs the client, in CPU: the sweep's sampler against the way it scraped before.

    .venv/bin/python benchmarks/scrape_cost.py [--scrapes 100] [--interval 0.2] [--url URL | --sim]

Starts the real CPU vLLM (tiny dense model, via tests/support/vllm_server.py) unless `--url` names a running server
(or `--sim` asks for servescope's simulator), then scrapes its /metrics with two samplers on a background event
loop of their own, as a sweep does (engine/background.py), alternating in rounds of 10:

- `servescope`: `core.telemetry.MetricsSampler` over `RawMetrics` (one kept-alive connection, the body as bytes) and
  `parse_metrics`, which reads only the families servescope shows and skips the rest unread;
- `before`: the same sampler over an httpx.AsyncClient with the parse of before (every line of the text filtered in
  Python, then prometheus_client's parser on what was kept), as servescope scraped until 2026-12-07.

Each scrape's CPU is the background thread's CPU time from its start to its end (what `MetricsSampler` measures
and the client line prints, `/metrics scrapes ... ms CPU/s`); the whole process's CPU over each variant's scrapes is
printed beside it (the thread's wake-ups and anything else the process did meanwhile). Then the parse alone of a
recorded /metrics of vLLM 0.32 serving speculative decoding and two LoRA adapters (tests/core/data), 2,000 times.
Prints medians and means in ms; the target is under 1 ms of client CPU per scrape of a real vLLM's /metrics.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from servescope.core import telemetry  # noqa: E402
from servescope.core.client import KEEPALIVE_S, async_client, ssl_context  # noqa: E402
from servescope.core.telemetry import MetricsSampler, RawMetrics, parse_metrics  # noqa: E402
from servescope.engine.background import Background  # noqa: E402

FIXTURE = ROOT / "tests" / "core" / "data" / "vllm-0.32-cpu-metrics-ngram-lora.txt"


def parse_before(text: str | bytes) -> dict[str, float | str]:
    """The parse servescope used before: the text decoded, every line filtered by name in Python, then
    prometheus_client's parser on the kept lines (the families' sample names of `telemetry.READ`)."""
    from prometheus_client.parser import text_string_to_metric_families

    from servescope.core.servermetrics import family_names
    from servescope.core.specdecode import lora_keys

    if isinstance(text, bytes):
        text = text.decode()
    wanted = telemetry.READ
    families = {f for n in wanted for f in family_names(n)}
    keep: list[str] = []
    for line in text.splitlines():
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2] in families:
                keep.append(line)
            continue
        end = len(line)
        for ch in "{ ":
            i = line.find(ch)
            if 0 <= i < end:
                end = i
        if line[:end] in wanted:
            keep.append(line)
    keep.append("")
    out: dict[str, float | str] = {}
    for fam in text_string_to_metric_families("\n".join(keep)):
        for s in fam.samples:
            if s.name == telemetry.CACHE_INFO:
                for k, v in s.labels.items():
                    try:
                        out[f"cache_config.{k}"] = float(v)
                    except ValueError:
                        out[f"cache_config.{k}"] = v
            elif s.name == telemetry.LORA_INFO:
                lora_keys(s.labels, float(s.value), out)
            else:
                prev = out.get(s.name)
                v = float(s.value)
                out[s.name] = (max(prev, v) if s.name in telemetry._MAX_OVER_LABELS else prev + v) \
                    if isinstance(prev, float) else v
    return out


def per_call_ms(fn: Callable[[], object], n: int) -> float:
    t = time.thread_time_ns()
    for _ in range(n):
        fn()
    return (time.thread_time_ns() - t) / n / 1e6


async def scrape_rounds(sampler: MetricsSampler, n: int, interval_s: float) -> None:
    for _ in range(n):
        await sampler.sample_now()
        await asyncio.sleep(interval_s)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scrapes", type=int, default=100, help="scrapes per variant (default 100)")
    ap.add_argument("--interval", type=float, default=0.2, help="seconds between scrapes (default 0.2)")
    ap.add_argument("--url", default="", help="a running server to scrape (default: start the real CPU vLLM)")
    ap.add_argument("--sim", action="store_true", help="scrape servescope's simulator (profile tiny) instead")
    args = ap.parse_args()

    stop: Callable[[], None] = lambda: None  # noqa: E731
    url = args.url
    where = url
    if not url and args.sim:
        from servescope.sim.launcher import start_sim

        ctx = start_sim("tiny")
        sim = ctx.__enter__()
        url, where = sim.url, "servescope's simulator (tiny)"
        stop = lambda: ctx.__exit__(None, None, None)  # noqa: E731
    elif not url:
        from tests.support import vllm_server

        print("starting vLLM (tiny dense model) ...", file=sys.stderr)
        srv = vllm_server.start("dense", ["--no-enable-prefix-caching", "--max-model-len", "2048"])
        url, where = srv.url, "the real CPU vLLM 0.32 (tiny dense model), idle"
        stop = srv.stop
    bg = Background()
    try:
        async def make() -> dict[str, MetricsSampler]:
            return {"servescope": MetricsSampler(RawMetrics(url, ssl_context=ssl_context, idle_s=KEEPALIVE_S), 1e9),
                    "before": MetricsSampler(async_client(base_url=url, timeout=10.0), 1e9)}

        samplers = bg_run(bg, make())
        size = len(bg_run(bg, samplers["servescope"].source.fetch("/metrics", 10.0))[1])
        proc_cpu = dict.fromkeys(samplers, 0.0)
        rounds = max(1, args.scrapes // 10)
        for r in range(rounds):
            for name in (list(samplers) if r % 2 == 0 else list(samplers)[::-1]):
                s = samplers[name]
                if name == "before":
                    telemetry_parse, telemetry.parse_metrics = telemetry.parse_metrics, parse_before
                c0 = time.process_time()
                try:
                    bg_run(bg, scrape_rounds(s, 10, args.interval))
                finally:
                    if name == "before":
                        telemetry.parse_metrics = telemetry_parse
                proc_cpu[name] += time.process_time() - c0
        print(f"\n/metrics scrape cost, {time.strftime('%Y-%m-%d %H:%M')}, {os.cpu_count()} cores "
              f"({cpu_model()}); {where}: {size:,} bytes; {rounds * 10} scrapes per variant, {args.interval:g} s apart, "
              f"alternating in rounds of 10; load average {os.getloadavg()[0]:.2f}")
        print("| scraper | scrapes ok | thread CPU per scrape, median ms | mean ms | process CPU per scrape, mean ms |")
        print("|---|---|---|---|---|")
        for name, s in samplers.items():
            costs = [c / 1e6 for c in s.cost_cpu_ns]
            print(f"| {name} | {len(s)} of {len(costs)} | {statistics.median(costs):.3f} | {statistics.mean(costs):.3f} "
                  f"| {proc_cpu[name] / len(costs) * 1000:.3f} |")
        for s in samplers.values():
            bg_run(bg, s.stop())
        bg_run(bg, samplers["servescope"].source.aclose())  # type: ignore[attr-defined]
        bg_run(bg, samplers["before"].http.aclose())  # type: ignore[union-attr]
    finally:
        bg.close()
        stop()
    data = FIXTURE.read_bytes()
    assert parse_metrics(data) == parse_before(data)
    print(f"parse alone of {FIXTURE.relative_to(ROOT)} ({len(data):,} bytes, spec decode + LoRA), 2,000 times: "
          f"servescope {per_call_ms(lambda: parse_metrics(data), 2000):.3f} ms, "
          f"before {per_call_ms(lambda: parse_before(data), 2000):.3f} ms per scrape (same result)")


def bg_run(bg: Background, coro):  # type: ignore[no-untyped-def]
    """Run `coro` on the background loop and wait for it here."""
    return asyncio.run_coroutine_threadsafe(coro, bg.loop).result()


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "?"
    name = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "?")
    return f"{name}, {'with' if 'avx512f' in out else 'no'} AVX-512"


if __name__ == "__main__":
    main()
