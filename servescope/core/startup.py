"""What a vLLM server's start spent, from its log (`ServerProcess.log_text()`: the run since its last start):
loading the weights, torch.compile, capturing CUDA graphs and initialising the engine as a whole, in seconds, where
the log says so. vLLM 0.32's lines (vllm/model_executor/model_loader/default_loader.py, vllm/v1/worker/
gpu_model_runner.py, vllm/compilation/monitor.py, vllm/v1/engine/core.py):

    Loading weights took 0.03 seconds
    Model loading took 15.2 GiB memory and 12.345678 seconds
    [backbone] torch.compile took 38.12 s in total
    Graph capturing finished in 21 secs, took 0.84 GiB
    init engine (profile, create kv cache, warmup model) took 45.14 s (compilation: 38.12 s)

A CPU build logs the weights and the engine's start only; other servers log none of these (an empty result)."""

from __future__ import annotations

import re

_WEIGHTS = re.compile(r"Model loading took [\d.]+ GiB(?: memory)? and ([\d.]+) seconds")
_WEIGHTS_ONLY = re.compile(r"Loading weights took ([\d.]+) seconds")
_COMPILE = re.compile(r"torch\.compile took ([\d.]+) s in total")
_COMPILE_INIT = re.compile(r"\(compilation: ([\d.]+) s")
_GRAPHS = re.compile(r"Graph capturing finished in ([\d.]+) secs")
_INIT = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")


def startup_phases(log_text: str) -> dict[str, float]:
    """{"weights_s", "compile_s", "cuda_graphs_s", "engine_init_s"}: those the log names. Compiled graphs'
    lines add up (one engine compiles them in turn); of the others the largest counts (engines and workers start
    side by side)."""

    def found(rx: re.Pattern[str]) -> list[float]:
        return [float(m.group(1)) for m in rx.finditer(log_text)]

    out: dict[str, float] = {}
    weights = found(_WEIGHTS) or found(_WEIGHTS_ONLY)
    if weights:
        out["weights_s"] = max(weights)
    compile_s = found(_COMPILE)
    if compile_s:
        out["compile_s"] = sum(compile_s)
    elif init_compile := found(_COMPILE_INIT):
        out["compile_s"] = max(init_compile)
    graphs = found(_GRAPHS)
    if graphs:
        out["cuda_graphs_s"] = max(graphs)
    init = found(_INIT)
    if init:
        out["engine_init_s"] = max(init)
    return out
