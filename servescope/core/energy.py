"""Energy per output token and mean power over a cell, from the GPUs' NVML window (core/gpu.py
GpuSampler.window_summary): the `energy` a cell reports where NVML measured power, and nothing where it did not
(no zeros stand in for a figure never measured)."""

from __future__ import annotations

from servescope.core.results import Energy, GpuWindow


def cell_energy(gpu: GpuWindow | None) -> Energy | None:
    """j_per_output_token = the trapezoid integral of every GPU's power over the cell's window (energy_wh x 3600)
    / the cell's output tokens; mean_w = that integral / the seconds it covers. None without NVML, without a power
    reading in the window, or without output tokens."""
    if gpu is None or not gpu.available or gpu.energy_wh is None or gpu.output_tokens <= 0:
        return None
    joules = gpu.energy_wh * 3600.0
    covered = (gpu.duration_s or 0.0) * (gpu.energy_coverage if gpu.energy_coverage is not None else 1.0)
    return Energy(j_per_output_token=joules / gpu.output_tokens,
                  mean_w=joules / covered if covered > 0 else gpu.power_w_mean)
