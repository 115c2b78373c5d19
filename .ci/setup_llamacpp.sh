#!/usr/bin/env bash
# Build llama.cpp's llama-server and llama-quantize (CPU) from the llama.cpp sources that PyPI ships inside the
# llama-cpp-python source distribution (vendor/llama.cpp is the upstream tree), cached outside the clone, and
# convert the tests' tiny dense model (from .ci/setup_vllm.sh) to GGUF: tiny-f16.gguf and tiny-q4_k_m.gguf.
# Cold: about 8 minutes on 2 cores (download 45 s, build 7 min, convert 6 s). Idempotent: with the cache in
# place a run takes about a second. Every stage is built in a temporary folder and renamed into place, so an interrupted run never
# leaves a half cache.
# Prints the llama-server path and the GGUF model folder on its last two lines.
set -euo pipefail
LLAMACPP_PY_VERSION="${LLAMACPP_PY_VERSION:-0.3.36}"
# bump when the build or conversion recipe (this script, tests/support/gguf_convert.py) changes: a changed
# recipe gets a fresh cache folder
RECIPE=1
CACHE="${SERVESCOPE_TEST_CACHE:-$HOME/.cache/servescope-test}"
DIR="$CACHE/llamacpp-$LLAMACPP_PY_VERSION-r$RECIPE"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
JOBS="${LLAMACPP_JOBS:-$(nproc)}"
mkdir -p "$CACHE/tmp"
# one builder at a time (parallel test runs share the cache)
exec 9>"$CACHE/.llamacpp.lock"
flock 9
# holding the lock, any work folder left is from an interrupted run
rm -rf "$CACHE/tmp"/llamacpp-build.* "$CACHE/tmp"/llamacpp-models.*

fail() { echo "setup_llamacpp: $*" >&2; exit 1; }

if [ ! -x "$DIR/bin/llama-server" ] || [ ! -f "$DIR/.servescope-complete" ]; then
  echo "setup_llamacpp: building llama-server from llama-cpp-python==$LLAMACPP_PY_VERSION's llama.cpp into $DIR" \
       "(about 8 minutes on 2 cores)" >&2
  T0=$SECONDS
  rm -rf "$DIR"
  WORK="$(mktemp -d "$CACHE/tmp/llamacpp-build.XXXXXX")"
  trap 'rm -rf "$WORK"' EXIT
  python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    -d "$WORK/dl" "llama-cpp-python==$LLAMACPP_PY_VERSION" >&2
  tar -xzf "$WORK/dl/llama_cpp_python-$LLAMACPP_PY_VERSION.tar.gz" -C "$WORK" \
    "llama_cpp_python-$LLAMACPP_PY_VERSION/vendor/llama.cpp"
  SRC="$WORK/llama_cpp_python-$LLAMACPP_PY_VERSION/vendor/llama.cpp"
  [ -f "$SRC/tools/server/server.cpp" ] || fail "no llama.cpp server sources in the sdist ($SRC)"
  # GGML_NATIVE=OFF: portable across CI machines (x86-64 with AVX2/FMA/F16C, the ggml defaults without NATIVE)
  # rather than tuned to this CPU; the build time is the same. Shared libraries stay next to the binaries in
  # bin/ and are found through an $ORIGIN run path, so the folder can be renamed into place.
  LOG="$WORK/build.log"
  if ! { cmake -S "$SRC" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
           -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
           -DLLAMA_BUILD_SERVER=ON -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON &&
         cmake --build "$WORK/build" --target llama-server llama-quantize -j "$JOBS"; } >"$LOG" 2>&1; then
    tail -n 40 "$LOG" >&2
    fail "the llama.cpp build failed (log above)"
  fi
  OUT="$WORK/out"
  mkdir -p "$OUT/convert"
  cp -a "$WORK/build/bin" "$OUT/bin"
  # the converter (a script, its conversion/ package and gguf-py) for the model stage
  cp -a "$SRC/convert_hf_to_gguf.py" "$SRC/gguf-py" "$OUT/convert/"
  if [ -d "$SRC/conversion" ]; then cp -a "$SRC/conversion" "$OUT/convert/"; fi
  cp -a "$SRC/tools/server/README.md" "$OUT/server-README.md"
  "$OUT/bin/llama-server" --version >"$OUT/version.txt" 2>&1 || { cat "$OUT/version.txt" >&2; fail "llama-server does not run"; }
  touch "$OUT/.servescope-complete"
  mv "$OUT" "$DIR"
  rm -rf "$WORK"
  trap - EXIT
  echo "setup_llamacpp: built in $((SECONDS - T0)) s" >&2
fi

# The tiny dense HF model and a Python with torch/transformers/safetensors come from setup_vllm.sh.
VLLM_OUT="$(bash "$HERE/.ci/setup_vllm.sh")"
VENV="$(printf '%s\n' "$VLLM_OUT" | tail -n 2 | head -n 1)"
HF_MODELS="$(printf '%s\n' "$VLLM_OUT" | tail -n 1)"
# keyed by the tiny model's own version (models-v1, ...): a rebuilt tiny model gets fresh GGUFs
MODELS="$DIR/$(basename "$HF_MODELS")-gguf"
if [ ! -f "$MODELS/tiny-f16.gguf" ] || [ ! -f "$MODELS/tiny-q4_k_m.gguf" ]; then
  echo "setup_llamacpp: converting $HF_MODELS/dense to GGUF in $MODELS" >&2
  rm -rf "$MODELS"
  WORK="$(mktemp -d "$CACHE/tmp/llamacpp-models.XXXXXX")"
  trap 'rm -rf "$WORK"' EXIT
  mkdir -p "$WORK/out"
  TMPDIR="$WORK" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
    "$VENV/bin/python" "$HERE/tests/support/gguf_convert.py" "$DIR/convert" "$HF_MODELS/dense" \
    --outtype f16 --outfile "$WORK/out/tiny-f16.gguf" >"$WORK/convert.log" 2>&1 ||
    { tail -n 40 "$WORK/convert.log" >&2; fail "convert_hf_to_gguf.py failed (log above)"; }
  "$DIR/bin/llama-quantize" "$WORK/out/tiny-f16.gguf" "$WORK/out/tiny-q4_k_m.gguf" Q4_K_M >"$WORK/quantize.log" 2>&1 ||
    { tail -n 40 "$WORK/quantize.log" >&2; fail "llama-quantize failed (log above)"; }
  mv "$WORK/out" "$MODELS"
  rm -rf "$WORK"
  trap - EXIT
fi
echo "$DIR/bin/llama-server"
echo "$MODELS"
