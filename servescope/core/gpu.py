"""NVML readings per GPU (memory, utilisation, power, clocks, temperature) turned into energy and cost,
and the one listing of this machine's GPUs (`list_gpus`, `describe_gpus`).

Nothing here raises because NVML is missing: a machine without it leaves `GpuSampler.available` False with
a `reason`, and `list_gpus()` returns []. pynvml is imported lazily (only when a GPU is looked at).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import warnings
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import msgspec

from servescope.core.errors import error_text
from servescope.core.results import GpuStat, GpuWindow
from servescope.core.textsafe import clean_text

if TYPE_CHECKING:
    import polars as pl

__all__ = ["GPU_COLUMNS", "GpuInfo", "GpuSampler", "Nvml", "describe_gpus", "list_gpus"]

GPU_COLUMNS: tuple[str, ...] = ("mem_used_gib", "mem_total_gib", "util_pct", "power_w", "sm_clock_mhz",
                                "temp_c", "energy_j")
_GIB = float(1 << 30)


class _MemoryInfo(Protocol):
    @property
    def used(self) -> int: ...
    @property
    def total(self) -> int: ...


class _Utilization(Protocol):
    @property
    def gpu(self) -> int: ...


class Nvml(Protocol):
    """The part of pynvml servescope calls (tests pass a fake); a device handle is opaque."""

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> object: ...
    def nvmlDeviceGetName(self, handle: object, /) -> str | bytes: ...
    def nvmlDeviceGetMemoryInfo(self, handle: object, /) -> _MemoryInfo: ...
    def nvmlDeviceGetUtilizationRates(self, handle: object, /) -> _Utilization: ...
    def nvmlDeviceGetPowerUsage(self, handle: object, /) -> int: ...
    def nvmlDeviceGetClockInfo(self, handle: object, clock: int, /) -> int: ...
    def nvmlDeviceGetTemperature(self, handle: object, sensor: int, /) -> int: ...
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: object, /) -> int: ...


def _import_pynvml() -> Nvml:
    with warnings.catch_warnings():  # the `pynvml` shim over nvidia-ml-py warns that it is deprecated
        warnings.simplefilter("ignore")
        import pynvml

    nv: Nvml = pynvml  # an untyped module: Nvml is what servescope calls of it
    return nv


def _enumerate(nv: Nvml, indices: Sequence[int] | None = None) -> list[tuple[int, str, object]]:
    """(index, name, handle) of the GPUs NVML sees (all, or those of `indices`); NVML already initialised."""
    count = int(nv.nvmlDeviceGetCount())
    wanted = list(range(count)) if indices is None else [i for i in indices if 0 <= i < count]
    out: list[tuple[int, str, object]] = []
    for i in wanted:
        h = nv.nvmlDeviceGetHandleByIndex(i)
        name = nv.nvmlDeviceGetName(h)
        out.append((i, name.decode(errors="replace") if isinstance(name, bytes) else str(name), h))
    return out


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    mem_total_gib: float | None

    def describe(self) -> str:
        mem = f" ({self.mem_total_gib:.0f} GiB)" if self.mem_total_gib is not None else ""
        return f"{self.index}: {self.name}{mem}"


def list_gpus(nvml: Nvml | None = None) -> list[GpuInfo]:
    """The GPUs NVML sees on this machine ([] without NVML or GPU). `nvml`: a pynvml-like object (tests)."""
    try:
        nv = nvml if nvml is not None else _import_pynvml()
        nv.nvmlInit()
    except Exception:  # noqa: BLE001 - no pynvml, no driver
        return []
    try:
        out: list[GpuInfo] = []
        for i, name, h in _enumerate(nv):
            try:
                mem: float | None = nv.nvmlDeviceGetMemoryInfo(h).total / _GIB
            except Exception:  # noqa: BLE001 - NotSupported on unified-memory GPUs
                mem = None
            out.append(GpuInfo(i, name, mem))
        return out
    except Exception:  # noqa: BLE001
        return []
    finally:
        with contextlib.suppress(Exception):
            nv.nvmlShutdown()


def describe_gpus(nvml: Nvml | None = None) -> list[str]:
    """`list_gpus()` as lines: "0: NVIDIA H200 (140 GiB)"."""
    return [g.describe() for g in list_gpus(nvml)]


class GpuSampler:
    """NVML readings per GPU every `interval_s` in a background thread.

    Built without NVML (pynvml missing, no driver, no GPU), it is a no-op: `available` False and `reason`
    says why; `frame()` is empty and summaries carry the reason. `nvml` may be any object with pynvml's
    functions (tests pass a fake); `clock` returns perf_counter_ns-compatible stamps.
    """

    def __init__(self, interval_s: float = 1.0, nvml: Nvml | None = None, indices: Sequence[int] | None = None,
                 clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.interval_s = float(interval_s)
        self.clock = clock
        self.available = False
        self.reason = ""
        self.names: list[str] = []
        self.indices: list[int] = []
        self._handles: list[object] = []
        self._nvml: Nvml | None = None
        self.t_ns: array[int] = array("q")
        self.gpu: array[int] = array("b")
        self.cols: dict[str, array[float]] = {c: array("d") for c in GPU_COLUMNS}
        self.errors = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        try:
            nv = nvml if nvml is not None else _import_pynvml()
        except Exception as e:  # noqa: BLE001 - ImportError and anything a broken install raises
            self.reason = f"pynvml cannot be imported ({clean_text(error_text(e))}); install nvidia-ml-py"
            return
        try:
            nv.nvmlInit()
        except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded...
            self.reason = f"NVML is not available: nvmlInit failed ({_err_text(e)}); no NVIDIA driver or GPU here?"
            return
        try:
            for i, name, h in _enumerate(nv, indices):
                self.names.append(name)
                self.indices.append(i)
                self._handles.append(h)
        except Exception as e:  # noqa: BLE001
            self.reason = f"NVML could not list the GPUs ({_err_text(e)})"
            with contextlib.suppress(Exception):
                nv.nvmlShutdown()
            return
        if not self._handles:
            self.reason = "NVML found no GPU" if indices is None else f"NVML found none of the GPUs {list(indices)}"
            with contextlib.suppress(Exception):
                nv.nvmlShutdown()
            return
        self._nvml = nv
        self.available = True

    # --- sampling -------------------------------------------------------------------------------------
    def sample_once(self) -> None:
        """Read every GPU once (a field the GPU does not support stays NaN). No-op without NVML."""
        nv = self._nvml
        if not self.available or nv is None:
            return
        t = self.clock()
        readings: list[list[float]] = []
        for h in self._handles:
            row = [math.nan] * len(GPU_COLUMNS)
            try:
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                row[0] = mem.used / _GIB
                row[1] = mem.total / _GIB
            except Exception:  # noqa: BLE001 - NotSupported on unified-memory GPUs (GB10)
                self.errors += 1
            try:
                row[2] = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
            except Exception:  # noqa: BLE001
                self.errors += 1
            try:
                row[3] = nv.nvmlDeviceGetPowerUsage(h) / 1000.0  # mW -> W
            except Exception:  # noqa: BLE001
                self.errors += 1
            try:
                row[4] = float(nv.nvmlDeviceGetClockInfo(h, getattr(nv, "NVML_CLOCK_SM", 1)))
            except Exception:  # noqa: BLE001
                self.errors += 1
            try:
                row[5] = float(nv.nvmlDeviceGetTemperature(h, getattr(nv, "NVML_TEMPERATURE_GPU", 0)))
            except Exception:  # noqa: BLE001
                self.errors += 1
            try:
                row[6] = nv.nvmlDeviceGetTotalEnergyConsumption(h) / 1000.0  # mJ -> J (Volta and later)
            except Exception:  # noqa: BLE001 - optional: the trapezoid of power is the reference
                pass
            readings.append(row)
        with self._lock:
            for k, row in enumerate(readings):
                self.t_ns.append(t)
                self.gpu.append(k)
                for c, v in zip(GPU_COLUMNS, row, strict=True):
                    self.cols[c].append(v)

    def start(self) -> None:
        """Sample in a daemon thread until `stop()` (no-op without NVML)."""
        if not self.available or self._thread is not None:
            return
        self._stop.clear()
        self.sample_once()
        self._thread = threading.Thread(target=self._run, name="servescope-gpu-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        nxt = time.perf_counter() + self.interval_s
        while not self._stop.wait(max(0.0, nxt - time.perf_counter())):
            try:
                self.sample_once()
            except Exception:  # noqa: BLE001 - never let telemetry kill a run
                self.errors += 1
            nxt += self.interval_s
            if nxt < time.perf_counter():
                nxt = time.perf_counter() + self.interval_s

    def stop(self) -> None:
        th, self._thread = self._thread, None
        if th is not None:
            self._stop.set()
            th.join(max(2.0, self.interval_s * 2))
            with contextlib.suppress(Exception):
                self.sample_once()  # a closing sample so the last window is covered

    def close(self) -> None:
        self.stop()
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()

    def latest(self, seen: int = 0) -> tuple[int, list[dict[str, float]] | None]:
        """(rows so far, the newest reading of every GPU as dicts of GPU_COLUMNS plus `gpu` (its NVML index),
        or None when there is no row beyond `seen`): for live panels."""
        with self._lock:
            n = len(self.t_ns)
            if n <= seen or not self.indices:
                return n, None
            k = len(self.indices)
            return n, [{c: self.cols[c][i] for c in self.cols} | {"gpu": self.indices[self.gpu[i]]}
                       for i in range(max(0, n - k), n)]

    # --- results --------------------------------------------------------------------------------------
    def frame(self) -> pl.DataFrame:
        """Long format: `t_ns`, `gpu` (position in `indices`), `gpu_index`, `name` and one column per reading."""
        import polars as pl

        with self._lock:
            gpus = self.gpu.tolist()
            data: dict[str, pl.Series] = {
                "t_ns": pl.Series("t_ns", self.t_ns.tolist(), dtype=pl.Int64),
                "gpu": pl.Series("gpu", gpus, dtype=pl.Int8),
                "gpu_index": pl.Series("gpu_index", [self.indices[g] for g in gpus], dtype=pl.Int16),
                "name": pl.Series("name", [self.names[g] for g in gpus], dtype=pl.Utf8),
            }
            for c, arr in self.cols.items():
                data[c] = pl.Series(c, arr.tolist(), dtype=pl.Float64).fill_nan(None)
        return pl.DataFrame(data)

    def _series(self, g: int, col: str) -> tuple[list[int], list[float]]:
        with self._lock:
            ts = [t for t, k in zip(self.t_ns, self.gpu, strict=True) if k == g]
            vs = [v for v, k in zip(self.cols[col], self.gpu, strict=True) if k == g]
        pairs = [(t, v) for t, v in zip(ts, vs, strict=True) if not math.isnan(v)]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def _energy_j(self, g: int, t0: int, t1: int) -> tuple[float | None, float]:
        """Trapezoid integral of power over [t0, t1] for GPU g: (joules, seconds covered). Ends between two
        samples are interpolated; within 2 intervals outside the samples the nearest reading is held."""
        ts, ps = self._series(g, "power_w")
        if not ts or t1 <= t0:
            return None, 0.0
        hold = int(2 * self.interval_s * 1e9)
        a = max(t0, ts[0] - hold) if ts[0] > t0 else t0
        b = min(t1, ts[-1] + hold) if ts[-1] < t1 else t1
        if b <= a:
            return None, 0.0

        def p_at(t: int) -> float:
            if t <= ts[0]:
                return ps[0]
            if t >= ts[-1]:
                return ps[-1]
            i = bisect_right(ts, t)
            ta, tb = ts[i - 1], ts[i]
            return ps[i - 1] + (ps[i] - ps[i - 1]) * (t - ta) / (tb - ta) if tb > ta else ps[i]

        pts = [(a, p_at(a))]
        i0 = bisect_right(ts, a)
        i1 = bisect_left(ts, b)
        pts += [(ts[i], ps[i]) for i in range(i0, i1)]
        pts.append((b, p_at(b)))
        joules = 0.0
        for (ta, pa), (tb, pb) in zip(pts, pts[1:], strict=False):
            joules += (pa + pb) / 2.0 * (tb - ta) / 1e9
        return joules, (b - a) / 1e9

    def window_summary(self, t0_ns: int, t1_ns: int, output_tokens: int = 0,
                       price_usd_per_kwh: float | None = None) -> GpuWindow:
        """GPU figures for one window (all GPUs together unless said per GPU):

        energy_wh = sum over GPUs of the trapezoid integral of power over [t0, t1] / 3600;
        wh_per_1m_output_tokens = energy_wh / output_tokens x 1e6;
        cost_usd_per_1m_output_tokens = wh_per_1m_output_tokens / 1000 x price_usd_per_kwh.
        """
        duration = max(0, t1_ns - t0_ns) / 1e9
        empty = GpuWindow(available=self.available, reason=self.reason or None, gpus=len(self._handles),
                          names=list(self.names), duration_s=duration, output_tokens=output_tokens,
                          price_usd_per_kwh=price_usd_per_kwh)
        if not self.available:
            return empty
        with self._lock:
            lo = bisect_left(self.t_ns, t0_ns)
            hi = bisect_right(self.t_ns, t1_ns)
            gpu = self.gpu[lo:hi].tolist()
            t_in = self.t_ns[lo:hi].tolist()
            win = {c: self.cols[c][lo:hi].tolist() for c in GPU_COLUMNS}

        def vals(col: str, g: int | None = None) -> list[float]:
            return [v for v, k in zip(win[col], gpu, strict=True) if (g is None or k == g) and not math.isnan(v)]

        def mean(xs: list[float]) -> float | None:
            return sum(xs) / len(xs) if xs else None

        # sums over GPUs at each sample time
        by_t: dict[int, dict[str, float]] = {}
        for i, t in enumerate(t_in):
            d = by_t.setdefault(t, {})
            for c in ("mem_used_gib", "power_w"):
                v = win[c][i]
                if not math.isnan(v):
                    d[c] = d.get(c, 0.0) + v
        mem_tot = [d["mem_used_gib"] for d in by_t.values() if "mem_used_gib" in d]
        pow_tot = [d["power_w"] for d in by_t.values() if "power_w" in d]
        totals = [max(vals("mem_total_gib", g), default=0.0) for g in range(len(self._handles))]
        temps = vals("temp_c")

        energy_j = 0.0
        covered: list[float] = []
        counter_j: float | None = 0.0
        any_energy = False
        per_gpu: list[GpuStat] = []
        for g in range(len(self._handles)):
            j, secs = self._energy_j(g, t0_ns, t1_ns)
            e_counter = vals("energy_j", g)
            cj = (e_counter[-1] - e_counter[0]) if len(e_counter) >= 2 else None
            if cj is None or counter_j is None:
                counter_j = None
            else:
                counter_j += cj
            if j is not None:
                any_energy = True
                energy_j += j
                covered.append(secs)
            per_gpu.append(GpuStat(
                index=self.indices[g],
                name=self.names[g],
                energy_wh=j / 3600.0 if j is not None else None,
                mem_used_gib_peak=max(vals("mem_used_gib", g), default=None),
                mem_total_gib=totals[g] or None,
                util_pct_mean=mean(vals("util_pct", g)),
                power_w_mean=mean(vals("power_w", g)),
                temp_c_max=max(vals("temp_c", g), default=None),
            ))
        wh: float | None = None
        per_m: float | None = None
        cost: float | None = None
        coverage: float | None = None
        if any_energy:
            wh = energy_j / 3600.0
            coverage = (min(covered) / duration) if duration > 0 and covered else None
            if output_tokens > 0:
                per_m = wh / output_tokens * 1e6
                if price_usd_per_kwh is not None:
                    cost = per_m / 1000.0 * price_usd_per_kwh
        return msgspec.structs.replace(
            empty,
            samples=len(set(t_in)),
            energy_wh=wh,
            energy_coverage=coverage,
            energy_wh_counter=counter_j / 3600.0 if counter_j is not None and len(self._handles) else None,
            wh_per_1m_output_tokens=per_m,
            cost_usd_per_1m_output_tokens=cost,
            mem_used_gib_peak=max(mem_tot) if mem_tot else None,
            mem_total_gib=sum(totals) if any(totals) else None,
            util_pct_mean=mean(vals("util_pct")),
            power_w_mean=mean(pow_tot),
            power_w_peak=max(pow_tot) if pow_tot else None,
            sm_clock_mhz_mean=mean(vals("sm_clock_mhz")),
            temp_c_max=max(temps) if temps else None,
            per_gpu=per_gpu,
        )


def _err_text(e: BaseException) -> str:
    return clean_text(error_text(e))[:200]
