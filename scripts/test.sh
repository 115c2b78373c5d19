#!/usr/bin/env bash
# The whole test suite, from a fresh clone: installs what the tests need (a venv with servescope and its
# test tools, tmux, the vLLM CPU build, llama.cpp's server and the tiny test models, all cached outside the
# clone), then runs ruff, mypy and pytest (real vLLM, real llama.cpp and simulator integration tests included).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v tmux >/dev/null 2>&1; then
  echo "test.sh: installing tmux (needed by the TUI end-to-end test)" >&2
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq tmux >/dev/null; else sudo apt-get install -y -qq tmux >/dev/null; fi
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -U "pip>=25.1"
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[ray]' --group test --group lint
bash .ci/setup_vllm.sh >/dev/null
[ "${SERVESCOPE_SKIP_LLAMACPP:-}" = 1 ] || bash .ci/setup_llamacpp.sh >/dev/null  # llama-server and GGUF models
.venv/bin/ruff check servescope tests benchmarks
.venv/bin/mypy
exec .venv/bin/python -m pytest -p no:cacheprovider -q -ra "$@"
