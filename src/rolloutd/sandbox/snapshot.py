"""A fresh container from a runtime's final file system: where a verifier runs, out of the
agent's reach.

The agent's container is committed to an image (podman-commit(1): the container's own file
system, paused while it is read; bind mounts are not part of it), a new runtime starts from that
image with its own network policy and limits, and its workspace (a bind mount, so not in the
image) is replaced by a copy of the agent's. Nothing of the agent's runs there, its HOME (the
harness's configuration) is not carried over, and every folder the verifier uses is made
afresh inside. :func:`fresh_runtime` gives the started runtime; stopping it removes the image.
"""

from __future__ import annotations

import asyncio
import re
import shutil
from pathlib import Path
from typing import Any

import structlog

from rolloutd.errors import ConfigError, RuntimeStartError
from rolloutd.sandbox.runtimes import create_runtime
from rolloutd.sandbox.runtimes.base import Runtime
from rolloutd.types import RuntimeSpec

log = structlog.get_logger(__name__)

#: runtime types whose file system can be committed to an image
SNAPSHOT_RUNTIMES = ("podman", "docker")
#: repository of snapshot images; the tag is the runtime id (lowercase)
SNAPSHOT_REPOSITORY = "localhost/rolloutd-snapshot"
#: label naming the runtime a snapshot image was made from
SNAPSHOT_LABEL = "rolloutd.snapshot"
#: seconds a commit or an image removal may take
CLI_TIMEOUT_S = 600.0


async def _cli(binary: str, *args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        binary,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), CLI_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return -9, "timed out"
    return proc.returncode or 0, out.decode(errors="replace")


def _binary(runtime: Runtime) -> str:
    if runtime.type not in SNAPSHOT_RUNTIMES:
        raise ConfigError(
            f"a fresh container from the agent's file system needs a container runtime "
            f"({', '.join(SNAPSHOT_RUNTIMES)}), not {runtime.type}"
        )
    return str(getattr(runtime, "binary", runtime.type))


async def commit(runtime: Runtime) -> str:
    """Commit ``runtime``'s container to ``localhost/rolloutd-snapshot:{runtime id}``.

    Returns:
        The image's name.

    Raises:
        ConfigError: not a container runtime.
        RuntimeStartError: the commit failed.
    """
    binary = _binary(runtime)
    tag = re.sub(r"[^a-z0-9._-]", "-", runtime.runtime_id.lower())[:120]
    image = f"{SNAPSHOT_REPOSITORY}:{tag}"
    code, out = await _cli(
        binary,
        "commit",
        "--quiet",
        "--pause=true",
        "--change",
        f"LABEL {SNAPSHOT_LABEL}={runtime.runtime_id}",
        str(getattr(runtime, "name", f"rolloutd-{runtime.runtime_id}")),
        image,
    )
    if code != 0:
        raise RuntimeStartError(f"commit of runtime {runtime.runtime_id} failed: {out[-300:]}")
    return image


def _tree_bytes(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total


async def disk_used_bytes(runtime: Runtime) -> int:
    """Bytes the runtime's container wrote: its writable layer (``podman container inspect
    --size``: ``SizeRw``) and its workspace (a bind mount, counted on the host).

    Raises:
        ConfigError: not a container runtime.
        RuntimeStartError: the container cannot be inspected.
    """
    binary = _binary(runtime)
    name = str(getattr(runtime, "name", f"rolloutd-{runtime.runtime_id}"))
    code, out = await _cli(
        binary, "container", "inspect", "--size", "--format", "{{.SizeRw}}", name
    )
    if code != 0:
        raise RuntimeStartError(f"inspect of runtime {runtime.runtime_id} failed: {out[-300:]}")
    return int(out.strip().splitlines()[-1]) + await asyncio.to_thread(
        _tree_bytes, runtime.workspace
    )


async def remove_image(binary: str, image: str) -> None:
    """Remove a snapshot image (a failure is logged: the image is then left behind)."""
    code, out = await _cli(binary, "rmi", "--force", image)
    if code != 0:
        log.warning("snapshot_remove_failed", image=image, output=out[-300:])


def _replace_tree(source: Path, target: Path) -> None:
    for child in list(target.iterdir()):
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)


class FreshRuntime:
    """An async context manager: the started fresh runtime; on exit it is stopped and its
    image removed.

    Args:
        source: the agent's started runtime.
        network: the fresh runtime's network policy (``none`` or ``host``).
        env: its extra environment (on top of ``source.spec.env``).
        purpose: a word in its runtime id (``verify``).
    """

    def __init__(
        self, source: Runtime, *, network: str, env: dict[str, str], purpose: str = "verify"
    ) -> None:
        self.source = source
        self.network = network
        self.env = env
        self.purpose = purpose
        self.runtime: Runtime | None = None
        self.image: str | None = None

    async def __aenter__(self) -> Runtime:
        source = self.source
        self.image = await commit(source)
        updates: dict[str, Any] = {
            "image": self.image,
            "build": None,
            "network": self.network,
            "env": {**source.spec.env, **self.env},
            "files": {},
            "prepare": [],
            "artifacts": [],
        }
        spec = RuntimeSpec.model_validate(
            {
                k: v
                for k, v in {**source.spec.model_dump(), **updates}.items()
                if k in RuntimeSpec.model_fields
            }
        )
        runtime = create_runtime(
            spec,
            f"{source.runtime_id}-{self.purpose}",
            source.runtime_dir.parent,
            grace_s=source.grace_s,
        )
        self.runtime = runtime
        try:
            await runtime.start()
            await asyncio.to_thread(_replace_tree, source.workspace, runtime.workspace)
            await runtime.adopt(runtime.workspace)
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        log.info("fresh_runtime_started", runtime_id=runtime.runtime_id, image=self.image)
        return runtime

    async def __aexit__(self, *exc: object) -> None:
        try:
            if self.runtime is not None:
                await self.runtime.stop()
        finally:
            if self.image is not None:
                await remove_image(_binary(self.source), self.image)
                self.image = None
