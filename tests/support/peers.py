"""The peer benchmark clients the import tests run: GuideLLM, AIPerf and inference-perf, installed from the package
registry into cached venvs by .ci/setup_peers.sh (idempotent, with a lock), driven as their users drive them.
inference-perf needs Python 3.12 or later: without one it is not installed (`Peers.inference_perf` None).

Neither can reach a model hub here: both are given the tiny test model's folder (.ci/setup_vllm.sh builds it) as
their tokenizer, by path. Each run writes its usual files into `out` and returns the files to import.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("SERVESCOPE_TEST_CACHE", str(Path.home() / ".cache" / "servescope-test")))
TOKENIZER = CACHE / "models-v1" / "dense"  # the tiny dense model's folder (its tokenizer.json)


@dataclass(frozen=True)
class Peers:
    guidellm: Path  # the venvs
    aiperf: Path
    inference_perf: Path | None  # None: no Python 3.12 here to install it with


def setup() -> Peers:
    """Run .ci/setup_peers.sh (cached: a second run takes a second) and return the venvs."""
    out = subprocess.run(["bash", str(ROOT / ".ci" / "setup_peers.sh")], check=True, capture_output=True, text=True,
                         timeout=1800)
    lines = out.stdout.strip().splitlines()
    return Peers(Path(lines[-3]), Path(lines[-2]), Path(lines[-1]) if lines[-1] != "-" else None)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.update(HF_HUB_DISABLE_TELEMETRY="1", DO_NOT_TRACK="1", TOKENIZERS_PARALLELISM="false")
    return env


def _run(cmd: list[str], log: Path, timeout: float) -> None:
    with open(log, "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, env=_env(), cwd=log.parent)
    if p.returncode != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise AssertionError(f"{cmd[0]} exited {p.returncode}:\n{tail}")


def run_guidellm(peers: Peers, url: str, model: str, concurrency: list[int], requests: int, input_tokens: int,
                 output_tokens: int, out: Path, timeout: float = 600) -> Path:
    """`guidellm run` with the concurrent profile at each concurrency, `requests` per benchmark, synthetic prompts of
    `input_tokens` (its tokenizer's) asking `output_tokens`; the benchmarks JSON it wrote."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "benchmarks.json"
    streams = ",".join(map(str, concurrency))
    cmd = [str(peers.guidellm / "bin" / "guidellm"), "run",
           "--backend", f"kind=openai_http,target={url},model={model},request_format=/v1/completions",
           "--profile", f"kind=concurrent,streams={concurrency[0]}", "--override", "profile.streams", streams,
           "--data", f"kind=synthetic_text,prompt_tokens={input_tokens},output_tokens={output_tokens}",
           "--tokenizer", f"kind=huggingface_auto,model={TOKENIZER}",
           "--constraint", f"kind=max_requests,count={requests}",
           "--output", f"kind=json,path={path}", "--disable-console-interactive"]
    _run(cmd, out / "guidellm.log", timeout)
    return path


def run_aiperf(peers: Peers, url: str, model: str, concurrency: list[int], requests: int, input_tokens: int,
               output_tokens: int, out: Path, timeout: float = 600) -> Path:
    """`aiperf profile` sweeping the concurrencies, `requests` per run, synthetic prompts of `input_tokens` (its
    tokenizer's) asking exactly `output_tokens` (ignore_eos); the artifact folder (one folder per concurrency when
    there are several)."""
    out.mkdir(parents=True, exist_ok=True)
    art = out / "artifacts"
    cmd = [str(peers.aiperf / "bin" / "aiperf"), "profile", "-m", model, "--url", url,
           "--endpoint-type", "completions", "--streaming", "--tokenizer", str(TOKENIZER),
           "--isl", str(input_tokens), "--isl-stddev", "0", "--osl", str(output_tokens), "--osl-stddev", "0",
           "--concurrency", ",".join(map(str, concurrency)), "--request-count", str(requests),
           "--extra-inputs", "ignore_eos:true", "--artifact-dir", str(art), "--ui", "none",
           "--no-server-metrics", "--no-gpu-telemetry", "--random-seed", "1"]
    _run(cmd, out / "aiperf.log", timeout)
    return art


def run_inference_perf(peers: Peers, url: str, model: str, concurrency: list[int], requests: int, input_tokens: int,
                       output_tokens: int, out: Path, timeout: float = 600) -> Path:
    """`inference-perf -c config.yaml` with a concurrent load, one stage per concurrency of `requests` requests,
    random prompts of `input_tokens` (its tokenizer's) asking exactly `output_tokens` (ignore_eos), streaming; the
    reports folder (its lifecycle reports, config.yaml and the partial llm-d reports it writes beside them)."""
    assert peers.inference_perf is not None
    out.mkdir(parents=True, exist_ok=True)
    reports = out / "reports"
    stages = "".join(f"  - {{concurrency_level: {c}, num_requests: {requests}}}\n" for c in concurrency)
    dist = "{{min: {0}, max: {0}, mean: {0}}}"
    (out / "config.yaml").write_text(
        "api: {type: completion, streaming: true}\n"
        f"data: {{type: random, input_distribution: {dist.format(input_tokens)}, "
        f"output_distribution: {dist.format(output_tokens)}}}\n"
        f"load:\n  type: concurrent\n  stages:\n{stages}"
        "report: {request_lifecycle: {summary: true, per_stage: true, per_request: true}}\n"
        f"storage: {{local_storage: {{path: {reports}}}}}\n"
        f"server: {{type: vllm, model_name: {model}, base_url: '{url}', ignore_eos: true}}\n"
        f"tokenizer: {{pretrained_model_name_or_path: '{TOKENIZER}'}}\n")
    _run([str(peers.inference_perf / "bin" / "inference-perf"), "-c", str(out / "config.yaml")],
         out / "inference-perf.log", timeout)
    return reports


# ---- one run of each tool at the same load, once per test session ---------------------------------------------
CONCURRENCY = [1, 4]
REQUESTS = 16  # per load
INPUT_TOKENS = 128  # the prompts' length in the tokenizer all three are given (the tiny dense model's)
OUTPUT_TOKENS = 64  # asked exactly (ignore_eos)
WORKLOAD = "peer128"


@dataclass(frozen=True)
class SameLoad:
    """A servescope session, GuideLLM's benchmarks JSON, AIPerf's artifact folder and inference-perf's reports folder
    (None without the tool) of one workload and loads, measured one after another against one simulator."""

    servescope: Path  # the session directory
    guidellm: Path
    aiperf: Path
    inference_perf: Path | None
    url: str


def same_load_runs(out: Path) -> SameLoad:
    import json
    import sys

    from servescope.sim.launcher import start_sim

    p = setup()
    if not (TOKENIZER / "tokenizer.json").is_file():  # the tiny models come with the vLLM setup
        from tests.support import vllm_server

        vllm_server.setup()
    wl = out / f"{WORKLOAD}.toml"
    wl.write_text(f'[workload]\nname = "{WORKLOAD}"\napi = "completions"\ninput_tokens = {INPUT_TOKENS}\n'
                  f"output_tokens = {OUTPUT_TOKENS}\n")
    # no prefix cache: each tool's prompts would otherwise find the earlier tool's in it
    with start_sim("tiny", ["--no-enable-prefix-caching"]) as h:
        r = subprocess.run([sys.executable, "-m", "servescope", "run", "--url", h.url, "-w", str(wl), "-c",
                            ",".join(map(str, CONCURRENCY)), "-n", str(REQUESTS), "--warmup", "0",
                            # the peers' regime: users started together, figures over the whole run
                            "--ramp", "0", "--window", "whole", "--tokenizer",
                            str(TOKENIZER), "--save", str(out / "servescope"), "--json"],
                           capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert r.returncode == 0, r.stderr[-3000:]
        session = Path(json.loads(r.stdout.strip().splitlines()[-1])["session"])
        gl = run_guidellm(p, h.url, "tiny", CONCURRENCY, REQUESTS, INPUT_TOKENS, OUTPUT_TOKENS, out / "guidellm")
        ap = run_aiperf(p, h.url, "tiny", CONCURRENCY, REQUESTS, INPUT_TOKENS, OUTPUT_TOKENS, out / "aiperf")
        ip = (run_inference_perf(p, h.url, "tiny", CONCURRENCY, REQUESTS, INPUT_TOKENS, OUTPUT_TOKENS,
                                 out / "inference-perf") if p.inference_perf is not None else None)
        return SameLoad(session, gl, ap, ip, h.url)
