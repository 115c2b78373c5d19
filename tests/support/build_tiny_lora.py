"""LoRA adapters for the tiny test model (.ci/setup_vllm.sh's dense model), made locally: no hub.

`build_adapters(model_dir, out_dir, names)` writes OUT/NAME/adapter_config.json and adapter_model.safetensors for
each name: rank-8 low-rank pairs on every layer's q_proj and v_proj, with small seeded random weights (each adapter
its own seed), in PEFT's layout, which vLLM's `--lora-modules NAME=PATH` reads. Shapes come from the model's
config.json; numpy and safetensors (which the test environment has through transformers) write them."""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from pathlib import Path

RANK = 8


def build_adapters(model_dir: Path, out_dir: Path, names: Sequence[str], rank: int = RANK) -> dict[str, Path]:
    import numpy as np
    from safetensors.numpy import save_file

    cfg = json.loads((model_dir / "config.json").read_text())
    hidden = int(cfg["hidden_size"])
    head_dim = int(cfg.get("head_dim") or hidden // int(cfg["num_attention_heads"]))
    outs = {"q_proj": int(cfg["num_attention_heads"]) * head_dim,
            "v_proj": int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]) * head_dim}
    paths: dict[str, Path] = {}
    for name in names:
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        tensors = {}
        for layer in range(int(cfg["num_hidden_layers"])):
            for module, out in outs.items():
                key = f"base_model.model.model.layers.{layer}.self_attn.{module}"
                tensors[f"{key}.lora_A.weight"] = (rng.standard_normal((rank, hidden)) * 0.02).astype(np.float32)
                tensors[f"{key}.lora_B.weight"] = (rng.standard_normal((out, rank)) * 0.02).astype(np.float32)
        d = out_dir / name
        d.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(d / "adapter_model.safetensors"))
        (d / "adapter_config.json").write_text(json.dumps({
            "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0,
            "target_modules": list(outs), "bias": "none", "fan_in_fan_out": False, "modules_to_save": None,
            "base_model_name_or_path": str(model_dir)}))
        paths[name] = d
    return paths
