"""A cell's serving figures on the command line: speculative decoding, each LoRA adapter, the prefix cache's reset
and target, the launched server's start and the energy per token, as lines of `run`'s table and as `--json`'s
keys (their shape is in docs/measuring.md and docs/speculation.md: scripts rely on it)."""

from __future__ import annotations

from typing import TypedDict

from servescope.core.results import CellResult, Dist
from servescope.core.textsafe import clean_text

ADAPTER_LINES = 12  # adapters listed in a cell's table, then how many more


class ServingJson(TypedDict, total=False):
    """`run --json`'s serving keys of a cell: spec_decode and adapters null without them, prefix_cache_reset always,
    startup only for a launched server, energy only with NVML, prefix_cache_target only when the workload aims,
    lora_server only when the server serves adapters."""

    spec_decode: dict[str, float | None] | None
    adapters: dict[str, dict[str, object]] | None
    prefix_cache_reset: bool
    lora_server: dict[str, object]
    prefix_cache_target: float
    startup: dict[str, object]
    energy: dict[str, float | None]


def _stats(d: Dist) -> dict[str, float | None]:
    return {k: d.stat(k) for k in ("mean", "p50", "p90", "p99")}


def serving_json(s: CellResult) -> ServingJson:
    out: ServingJson = {
        "spec_decode": s.spec_decode.to_dict() if s.spec_decode is not None else None,
        "adapters": ({name: {"requests": a.requests, "output_tok_s": a.output_tok_s, "ttft_ms": _stats(a.ttft_ms),
                             "tpot_ms": _stats(a.tpot_ms)} for name, a in s.adapters.items()}
                     if s.adapters is not None else None),
        "prefix_cache_reset": bool(s.prefix_cache_reset),
    }
    if s.lora_server is not None:
        out["lora_server"] = s.lora_server.to_dict()
    if s.prefix_cache_target is not None:
        out["prefix_cache_target"] = s.prefix_cache_target
    if s.startup is not None:
        out["startup"] = s.startup.to_dict()
    if s.energy is not None:
        out["energy"] = s.energy.to_dict()
    return out


def _f(v: float | None, nd: int = 1) -> str:
    return f"{v:,.{nd}f}" if v is not None else "-"


def serving_lines(s: CellResult) -> list[str]:
    """The cell's serving figures, one line each, for those it has (none for a cell without them). A launched
    server's start is said when it starts (a notice), not under each of its cells."""
    lines: list[str] = []
    sd = s.spec_decode
    if sd is not None:
        acc = f"{sd.acceptance_rate:.1%} of drafted tokens accepted" if sd.acceptance_rate is not None else \
            "nothing drafted"
        lines.append(f"  speculative decoding (/metrics): {acc}, {_f(sd.mean_accepted_tokens, 2)} accepted tokens per "
                     f"draft, {_f(sd.drafts_per_step, 2)} drafts per step")
    if s.adapters:
        for name, a in list(s.adapters.items())[:ADAPTER_LINES]:
            lines.append(f"  adapter {clean_text(name)}: {a.requests} requests, output {_f(a.output_tok_s)} tok/s, "
                         f"TTFT p50 {_f(a.ttft_ms.p50, 2)} ms, TPOT p50 {_f(a.tpot_ms.p50, 2)} ms")
        if len(s.adapters) > ADAPTER_LINES:
            lines.append(f"  ... and {len(s.adapters) - ADAPTER_LINES} more adapters (--json has them all)")
    ls = s.lora_server
    if ls is not None:
        ran = ", ".join(clean_text(a) for a in ls.adapters_running[:ADAPTER_LINES]) or "none"
        lines.append(f"  server LoRA (vllm:lora_requests_info): adapters running during the cell: {ran}"
                     + (f" (max_loras {ls.max_loras})" if ls.max_loras is not None else ""))
    if s.prefix_cache_reset is not None:
        lines.append("  prefix cache: reset before the cell" if s.prefix_cache_reset
                     else "  prefix cache: NOT reset before the cell (see the warning above)")
    if s.prefix_cache_target is not None:
        got = f"{s.prefix_cache_hit_rate:.1%}" if s.prefix_cache_hit_rate is not None else "not measured"
        lines.append(f"  prefix cache hit rate: {got} measured, {s.prefix_cache_target:.0%} aimed at by the workload")
    if s.energy is not None:
        lines.append(f"  energy (NVML): {_f(s.energy.j_per_output_token, 3)} J per output token, mean "
                     f"{_f(s.energy.mean_w)} W")
    return lines
