"""Fixed sessions built from synthetic request records (through the real SessionWriter and summarize, with the
engine's own session metadata and cell rows), and the real `vllm bench serve` result files for the import test
(marked vllm)."""

from __future__ import annotations

import json
import os
import subprocess
from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from servescope.core.metrics import records_frame, summarize
from servescope.core.records import RequestRecord
from servescope.core.results import CellResult
from servescope.sessions.store import load_session
from servescope.workloads.spec import PRESETS, Workload

from .synth import plan, sweep_session

DATA = Path(__file__).parent / "data"
GOLDEN = Path(__file__).parent / "golden"


@dataclass
class CellSpec:
    """A synthetic cell: latencies grow with concurrency in a fixed, deterministic way."""

    workload: str
    concurrency: int
    ttft_ms: float = 100.0  # at c=1
    tpot_ms: float = 6.0  # at c=1
    out_tokens: int = 256
    in_tokens: int = 300
    reasoning: int = 0  # reasoning tokens at the start of each output
    requests: int = 20
    failed: int = 0
    ttft_growth: float = 0.30  # per extra user
    tpot_growth: float = 0.05
    server: dict[str, Any] | None = None
    prompt_delta: int = 0  # measured prompt - requested
    skipped: str = ""
    stopped: str = ""  # the reason a measured cell was stopped early (its status then "stopped")
    client: dict[str, Any] | None = None  # the summary's `client` entry (core/health.py judge_client)
    telemetry: dict[str, Any] | None = None  # the summary's `telemetry` entry (core/telemetry.py window_summary)
    quality: dict[str, Any] | None = None  # the summary's `quality` entry (--quality-share: probe questions)


@dataclass
class SessionSpec:
    name: str
    cells: list[CellSpec]
    tags: dict[str, str] = field(default_factory=dict)
    slos: dict[str, float] = field(default_factory=dict)
    workloads: list[Workload] | None = None  # default: the presets the cells name
    status: str = "completed"
    message: str = ""
    model: str = "Qwen/Qwen3.5-35B-A3B"
    url: str = "http://127.0.0.1:8000"


def _records(c: CellSpec) -> tuple[list[RequestRecord], float]:
    recs = []
    ttft = c.ttft_ms * (1 + c.ttft_growth * (c.concurrency - 1))
    tpot = c.tpot_ms * (1 + c.tpot_growth * (c.concurrency - 1))
    t_user = [1_000_000] * c.concurrency  # ns clock per closed-loop user
    for i in range(c.requests):
        u = i % c.concurrency
        jitter = 1 + 0.02 * ((i * 7) % 5 - 2)  # -4%..+4%, deterministic
        sent = t_user[u]
        r = RequestRecord(index=i, user=u, warmup=False, input_tokens_requested=c.in_tokens,
                          output_tokens_requested=c.out_tokens, scheduled_ns=sent, sent_ns=sent)
        if i < c.failed:
            r.status = "error"
            r.http_status = 500
            r.error = "HTTP 500: engine dead"
            r.end_ns = sent + 5_000_000
            t_user[u] = r.end_ns
            recs.append(r)
            continue
        first = sent + int(ttft * jitter * 1e6)
        stamps = [first + int(k * tpot * 1e6) for k in range(c.out_tokens)]
        r.first_token_ns = first
        r.first_content_ns = stamps[c.reasoning] if c.reasoning < len(stamps) else stamps[-1]
        r.chunk_ns = array("q", stamps)
        r.chunk_tokens = array("i", [1] * c.out_tokens)
        r.end_ns = stamps[-1] + 100_000
        r.prompt_tokens = c.in_tokens + c.prompt_delta
        r.output_tokens = c.out_tokens
        r.reasoning_tokens = c.reasoning
        r.usage_reported = True
        recs.append(r)
        t_user[u] = r.end_ns
    wall = (max(t_user) - 1_000_000) / 1e9
    return recs, wall


def build_session(base: Path, spec: SessionSpec, dirname: str | None = None) -> Path:
    """Write a session whose every field is fixed (dates, host, version), so reports repeat exactly. Its
    session.toml and cell rows are the engine's (tests/sessions/synth.py `sweep_session`), its workloads the
    presets of those names (unless `spec.workloads` gives them)."""
    path = base / (dirname or f"20261201-120000-{spec.name}")
    given = {w.name: w for w in spec.workloads or ()}
    cells = plan([(given.get(c.workload) or PRESETS[c.workload], c.concurrency, c.requests) for c in spec.cells])
    w, ran = sweep_session(path, spec.name, cells, model=spec.model, max_model_len=32768,
                           tokenizer="server /tokenize", slos=spec.slos, tags=spec.tags, url=spec.url)
    for cell, c in zip(cells, spec.cells, strict=True):
        if c.skipped:  # as the runner skips a cell that does not fit the model
            w.write_cell({**cell.row(), "status": "skipped", "reason": c.skipped}, None, None)
            continue
        recs, wall = _records(c)
        df = records_frame(recs)
        summary = summarize(df, wall, spec.slos).to_dict()
        if c.server is not None:
            summary["server"] = c.server
        if c.client is not None:
            summary["client"] = c.client
        if c.telemetry is not None:
            summary["telemetry"] = c.telemetry
        if c.quality is not None:
            summary["quality"] = c.quality
        w.write_cell({**cell.row(), **ran, "status": "stopped" if c.stopped else "done", "reason": c.stopped}, df,
                     CellResult.from_dict(summary))
    w.finish(spec.status, spec.message)
    w.meta.update(started_at="2026-12-01T12:00:00+0000", ended_at="2026-12-01T12:10:00+0000", host="gpu-box",
                  servescope_version="0.1.0")
    w.save_meta()
    return path


def gptq_spec() -> SessionSpec:
    """Session A: GPTQ-Int4, fast; sharegpt c=1,4,16 (c=16 saturates), thinking on at c=1,4, a skipped cell."""
    kv = 6000.0  # 16 users x ~550 tokens do not fit
    return SessionSpec(
        "gptq", tags={"quant": "GPTQ-Int4", "gpu": "RTX Pro 6000"}, slos={"ttft_ms": 1000.0, "tpot_ms": 50.0},
        cells=[
            CellSpec("sharegpt", 1, server={"preemptions": 0.0, "kv_cache_tokens": kv, "queue_ms_mean": 0.5}),
            CellSpec("sharegpt", 4, server={"preemptions": 0.0, "kv_cache_tokens": kv, "queue_ms_mean": 2.0}),
            CellSpec("sharegpt", 16, ttft_growth=0.8, tpot_growth=0.2, failed=2, prompt_delta=-12,
                     server={"preemptions": 37.0, "kv_cache_tokens": kv, "queue_ms_mean": 900.0}),
            CellSpec("sharegpt-think", 1, out_tokens=1024, reasoning=768),
            CellSpec("sharegpt-think", 4, out_tokens=1024, reasoning=768),
            CellSpec("longin", 1, skipped="input 8192 + output 256 tokens exceed the model's max length 8192"),
        ],
    )


def fp8_spec() -> SessionSpec:
    """Session B: FP8, slower decode; sharegpt c=1,4 only, plus a longout cell A lacks."""
    return SessionSpec(
        "fp8", tags={"quant": "FP8", "gpu": "RTX Pro 6000"}, slos={"ttft_ms": 1000.0, "tpot_ms": 50.0},
        cells=[
            CellSpec("sharegpt", 1, ttft_ms=110.0, tpot_ms=6.9),
            CellSpec("sharegpt", 4, ttft_ms=115.0, tpot_ms=6.9),
            CellSpec("longout", 1, in_tokens=128, out_tokens=2048, tpot_ms=6.9),
        ],
    )


@pytest.fixture
def fixed_pair(tmp_path: Path) -> tuple[Any, Any]:
    a = build_session(tmp_path / "sessions", gptq_spec())
    b = build_session(tmp_path / "sessions", fp8_spec())
    return load_session(a), load_session(b)


# ---- the real vllm bench serve (marked vllm) --------------------------------------------------------
@dataclass
class BenchFiles:
    detailed: list[Path]
    aggregate: Path
    server: Any


@pytest.fixture(scope="session")
def vllm_bench_files(vllm_server: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BenchFiles]:
    """`vllm bench serve --save-result` files from the real CPU vLLM: c=1 and c=4 with --save-detailed, and c=2
    without (aggregates only). Uses the session-wide vLLM of tests/conftest.py."""
    from tests.support.vllm_server import vllm_env

    out = tmp_path_factory.mktemp("vllm-bench")
    scratch = Path(os.environ.get("SERVESCOPE_TEST_CACHE", Path.home() / ".cache" / "servescope-test")) / "scratch"
    env = vllm_env(scratch)
    files = []
    for c, detailed in ((1, True), (4, True), (2, False)):
        name = f"bench-c{c}.json"
        cmd = [str(vllm_server.venv / "bin" / "vllm"), "bench", "serve", "--backend", "vllm",
               "--base-url", vllm_server.url, "--model", vllm_server.model, "--dataset-name", "random",
               "--random-input-len", "128", "--random-output-len", "32", "--num-prompts", "12",
               "--max-concurrency", str(c), "--seed", str(100 + c), "--save-result", "--result-dir", str(out),
               "--result-filename", name, "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles",
               "50,90,99", *(["--save-detailed"] if detailed else [])]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0 and (out / name).is_file(), r.stderr[-3000:]
        json.loads((out / name).read_text())
        files.append(out / name)
    yield BenchFiles(files[:2], files[2], vllm_server)
