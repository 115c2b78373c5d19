"""The capacity twin's starting point: the measured server's shape as a simulator profile, before any fitting.

What the twin knows before it fits a single number (`servescope.engine.twin` fits the rest):
- the model's shape: the simulator profile a `sim://` session ran (or the profile whose served name a
  simulator reported), else the model's Hugging Face `config.json` (from `--model-config`, or the directory
  `/v1/models` named as the model's root when it exists on this machine), else a generic dense shape;
- the KV budget: the tokens the server reported (`vllm:cache_config_info`) and its block size;
- the scheduler's limits: from the launched server's arguments (`--max-num-seqs`,
  `--max-num-batched-tokens`), else inferred from the running/waiting series (running never above N while
  requests waited with the cache not full: `max_num_seqs` = N), else vLLM's defaults.
What-if knobs (`--gpu-memory-utilization`, `--kv-cache-dtype`, `--max-model-len`, `--max-num-seqs`) change a
profile here, the way vLLM would change its own budget.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import polars as pl

from servescope.core.errors import ServescopeError
from servescope.engine.simtarget import SCHEME
from servescope.engine.specsearch import spec_server_config, with_speculation
from servescope.sessions.store import Session
from servescope.sim.profile import (
    GIB,
    KV_DTYPE_BYTES,
    CostModel,
    EfficiencySpec,
    EngineSpec,
    GpuSpec,
    ModelSpec,
    Profile,
    ProfileError,
    list_profiles,
    load_profile,
)


def vllm_default_limits(gpu_memory_gib: float | None, gpu_name: str = "") -> tuple[int, int, str]:
    """vLLM's own defaults for an API server (its engine arguments, by device): (max_num_seqs,
    max_num_batched_tokens, what they were chosen by). A device this machine did not see (a remote server, a CPU
    build) gets the common case: 256 and 2048 (vLLM's CPU build: 128 and 2048)."""
    if gpu_memory_gib is None:
        return 256, 2048, "vLLM's defaults where the GPU is unknown or under 70 GiB"
    if gpu_memory_gib >= 160:
        return 1024, 16384, "vLLM's defaults for a GPU of 160 GiB or more"
    if gpu_memory_gib >= 70 and "a100" not in gpu_name.lower():
        return 1024, 8192, "vLLM's defaults for a GPU of 70 GiB or more (not an A100)"
    return 256, 2048, "vLLM's defaults for a GPU under 70 GiB (or an A100)"

# a placeholder accelerator for a server whose hardware is unknown: the fit's efficiencies then carry the rates
NOMINAL_GPU = GpuSpec(name="unknown (nominal: the fitted efficiencies carry the rates)", memory_gib=80.0,
                      bandwidth_gbs=1000.0, peak_tflops=100.0)


@dataclass(frozen=True)
class Shape:
    """A profile to fit, and where each part of it came from (shown by `twin fit` and stored with the fit)."""

    profile: Profile
    source: str  # "profile NAME" | "config PATH" | "generic dense shape (no config.json)"
    kv_source: str  # "server metrics" | "profile" | ...
    limits_source: str
    # whether the server schedules its next step while the device runs this one (vLLM's async scheduling) is
    # known from a simulator profile; for other servers the fit tries both and keeps the closer
    async_known: bool = False


def _sim_profile_name(session: Session) -> str | None:
    info = session.info
    url = info.target.url or ""
    if url.startswith(SCHEME):  # sessions before 2026-12-06 stored `sim://` alone for the default profile
        return url[len(SCHEME):].strip("/") or None
    try:
        models = json.loads(info.models_json or "[]")
    except ValueError:
        return None
    served = [m.get("id") for m in models if isinstance(m, dict) and m.get("owned_by") == "servescope-sim"]
    if not served:
        return None
    for name in list_profiles():
        try:
            if load_profile(name).model.served_name == served[0]:
                return name
        except ProfileError:
            continue
    return None


def _model_root(session: Session) -> Path | None:
    try:
        models = json.loads(session.info.models_json or "[]")
    except ValueError:
        return None
    for m in models:
        if isinstance(m, dict) and m.get("id") == session.info.model:
            root = m.get("root")
            if isinstance(root, str) and (Path(root) / "config.json").is_file():
                return Path(root)
    return None


def model_from_config(cfg: Mapping[str, object], served_name: str, max_model_len: int) -> ModelSpec:
    """A ModelSpec from a Hugging Face config.json (Llama, Qwen2/3, Qwen3-MoE, Mixtral, Mistral shapes)."""
    sub = cfg.get("text_config")
    text: Mapping[str, object] = sub if isinstance(sub, Mapping) else cfg

    def num(key: str, default: float = 0) -> float:
        v = text.get(key, default)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float(default)

    hidden = num("hidden_size")
    layers = int(num("num_hidden_layers"))
    heads = int(num("num_attention_heads")) or 1
    kv_heads = int(num("num_key_value_heads", heads)) or heads
    head_dim = int(num("head_dim")) or int(hidden // heads)
    inter = num("intermediate_size")
    vocab = num("vocab_size")
    if hidden <= 0 or layers <= 0 or vocab <= 0:
        raise ServescopeError("the model's config.json lacks hidden_size, num_hidden_layers or vocab_size: "
                              "give the config of a decoder-only model with --model-config")
    experts = int(num("num_experts") or num("num_local_experts") or num("n_routed_experts"))
    topk = int(num("num_experts_per_tok"))
    moe_inter = num("moe_intermediate_size") or inter
    attn = layers * hidden * (heads * head_dim + 2 * kv_heads * head_dim + heads * head_dim)
    if experts and topk:
        dense = attn + layers * 3 * hidden * num("shared_expert_intermediate_size")
        expert = layers * experts * 3 * hidden * moe_inter
    else:
        dense, expert = attn + layers * 3 * hidden * inter, 0.0
    q = cfg.get("quantization_config")
    bits = 16.0
    if isinstance(q, Mapping):
        b = q.get("bits") or q.get("w_bit")
        bits = float(b) + 0.25 if isinstance(b, (int, float)) else 8.06 if "fp8" in str(q.get("quant_method", "")) else 16.0
    tied = bool(cfg.get("tie_word_embeddings", False))
    return ModelSpec(
        served_name=served_name, max_model_len=max_model_len, dense_params_b=dense / 1e9,
        lm_head_params_b=hidden * vocab / 1e9, other_params_b=0.0 if tied else hidden * vocab / 1e9,
        expert_params_b=expert / 1e9, num_experts=experts if topk else 0, experts_per_token=topk if experts else 0,
        weight_bits=bits, num_layers=layers, full_attention_layers=layers, num_q_heads=heads, num_kv_heads=kv_heads,
        head_dim=head_dim,
    )


GENERIC_CONFIG = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                  "head_dim": 128, "intermediate_size": 14336, "vocab_size": 128256}


def _server_arg(args: object, flag: str) -> str | None:
    if not isinstance(args, Sequence) or isinstance(args, str):
        return None
    items = [str(a) for a in args]
    for i, a in enumerate(items):
        if a == flag and i + 1 < len(items):
            return items[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _inferred_max_seqs(session: Session) -> int | None:
    """running never above N while requests waited and the KV cache had room: the server's max_num_seqs."""
    path = session.path / "telemetry.parquet"
    if not path.is_file():
        return None
    try:
        t = pl.read_parquet(path, columns=["num_requests_running", "num_requests_waiting", "kv_cache_usage_perc"])
    except Exception:  # noqa: BLE001 - a damaged or old telemetry file: no inference
        return None
    queued = t.filter((pl.col("num_requests_waiting") > 0) & (pl.col("kv_cache_usage_perc") < 0.9))
    if queued.height < 2:
        return None
    top = queued["num_requests_running"].max()
    peak = t["num_requests_running"].max()
    if not isinstance(top, (int, float)) or not isinstance(peak, (int, float)) or top < 1 or peak > top:
        return None
    return int(top)


def session_shape(session: Session, model_config: Path | None = None, max_num_seqs: int | None = None,
                  max_num_batched_tokens: int | None = None) -> Shape:
    """The profile the fit starts from (efficiencies at neutral priors: the fit sets them)."""
    info = session.info
    max_len = int(info.max_model_len or 8192)
    name = None if model_config else _sim_profile_name(session)
    if name is not None:
        try:
            base = load_profile(name)
        except ProfileError as e:
            raise ServescopeError(f"the session ran the simulator's profile {name!r}, which this servescope lacks: "
                                  f"{e}") from None
        model, gpu, engine, source = base.model, base.gpu, base.engine, f"simulator profile {name}"
        eff = replace(EfficiencySpec(), async_scheduling=base.efficiency.async_scheduling)
        defaults_by = ""
    else:
        cfg_path = model_config / "config.json" if model_config and model_config.is_dir() else model_config
        root = _model_root(session) if cfg_path is None else None
        cfg_path = cfg_path or (root / "config.json" if root else None)
        if cfg_path is not None:
            try:
                cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as e:
                raise ServescopeError(f"cannot read the model's config {cfg_path}: {e}; give a Hugging Face "
                                      "config.json with --model-config") from None
            if not isinstance(cfg, dict):
                raise ServescopeError(f"{cfg_path}: not a JSON object; give a Hugging Face config.json")
            model, source = model_from_config(cfg, info.model, max_len), f"config {cfg_path}"
        else:
            model = model_from_config(GENERIC_CONFIG, info.model, max_len)
            source = "generic dense shape (32 layers, 8 KV heads x 128; no config.json: give --model-config)"
        gpu_info = info.gpu or {}
        gpu = NOMINAL_GPU
        mem = _gpu_memory_gib(session)
        names = gpu_info.get("names")
        label = str(names[0]) if isinstance(names, list) and names else "GPU"
        default_seqs, default_tokens, defaults_by = vllm_default_limits(mem, label)
        eff = EfficiencySpec()
        engine = EngineSpec(max_num_seqs=default_seqs, max_num_batched_tokens=default_tokens)
        if mem:
            gpu = replace(NOMINAL_GPU, name=f"{label} (nominal rates)", memory_gib=mem)
    model = replace(model, max_model_len=max_len)
    # the KV budget the server reported
    kv = info.kv_budget or {}
    kv_source = "profile"
    tokens = kv.get("kv_cache_tokens")
    if isinstance(tokens, (int, float)) and tokens > 0:
        block = kv.get("block_size")
        engine = replace(engine, kv_cache_tokens=int(tokens),
                         block_size=int(block) if isinstance(block, int) and block > 0 else engine.block_size)
        gmu = kv.get("gpu_memory_utilization")
        if isinstance(gmu, (int, float)) and 0 < gmu <= 1:
            engine = replace(engine, gpu_memory_utilization=float(gmu))
        dtype = kv.get("cache_dtype")
        if isinstance(dtype, str) and dtype in KV_DTYPE_BYTES:
            model = replace(model, kv_cache_dtype=dtype)
        kv_source = f"server ({kv.get('source', 'metrics')}): {int(tokens):,} tokens"
    # the scheduler's limits
    args = info.server.args if info.server is not None else None
    limits = []
    seqs = max_num_seqs or _int(_server_arg(args, "--max-num-seqs"))
    if seqs:
        limits.append(f"max_num_seqs {seqs} ({'--max-num-seqs' if max_num_seqs else 'server arguments'})")
    elif (inferred := _inferred_max_seqs(session)) is not None:
        seqs = inferred
        limits.append(f"max_num_seqs {seqs} (inferred: running never above it while requests waited)")
    tokens_budget = max_num_batched_tokens or _int(_server_arg(args, "--max-num-batched-tokens"))
    if tokens_budget:
        limits.append(f"max_num_batched_tokens {tokens_budget}")
    engine = replace(engine, max_num_seqs=seqs or engine.max_num_seqs,
                     max_num_batched_tokens=tokens_budget or engine.max_num_batched_tokens)
    if name is None and not (seqs and tokens_budget):
        rest = [f"max_num_seqs {engine.max_num_seqs}"] if not seqs else []
        rest += [f"max_num_batched_tokens {engine.max_num_batched_tokens}"] if not tokens_budget else []
        limits.append(f"{', '.join(rest)} ({defaults_by})")
    limits_source = "; ".join(limits) or (f"profile: max_num_seqs {engine.max_num_seqs}, max_num_batched_tokens "
                                          f"{engine.max_num_batched_tokens}")
    profile = Profile(name=f"twin of {info.name or session.path.name}", description="", model=model, gpu=gpu,
                      engine=engine, efficiency=eff)
    # speculative decoding as the server ran it, with the acceptance its cells measured (engine/specsearch.py);
    # LoRA adapters are not modelled: their requests run as the base model's
    rates = [sd.acceptance_rate for s in session.summaries()
             if s is not None and (sd := s.spec_decode) is not None and sd.acceptance_rate is not None]
    profile, spec_said = with_speculation(profile, spec_server_config(args), rates)
    if spec_said:
        limits_source += f"; {spec_said}"
    return Shape(profile, source, kv_source, limits_source, async_known=name is not None)


def _int(v: str | None) -> int | None:
    try:
        n = int(v) if v is not None else None
    except ValueError:
        return None
    return n if n and n > 0 else None


def _gpu_memory_gib(session: Session) -> float | None:
    for s in session.summaries():
        gpu = getattr(s, "gpu", None) if s is not None else None
        total = getattr(gpu, "mem_total_gib", None)
        if isinstance(total, (int, float)) and total > 0:
            return float(total)
    return None


@dataclass(frozen=True)
class Knobs:
    """What-if server settings (None: as measured)."""

    gpu_memory_utilization: float | None = None
    kv_cache_dtype: str | None = None
    max_model_len: int | None = None
    max_num_seqs: int | None = None

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.gpu_memory_utilization, self.kv_cache_dtype, self.max_model_len,
                                           self.max_num_seqs))

    def label(self) -> str:
        parts = []
        if self.gpu_memory_utilization is not None:
            parts.append(f"--gpu-memory-utilization {self.gpu_memory_utilization:g}")
        if self.kv_cache_dtype is not None:
            parts.append(f"--kv-cache-dtype {self.kv_cache_dtype}")
        if self.max_model_len is not None:
            parts.append(f"--max-model-len {self.max_model_len}")
        if self.max_num_seqs is not None:
            parts.append(f"--max-num-seqs {self.max_num_seqs}")
        return " ".join(parts) or "as measured"


AS_MEASURED = Knobs()


def apply_knobs(p: Profile, k: Knobs, memory_known: bool) -> Profile:
    """The profile vLLM would run with these settings: the KV pool rescaled as vLLM sizes it
    (memory x utilization - weights - activations, divided by the KV bytes per token)."""
    if not k.any:
        return p
    model, engine = p.model, p.engine
    tokens = float(engine.kv_cache_tokens) if engine.kv_cache_tokens > 0 else float(CostModel(p).kv_cache_tokens)
    if k.gpu_memory_utilization is not None:
        if not 0 < k.gpu_memory_utilization <= 1:
            raise ServescopeError(f"--gpu-memory-utilization must be in (0, 1], got {k.gpu_memory_utilization:g}")
        if not memory_known:
            raise ServescopeError("cannot predict --gpu-memory-utilization: the GPU's memory is unknown (the session "
                                  "has no NVML data and ran no simulator profile)")
        cost = CostModel(p)
        fixed = cost.weight_bytes + engine.activation_reserve_gib * GIB
        old = p.gpu.memory_gib * GIB * engine.gpu_memory_utilization - fixed
        new = p.gpu.memory_gib * GIB * k.gpu_memory_utilization - fixed
        if new <= 0:
            raise ServescopeError(f"--gpu-memory-utilization {k.gpu_memory_utilization:g} leaves no memory for the KV "
                                  f"cache: the weights and activations take {fixed / GIB:.1f} GiB of "
                                  f"{p.gpu.memory_gib:g} GiB")
        tokens = tokens * new / old if old > 0 else new / max(cost.kv_bytes_per_token, 1.0)
        engine = replace(engine, gpu_memory_utilization=k.gpu_memory_utilization)
    if k.kv_cache_dtype is not None:
        if k.kv_cache_dtype not in KV_DTYPE_BYTES:
            raise ServescopeError(f"unknown --kv-cache-dtype {k.kv_cache_dtype!r}; use one of "
                                  f"{', '.join(sorted(KV_DTYPE_BYTES))}")
        old_b = KV_DTYPE_BYTES.get(model.kv_cache_dtype, 2.0)
        new_b = KV_DTYPE_BYTES[k.kv_cache_dtype]
        tokens = tokens * old_b / new_b
        model = replace(model, kv_cache_dtype=k.kv_cache_dtype)
    if k.max_model_len is not None:
        if k.max_model_len < 16:
            raise ServescopeError(f"--max-model-len must be at least 16, got {k.max_model_len}")
        model = replace(model, max_model_len=k.max_model_len)
    if k.max_num_seqs is not None:
        if k.max_num_seqs < 1:
            raise ServescopeError(f"--max-num-seqs must be at least 1, got {k.max_num_seqs}")
        engine = replace(engine, max_num_seqs=k.max_num_seqs)
    engine = replace(engine, kv_cache_tokens=max(1, int(math.floor(tokens))))
    return replace(p, model=model, engine=engine)


def profile_to_dict(p: Profile) -> dict[str, object]:
    """A profile as the TOML tables `servescope.sim.profile.load_profile` reads back."""
    from dataclasses import asdict

    return {"description": p.description, "model": asdict(p.model), "gpu": asdict(p.gpu), "engine": asdict(p.engine),
            "efficiency": asdict(p.efficiency), "quality": asdict(p.quality)}
