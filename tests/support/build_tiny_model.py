"""Build the tiny random-weight models the real-vLLM tests serve (no model hub needed).

Run with the vLLM venv's Python (it has torch, transformers and tokenizers):
    python build_tiny_model.py OUT_DIR
Writes OUT_DIR/dense (LlamaForCausalLM) and OUT_DIR/moe (Qwen3MoeForCausalLM), sharing one
byte-level BPE tokenizer trained on the Python standard library's sources, and OUT_DIR/dense-perturbed:
the dense model with seeded Gaussian noise added to every linear and embedding weight (a stand-in for a
lossy quantization, for the quality probe's tests). Deterministic.
"""

from __future__ import annotations

import glob
import os
import sys
import sysconfig

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIAL = ["<s>", "</s>", "<pad>", "<|im_start|>", "<|im_end|>"]
PERTURB_SEED = 1234
PERTURB_REL_STD = 0.02  # noise std as a fraction of each weight tensor's own std


def build_tokenizer(out: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    stdlib = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(stdlib, "*.py")))[:400]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=8192,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(files, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    fast.chat_template = CHATML
    return fast


def main() -> None:
    out = sys.argv[1]
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = build_tokenizer(out)
    eos = [tok.convert_tokens_to_ids("</s>"), tok.convert_tokens_to_ids("<|im_end|>")]
    common = dict(
        vocab_size=len(tok),
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=8192,
        bos_token_id=tok.bos_token_id,
        eos_token_id=eos,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    dense_cfg = LlamaConfig(intermediate_size=768, **common)
    dense = LlamaForCausalLM(dense_cfg).to(torch.bfloat16)
    d = os.path.join(out, "dense")
    dense.save_pretrained(d)
    tok.save_pretrained(d)

    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    moe_cfg = Qwen3MoeConfig(
        intermediate_size=768,
        moe_intermediate_size=128,
        num_experts=8,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        **common,
    )
    moe = Qwen3MoeForCausalLM(moe_cfg).to(torch.bfloat16)
    m = os.path.join(out, "moe")
    moe.save_pretrained(m)
    tok.save_pretrained(m)

    # built last, from the dense model's weights, so that dense/ and moe/ stay as they were
    p = os.path.join(out, "dense-perturbed")
    perturbed = perturb(dense, PERTURB_SEED, PERTURB_REL_STD)
    perturbed.save_pretrained(p)
    tok.save_pretrained(p)
    print(out)


def perturb(model, seed: int, rel_std: float):
    """A copy of model with N(0, (rel_std * std(W))^2) noise added to each Linear/Embedding weight W."""
    import copy

    import torch

    names = {f"{n}.weight" for n, mod in model.named_modules()
             if isinstance(mod, (torch.nn.Linear, torch.nn.Embedding))}
    state = model.state_dict()
    torch.manual_seed(seed)
    noisy = {}
    for name in sorted(names):
        w = state[name].float()
        noise = torch.randn(w.shape, dtype=torch.float32) * (rel_std * w.std().item())
        noisy[name] = (w + noise).to(state[name].dtype)
    out = copy.deepcopy(model)
    out.load_state_dict({**state, **noisy})
    return out


if __name__ == "__main__":
    main()
