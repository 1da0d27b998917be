#!/usr/bin/env bash
# Install rolloutd with the LOWEST versions its pyproject.toml allows for each direct
# dependency (uv's --resolution lowest-direct) into a fresh virtual environment, then run the
# tests that need no engine, harness CLI or long run in it. A floor the code does not work with
# fails here (orjson 3.8 lacked orjson.Fragment, and every model call crashed).
#
# Wheels only (--only-binary :all:): a floor without a CPython wheel for this machine would need
# a compiler toolchain that a fresh machine may not have, so it is not a floor we can promise.
# The client's floors (rolloutd's own dependencies) and the server extra's are checked
# together, with the test extra. torch, accelerate and the engine extra (llama.cpp, model
# packages) stay out: they are pinned by scripts/setup.sh, not floors.
#
# Environment:
#   ROLLOUTD_LOWEST_VENV    folder of the environment, removed and made anew
#                           (default: ${TMPDIR:-/tmp}/rolloutd-lowest-$UID)
#   ROLLOUTD_LOWEST_PYTHON  interpreter to base it on (default: python3)
#   UV                      the uv binary (default: uv on PATH); its cache is reused
# Arguments are passed to pytest (default: the fast selection below).
set -euo pipefail
cd "$(dirname "$0")/.."

UV="${UV:-uv}"
VENV="${ROLLOUTD_LOWEST_VENV:-${TMPDIR:-/tmp}/rolloutd-lowest-$(id -u)}"
PYTHON="${ROLLOUTD_LOWEST_PYTHON:-python3}"

t0=$(date +%s)
rm -rf "$VENV"
"$UV" venv -q --python "$PYTHON" "$VENV"
"$UV" pip install -q --python "$VENV/bin/python" --resolution lowest-direct \
  --only-binary :all: -e '.[server,test]'
echo "lowest-direct environment in $VENV built in $(( $(date +%s) - t0 )) s"
"$UV" pip freeze --python "$VENV/bin/python" --exclude-editable | tr '\n' ' '
echo

# the inner run deselects the `lowest` marker: it must not start this script again; and the
# acceptance tier, which its own -m would otherwise let in. The selection covers what the floors carry (gateway routes and backends through orjson, aiohttp,
# fastapi, uvicorn; templates and tokenizers through transformers; pydantic models; exports
# through pyarrow; gRPC health against Temporal); property tests of rolloutd's own algorithms
# (memo, dialect round trips, builders) are left to the main run: a minute of CPU, no new floor.
MARKS="not acceptance and not engine and not harness and not slow and not sandbox and not lowest"
if [ "$#" -eq 0 ]; then
  set -- tests/proxy tests/trajectory tests/trainer_client tests/evaluators/test_evaluators.py \
    tests/engine/test_models.py tests/workers/test_health.py tests/cli/test_cli.py \
    --ignore=tests/proxy/sessions/test_request_identity.py \
    --ignore=tests/proxy/dialects/test_dialect_roundtrip.py \
    --ignore=tests/trajectory/test_trajectory_properties.py
fi
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider --durations=10 -m "$MARKS" "$@"
