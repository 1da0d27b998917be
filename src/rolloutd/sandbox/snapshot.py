"""A fresh container from a runtime's final file system: where a verifier runs, out of the
agent's reach.

A new runtime starts from the agent's image (the same spec: image or build, workdir, limits),
with the verifier's network policy (checked against the agent runtime's sandbox policy). Then
the agent's changes are carried over:

- everything the agent's container changed outside its bind mounts (podman-diff(1): added,
  changed and deleted paths of its own file system) is packed by ``tar`` *inside* the agent's
  container, so owners are the container's own (the agent's container runs in a user
  namespace: a ``podman commit`` would store the host's shifted uids, which a new user
  namespace cannot map), and unpacked as root in the fresh one after the deleted paths are
  removed there;
- the workspace (a bind mount of a host folder, not part of the container's file system) is
  replaced by a copy of the agent's.

Nothing of the agent's runs in the fresh container and its HOME (the harness's configuration,
the session key) is not carried over. The runtime's own mounts (workspace, HOME, the exec
server, the host's Python and harness CLIs) are never carried over either.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path, PurePosixPath
from typing import Any

import structlog

from rolloutd.errors import ConfigError, RolloutdError, RuntimeStartError
from rolloutd.sandbox.runtimes import create_runtime, podman_images
from rolloutd.sandbox.runtimes.base import Runtime
from rolloutd.types import RuntimeSpec

log = structlog.get_logger(__name__)

#: runtime types whose file system changes can be listed (podman-diff(1), docker-diff(1))
SNAPSHOT_RUNTIMES = ("podman", "docker")
#: seconds a diff may take
CLI_TIMEOUT_S = 600.0
#: folders whose contents are never carried over: kernel file systems, the runtime's own
#: mounts and the files podman writes into every container
NEVER_CARRIED = (
    "/proc",
    "/sys",
    "/dev",
    "/run/rolloutd",
    "/run/rolloutd-host",
    "/run/rolloutd-exec-server.pyc",
    "/run/.containerenv",
    "/etc/hosts",
    "/etc/hostname",
    "/etc/resolv.conf",
)
#: the pack of changes, in the agent's HOME (a bind mount: the worker reads it on the host)
PACK_NAME = ".rolloutd-changes.tar"


def _binary(runtime: Runtime) -> str:
    if runtime.type not in SNAPSHOT_RUNTIMES:
        raise ConfigError(
            f"a fresh container from the agent's file system needs a container runtime "
            f"({', '.join(SNAPSHOT_RUNTIMES)}), not {runtime.type}"
        )
    return str(getattr(runtime, "binary", runtime.type))


def _container(runtime: Runtime) -> str:
    return str(getattr(runtime, "name", f"rolloutd-{runtime.runtime_id}"))


async def _ask(runtime: Runtime, what: str, *args: str) -> str:
    """Run the container CLI command ``args`` on the runtime's container (its name last); its
    stdout.

    Raises:
        ConfigError: not a container runtime.
        RuntimeStartError: the command failed (``what`` names it).
    """
    code, out = await podman_images.cli(
        _binary(runtime), *args, _container(runtime), timeout_s=CLI_TIMEOUT_S, merge_stderr=False
    )
    if code != 0:
        raise RuntimeStartError(f"{what} of runtime {runtime.runtime_id} failed: {out[-300:]}")
    return out


def _excluded(runtime: Runtime) -> list[PurePosixPath]:
    """Paths (and what is below them) never carried over from ``runtime``."""
    tool_dirs = getattr(runtime, "_tool_dirs", lambda: [])()
    return [
        PurePosixPath(p)
        for p in (*NEVER_CARRIED, runtime.workdir, runtime.home, *map(str, tool_dirs))
    ]


def _kept(path: str, excluded: list[PurePosixPath]) -> bool:
    inside = PurePosixPath(path)
    # a mount point's parents (podman made them) are kept: they are plain folders
    return not any(inside == e or inside.is_relative_to(e) for e in excluded)


async def changes(runtime: Runtime) -> tuple[list[str], list[str]]:
    """What the agent's container changed in its own file system: ``(added or changed,
    deleted)`` absolute paths, the runtime's own mounts left out.

    Raises:
        ConfigError: not a container runtime.
        RuntimeStartError: the diff failed.
    """
    out = await _ask(runtime, "diff", "diff", "--format", "json")
    diff: dict[str, Any] = json.loads(out or "{}")
    excluded = _excluded(runtime)
    written = sorted(
        {
            p
            for p in [*(diff.get("added") or []), *(diff.get("changed") or [])]
            if _kept(p, excluded)
        }
    )
    deleted = sorted(p for p in diff.get("deleted") or [] if _kept(p, excluded))
    return written, deleted


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
    out = await _ask(
        runtime, "inspect", "container", "inspect", "--size", "--format", "{{.SizeRw}}"
    )
    return int(out.strip().splitlines()[-1]) + await asyncio.to_thread(
        _tree_bytes, runtime.workspace
    )


async def _pack(runtime: Runtime, written: list[str]) -> bytes:
    """The written paths as a tar made inside ``runtime`` (owners as the container sees them);
    folders without their contents (each changed file is listed on its own)."""
    pack_inside = f"{runtime.home}/{PACK_NAME}"
    result = await runtime.exec(
        ["tar", "-c", "--no-recursion", "--null", "-T", "-", "-f", pack_inside],
        stdin=b"\0".join(p.encode() for p in written),
        cwd="/",
        timeout_s=CLI_TIMEOUT_S,
    )
    if result.exit_code not in (0, 1):  # 1: a file changed while read (tar(1)): kept
        raise RolloutdError(f"packing the agent's changes failed: {result.stderr[-300:]}")
    host = runtime.host_path(pack_inside)
    try:
        return await asyncio.to_thread(host.read_bytes)
    finally:
        host.unlink(missing_ok=True)


def _replace_tree(source: Path, target: Path) -> None:
    for child in list(target.iterdir()):
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    shutil.copytree(source, target, symlinks=True, dirs_exist_ok=True)


class FreshRuntime:
    """An async context manager: the started fresh runtime (see the module docstring); on
    exit it is stopped.

    Args:
        source: the agent's started runtime (a container runtime).
        network: the fresh runtime's network policy (``none`` or ``host``).
        env: its extra environment (on top of ``source.spec.env``).
        purpose: a short word in its runtime id (``v``): its folder holds a unix socket, whose
            path must fit in 108 bytes (unix(7)).

    Attributes:
        num_written, num_deleted: paths carried over from the agent's file system.
    """

    def __init__(
        self, source: Runtime, *, network: str, env: dict[str, str], purpose: str = "v"
    ) -> None:
        self.source = source
        self.network = network
        self.env = env
        self.purpose = purpose
        self.runtime: Runtime | None = None
        self.num_written = self.num_deleted = 0

    async def __aenter__(self) -> Runtime:
        source = self.source
        written, deleted = await changes(source)
        pack = await _pack(source, written) if written else b""
        updates: dict[str, Any] = {
            "network": self.network,
            "env": {**source.spec.env, **self.env},
            "files": {},
            "prepare": [],
            "artifacts": [],
        }
        spec = RuntimeSpec.model_validate({**source.spec.model_dump(), **updates})
        runtime = create_runtime(
            spec,
            f"{source.runtime_id}-{self.purpose}",
            source.runtime_dir.parent,
            grace_s=source.grace_s,
            policy=source.policy,
            host_id=str(getattr(source, "host_id", "")),
        )
        self.runtime = runtime
        try:
            await runtime.start()
            await asyncio.to_thread(_replace_tree, source.workspace, runtime.workspace)
            await runtime.adopt(runtime.workspace)
            if deleted:
                await self._run(
                    runtime, "xargs -0 -r rm -rf --", b"\0".join(map(str.encode, deleted))
                )
            if pack:
                await self._run(runtime, "tar -x -p --same-owner -C / -f -", pack)
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        self.num_written, self.num_deleted = len(written), len(deleted)
        log.info(
            "fresh_runtime_started",
            runtime_id=runtime.runtime_id,
            num_written=len(written),
            num_deleted=len(deleted),
        )
        return runtime

    @staticmethod
    async def _run(runtime: Runtime, command: str, stdin: bytes) -> None:
        result = await runtime.exec(
            ["/bin/sh", "-c", command], stdin=stdin, cwd="/", timeout_s=CLI_TIMEOUT_S
        )
        if result.exit_code != 0:
            raise RolloutdError(
                f"carrying the agent's changes over failed ({command}): {result.stderr[-300:]}"
            )

    async def __aexit__(self, *exc: object) -> None:
        if self.runtime is not None:
            await self.runtime.stop()
            self.runtime = None
