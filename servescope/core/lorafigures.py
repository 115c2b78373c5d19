"""Each LoRA adapter's figures in a cell: its requests (those that named it as their model; the base model's under
"base"), their output tok/s over the cell's wall time, their TTFT and TPOT, from the cell's records (the
`adapter` column of the requests frame)."""

from __future__ import annotations

import polars as pl

from servescope.core.metrics import describe, per_request, stamp_fault
from servescope.core.results import AdapterFigures

BASE = "base"  # the key of the base model's requests in a cell that mixes adapters and the base model


def adapter_figures(df: pl.DataFrame, wall_s: float) -> dict[str, AdapterFigures] | None:
    """{adapter: figures} over the cell's measured (non-warmup) ok requests, the most requested first (ties in the
    order they first appear); None when no request named an adapter."""
    if "adapter" not in df.columns or df.is_empty():
        return None
    rows = df.filter(~pl.col("warmup"))
    if not (rows["adapter"].fill_null("") != "").any():
        return None
    ok = per_request(rows).filter((pl.col("status") == "ok") & stamp_fault().is_null())
    wall = max(wall_s, 1e-9)
    out: dict[str, AdapterFigures] = {}
    for name in rows["adapter"].fill_null("").unique(maintain_order=True).to_list():
        mine = ok.filter(pl.col("adapter").fill_null("") == name)
        out[name or BASE] = AdapterFigures(requests=mine.height,
                                           output_tok_s=int(mine["output_tokens"].sum() or 0) / wall,
                                           ttft_ms=describe(mine["ttft_ms"]), tpot_ms=describe(mine["tpot_ms"]))
    return dict(sorted(out.items(), key=lambda kv: -kv[1].requests))  # sorted() is stable: ties keep their order
