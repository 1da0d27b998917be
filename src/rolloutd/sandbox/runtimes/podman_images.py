"""Container images of the podman (and docker) runtime: the Debian base image made on the host,
images built from a task's Dockerfile (cached by content hash), and their garbage collection.

**Base image.** :data:`BASE_IMAGE` is Debian ``bookworm`` made on the sandbox host with
``mmdebstrap --variant=minbase`` and ``podman import`` (no registry is pulled from), with what
the runtime's own steps need (``git`` for the session's patch, ``python3`` for checks). It is
the base image of ``scripts/build_images.sh``, made the same way from the same package list: it
is tagged ``localhost/rolloutd-base:bookworm-{sha256 of the list, 12 hex}`` (the content: a
changed list makes a new image) and the stable alias :data:`BASE_IMAGE`, which task
Dockerfiles name in ``FROM`` (``ARG BASE_IMAGE=localhost/rolloutd-base:bookworm``). It is made
when a task first needs it: a task that names no image, and a task whose Dockerfile names it
(a build would otherwise try to pull it from a registry called ``localhost``).

**Builds.** Every image a task's Dockerfile names (``FROM`` after its build arguments,
``COPY --from``, ``RUN --mount=from=``: :mod:`.dockerfile`) must match the sandbox policy's
``images`` before anything is built or pulled; one that does not, or cannot be resolved, is a
:class:`~rolloutd.errors.PolicyError`. A task's ``runtime.build`` (a context folder, a
Dockerfile, build arguments) is hashed: every file of the context (path, executable bit,
bytes; a symlink's target), the Dockerfile's path, the arguments, the ids of the images it
names (so a rebuilt base rebuilds what is built on it) and whether the build had network.
The image is ``localhost/rolloutd-build:{hash}``; a tag that exists is not built again, and
concurrent provisionings of one hash in a worker wait for one build. Builds run with
``--layers=false`` (no intermediate images are left to collect) and, unless the policy's
``build_network`` allows it, ``--network none``.

**Garbage collection.** Built images carry the label ``rolloutd.managed=build``; each use
touches a record ``{runtime_root}/.images/{hash}``. :func:`collect_garbage` removes the least
recently used of the built images this runtime root has records of until those left take at
most the host's budget (``SandboxSettings.image_cache_gb``); an image a container still uses is
skipped (``podman rmi`` without ``--force`` refuses it). The base image, named images and other
roots' builds are never removed.

Flags: podman-build(1), podman-import(1), podman-image-inspect(1), podman-rmi(1) of podman 4.3;
docker's CLI takes the same ones (``docker build``, ``docker import``, ``docker image rm``).
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import structlog

from rolloutd.dockerfile import UnresolvableError, image_references
from rolloutd.errors import ConfigError, PolicyError, RuntimeStartError
from rolloutd.sandbox_policy import POLICY_SETTING
from rolloutd.types import ImageBuild

log = structlog.get_logger(__name__)

#: the base image's stable name (what task Dockerfiles name in ``FROM``).
BASE_IMAGE = "localhost/rolloutd-base:bookworm"
#: Debian suite and packages of the base image (beyond ``minbase``): scripts/build_images.sh's
#: ``BASE_PACKAGES``, in its order (the tag hashes this list).
BASE_SUITE = "bookworm"
BASE_PACKAGES = "python3,python3-venv,ca-certificates,bubblewrap,libgomp1,libstdc++6,git,procps"
#: repository of images built from tasks' Dockerfiles.
BUILT_REPOSITORY = "localhost/rolloutd-build"
#: label of every image this module makes: ``base`` or ``build``.
MANAGED_LABEL = "rolloutd.managed"
#: label holding a built image's content hash.
BUILD_LABEL = "rolloutd.build"
#: seconds a base image build (mmdebstrap downloads from the Debian mirror) may take.
BASE_BUILD_TIMEOUT_S = 1800.0
#: seconds a Dockerfile build may take.
BUILD_TIMEOUT_S = 1800.0
#: seconds other image commands may take.
CLI_TIMEOUT_S = 120.0
#: seconds an image id a ``FROM`` line names is cached (a rebuilt base is seen after this).
FROM_ID_TTL_S = 30.0
#: folder below the runtime root holding one last-use record per built image.
RECORDS_DIR = ".images"
#: PATH of commands in an image that sets none (an imported image has no ``ENV``).
BASE_ENV_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

_locks: dict[str, asyncio.Lock] = {}
_from_ids: dict[str, tuple[float, str]] = {}
_context_hashes: dict[tuple[str, tuple[tuple[str, int, int, int], ...]], str] = {}
_configs: dict[tuple[str, str], tuple[float, dict]] = {}
#: seconds an image's config is cached (:func:`image_config`).
CONFIG_TTL_S = 30.0


async def cli(
    binary: str,
    *args: str,
    timeout_s: float = CLI_TIMEOUT_S,
    cwd: Path | None = None,
    merge_stderr: bool = True,
) -> tuple[int, str]:
    """Run a container CLI command; return its exit code and output (stdout and stderr; with
    ``merge_stderr=False`` stdout alone, or stderr when stdout is empty, so that a warning on
    stderr cannot spoil a machine-readable stdout).

    The process is killed when ``timeout_s`` passes (exit code -9) or the caller is cancelled.
    Its environment is the worker's (the operator's: e.g. a ``DOCKER_HOST`` it set), never a
    task's. ``cwd``: its working folder (conmon, which outlives ``podman run``, keeps it and
    writes an ``oom`` file there when the container's memory limit is hit).
    """
    proc = await asyncio.create_subprocess_exec(
        binary,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT if merge_stderr else asyncio.subprocess.PIPE,
        start_new_session=True,
        cwd=cwd,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except (TimeoutError, asyncio.CancelledError) as exc:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        await proc.wait()
        if isinstance(exc, asyncio.CancelledError):
            raise
        return -9, f"{binary} {args[0]} timed out after {timeout_s:.0f} s"
    return proc.returncode or 0, (out or err or b"").decode(errors="replace")


async def image_config(binary: str, name: str) -> dict | None:
    """The image's ``Config`` (``Env``, ``WorkingDir``, ...) and ``Id``, or None when the image
    is not in the store; an answer is cached :data:`CONFIG_TTL_S` (a tag moved to another image
    is seen after that)."""
    cached = _configs.get((binary, name))
    if cached and time.monotonic() - cached[0] < CONFIG_TTL_S:
        return cached[1]
    code, out = await cli(binary, "image", "inspect", "--format", "json", "--", name)
    if code != 0:
        return None
    (info,) = json.loads(out)[:1]
    config = dict(info.get("Config") or {})
    config["Id"] = info.get("Id", "")
    _configs[(binary, name)] = (time.monotonic(), config)
    return config


def _lock(key: str) -> asyncio.Lock:
    return _locks.setdefault(key, asyncio.Lock())


def base_image_tag() -> str:
    """The base image's content tag, as scripts/build_images.sh names it:
    ``localhost/rolloutd-base:bookworm-{sha256 of BASE_PACKAGES, 12 hex}``."""
    digest = hashlib.sha256(BASE_PACKAGES.encode()).hexdigest()[:12]
    return f"{BASE_IMAGE}-{digest}"


async def ensure_base_image(binary: str = "podman") -> str:
    """Make :data:`BASE_IMAGE` unless the current recipe's image exists; return its name.

    Cold: ``mmdebstrap`` (a Debian mirror; about 2 minutes on 2 shared cores) and an import;
    warm: one ``image exists``.

    Raises:
        ConfigError: ``mmdebstrap`` is not installed (apt-get install mmdebstrap).
        RuntimeStartError: the build or import failed.
    """
    tag = base_image_tag()
    async with _lock(tag):
        if await image_config(binary, tag) is not None:
            if await image_config(binary, BASE_IMAGE) is None:
                await cli(binary, "tag", tag, BASE_IMAGE)
            return BASE_IMAGE
        mmdebstrap = shutil.which("mmdebstrap")
        if mmdebstrap is None:
            raise ConfigError(
                f"the base image {BASE_IMAGE} needs mmdebstrap (apt-get install mmdebstrap)"
            )
        began = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="rolloutd-base-") as tmp:
            rootfs = str(Path(tmp) / "rootfs.tar")
            code, out = await cli(
                mmdebstrap,
                "--quiet",
                "--variant=minbase",
                f"--include={BASE_PACKAGES}",
                BASE_SUITE,
                rootfs,
                timeout_s=BASE_BUILD_TIMEOUT_S,
            )
            if code != 0:
                raise RuntimeStartError(f"mmdebstrap failed ({code}): {out.strip()[-500:]}")
            # as scripts/build_images.sh imports it (one image for both; no ENV: podman's
            # default PATH, and the runtime sets its own)
            code, out = await cli(
                binary, "import", "--quiet", rootfs, tag, timeout_s=CLI_TIMEOUT_S * 5
            )
            if code != 0:
                raise RuntimeStartError(f"{binary} import failed ({code}): {out.strip()[-500:]}")
        await cli(binary, "tag", tag, BASE_IMAGE)
        for name in (tag, BASE_IMAGE):  # what a build found missing is there now
            _from_ids.pop(name, None)
            _configs.pop((binary, name), None)
        log.info("base_image_built", image=tag, duration_s=round(time.monotonic() - began, 1))
        return BASE_IMAGE


def _context_hash(context: Path) -> str:
    """sha256 of a build context's files (path, executable bit, bytes; a symlink's target),
    cached per process while no file's size, mtime or mode changed."""
    entries: list[tuple[str, int, int, int]] = []
    for folder, dirs, files in os.walk(context):
        dirs.sort()
        for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            path = os.path.join(folder, name)
            st = os.lstat(path)
            entries.append((os.path.relpath(path, context), st.st_size, st.st_mtime_ns, st.st_mode))
    key = (str(context), tuple(entries))
    if key in _context_hashes:
        return _context_hashes[key]
    digest = hashlib.sha256()
    for rel, _, _, mode in entries:
        path = context / rel
        digest.update(rel.encode() + b"\0")
        if os.path.islink(path):
            digest.update(b"L" + os.readlink(path).encode())
        else:
            digest.update(b"X" if mode & 0o111 else b"F")
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
        digest.update(b"\0")
    _context_hashes[key] = digest.hexdigest()
    return _context_hashes[key]


async def _from_id(binary: str, name: str) -> str:
    """The id of a ``FROM`` image in the store (cached :data:`FROM_ID_TTL_S`), or its name
    when it is not there (the build pulls it)."""
    cached = _from_ids.get(name)
    if cached and time.monotonic() - cached[0] < FROM_ID_TTL_S:
        return cached[1]
    code, out = await cli(binary, "image", "inspect", "--format", "{{.Id}}", "--", name)
    found = out.strip() if code == 0 else name
    _from_ids[name] = (time.monotonic(), found)
    return found


def build_images(build: ImageBuild, images: list[str] | None) -> list[str]:
    """The images a build's Dockerfile names, each checked against the sandbox policy's
    ``images`` patterns (:func:`fnmatch.fnmatchcase`, as a task's own ``image``).

    Args:
        build: the task's build.
        images: the policy's patterns; None: not checked (a trusted caller: tests, benchmarks).

    Returns:
        The references (:func:`~rolloutd.dockerfile.image_references`).

    Raises:
        ConfigError: the context is not a folder or holds no such Dockerfile.
        PolicyError: a reference outside ``images``, or one that cannot be resolved.
    """
    context = Path(build.context)
    dockerfile = context / build.dockerfile
    if not context.is_dir() or not dockerfile.is_file():
        raise ConfigError(f"runtime.build: no Dockerfile {build.dockerfile!r} in {context}")
    text = dockerfile.read_text(encoding="utf-8", errors="replace")
    try:
        references = image_references(text, build.args, name=build.dockerfile)
    except UnresolvableError as e:
        raise PolicyError(f"runtime.build: {e}; the images it names cannot be checked") from None
    if images is not None:
        for reference in references:
            if not any(fnmatch.fnmatchcase(reference, p) for p in images):
                raise PolicyError(
                    f"runtime.build: {build.dockerfile} names the image {reference!r} (after "
                    f"its build arguments), outside the sandbox policy (images: "
                    f"{', '.join(images) or 'none'}; the operator sets it in {POLICY_SETTING})"
                )
    return references


async def build_hash(
    binary: str, build: ImageBuild, *, network: bool, images: list[str] | None = None
) -> str:
    """The content hash of an image build (see the module docstring), 64 hex digits.

    Raises:
        ConfigError: the context is not a folder or holds no such Dockerfile.
        PolicyError: as :func:`build_images` (``images``: the policy's patterns).
    """
    references = build_images(build, images)
    context_hash = await asyncio.to_thread(_context_hash, Path(build.context))
    from_ids = [await _from_id(binary, n) for n in references]
    payload = json.dumps(
        [context_hash, build.dockerfile, sorted(build.args.items()), from_ids, network]
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def touch_used(root: Path, image_hash: str) -> None:
    """Record that a built image was used now (its last-use record's mtime)."""
    path = Path(root) / RECORDS_DIR / image_hash
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()


async def ensure_built(
    binary: str,
    build: ImageBuild,
    *,
    network: bool,
    root: Path,
    images: list[str] | None = None,
) -> tuple[str, bool]:
    """The image of a task's ``runtime.build``, built unless its hash's tag exists.

    Args:
        binary: ``podman`` or ``docker``.
        build: the task's build.
        network: whether the build may use the network (the sandbox policy's
            ``build_network``).
        root: the runtime root (its last-use records live below it).
        images: the sandbox policy's ``images`` patterns, which every image the Dockerfile
            names must match; None: not checked (a trusted caller).

    Returns:
        (image name, whether it was built now).

    The base image (:data:`BASE_IMAGE`, or its content tag) is made first when the Dockerfile
    names it and it is not here (:func:`ensure_base_image`).

    Raises:
        ConfigError: no such context or Dockerfile; the base image is needed and mmdebstrap
            is not installed.
        PolicyError: the Dockerfile names an image outside ``images`` (nothing was built).
        RuntimeStartError: the base image or the build failed (the output's tail in the
            message, and that the build had no network when the policy gave it none; not
            retried: the same Dockerfile fails the same way).
    """
    if {BASE_IMAGE, base_image_tag()} & set(build_images(build, images)):
        await ensure_base_image(binary)
    image_hash = await build_hash(binary, build, network=network, images=images)
    tag = f"{BUILT_REPOSITORY}:{image_hash[:24]}"
    async with _lock(tag):
        if await image_config(binary, tag) is not None:
            touch_used(root, image_hash[:24])
            return tag, False
        began = time.monotonic()
        args = [
            "build",
            "--layers=false",
            "--pull=missing" if Path(binary).name != "docker" else "--pull=false",
            "--network",
            "private" if network else "none",
            "--tag",
            tag,
            "--label",
            f"{MANAGED_LABEL}=build",
            "--label",
            f"{BUILD_LABEL}={image_hash[:24]}",
            "--file",
            str(Path(build.context) / build.dockerfile),
        ]
        if Path(binary).name == "docker":
            args = [a for a in args if a != "--layers=false"]
            args[args.index("private")] = "default"
        for name, value in build.args.items():
            args += ["--build-arg", f"{name}={value}"]
        code, out = await cli(binary, *args, "--", build.context, timeout_s=BUILD_TIMEOUT_S)
        if code != 0:
            offline = (
                ""
                if network
                else " (the build had no network: the sandbox policy's build_network is off, "
                f"which a Dockerfile that downloads, apt-get or pip, needs on: {POLICY_SETTING})"
            )
            raise RuntimeStartError(
                f"image build from {build.context}/{build.dockerfile} failed ({code}){offline}: "
                f"{out.strip()[-800:]}",
                retryable=False,
            )
        touch_used(root, image_hash[:24])
        log.info("image_built", image=tag, duration_s=round(time.monotonic() - began, 2))
        return tag, True


async def collect_garbage(binary: str, root: Path, max_bytes: int) -> list[str]:
    """Remove the least recently used built images until those left take ``max_bytes`` at
    most; images in use by a container are skipped.

    Returns:
        The names of the images removed.
    """
    code, out = await cli(
        binary, "images", "--filter", f"label={MANAGED_LABEL}=build", "--format", "json"
    )
    if code != 0:
        log.warning("image_gc_list_failed", output=out.strip()[-300:])
        return []
    records = Path(root) / RECORDS_DIR
    used: dict[str, float] = {}
    for image in json.loads(out or "[]"):
        digest = str((image.get("Labels") or {}).get(BUILD_LABEL, ""))
        with contextlib.suppress(OSError):
            used[image["Id"]] = (records / digest).stat().st_mtime if digest else -1
    # only images this root built or used (a record): other workers' builds are theirs
    images = [i for i in json.loads(out or "[]") if used.get(i["Id"], -1) >= 0]
    images.sort(key=lambda i: used[i["Id"]])
    total = sum(int(i.get("Size") or 0) for i in images)
    removed: list[str] = []
    for image in images:
        if total <= max_bytes:
            break
        names = image.get("Names") or [image["Id"]]
        code, out = await cli(binary, "rmi", "--", image["Id"])
        if code != 0:  # in use by a container: kept
            log.info("image_gc_skipped", image=names[0], output=out.strip()[-200:])
            continue
        total -= int(image.get("Size") or 0)
        removed.append(names[0])
        for name in names:
            _configs.pop((binary, name), None)
        digest = str((image.get("Labels") or {}).get(BUILD_LABEL, ""))
        if digest:
            (records / digest).unlink(missing_ok=True)
    if removed:
        log.info("images_collected", num_removed=len(removed), bytes_left=total)
    return removed
