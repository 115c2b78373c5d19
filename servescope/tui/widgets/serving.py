"""A cell's serving figures as the app's panes show them, one short line each: speculative decoding (beside the
TPOT), the most requested LoRA adapters, the prefix cache's target and reset, and the energy per output token
(NVML). A cell without them has no line (no zeros). The report's tables hold the same figures
(servescope.reports.serving_doc); this module stays light (no polars) for the app's first frame."""

from __future__ import annotations

import math

from servescope.core.results import CellResult
from servescope.core.textsafe import clean_text

ADAPTERS_SHOWN = 3  # adapters a pane lists per cell, then how many more


def _n(v: float | None, nd: int = 1) -> str:
    return f"{v:,.{nd}f}" if v is not None and math.isfinite(v) else "-"


def _pct(v: float | None) -> str:
    return f"{v:.1%}" if v is not None and math.isfinite(v) else "-"


def serving_lines(s: CellResult, adapters: int = ADAPTERS_SHOWN) -> list[str]:
    """The cell's lines ([] for a cell without speculation, adapters, a prefix-cache target or reset, or energy);
    adapter names are cleaned of escape sequences (the panes show them as text, never markup)."""
    lines: list[str] = []
    sd = s.spec_decode
    if sd is not None:
        acc = f"{_pct(sd.acceptance_rate)} of drafts accepted" if sd.acceptance_rate is not None else "nothing drafted"
        lines.append(f"spec decode: {acc}, {_n(sd.mean_accepted_tokens, 2)} tok/draft (mean), "
                     f"{_n(sd.drafts_per_step, 2)} drafts/step; TPOT p50 {_n(s.tpot_ms.p50, 2)} ms")
    if s.adapters:
        for name, a in list(s.adapters.items())[:adapters]:
            lines.append(f"adapter {clean_text(name)}: {a.requests} req, {_n(a.output_tok_s)} out tok/s, "
                         f"TTFT p50 {_n(a.ttft_ms.p50)} ms, TPOT p50 {_n(a.tpot_ms.p50, 2)} ms")
        if len(s.adapters) > adapters:
            lines.append(f"… {len(s.adapters) - adapters} more adapters (the report lists them all)")
    if s.prefix_cache_target is not None:
        lines.append(f"prefix cache hit: {_pct(s.prefix_cache_hit_rate)} measured, {s.prefix_cache_target:.0%} "
                     "aimed at")
    if s.prefix_cache_reset is not None:
        lines.append("prefix cache: reset before the cell" if s.prefix_cache_reset
                     else "prefix cache: NOT reset (the server offers no reset)")
    e = s.energy
    if e is not None:
        lines.append(f"energy (NVML): {_n(e.j_per_output_token, 3)} J/out tok, mean {_n(e.mean_w)} W")
    return lines
