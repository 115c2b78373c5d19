"""What GPU-box users change between runs, wired into the sweep: LoRA traffic (each request names its adapter), the
workload's sampling and speculation settings on its requests, the prefix cache reset before each cell
(`--reset-prefix-cache`), and a cell's serving figures: speculative decoding, per-adapter figures, the server's
adapters, the prefix-cache target, the launched server's start and the energy per token.

The runner and a cell attempt call these; the figures' definitions live in core (core/specdecode.py,
core/lorafigures.py, core/energy.py, core/startup.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping, Sequence

import httpx
import msgspec
import polars as pl

from servescope.core.client import RequestSpec, async_client
from servescope.core.energy import cell_energy
from servescope.core.lorafigures import adapter_figures
from servescope.core.results import CellResult, GpuWindow, LoraServer, Startup
from servescope.core.specdecode import lora_window, spec_decode_delta
from servescope.core.textsafe import clean_text
from servescope.workloads.spec import Workload

Metrics = Mapping[str, float | str]
RESET_PATH = "/reset_prefix_cache"
RESET_TRIES = 10  # a reset refused while the server still holds blocks (requests ending) is tried again
RESET_RETRY_S = 0.5


def adapter_names(workloads: Sequence[Workload]) -> list[str]:
    """Every LoRA adapter the sweep's workloads name, in order (the base model left out)."""
    out: dict[str, None] = {}
    for w in workloads:
        if w.adapters is not None:
            out.update(dict.fromkeys(w.adapters.adapters))
    return list(out)


def sim_serving_args(workloads: Sequence[Workload]) -> list[str]:
    """A `sim://` target's flags for the sweep's workloads: the adapters they name (the simulator reads no path)."""
    names = adapter_names(workloads)
    return ["--enable-lora", "--lora-modules", *(f"{n}={n}" for n in names)] if names else []


def serving_specs(workload: Workload, prompt_key: str, specs: Sequence[RequestSpec]) -> list[RequestSpec]:
    """The cell's requests with the workload's adapter (drawn per prompt, seeded by the cell's prompt key),
    temperature and speculation acceptance; as given when it sets none of them."""
    if workload.adapters is None and workload.temperature is None and workload.spec_acceptance is None:
        return list(specs)
    picks = workload.adapters.assign(len(specs), prompt_key) if workload.adapters is not None else [None] * len(specs)
    return [dataclasses.replace(s, model=a, temperature=workload.temperature,
                                spec_acceptance=workload.spec_acceptance) for s, a in zip(specs, picks, strict=True)]


def block_sized(w: Workload, block_size: object) -> Workload:
    """A workload aiming at a prefix-cache hit rate, its shared prefix rounded to the server's KV blocks (vLLM
    caches whole blocks: 16 tokens on GPUs, 128 on its CPU build), so the prompts share what the cache can hit;
    as it is without a target or a known block size."""
    if w.prefix_cache_hit_rate is None or not isinstance(block_size, (int, float)) or block_size < 1:
        return w
    block = int(block_size)
    inp = w.input_tokens
    mean_in = inp.value if inp.dist == "fixed" else (inp.mean if inp.dist == "normal" else (inp.min + inp.max) / 2)
    lowest = inp.value if inp.dist == "fixed" else inp.min
    prefix = round(w.prefix_cache_hit_rate * mean_in / block) * block
    while prefix >= lowest and prefix > 0:
        prefix -= block
    return dataclasses.replace(w, prefix_tokens=max(prefix, 0))


class PrefixReset:
    """`--reset-prefix-cache`: empty the server's prefix cache before each cell, where it offers
    `POST /reset_prefix_cache` (vLLM does with VLLM_SERVER_DEV_MODE=1, the simulator always). `before_cell()` says
    whether the cache was reset; where the server does not offer it, `notice` holds the one line to say, once."""

    def __init__(self, api_key: str | None) -> None:
        self.api_key = api_key
        self.offered: bool | None = None  # None until tried; False: the server answered 404/405 (said once)
        self.notice = ""

    async def before_cell(self, url: str) -> bool:
        if self.offered is False:
            return False
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        why = ""
        try:
            async with async_client(base_url=url, timeout=30.0, headers=headers) as c:
                for _ in range(RESET_TRIES):
                    r = await c.post(RESET_PATH)
                    if r.status_code in (404, 405):
                        self.offered = False
                        self.notice = (f"the server does not offer POST {RESET_PATH} (HTTP {r.status_code}; vLLM "
                                       "serves it when started with VLLM_SERVER_DEV_MODE=1): --reset-prefix-cache "
                                       "does nothing, cells run with the prefix cache as they find it")
                        return False
                    if r.status_code == 200 and _success(r):
                        self.offered = True
                        return True
                    why = f"HTTP {r.status_code}: {clean_text(r.text)[:120]}"
                    await asyncio.sleep(RESET_RETRY_S)
        except httpx.HTTPError as e:
            why = clean_text(str(e)) or type(e).__name__
        self.notice = f"the server's prefix cache could not be reset before this cell ({why})"
        return False


def _success(r: httpx.Response) -> bool:
    """vLLM answers {"success": bool} (older versions an empty 200)."""
    try:
        body = r.json()
    except ValueError:
        return True
    return not isinstance(body, dict) or body.get("success", True) is not False


def serving_figures(summary: CellResult, df: pl.DataFrame, before: Metrics | None, after: Metrics | None,
                    gpu: GpuWindow | None, workload: Workload, reset: bool | None,
                    startup: Startup | None) -> CellResult:
    """The cell's summary with its serving figures: speculative decoding (from the /metrics boundary samples),
    each adapter's figures (over the whole cell's requests `df`, beside a steady window's) and the adapters the
    server ran, the prefix-cache target and reset, the launched
    server's start and the energy per output token (NVML)."""
    lw = lora_window(before, after)
    return msgspec.structs.replace(
        summary, spec_decode=spec_decode_delta(before, after),
        lora_server=LoraServer(adapters_running=lw[0], max_loras=lw[1]) if lw is not None else None,
        adapters=adapter_figures(df, (summary.whole or summary).wall_s or 0.0), prefix_cache_reset=reset,
        prefix_cache_target=workload.prefix_cache_hit_rate, startup=startup, energy=cell_energy(gpu))



PHASE_LABELS = {"weights_s": "weights", "compile_s": "compile", "cuda_graphs_s": "CUDA graphs",
                "engine_init_s": "engine start"}


def startup_text(what: str, st: Startup) -> str:
    """One line for a launched server's start: "the server started: healthy after 41.2 s, first token after 41.9 s
    (its log: weights 0.03 s, engine start 5.79 s)"."""
    def s(v: float | None) -> str:
        return f"{v:.1f} s" if v is not None else "-"

    phases = ", ".join(f"{PHASE_LABELS.get(k, k)} {v:.2f} s" for k, v in (st.phases or {}).items())
    return (f"{what} started: healthy after {s(st.healthy_s)}, first token after {s(st.first_token_s)}"
            + (f" (its log: {phases})" if phases else ""))
