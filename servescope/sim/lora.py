"""LoRA adapters in the simulator: vLLM's `--lora-modules NAME=PATH ...` read, the GPU slots adapters are swapped
into (`--max-loras`), what they cost a step, and vLLM's `vllm:lora_requests_info` gauge.

What is modelled, as vLLM V1's scheduler and LoRA manager run it:
- A request names its adapter as its `model`; the base model's name means no adapter.
- A step's batch holds requests of at most `max_loras` distinct adapters: a waiting request whose adapter would be
  one too many is skipped (it waits) and the next waiting one is looked at.
- The adapters a batch uses must sit in the GPU's `max_loras` slots; one that does not is loaded into the least
  recently used free slot (a swap): its weights cross the host link (`HOST_LINK_GBS`) plus a fixed load cost, time
  added to the step that first runs it.
- A step with adapters pays for them: each distinct adapter's weights are read once (at the GPU's bandwidth), each
  adapter token computes through the low-rank matrices, and each distinct adapter is a segment of the LoRA kernels
  (`SEGMENT_MS`).
- An adapter's size follows its rank: about dense_params x 2 x rank / hidden (the low-rank pair of every linear
  layer, as with target modules "all-linear"), in 16 bits.

Not modelled: the CPU cache of adapters (`--max-cpu-loras`) and loading them from disk, adapters of different
ranks, LoRA on the embeddings or the LM head.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

HOST_LINK_GBS = 25.0  # host -> GPU copy of an adapter's weights (PCIe 4.0 x16, as achieved)
LOAD_MS = 0.5  # a swap's fixed cost besides the copy (allocation, slot bookkeeping)
SEGMENT_MS = 0.05  # one more adapter segment in a step's LoRA kernels (launch and reduction)
DEFAULT_MAX_LORAS = 1  # vLLM's default --max-loras
DEFAULT_MAX_LORA_RANK = 16  # vLLM's default --max-lora-rank
LORA_INFO = "vllm:lora_requests_info"
MAX_INFO_SERIES = 64  # label sets kept for the gauge (vLLM keeps every one it ever set)


class LoraModulesError(ValueError):
    """`--lora-modules` that vLLM would refuse; the message is one line."""


def parse_lora_modules(items: list[str]) -> dict[str, str]:
    """`NAME=PATH` words (vLLM's old format; a JSON object `{"name": ..., "path": ...}` too) -> {name: path}."""
    import json

    out: dict[str, str] = {}
    for item in items:
        if not item:
            continue
        if "=" in item and "," not in item and not item.lstrip().startswith("{"):
            name, path = item.split("=", 1)
        else:
            try:
                d = json.loads(item)
                name, path = str(d["name"]), str(d["path"])
            except (ValueError, TypeError, KeyError):
                raise LoraModulesError(f"--lora-modules {item!r}: give NAME=PATH (or a JSON object with name and "
                                       "path)") from None
        name = name.strip()
        if not name or not path.strip():
            raise LoraModulesError(f"--lora-modules {item!r}: give NAME=PATH, both non-empty")
        out[name] = path
    return out


@dataclass(frozen=True)
class LoraCost:
    """What adapters cost a step on one profile's GPU (seconds)."""

    adapter_bytes: float
    bandwidth: float  # bytes/s the GPU reads weights at
    gemm_rate: float  # FLOP/s of the small low-rank matmuls

    @property
    def swap_s(self) -> float:
        return self.adapter_bytes / (HOST_LINK_GBS * 1e9) + LOAD_MS / 1e3

    def step_s(self, adapters: int, adapter_tokens: int) -> float:
        """The step's extra time for `adapters` distinct adapters over `adapter_tokens` tokens that use one."""
        if not adapters:
            return 0.0
        read = adapters * self.adapter_bytes / self.bandwidth
        compute = adapter_tokens * self.adapter_bytes / self.gemm_rate  # 2 FLOPs per 16-bit weight per token
        return read + compute + adapters * SEGMENT_MS / 1e3


def adapter_bytes(dense_params_b: float, hidden: int, rank: int) -> float:
    return dense_params_b * 1e9 * 2.0 * rank / max(hidden, 1) * 2.0


class LoraSlots:
    """The GPU's adapter slots: which adapters are loaded (least recently used first), and how many swaps so far."""

    def __init__(self, max_loras: int) -> None:
        self.max_loras = max(1, max_loras)
        self.loaded: OrderedDict[str, None] = OrderedDict()
        self.swaps = 0

    def use(self, name: str, active: set[str]) -> bool:
        """Mark `name` used by the step; True when it had to be loaded (a swap), evicting the least recently used
        adapter no running request holds."""
        if name in self.loaded:
            self.loaded.move_to_end(name)
            return False
        if len(self.loaded) >= self.max_loras:
            victim = next((a for a in self.loaded if a not in active), None)
            if victim is None:  # cannot happen: admission keeps active adapters within max_loras
                victim = next(iter(self.loaded))
            del self.loaded[victim]
        self.loaded[name] = None
        self.swaps += 1
        return True


class LoraInfo:
    """`vllm:lora_requests_info`: a gauge whose labels name the adapters with running and waiting requests, set to
    the time it was set; as in vLLM, every label set it was ever set with stays in the output (the most recent
    `MAX_INFO_SERIES` here), so the newest value is the current state."""

    def __init__(self, max_loras: int) -> None:
        self.max_loras = max_loras
        self.series: OrderedDict[tuple[str, str], float] = OrderedDict()

    def set(self, running: list[str], waiting: list[str], now: float) -> None:
        key = (",".join(running), ",".join(waiting))
        self.series.pop(key, None)
        self.series[key] = now
        while len(self.series) > MAX_INFO_SERIES:
            self.series.popitem(last=False)

    def render(self, out: list[str]) -> None:
        out.append(f"# HELP {LORA_INFO} Running stats on lora requests.")
        out.append(f"# TYPE {LORA_INFO} gauge")
        for (running, waiting), t in self.series.items():
            out.append(f'{LORA_INFO}{{max_lora="{self.max_loras}",running_lora_adapters="{_label(running)}",'
                       f'waiting_lora_adapters="{_label(waiting)}"}} {t!r}')


def _label(v: str) -> str:
    """A Prometheus label value: backslash, double quote and newline escaped."""
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
