"""Run llama.cpp's convert_hf_to_gguf.py on the tests' tiny model, declaring its BPE pre-tokenizer.

The converter recognises a BPE tokenizer by a hash of how it splits a test text and refuses any other
("BPE pre-tokenizer was not recognized"). The tiny model's tokenizer (tests/support/build_tiny_model.py) is a
byte-level BPE with the GPT-2 split regex, so we declare it as llama.cpp's "gpt-2" pre-tokenizer.

Run with a Python that has torch, transformers and safetensors (the vLLM CPU venv of .ci/setup_vllm.sh):
    python gguf_convert.py CONVERTER_DIR [convert_hf_to_gguf.py arguments...]
CONVERTER_DIR holds convert_hf_to_gguf.py, conversion/ and gguf-py/ from the llama.cpp tree.
"""

from __future__ import annotations

import os
import runpy
import sys

PRE_TOKENIZER = os.environ.get("SERVESCOPE_GGUF_PRE_TOKENIZER", "gpt-2")


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    conv = os.path.abspath(sys.argv[1])
    script = os.path.join(conv, "convert_hf_to_gguf.py")
    # what running the script directly would put on sys.path: its folder (for `conversion`) and gguf-py
    sys.path[:0] = [conv, os.path.join(conv, "gguf-py")]
    try:
        from conversion import base  # llama.cpp >= late 2025: the model classes live in conversion/
    except ImportError:  # older trees: everything in convert_hf_to_gguf.py
        base = None
    if base is not None:
        base.TextModel.get_vocab_base_pre = lambda self, tokenizer: PRE_TOKENIZER  # type: ignore[attr-defined]
        sys.argv = [script, *sys.argv[2:]]
        runpy.run_path(script, run_name="__main__")
        return
    sys.path.insert(0, conv)
    import convert_hf_to_gguf as chg  # type: ignore[import-not-found]

    chg.TextModel.get_vocab_base_pre = lambda self, tokenizer: PRE_TOKENIZER
    sys.argv = [script, *sys.argv[2:]]
    chg.main()


if __name__ == "__main__":
    main()
