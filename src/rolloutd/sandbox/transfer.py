"""Files in and out of a runtime anywhere in its file system, not only its workspace and HOME.

:meth:`Runtime.upload` writes below the workspace or HOME, which the worker holds on the host.
A container runtime's other folders (``/tests``, ``/solution``, ``/logs/verifier`` in a Harbor
task) exist only inside, so these helpers go through a command in the runtime: a tar stream on
standard input (GNU tar, tar(1)), or ``cat`` of a file. The runtime's commands run as its root
in a container runtime; a runtime that cannot write the target fails the command.
"""

from __future__ import annotations

import io
import shlex
import tarfile
from pathlib import Path

from rolloutd.errors import PolicyError, RolloutdError
from rolloutd.sandbox.runtimes.base import Runtime
from rolloutd.sandbox_policy import upload_violation

#: bytes of a file :func:`read_inside` returns at most.
MAX_READ_BYTES = 1 << 20


def tar_tree(source: Path) -> bytes:
    """``source``'s files (and empty folders) as an uncompressed tar, paths relative to it,
    owned by root, modes kept."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(source.rglob("*")):
            info = tar.gettarinfo(str(path), arcname=str(path.relative_to(source)))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if info.isreg():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    return buffer.getvalue()


def check_source(runtime: Runtime, source: Path, field: str) -> None:
    """Refuse a host folder a task names outside the runtime's sandbox policy
    (``upload_sources``, symlinks followed), as prepare-step uploads are refused.

    Raises:
        PolicyError: ``source`` is not below an allowed upload source.
    """
    if runtime.policy is None:
        return
    why = upload_violation(str(source), runtime.policy, resolve=True)
    if why:
        raise PolicyError(
            f"{field}={str(source)!r} is outside the sandbox policy: {why} (upload_sources: "
            f"{', '.join(runtime.policy.upload_sources) or 'none'})"
        )


async def copy_tree_in(
    runtime: Runtime, source: Path, target: str, *, replace: bool = True, timeout_s: float = 120.0
) -> None:
    """Copy the host folder ``source`` to the folder ``target`` inside ``runtime``.

    Args:
        runtime: a started runtime.
        source: a host folder.
        target: an absolute folder inside; with ``replace``, whatever was there is removed
            first (so nothing the agent left at that path survives).
        replace: remove ``target`` before copying.
        timeout_s: limit of the copy, s.

    Raises:
        RolloutdError: the command failed (no ``tar`` in the image, a read-only target).
    """
    quoted = shlex.quote(target)
    prefix = f"rm -rf {quoted} && " if replace else ""
    result = await runtime.exec(
        ["/bin/sh", "-c", f"{prefix}mkdir -p {quoted} && tar -x --no-same-owner -C {quoted}"],
        stdin=tar_tree(source),
        timeout_s=timeout_s,
        cwd="/",
    )
    if result.exit_code != 0:
        raise RolloutdError(
            f"runtime {runtime.runtime_id}: copying {source} to {target} failed "
            f"(exit {result.exit_code}): {(result.stderr or result.stdout).strip()[-300:]}"
        )


async def read_inside(runtime: Runtime, path: str, *, timeout_s: float = 30.0) -> str | None:
    """The text of the file ``path`` inside ``runtime`` (UTF-8, invalid bytes replaced), or
    None when there is no such file."""
    result = await runtime.exec(
        ["/bin/sh", "-c", f"test -f {shlex.quote(path)} && cat {shlex.quote(path)}"],
        timeout_s=timeout_s,
        max_output_bytes=MAX_READ_BYTES,
        cwd="/",
    )
    return result.stdout if result.exit_code == 0 else None
