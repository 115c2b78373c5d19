"""What a million tokens cost, for a hosted API and for your own GPU: each cell's `cost` (`CellCost`), from the
prices a sweep is given (`--price`, `--gpu-hour`, `--electricity-price`), computed here and nowhere else.

Both sides answer the same question: what the cell's tokens would cost, divided by its tokens.

- A hosted API (`--price input=USD,output=USD`, its list price per 1M tokens), from the cell's measured token
  mix (I input and O output tokens of its successful requests, as the server's usage counted them):
  spend = I x input / 1e6 + O x output / 1e6;
  usd_per_1m_output_tokens = spend / O x 1e6 = output + input x I / O;
  usd_per_1m_total_tokens = spend / (I + O) x 1e6.
- A GPU (`--gpu-hour USD`, what the box costs per hour, amortised or rented), from the cell's measured aggregate
  throughput (output tok/s and total tok/s over its wall time):
  usd_per_1m_output_tokens = gpu_hour / 3600 / output_tok_s x 1e6;
  usd_per_1m_total_tokens = gpu_hour / 3600 / total_tok_s x 1e6;
  plus, where the GPUs' energy was measured (NVML) and `--electricity-price` given, the energy's cost:
  Wh per 1M output tokens / 1000 x USD per kWh (per 1M total tokens: that x O / (I + O)).
- Energy alone (`--electricity-price` without `--gpu-hour`): the energy term only.

Failed requests cost nothing here (an API does not bill them; on a GPU their time is in the wall time, and so
in the throughput). A cell without output tokens has no cost.

The prices and their parsers are in core/prices.py."""

from __future__ import annotations

import msgspec

from servescope.core.prices import Prices, usd_text
from servescope.core.results import CellCost, CellResult, finite

__all__ = ["API_BASIS", "ENERGY_BASIS", "GPU_BASIS", "cell_cost", "is_api", "is_gpu", "with_cost"]

API_BASIS = "api list price"  # how every API cell's basis starts
GPU_BASIS = "gpu-hour"  # how every GPU cell's basis starts (with --gpu-hour)
ENERGY_BASIS = "energy only"  # --electricity-price alone


# ---- a cell's cost -----------------------------------------------------------------------------------
def cell_cost(r: CellResult, prices: Prices) -> CellCost | None:
    """The cell's cost per 1M tokens (see the module's formulas); None without a price, or without the
    figures it needs (no output tokens; for a GPU, no throughput or energy)."""
    out_tok, in_tok = r.output_tokens_total, r.input_tokens_total
    if prices.api is not None:
        if not out_tok or out_tok <= 0:
            return None
        i = float(in_tok or 0)
        spend = i * prices.api.input / 1e6 + out_tok * prices.api.output / 1e6
        return CellCost(usd_per_1m_output_tokens=spend / out_tok * 1e6,
                        usd_per_1m_total_tokens=spend / (i + out_tok) * 1e6,
                        basis=f"{API_BASIS} ${usd_text(prices.api.input)} in / ${usd_text(prices.api.output)} out per 1M "
                              f"tok, {i / out_tok:.2f} in tok per out tok")
    out_s, total_s = finite(r.output_tok_s), finite(r.total_tok_s)
    energy_out = energy_total = None  # USD per 1M output (total) tokens of the measured energy
    kwh = prices.electricity_usd_per_kwh
    wh = finite(r.gpu.wh_per_1m_output_tokens) if r.gpu is not None else None
    if kwh is not None and wh is not None:
        energy_out = wh / 1000.0 * kwh
        share = out_s / total_s if out_s and total_s else None  # O / (I + O)
        energy_total = energy_out * share if share is not None else None
    hour = prices.gpu_usd_per_hour
    if hour is not None:
        if not out_s or out_s <= 0:
            return None
        per_out = hour / 3600.0 / out_s * 1e6
        per_total = hour / 3600.0 / total_s * 1e6 if total_s and total_s > 0 else None
        basis = f"{GPU_BASIS} ${usd_text(hour)} at {_tok_s(out_s)} output tok/s"
        if energy_out is not None:
            per_out += energy_out
            per_total = per_total + energy_total if per_total is not None and energy_total is not None else None
            basis += f" + energy {wh:,.0f} Wh/1M out tok at ${usd_text(kwh or 0.0)}/kWh"
        elif kwh is not None:
            basis += " (energy not measured)"
        return CellCost(usd_per_1m_output_tokens=per_out, usd_per_1m_total_tokens=per_total, basis=basis)
    if energy_out is not None:
        return CellCost(usd_per_1m_output_tokens=energy_out, usd_per_1m_total_tokens=energy_total,
                        basis=f"{ENERGY_BASIS}: {wh:,.0f} Wh/1M out tok at ${usd_text(kwh or 0.0)}/kWh (no --gpu-hour)")
    return None


def with_cost(r: CellResult, prices: Prices) -> CellResult:
    """`r` with its `cost` (kept when it already has one; unchanged without a price that applies)."""
    if r.cost is not None or not prices.any:
        return r
    cost = cell_cost(r, prices)
    return r if cost is None else msgspec.structs.replace(r, cost=cost)


def is_api(cost: CellCost | None) -> bool:
    """The cost is a hosted API's (from its list price)."""
    return cost is not None and cost.basis.startswith(API_BASIS)


def is_gpu(cost: CellCost | None) -> bool:
    """The cost is a GPU's hourly price over its throughput (energy alone is not: it leaves out the box)."""
    return cost is not None and cost.basis.startswith(GPU_BASIS)


def _tok_s(v: float) -> str:
    return f"{v:,.0f}" if v >= 10 else f"{v:.3g}"
