#!/usr/bin/env bash
# The trainer packages the bridges are tested against (rolloutd.trainer_client.bridges,
# docs/trainers.md), pinned, from PyPI, outside the lock file as torch is. Run it after
# scripts/setup.sh; idempotent (a second run only checks).
#
# --project: trl and verifiers into the project's environment only (the first part below):
# scripts/setup.sh runs it, so the default tier's bridge tests (TRL's scoring and loss, its
# async protocols, verifiers' wire types) run wherever the project is set up. Without it,
# verl's and skyrl's environments too (the acceptance tier's bridge runs).
#
# - trl 1.16.0 and verifiers 0.4.0 go into the project's environment ($ROLLOUTD_VENV, default
#   .venv), constrained by the lock: every package the lock pins keeps its version (pip -c with
#   `uv export`), torch stays the CPU 2.13.0 setup.sh installed. verifiers is installed without
#   its declared requirements, then those requirements under the same constraints: it declares
#   openai < 3, rolloutd needs openai >= 3.57, and the parts the bridge uses (the ZMQ env server
#   and client, msgpack) import and run on openai 3.57 (tests/trainer_client/bridges).
# - verl 0.9.1 (Python 3.11) and skyrl 0.4.0 with skyrl-gym (Python >= 3.12) get an environment
#   each under $ROLLOUTD_TRAINERS_DIR (default ~/.cache/rolloutd/trainers), as the Python
#   harness CLIs have: verl caps transformers below 5.11 and pulls hydra, whose grammar needs
#   antlr4 4.9 (the lock pins 4.13 for math-verify's LaTeX parser); skyrl caps transformers at
#   5.16.1 and needs Python 3.12. Each holds its trainer with the trainer's own requirements
#   and rolloutd's trainer client (rolloutd without its dependencies, then the client's, at the
#   lock's versions): a trainer process there talks to the fleets over Temporal, as in a
#   cluster. verl gets the CPU torch wheel first (else it pulls a 6 GB CUDA build) and what
#   its agent loop imports without a GPU (cachetools fastapi uvicorn pyzmq msgspec). PyPI has
#   no CPU torch for Python 3.12, so skyrl's environment gets PyPI's default torch.
set -euo pipefail
cd "$(dirname "$0")/.."

PROJECT_ONLY=0
[ "${1:-}" = "--project" ] && PROJECT_ONLY=1

TRL_VERSION=1.16.0
VERIFIERS_VERSION=0.4.0
VERL_VERSION=0.9.1
SKYRL_VERSION=0.4.0
TORCH_VERSION=2.13.0
VENV="${ROLLOUTD_VENV:-.venv}"
TRAINERS_DIR="${ROLLOUTD_TRAINERS_DIR:-$HOME/.cache/rolloutd/trainers}"
# a Python 3.12 that runs (a pyenv shim may exist and refuse)
PYTHON312="${ROLLOUTD_PYTHON312:-}"
if [ -z "$PYTHON312" ]; then
  for candidate in $(ls -d "$HOME"/.pyenv/versions/3.12*/bin/python3.12 2>/dev/null) \
      $(command -v python3.12 || true); do
    if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      PYTHON312=$candidate
      break
    fi
  done
fi

[ -x "$VENV/bin/python" ] || { echo "run scripts/setup.sh first ($VENV)" >&2; exit 1; }
mkdir -p "$TRAINERS_DIR"
pip_in() { "$1/bin/python" -m pip --disable-pip-version-check -q "${@:2}"; }
installed() { "$1/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('$2') != '$3')" 2>/dev/null; }

# the lock's pins as pip constraints; torch is the CPU wheel setup.sh installed, not the lock's
constraints=$(mktemp)
trap 'rm -f "$constraints" "$constraints.client"' EXIT
"$VENV/bin/uv" export --frozen --no-hashes --no-emit-project --all-extras --no-header \
  --no-annotate --no-emit-package torch -q > "$constraints"
echo "torch==$TORCH_VERSION" >> "$constraints"

# --- trl and verifiers in the project's environment
installed "$VENV" trl "$TRL_VERSION" || pip_in "$VENV" install -c "$constraints" "trl==$TRL_VERSION"
if ! installed "$VENV" verifiers "$VERIFIERS_VERSION"; then
  pip_in "$VENV" download --no-deps -d "$TRAINERS_DIR/wheels" "verifiers==$VERIFIERS_VERSION"
  wheel=$(ls "$TRAINERS_DIR"/wheels/verifiers-"$VERIFIERS_VERSION"-*.whl)
  # its requirements but openai, under the lock's constraints
  "$VENV/bin/python" - "$wheel" > "$TRAINERS_DIR/verifiers-requirements.txt" <<'EOF'
import sys, zipfile
from email.parser import Parser
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    headers = Parser().parsestr(z.read(meta).decode())
for req in headers.get_all("Requires-Dist") or []:
    if "extra ==" not in req and not req.startswith("openai"):
        print(req)
EOF
  pip_in "$VENV" install -c "$constraints" -r "$TRAINERS_DIR/verifiers-requirements.txt"
  pip_in "$VENV" install --no-deps "$wheel"
fi

if [ "$PROJECT_ONLY" = 1 ]; then
  echo "trainers: trl $TRL_VERSION, verifiers $VERIFIERS_VERSION in $VENV"
  exit 0
fi

# --- the trainer client's own requirements, at the lock's versions (for the other envs)
client_reqs="temporalio grpcio grpcio-health-checking httpx pydantic pydantic-settings structlog fsspec rich cryptography pytest pytest-asyncio pytest-timeout"
grep -v -E '^(transformers|tokenizers|huggingface-hub|safetensors|antlr4-python3-runtime|numpy|setuptools)==' \
  "$constraints" > "$constraints.client"

client_env() {  # client_env DIR PYTHON: a venv with rolloutd's trainer client
  local dir=$1 python=$2
  [ -x "$dir/bin/python" ] || "$python" -m venv "$dir"
  if ! "$dir/bin/python" -c "import rolloutd.trainer_client, pytest_asyncio" 2>/dev/null; then
    # shellcheck disable=SC2086
    pip_in "$dir" install -c "$constraints.client" $client_reqs
    pip_in "$dir" install --no-deps -e .
  fi
}

# --- verl: Python 3.11 (the project's), CPU torch first
VERL_ENV="$TRAINERS_DIR/verl"
client_env "$VERL_ENV" "$("$VENV/bin/python" -c 'import os, sys; print(os.path.realpath(sys.executable))')"
installed "$VERL_ENV" torch "$TORCH_VERSION+cpu" || pip_in "$VERL_ENV" install "torch==$TORCH_VERSION"
if ! installed "$VERL_ENV" verl "$VERL_VERSION"; then
  pip_in "$VERL_ENV" install "torch==$TORCH_VERSION" "verl==$VERL_VERSION" \
    cachetools fastapi uvicorn pyzmq msgspec
fi

# --- skyrl: Python 3.12
if [ -z "$PYTHON312" ]; then
  echo "no Python 3.12 (set ROLLOUTD_PYTHON312): the skyrl environment is not built" >&2
else
  SKYRL_ENV="$TRAINERS_DIR/skyrl"
  client_env "$SKYRL_ENV" "$PYTHON312"
  if ! installed "$SKYRL_ENV" skyrl "$SKYRL_VERSION" || ! "$SKYRL_ENV/bin/python" -c \
      "from skyrl.train.utils.trainer_utils import validate_generator_output" 2>/dev/null; then
    # what skyrl.train.utils.trainer_utils (validate_generator_output) imports beyond skyrl's
    # declared requirements (its skyrl-train extra would build flash-attn for CUDA)
    pip_in "$SKYRL_ENV" install "skyrl==$SKYRL_VERSION" "skyrl-gym==$SKYRL_VERSION" \
      torch ray torchdata loguru jaxtyping aiohttp orjson pybase64
  fi
fi
echo "trainers: trl $TRL_VERSION, verifiers $VERIFIERS_VERSION in $VENV; verl $VERL_VERSION in $VERL_ENV${SKYRL_ENV:+; skyrl $SKYRL_VERSION in $SKYRL_ENV}"
