"""A launched server's start phases from vLLM's log (core/startup.py), and energy per output token from NVML
(core/energy.py) against the integral of a fake GPU's power."""

from __future__ import annotations

from pathlib import Path

import pytest

from servescope.core.energy import cell_energy
from servescope.core.gpu import GpuSampler
from servescope.core.results import GpuWindow
from servescope.core.startup import startup_phases
from tests.core.test_telemetry import FakeClock, FakeNVML

CPU_LOG = (Path(__file__).parent / "data" / "vllm-0.32-cpu-start.log").read_text()
# a GPU build's lines, as vLLM 0.32 formats them (gpu_model_runner.py, compilation/monitor.py, v1/engine/core.py)
GPU_LOG = """\
(Worker pid=10) INFO 12-07 10:00:01 [default_loader.py:501] Loading weights took 9.87 seconds
(Worker pid=10) INFO 12-07 10:00:02 [gpu_model_runner.py:5150] Model loading took 15.2 GiB memory and 11.234567 seconds
(Worker pid=10) INFO 12-07 10:00:40 [monitor.py:62] [backbone] torch.compile took 31.50 s in total
(Worker pid=10) INFO 12-07 10:00:45 [monitor.py:62] [encoder] torch.compile took 4.25 s in total
(Worker pid=10) INFO 12-07 10:01:05 [gpu_model_runner.py:6582] Graph capturing finished in 19 secs, took 0.84 GiB
(EngineCore pid=9) INFO 12-07 10:01:06 [core.py:386] init engine (profile, create kv cache, warmup model) took 64.10 s (compilation: 35.75 s)
"""


def test_phases_of_a_cpu_start_are_the_weights_and_the_engine() -> None:
    assert startup_phases(CPU_LOG) == {"weights_s": 0.03, "engine_init_s": 5.79}


def test_phases_of_a_gpu_start() -> None:
    assert startup_phases(GPU_LOG) == {"weights_s": 11.234567, "compile_s": 35.75, "cuda_graphs_s": 19.0,
                                       "engine_init_s": 64.10}
    only_init = "init engine (profile, create kv cache, warmup model) took 50.00 s (compilation: 30.00 s)"
    assert startup_phases(only_init) == {"compile_s": 30.0, "engine_init_s": 50.0}
    assert startup_phases("llama-server: listening") == {}


S = 1_000_000_000


def test_energy_per_token_is_the_integral_of_the_power() -> None:
    """Power ramps 100 -> 300 W over 10 s (read every second), then holds: the window [2.5 s, 12.5 s] holds
    the ramp's last 7.5 s and 2.5 s at 300 W."""
    nv = FakeNVML([{"name": "NVIDIA H100", "used_gib": 70.0, "total_gib": 80.0, "util": 90, "power_w": 100.0}])
    clock = FakeClock()
    g = GpuSampler(interval_s=1.0, nvml=nv, clock=clock)
    for sec in range(14):
        clock.at(sec)
        nv.power_mw[0] = (100.0 + 20.0 * min(sec, 10)) * 1000
        g.sample_once()
    w = g.window_summary(int(2.5 * S), int(12.5 * S), output_tokens=5000)
    e = cell_energy(w)
    joules = (150.0 + 300.0) / 2 * 7.5 + 300.0 * 2.5  # the ramp from 2.5 s (150 W) to 10 s, then flat
    assert e is not None
    assert e.j_per_output_token == pytest.approx(joules / 5000, rel=1e-9)
    assert e.mean_w == pytest.approx(joules / 10.0, rel=1e-9)


def test_no_energy_without_nvml_or_tokens() -> None:
    assert cell_energy(None) is None
    assert cell_energy(GpuWindow(available=False, reason="NVML is not available")) is None
    assert cell_energy(GpuWindow(available=True, energy_wh=1.0, output_tokens=0, duration_s=1.0)) is None
    assert cell_energy(GpuWindow(available=True, energy_wh=None, output_tokens=10, duration_s=1.0)) is None
