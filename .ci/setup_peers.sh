#!/usr/bin/env bash
# Install the peer benchmark clients the import tests run (GuideLLM, AIPerf and inference-perf, from the package
# registry) into
# cached venvs outside the clone, one venv each (their dependencies pin different versions of the same libraries).
# Idempotent: a second run with the cache in place takes a second. One installer at a time (a lock), and each
# venv's "complete" mark is written last, so an interrupted run never leaves a venv that looks whole.
# Neither tool can reach a model hub from the tests: they are pointed at the tiny test model's folder that
# .ci/setup_vllm.sh builds (its tokenizer.json), by path.
# inference-perf needs Python 3.12 or later: the first found (python3.13, python3.12, pyenv's) makes its venv; without
# one it is not installed and its line reads "-" (its tests skip).
# Prints the GuideLLM venv, the AIPerf venv and the inference-perf venv on its last three lines.
set -euo pipefail
GUIDELLM_VERSION="${GUIDELLM_VERSION:-0.8.1}"
AIPERF_VERSION="${AIPERF_VERSION:-0.13.0}"
INFERENCE_PERF_VERSION="${INFERENCE_PERF_VERSION:-0.7.0}"
CACHE="${SERVESCOPE_TEST_CACHE:-$HOME/.cache/servescope-test}"
mkdir -p "$CACHE"
exec 9>"$CACHE/.peers.lock"
flock 9

install() {  # NAME VERSION VENV CHECK [FIRST...]: pip-install FIRST then NAME==VERSION into VENV unless its mark is there
  local name="$1" version="$2" venv="$3" check="$4"
  shift 4
  if [ -f "$venv/.servescope-complete" ] && [ -x "$venv/bin/$check" ]; then
    return 0
  fi
  echo "setup_peers: installing $name==$version into $venv" >&2
  rm -rf "$venv"
  "${PYTHON:-python3}" -m venv "$venv"
  if [ "$#" -gt 0 ]; then
    "$venv/bin/pip" install -q --disable-pip-version-check "$@" 2>/dev/null ||
      "$venv/bin/pip" install -q --disable-pip-version-check --extra-index-url https://download.pytorch.org/whl/cpu "$@"
  fi
  "$venv/bin/pip" install -q --disable-pip-version-check "$name==$version"
  "$venv/bin/$check" --help >/dev/null
  touch "$venv/.servescope-complete"
}

# GuideLLM requires torch (it never runs a model here): PyPI's default build brings 4 GB of CUDA libraries. The CPU
# build the vLLM CPU venv uses (torch 2.13.0+cpu) is installed first: from the machine's wheel folder where pip has one
# (PIP_FIND_LINKS), else from PyTorch's CPU index
TORCH_CPU="${TORCH_CPU:-torch==2.13.0+cpu}"
install guidellm "$GUIDELLM_VERSION" "$CACHE/guidellm-$GUIDELLM_VERSION" guidellm "$TORCH_CPU"
install aiperf "$AIPERF_VERSION" "$CACHE/aiperf-$AIPERF_VERSION" aiperf
PY312=
for py in python3.13 python3.12 "$HOME"/.pyenv/versions/3.1[2-9]*/bin/python; do
  if command -v "$py" >/dev/null 2>&1 && "$py" -c 'import sys; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
    PY312="$py"
    break
  fi
done
if [ -n "$PY312" ]; then
  PYTHON="$PY312" install inference-perf "$INFERENCE_PERF_VERSION" "$CACHE/inference-perf-$INFERENCE_PERF_VERSION" inference-perf
fi
echo "$CACHE/guidellm-$GUIDELLM_VERSION"
echo "$CACHE/aiperf-$AIPERF_VERSION"
if [ -n "$PY312" ]; then echo "$CACHE/inference-perf-$INFERENCE_PERF_VERSION"; else echo "-"; fi
