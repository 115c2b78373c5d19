"""Simulator profiles: one TOML file per model x GPU x quantization x memory setting, and the roofline.

A profile names the model's shape (parameters, attention layout, KV cache dtype), the GPU (memory,
bandwidth, FLOP/s), vLLM's engine settings and a handful of efficiency factors. Everything the
simulator does is derived from these numbers by `CostModel`; nothing is fitted to a curve.
Profiles live in ``servescope/sim/profiles/`` (``NAME.toml``, subfolders allowed), or anywhere on disk
when `--profile` is given a path to a ``.toml`` file.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

try:
    import tomllib
except ImportError:  # pragma: no cover (Python 3.10)
    import tomli as tomllib  # type: ignore[no-redef]

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

PROFILES_DIR = Path(__file__).parent / "profiles"
DEFAULT_PROFILE = "rtx-pro-6000/qwen3.5-35b-a3b-gptq-int4"
GIB = 1024**3
KV_DTYPE_BYTES = {"auto": 2.0, "bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0}

_T = TypeVar("_T", bound="DataclassInstance")  # a profile section: ModelSpec, GpuSpec, ...


class ProfileError(Exception):
    """A profile that cannot be found or read; the message lists what is available."""


@dataclass(frozen=True)
class ModelSpec:
    served_name: str
    max_model_len: int
    dense_params_b: float  # linear weights every token uses (attention, linear attention, dense/shared FFN)
    lm_head_params_b: float  # output projection, kept in 16 bits, read every step
    other_params_b: float = 0.0  # resident but not read per step: embeddings, vision encoder (16 bits)
    expert_params_b: float = 0.0  # routed experts, all of them
    num_experts: int = 0
    experts_per_token: int = 0
    expert_routing_skew: float = 0.0  # Zipf exponent of expert popularity within a batch; 0: uniform routing
    weight_bits: float = 16.0  # bits per quantized weight, scales included (GPTQ/AWQ g128: 4.25, FP8: 8.06)
    unquantized_params_b: float = 0.0  # linear weights the quantizer left in 16 bits, read every step
    num_layers: int = 32
    full_attention_layers: int = 32  # layers whose KV cache grows with the context
    sliding_window_layers: int = 0
    sliding_window: int = 0
    num_q_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    kv_cache_dtype: str = "auto"
    state_bytes_per_seq: float = 0.0  # fixed recurrent state (linear attention / Mamba), per request
    add_bos_token: bool = False
    reasoning: bool = False
    reasoning_fraction: float = 0.75
    thinking_default: bool = False

    def __post_init__(self) -> None:
        v = self.expert_routing_skew
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise TypeError(f"expert_routing_skew must be a number >= 0, got {v!r}")
        if v and not (self.num_experts > 0 and self.experts_per_token > 0):
            raise TypeError("expert_routing_skew needs num_experts and experts_per_token (a MoE model)")
        if self.num_experts > 0 and not 0 <= self.experts_per_token <= self.num_experts:
            raise TypeError(f"experts_per_token must be between 0 and num_experts ({self.num_experts}), "
                            f"got {self.experts_per_token!r}")


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_gib: float
    bandwidth_gbs: float
    peak_tflops: float  # dense tensor FLOP/s at the precision the matmuls run in


@dataclass(frozen=True)
class EngineSpec:
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    activation_reserve_gib: float = 2.0  # non-KV runtime memory: activations, CUDA graphs, workspace
    kv_cache_tokens: int = 0  # 0: derive from memory; otherwise as vLLM logged it
    enable_prefix_caching: bool = True
    # speculative decoding (servescope.sim.specdecode; `--speculative-config`): off when the method is ""
    speculative_method: str = ""
    num_speculative_tokens: int = 0
    spec_acceptance: float = 0.0  # a drafted token's acceptance when the request does not say; 0: the method's
    # LoRA adapters (servescope.sim.lora; `--enable-lora`, `--max-loras`, `--max-lora-rank`)
    enable_lora: bool = False
    max_loras: int = 1
    max_lora_rank: int = 16

    def __post_init__(self) -> None:
        a = self.spec_acceptance
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 <= a <= 1:
            raise TypeError(f"spec_acceptance must be a number from 0 to 1, got {a!r}")
        for name in ("num_speculative_tokens", "max_loras", "max_lora_rank"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise TypeError(f"{name} must be a whole number >= 0, got {v!r}")
        if self.speculative_method and self.num_speculative_tokens < 1:
            raise TypeError("speculative_method needs num_speculative_tokens >= 1")


@dataclass(frozen=True)
class EfficiencySpec:
    bandwidth_eff: float = 0.8  # fraction of peak memory bandwidth reached by decode kernels
    gemm_eff: float = 0.7  # fraction of peak FLOP/s reached by large matmuls
    gemm_half_rows: float = 128.0  # rows (tokens per matmul, per expert for MoE) at half of gemm_eff
    attention_eff: float = 0.4  # fraction of peak FLOP/s reached by prefill attention
    step_overhead_ms: float = 1.0  # GPU side, fixed per step: kernel launches / graph replay, sampling
    host_overhead_ms: float = 1.0  # CPU side, fixed per step: scheduling, input preparation
    per_seq_overhead_us: float = 5.0  # CPU side, per scheduled sequence per step: input prep, detokenize
    async_scheduling: bool = True  # CPU work of step k+1 overlaps GPU work of step k (vLLM >= 0.11)
    frontend_ms: float = 5.0  # per request, before the engine sees it: HTTP, template, tokenize
    decode_slowdown: float = 1.0  # a fault (`--slow-decode F`): decode-only steps take (1 + F) x as long


@dataclass(frozen=True)
class QualitySpec:
    """How far the simulated model's answers fall from the undegraded one (`servescope.sim.model`,
    `servescope.sim.tasks`): all 0 is the reference model itself."""

    error_rate: float = 0.0  # share of exact-answer tasks answered wrong
    long_context_error_per_16k: float = 0.0  # retrieval/needle: added to error_rate per 16,384 prompt tokens
    logit_noise: float = 0.0  # standard deviation (nats) of the Gaussian noise added to every logit
    seed: int = 0  # seeds the noise and the error draws

    def __post_init__(self) -> None:
        for name in ("error_rate", "long_context_error_per_16k", "logit_noise"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise TypeError(f"{name} must be a number >= 0, got {v!r}")
        if self.error_rate > 1:
            raise TypeError(f"error_rate must be at most 1, got {self.error_rate!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise TypeError(f"seed must be an integer, got {self.seed!r}")


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    model: ModelSpec
    gpu: GpuSpec
    engine: EngineSpec = field(default_factory=EngineSpec)
    efficiency: EfficiencySpec = field(default_factory=EfficiencySpec)
    quality: QualitySpec = field(default_factory=QualitySpec)

    def with_overrides(self, **engine: Any) -> Profile:
        kept = {k: v for k, v in engine.items() if v is not None}
        model_kw = {k: kept.pop(k) for k in ("max_model_len", "served_name") if k in kept}
        eff_kw = {k: kept.pop(k) for k in ("decode_slowdown",) if k in kept}
        return Profile(
            self.name,
            self.description,
            _replace(self.model, **model_kw),
            self.gpu,
            _replace(self.engine, **kept),
            _replace(self.efficiency, **eff_kw),
            self.quality,
        )


def _replace(obj: Any, **kw: Any) -> Any:
    from dataclasses import replace

    return replace(obj, **kw) if kw else obj


def _build(cls: type[_T], data: object, where: str) -> _T:
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: must be a table of keys, got {data!r}")
    names = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ProfileError(f"{where}: unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    try:
        return cls(**data)
    except TypeError as e:
        raise ProfileError(f"{where}: {e}") from None


def list_profiles() -> list[str]:
    """Names of the shipped profiles, sorted (`tiny`, `rtx-pro-6000/...`)."""
    return sorted(p.relative_to(PROFILES_DIR).with_suffix("").as_posix() for p in PROFILES_DIR.rglob("*.toml"))


def profile_path(name: str) -> Path:
    if name.endswith(".toml") and Path(name).is_file():
        return Path(name)
    path = PROFILES_DIR / f"{name}.toml"
    if ".." in Path(name).parts or not path.is_file():
        raise ProfileError(f"unknown profile {name!r}; available: {', '.join(list_profiles())}")
    return path


def load_profile(name: str) -> Profile:
    path = profile_path(name)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ProfileError(f"cannot read profile {path}: not UTF-8 text (a binary file?); give a profile's "
                           ".toml file or a name from `servescope sim --list`") from None
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ProfileError(f"cannot read profile {path}: {e}") from None
    return profile_from_dict(data, name if not name.endswith(".toml") else path.stem, str(path))


def profile_from_dict(data: Mapping[str, object], name: str, where: str) -> Profile:
    """A profile from a profile file's parsed TOML (`where` names the file in errors); other top-level tables,
    such as a twin's [fit], are the caller's."""
    try:
        return Profile(
            name=name,
            description=str(data.get("description", "")),
            model=_build(ModelSpec, data["model"], f"{where} [model]"),
            gpu=_build(GpuSpec, data["gpu"], f"{where} [gpu]"),
            engine=_build(EngineSpec, data.get("engine", {}), f"{where} [engine]"),
            efficiency=_build(EfficiencySpec, data.get("efficiency", {}), f"{where} [efficiency]"),
            quality=_build(QualitySpec, data.get("quality", {}), f"{where} [quality]"),
        )
    except KeyError as e:
        raise ProfileError(f"{where}: missing section [{e.args[0]}]") from None


def describe(name: str) -> str:
    try:
        text = profile_path(name).read_text(encoding="utf-8")
        return str(tomllib.loads(text).get("description", ""))
    except (ProfileError, OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return "(unreadable)"


def _expert_hit_probs(num_experts: int, top_k: int, skew: float) -> tuple[float, ...]:
    """Per-token probability that each expert is routed to: k x Zipf(skew) popularity, capped at 1 (an
    expert cannot be picked twice by one token) with the excess spread over the others, so they sum to k."""
    weights = [(i + 1) ** -skew for i in range(num_experts)]
    total = math.fsum(weights)
    q = [top_k * w / total for w in weights]
    capped = 0
    while capped < num_experts and q[capped] > 1.0:  # q is non-increasing: the capped ones come first
        excess = q[capped] - 1.0
        q[capped] = 1.0
        capped += 1
        rest = math.fsum(q[capped:])
        if rest <= 0:
            break
        q[capped:] = [x + excess * x / rest for x in q[capped:]]
    return tuple(q)


class CostModel:
    """Memory and step-time arithmetic for one profile (all derived quantities live here)."""

    def __init__(self, p: Profile) -> None:
        m, g, e, eff = p.model, p.gpu, p.engine, p.efficiency
        self.profile = p
        self.block_size = e.block_size
        self.decode_slowdown = eff.decode_slowdown
        wbytes = m.weight_bits / 8.0
        self.dense_bytes = m.dense_params_b * 1e9 * wbytes + m.unquantized_params_b * 1e9 * 2.0
        self.expert_bytes = m.expert_params_b * 1e9 * wbytes
        self.lm_head_bytes = m.lm_head_params_b * 1e9 * 2.0
        self.weight_bytes = self.dense_bytes + self.expert_bytes + self.lm_head_bytes + m.other_params_b * 1e9 * 2.0
        self.moe = m.num_experts > 0 and m.experts_per_token > 0
        self.num_experts = m.num_experts
        self.topk_frac = m.experts_per_token / m.num_experts if self.moe else 0.0
        # per-token probability that each expert is among its top-k (uniform unless routing is skewed)
        self._expert_hit_p = (
            _expert_hit_probs(m.num_experts, m.experts_per_token, m.expert_routing_skew)
            if self.moe and m.expert_routing_skew > 0
            else None
        )
        self._touched_memo: dict[int, float] = {}
        # FLOPs per token: 2 x the weights a token passes through
        self.dense_flops_tok = 2e9 * (m.dense_params_b + m.unquantized_params_b + m.lm_head_params_b)
        self.expert_flops_tok = 2e9 * m.expert_params_b * self.topk_frac
        # attention FLOPs per (query token x context token): QK^T and PV over full-attention layers
        self.attn_flops_pair = 4.0 * m.num_q_heads * m.head_dim * m.full_attention_layers
        kvb = KV_DTYPE_BYTES.get(m.kv_cache_dtype, 2.0)
        per_layer = 2.0 * m.num_kv_heads * m.head_dim * kvb
        self.kv_full_bpt = per_layer * m.full_attention_layers
        self.kv_slide_bpt = per_layer * m.sliding_window_layers
        self.kv_bytes_per_token = self.kv_full_bpt + self.kv_slide_bpt
        self.window = m.sliding_window
        self.state_bytes = m.state_bytes_per_seq
        self.bandwidth = g.bandwidth_gbs * 1e9 * eff.bandwidth_eff
        self.gemm_peak = g.peak_tflops * 1e12 * eff.gemm_eff
        self.attn_peak = g.peak_tflops * 1e12 * eff.attention_eff
        self.half_rows = eff.gemm_half_rows
        self.step_overhead = eff.step_overhead_ms / 1e3
        self.host_overhead = eff.host_overhead_ms / 1e3
        # vLLM 0.32 turns asynchronous scheduling off with a CPU proposer (n-gram, suffix: it says so in its log)
        self.async_scheduling = eff.async_scheduling and e.speculative_method not in ("ngram", "suffix")
        self.per_seq_overhead = eff.per_seq_overhead_us / 1e6
        self.frontend_s = eff.frontend_ms / 1e3
        # KV pool
        self.available_kv_bytes = (
            g.memory_gib * GIB * e.gpu_memory_utilization - self.weight_bytes - e.activation_reserve_gib * GIB
        )
        if e.kv_cache_tokens > 0:
            self.kv_cache_tokens = e.kv_cache_tokens
        elif self.kv_bytes_per_token > 0:
            self.kv_cache_tokens = max(0, int(self.available_kv_bytes // self.kv_bytes_per_token))
        else:
            self.kv_cache_tokens = 0
        self.num_blocks = self.kv_cache_tokens // self.block_size
        block_bytes = max(self.kv_bytes_per_token * self.block_size, 1.0)
        self.state_blocks = math.ceil(self.state_bytes / block_bytes) if self.state_bytes else 0

    # --- memory -----------------------------------------------------------------------------------------
    def footprint_tokens(self, tokens: int) -> float:
        """KV tokens a request of `tokens` holds, in full-attention-token units (sliding layers capped)."""
        if not self.kv_slide_bpt:
            return float(tokens)
        capped = min(tokens, self.window + self.block_size) if self.window else tokens
        return (self.kv_full_bpt * tokens + self.kv_slide_bpt * capped) / self.kv_bytes_per_token

    def blocks_for(self, tokens: int) -> int:
        if tokens <= 0:
            return 0
        return math.ceil(self.footprint_tokens(tokens) / self.block_size) + self.state_blocks

    def max_concurrency(self, tokens: int) -> float:
        return self.num_blocks / max(self.blocks_for(tokens), 1)

    # --- time -------------------------------------------------------------------------------------------
    def _gemm_rate(self, rows: float) -> float:
        return self.gemm_peak * rows / (rows + self.half_rows)

    def touched_experts(self, num_tokens: int) -> float:
        """Expected share of the routed experts that a step of `num_tokens` tokens reads (per MoE layer).

        Uniform routing: 1 - (1 - k/E)^tokens. Skewed routing (`expert_routing_skew` s > 0): expert i is in a
        token's top-k with probability q_i (Zipf popularity i^-s, sum k, none above 1), and the share is
        mean(1 - (1 - q_i)^tokens): k/E at one token, fewer than uniform in between, all of them at large batches.
        """
        if self._expert_hit_p is None:
            return 1.0 - (1.0 - self.topk_frac) ** num_tokens
        share = self._touched_memo.get(num_tokens)
        if share is None:
            share = math.fsum(1.0 - (1.0 - q) ** num_tokens for q in self._expert_hit_p) / self.num_experts
            if len(self._touched_memo) < 65536:
                self._touched_memo[num_tokens] = share
        return share

    def step_time(self, num_tokens: int, num_seqs: int, kv_read_tokens: float, attn_pairs: float,
                  verify_pairs: float = 0.0) -> float:
        """Seconds for one engine step.

        num_tokens: tokens computed this step (decodes + prefill chunk tokens + drafted tokens verified); num_seqs:
        sequences in it; kv_read_tokens: KV entries read (sum of contexts, full-attention-token units);
        attn_pairs: (query, key) pairs of prefill attention over full-attention layers; verify_pairs: those of
        speculative decoding's verification (computed as prefill's are, but the step is still a decode step).
        """
        if num_tokens <= 0:
            return 0.0
        weight_bytes = self.dense_bytes + self.lm_head_bytes
        compute = self.dense_flops_tok * num_tokens / self._gemm_rate(num_tokens)
        if self.moe:
            touched = self.touched_experts(num_tokens)
            weight_bytes += self.expert_bytes * touched
            rows_per_expert = num_tokens * self.topk_frac / touched
            compute += self.expert_flops_tok * num_tokens / self._gemm_rate(rows_per_expert)
        compute += self.attn_flops_pair * (attn_pairs + verify_pairs) / self.attn_peak
        mem_bytes = weight_bytes + self.kv_bytes_per_token * kv_read_tokens + 2.0 * self.state_bytes * num_seqs
        memory = mem_bytes / self.bandwidth
        gpu = self.step_overhead + max(memory, compute)
        host = self.host_overhead + self.per_seq_overhead * num_seqs
        t = max(gpu, host) if self.async_scheduling else gpu + host
        return t * self.decode_slowdown if attn_pairs == 0.0 else t

    def decode_step_time(self, batch: int, context: int) -> float:
        return self.step_time(batch, batch, batch * self.footprint_tokens(context), 0.0)

    def prefill_time(self, prompt_len: int) -> float:
        """c=1 prefill: the chunked steps vLLM would run, ending with the first token."""
        chunk = self.profile.engine.max_num_batched_tokens
        t = 0.0
        done = 0
        while done < prompt_len:
            n = min(chunk, prompt_len - done)
            pairs = n * (done + (n + 1) / 2.0)
            t += self.step_time(n, 1, self.footprint_tokens(done), pairs)
            done += n
        return t

    def predict_c1(self, prompt_len: int, output_len: int) -> tuple[float, float]:
        """(TTFT, TPOT) in seconds for a lone request, as the roofline predicts them."""
        ttft = self.frontend_s + self.prefill_time(prompt_len)
        if output_len <= 1:
            return ttft, 0.0
        total = sum(self.decode_step_time(1, prompt_len + i) for i in range(1, output_len))
        return ttft, total / (output_len - 1)

    def weights_gib(self) -> float:
        return self.weight_bytes / GIB
