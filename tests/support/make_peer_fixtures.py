"""Write the stored import fixtures of tests/sessions/data/peers/ again (each folder's SOURCE.md says how it was made):

- guidellm-0.8.1/: the real GuideLLM 0.8.1 against servescope's simulator (tiny profile), concurrency 1 and 2;
- aiperf-0.13.0/: the real AIPerf 0.13.0 against the same simulator, concurrency 1 and 2;
- inference-perf/: inference-perf does not install here (it is not on the package registry), so a servescope run
  against the same simulator (constant rates 5 and 10 per second) is written in the shape of inference-perf's report
  writer: its per-request file, a file per stage and the run's summary, and its config.yaml. The shape follows
  kubernetes-sigs/inference-perf at commit 7de5ef2ed6f7934e0ecbc8297e593f79e68430c0: inference_perf/reportgen/base.py
  (summarize, summarize_requests, generate_reports), inference_perf/apis/base.py (InferenceInfo, ResponseMetrics,
  StreamedResponseMetrics, ErrorResponseInfo) and docs/reports.md; no code of it is used.

    .venv/bin/python tests/support/make_peer_fixtures.py            # all three
    .venv/bin/python tests/support/make_peer_fixtures.py inference-perf
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from servescope.sim.launcher import start_sim  # noqa: E402
from tests.support import peers  # noqa: E402

OUT = ROOT / "tests" / "sessions" / "data" / "peers"
PERCENTILES = [0.1, 1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9]  # inference-perf's default report percentiles


def guidellm(url: str, p: peers.Peers, tmp: Path) -> None:
    path = peers.run_guidellm(p, url, "tiny", [1, 2], 4, 32, 8, tmp / "guidellm")
    dest = OUT / "guidellm-0.8.1"
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy(path, dest / "benchmarks.json")


def aiperf(url: str, p: peers.Peers, tmp: Path) -> None:
    art = peers.run_aiperf(p, url, "tiny", [1, 2], 4, 32, 8, tmp / "aiperf")
    dest = OUT / "aiperf-0.13.0"
    for c in (1, 2):
        d = dest / f"concurrency_{c}"
        d.mkdir(parents=True, exist_ok=True)
        for name in ("profile_export.jsonl", "profile_export_aiperf.json"):
            shutil.copy(art / f"concurrency_{c}" / name, d / name)


def _summary(items: list[float]) -> dict[str, float] | None:
    """A distribution as inference-perf's reports state it (numpy's mean, min, max and linear percentiles)."""
    if not items:
        return None
    out = {"mean": float(np.mean(items)), "min": float(np.min(items)), "max": float(np.max(items))}
    for p in PERCENTILES:
        out["median" if p == 50 else f"p{p:g}"] = float(np.percentile(items, p))
    return out


def _stage(rows: list[dict[str, Any]], rate: float) -> dict[str, Any]:
    """One stage's lifecycle metrics, from its per-request entries, in the shape summarize_requests gives."""
    starts = [r["start_time"] for r in rows]
    ends = [r["end_time"] for r in rows]
    total = max(ends) - min(starts)
    send = max(starts) - min(starts)
    lat, ntpot, tpot, ttft, itl = [], [], [], [], []
    for r in rows:
        rm = r["info"]["response_metrics"]
        times = rm["output_token_times"]
        out = rm["output_tokens"]
        lat.append(r["end_time"] - r["start_time"])
        ntpot.append((r["end_time"] - r["start_time"]) / out if out else 0.0)
        if len(times) > 1:
            ttft.append(times[0] - r["start_time"])
            tpot.append((times[-1] - times[0]) / (out - 1))
            itl += [b - a for a, b in zip(times, times[1:], strict=False)]
    ins = [float(r["info"]["request_metrics"]["text"]["input_tokens"]) for r in rows]
    outs = [float(r["info"]["response_metrics"]["output_tokens"]) for r in rows]
    prompt = {"total": sum(ins), "cached": 0.0, "uncached": sum(ins), **(_summary(ins) or {})}
    return {
        "benchmark_time_seconds": total,
        "load_summary": {"count": len(rows), "schedule_delay": _summary([0.0] * len(rows)), "send_duration": send,
                         "requested_rate": rate, "achieved_rate": len(rows) / send if send > 0 else 0.0},
        "successes": {
            "count": len(rows),
            "latency": {"request_latency": _summary(lat), "normalized_time_per_output_token": _summary(ntpot),
                        "time_per_output_token": _summary(tpot), "time_to_first_token": _summary(ttft),
                        "inter_token_latency": _summary(itl)},
            "throughput": {"input_tokens_per_sec": sum(ins) / total, "output_tokens_per_sec": sum(outs) / total,
                           "total_tokens_per_sec": (sum(ins) + sum(outs)) / total,
                           "requests_per_sec": len(rows) / total, "images_per_sec": 0.0, "videos_per_sec": 0.0,
                           "audios_per_sec": 0.0},
            "prompt_tokens": prompt,
            "output_len": _summary(outs),
            "output_tokens": {"total": sum(outs), **(_summary(outs) or {})},
            "token_count_mismatches": 0,
        },
        "failures": {"count": 0, "request_latency": None, "prompt_tokens": {"total": 0.0, "cached": 0.0,
                                                                             "uncached": 0.0}, "by_label": {}},
    }


def inference_perf(url: str, tmp: Path) -> None:
    """A servescope run (constant 5/s, then 10/s; 12 requests each; 32-token prompts, 16 tokens out) written as
    inference-perf's reports: times in seconds on the client's perf_counter clock, as inference-perf stamps them."""
    wl = tmp / "ip.toml"
    wl.write_text('[workload]\nname = "ip"\napi = "completions"\ninput_tokens = 32\noutput_tokens = 16\n')
    r = subprocess.run([sys.executable, "-m", "servescope", "run", "--url", url, "-w", str(wl), "--rate", "5,10",
                        "--arrival", "constant", "-n", "12", "--warmup", "0", "--save", str(tmp / "ss"), "--json"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    dest = OUT / "inference-perf"
    dest.mkdir(parents=True, exist_ok=True)
    every: list[dict[str, Any]] = []
    base = 1000.0  # the run's first send on the fixture's clock (a perf_counter reading)
    t0: int | None = None
    for stage, rate in enumerate((5.0, 10.0)):
        df = pl.read_parquet(tmp / "ss" / "requests" / f"cell-{stage:04d}.parquet").filter(~pl.col("warmup"))
        t0 = t0 if t0 is not None else int(df["sent_ns"].min())
        rows = []
        for req in df.sort("sent_ns").iter_rows(named=True):
            def s(ns: int) -> float:
                return base + (ns - t0) / 1e9  # noqa: B023 - t0 is fixed before the loop
            times = [s(t) for t in req["chunk_ns"]]
            chunks = [json.dumps({"id": "cmpl-x", "object": "text_completion", "choices": [
                {"index": 0, "text": " word", "finish_reason": None}]}) for _ in times]
            usage = {"prompt_tokens": req["prompt_tokens"], "completion_tokens": req["output_tokens"],
                     "total_tokens": req["prompt_tokens"] + req["output_tokens"]}
            rows.append({
                "start_time": s(req["sent_ns"]), "end_time": s(req["end_ns"]),
                "request": json.dumps({"model": "tiny", "prompt": "(a 32-token prompt)", "max_tokens": 16,
                                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}),
                "response": "".join(f"data: {c}\n\n" for c in chunks) + "data: [DONE]\n\n",
                "info": {"request_metrics": {"text": {"input_tokens": req["prompt_tokens"]}, "image": None,
                                             "video": None, "audio": None},
                         "response_metrics": {"output_tokens": req["output_tokens"], "server_usage": usage,
                                              "response_chunks": chunks, "chunk_times": times,
                                              "output_token_times": times},
                         "extra_info": {}, "lora_adapter": None, "labels": {},
                         "input_tokens": req["prompt_tokens"]},
                "error": None,
            })
        (dest / f"stage_{stage}_lifecycle_metrics.json").write_text(json.dumps(_stage(rows, rate)))
        every += rows
    summary = _stage(every, 0.0)
    summary["load_summary"] = {"count": len(every), "schedule_delay": _summary([0.0] * len(every))}
    (dest / "summary_lifecycle_metrics.json").write_text(json.dumps(summary))
    (dest / "per_request_lifecycle_metrics.json").write_text(json.dumps(every))
    (dest / "config.yaml").write_text(
        "api:\n  type: completion\n  streaming: true\n"
        "data:\n  type: random\n  input_distribution:\n    min: 32\n    max: 32\n    mean: 32\n"
        "  output_distribution:\n    min: 16\n    max: 16\n    mean: 16\n"
        "load:\n  type: constant\n  stages:\n  - rate: 5.0\n    duration: 3\n  - rate: 10.0\n    duration: 2\n"
        "report:\n  request_lifecycle:\n    summary: true\n    per_stage: true\n    per_request: true\n"
        "    use_server_output_tokens: true\n"
        "server:\n  type: vllm\n  model_name: tiny\n  base_url: http://127.0.0.1:8000\n  ignore_eos: true\n"
        "tokenizer:\n  pretrained_model_name_or_path: tiny\n")


def main(which: list[str]) -> None:
    which = which or ["guidellm", "aiperf", "inference-perf"]
    h = start_sim("tiny")
    try:
        with tempfile.TemporaryDirectory() as t:
            tmp = Path(t)
            p = peers.setup() if {"guidellm", "aiperf"} & set(which) else None
            if "guidellm" in which and p is not None:
                guidellm(h.url, p, tmp)
            if "aiperf" in which and p is not None:
                aiperf(h.url, p, tmp)
            if "inference-perf" in which:
                inference_perf(h.url, tmp)
    finally:
        h.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
