#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what the tests need (a venv with servescope and its
# test tools, tmux, Chromium, the vLLM CPU build, llama.cpp's server, GuideLLM, AIPerf and inference-perf, and the
# tiny test models, all cached outside the clone), then runs ruff, mypy and pytest (real vLLM, real llama.cpp,
# GuideLLM, AIPerf, inference-perf, tmux, Ray and simulator tests included),
# printing the 30 slowest tests.
#   ./scripts/test.sh              everything (what CI's .ci/run calls)
#   ./scripts/test.sh --fast       the inner loop: everything but the tests marked vllm, llamacpp, tmux, ray or
#                                  slow (no vLLM or llama.cpp is installed or started)
#   ./scripts/test.sh [--fast] ARGS  extra arguments go to pytest (tests/core -x, -k name, ...)
# Tests run in SERVESCOPE_TEST_PROCS processes (default 2, 3 with --fast; 1: one process, no pytest-xdist),
# grouped so that the tests of a shared real server run in one process (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
# Python may cache bytecode in the clone's __pycache__ folders (ignored by git): every `servescope` process the
# tests start then loads the package instead of compiling it again, and pytest keeps its rewritten test modules.
unset PYTHONDONTWRITEBYTECODE
FAST=0
if [ "${1:-}" = "--fast" ]; then FAST=1; shift; fi
if [ "$FAST" = 0 ] && ! command -v tmux >/dev/null 2>&1; then
  echo "test.sh: installing tmux (needed by the TUI end-to-end tests)" >&2
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq tmux >/dev/null; else sudo apt-get install -y -qq tmux >/dev/null; fi
fi
if [ "$FAST" = 0 ] && ! command -v chromium >/dev/null 2>&1; then
  # Debian's headless Chromium opens the HTML report by file:// with networking blocked (tests/integration/test_figures_sim.py)
  echo "test.sh: installing chromium (needed by the HTML report's browser test)" >&2
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null; else sudo apt-get install -y -qq chromium >/dev/null; fi
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -U "pip>=25.1"
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[ray,plots]' --group test --group lint --group docs
if [ "$FAST" = 0 ]; then
  # the vLLM venv (mostly downloads and unpacking) and llama.cpp's build (compiling) at once, with ruff and mypy
  bash .ci/setup_vllm.sh >/dev/null & VLLM_SETUP=$!
  LLAMA_SETUP=
  if [ "${SERVESCOPE_SKIP_LLAMACPP:-}" != 1 ]; then
    bash .ci/setup_llamacpp.sh >/dev/null & LLAMA_SETUP=$!  # llama-server and GGUF models
  fi
  PEERS_SETUP=
  if [ "${SERVESCOPE_SKIP_PEERS:-}" != 1 ]; then
    bash .ci/setup_peers.sh >/dev/null & PEERS_SETUP=$!  # GuideLLM, AIPerf and inference-perf, for the import tests
  fi
fi
.venv/bin/ruff check servescope tests benchmarks
# mypy checks while the tests run (about 30 s from a clean clone here, else spent before them); its verdict is
# printed, and fails the run, at the end
MYPY_LOG=$(mktemp)
.venv/bin/mypy >"$MYPY_LOG" 2>&1 & MYPY=$!
if [ "$FAST" = 0 ]; then
  wait "$VLLM_SETUP"
  if [ -n "$LLAMA_SETUP" ]; then wait "$LLAMA_SETUP"; fi
  if [ -n "$PEERS_SETUP" ]; then wait "$PEERS_SETUP"; fi
fi
# three for --fast (its tests mostly wait on simulators that run in real time); two for everything: in three the
# whole suite took 19 min of pytest against 26-28 in two, but the twin's accuracy on the simulator failed in two
# runs of three (its fit runs all disturbed on 2 cores), docs/developer.md
DEFAULT_PROCS=2
if [ "$FAST" = 1 ]; then DEFAULT_PROCS=3; fi
PROCS=${SERVESCOPE_TEST_PROCS:-$DEFAULT_PROCS}
PAR=()
if [ "$PROCS" != 1 ]; then PAR=(-n "$PROCS" --dist loadgroup); fi
set +e
if [ "$FAST" = 1 ]; then
  .venv/bin/python -m pytest -p no:cacheprovider -q -ra --durations=10 "${PAR[@]}" \
    -m "not (vllm or llamacpp or tmux or ray or slow)" "$@"
else
  .venv/bin/python -m pytest -p no:cacheprovider -q -ra --durations=30 "${PAR[@]}" "$@"
fi
RC=$?
wait "$MYPY"; MYPY_RC=$?
set -e
cat "$MYPY_LOG"; rm -f "$MYPY_LOG"
if [ "$MYPY_RC" != 0 ]; then echo "test.sh: mypy found the errors above" >&2; exit 1; fi
exit "$RC"
