#!/usr/bin/env bash
# An environment of its own with `harbor` (pinned), which needs Python >= 3.12: the tests check
# rolloutd's task.toml reader against harbor's own TaskConfig there. Like scripts/setup.sh's
# harness CLIs: `uv tool install` under the tools folder, on a Python 3.12 found on PATH or in
# pyenv (never downloaded). Idempotent. Prints the environment's python on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
HARBOR_VERSION=0.25.0
VENV="${ROLLOUTD_VENV:-.venv}"
TOOLS_DIR="${ROLLOUTD_TOOLS_DIR:-$HOME/.cache/rolloutd/tools}"
python=""
# a Python 3.12 that runs: a pyenv shim may be on PATH and refuse ("command not found")
for candidate in "$HOME"/.pyenv/versions/3.12*/bin/python3.12 $(command -v python3.12 || true); do
  if "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
    python=$candidate
    break
  fi
done
[ -n "$python" ] || { echo "harbor_env: no Python 3.12 (PATH or ~/.pyenv)" >&2; exit 1; }
if ! "$TOOLS_DIR/harbor/bin/python" -c "import importlib.metadata as m, sys;
sys.exit(m.version('harbor') != '$HARBOR_VERSION')" 2>/dev/null; then
  UV_TOOL_DIR="$TOOLS_DIR" UV_TOOL_BIN_DIR="$TOOLS_DIR/bin" UV_PYTHON_DOWNLOADS=never \
    UV_NATIVE_TLS="${UV_NATIVE_TLS:-1}" \
    "$VENV/bin/uv" tool install --no-progress -q --force --python "$python" \
    "harbor==$HARBOR_VERSION" >&2
fi
echo "$TOOLS_DIR/harbor/bin/python"
