"""Files in and out of a runtime anywhere in its file system, not only its workspace and HOME.

:meth:`Runtime.upload` writes below the workspace or HOME, which the worker holds on the host.
A container runtime's other folders (``/tests``, ``/solution``, ``/logs/verifier`` in a Harbor
task) exist only inside. Two ways reach them:

- **host-side**, for a verifier (:func:`copy_in`, :func:`read_file`): the container CLI's own
  copy (podman-cp(1), docker-cp(1)) streams a tar archive in or out of the container; podman
  resolves the paths inside the container's root, and nothing inside the container runs, so
  no program a session left there (a ``tar``, ``sh`` or ``cat`` first on ``PATH``, a
  preloaded library) takes part. Only container runtimes have a CLI to do it.
- **through a command in the runtime** (:func:`copy_tree_in`, for a harness such as the
  oracle, which runs as the agent anyway): a tar stream on standard input (GNU tar, tar(1)).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import shlex
import subprocess
import tarfile
import threading
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from rolloutd.errors import ConfigError, PolicyError, RolloutdError
from rolloutd.sandbox.runtimes.base import Runtime
from rolloutd.sandbox_policy import upload_violation

#: bytes of a file :func:`read_file` returns at most.
MAX_READ_BYTES = 1 << 20
#: runtime types with a container CLI (podman-cp(1), docker-cp(1), podman-diff(1), ...)
CONTAINER_RUNTIMES = ("podman", "docker")
#: bytes read after a file's archive before the copy is ended (its padding is less)
DRAIN_BYTES = 1 << 16
#: seconds a container CLI copy may take
COPY_TIMEOUT_S = 600.0


def container_cli(runtime: Runtime) -> tuple[str, str]:
    """The container CLI binary and container name of a container runtime.

    Raises:
        ConfigError: not a container runtime.
    """
    if runtime.type not in CONTAINER_RUNTIMES:
        raise ConfigError(
            f"host-side access to a runtime's file system needs a container runtime "
            f"({', '.join(CONTAINER_RUNTIMES)}), not {runtime.type}"
        )
    binary = str(getattr(runtime, "binary", runtime.type))
    return binary, str(getattr(runtime, "name", f"rolloutd-{runtime.runtime_id}"))


def tar_tree(source: Path) -> bytes:
    """``source``'s files (and empty folders) as an uncompressed tar, paths relative to it,
    owned by root, modes kept."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        _add_tree(tar, source, "")
    return buffer.getvalue()


def _add_tree(tar: tarfile.TarFile, source: Path, prefix: str) -> None:
    """Add ``source``'s entries below ``prefix`` (root-owned, modes kept; links as links)."""
    for path in sorted(source.rglob("*")):
        name = str(PurePosixPath(prefix) / path.relative_to(source)) if prefix else None
        info = tar.gettarinfo(str(path), arcname=name or str(path.relative_to(source)))
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        if info.isreg():
            with open(path, "rb") as f:
                tar.addfile(info, f)
        else:
            tar.addfile(info)


def _folder_entry(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.uname, info.gname = tarfile.DIRTYPE, 0o755, "root", "root"
    return info


def write_pack(target: Path, trees: dict[str, Path | None]) -> None:
    """Write a tar to ``target`` holding each host folder of ``trees`` at its path (relative
    to ``/``; None: an empty folder), owned by root, modes kept, parents made."""
    with tarfile.open(target, mode="w") as tar:
        made: set[str] = set()
        for inside, source in trees.items():
            parts = PurePosixPath(inside.strip("/")).parts
            for n in range(1, len(parts) + 1):
                folder = "/".join(parts[:n])
                if folder not in made:
                    tar.addfile(_folder_entry(folder))
                    made.add(folder)
            if source is not None:
                _add_tree(tar, source, "/".join(parts))


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


async def copy_in(runtime: Runtime, pack: Path, *, timeout_s: float = COPY_TIMEOUT_S) -> None:
    """Unpack the tar file ``pack`` at ``/`` of a container runtime with the container CLI
    (``podman cp - NAME:/``), from the host side: its entries become the container root's
    (``--archive``, podman-cp(1)), folders that exist are merged into.

    Raises:
        ConfigError: not a container runtime.
        RolloutdError: the copy failed.
    """
    binary, name = container_cli(runtime)
    with open(pack, "rb") as stdin:
        code, out = await _run_cli([binary, "cp", "-", f"{name}:/"], stdin, timeout_s)
    if code != 0:
        raise RolloutdError(
            f"runtime {runtime.runtime_id}: copying in with `{Path(binary).name} cp` failed "
            f"(exit {code}): {out.strip()[-300:]}"
        )


async def _run_cli(argv: list[str], stdin: BinaryIO, timeout_s: float) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=stdin,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    except (TimeoutError, asyncio.CancelledError):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode(errors="replace")


class ReadResult:
    """What :func:`read_file` found at a path.

    Attributes:
        data: the file's bytes (at most ``max_bytes``), or None.
        kind: ``file``, ``missing``, ``not_a_file`` (a folder, a link, a device) or
            ``too_large`` (``data`` is None then).
    """

    def __init__(self, kind: str, data: bytes | None = None) -> None:
        self.kind = kind
        self.data = data

    def text(self) -> str | None:
        """The file's text (UTF-8, invalid bytes replaced), or None without a file."""
        return self.data.decode("utf-8", errors="replace") if self.data is not None else None


async def read_file(
    runtime: Runtime,
    path: str,
    *,
    max_bytes: int = MAX_READ_BYTES,
    timeout_s: float = 60.0,
) -> ReadResult:
    """Read the file ``path`` of a container runtime from the host side (``podman cp
    NAME:path -``, a tar on its standard output, read as a stream): the program that reads it
    is the container CLI, never one inside the container. A link is not followed (podman-cp(1)
    copies the link itself): it is ``not_a_file``.

    Args:
        runtime: a started container runtime.
        path: an absolute path inside.
        max_bytes: bytes of the file read at most; a larger file is ``too_large``.
        timeout_s: limit of the copy, s.

    Raises:
        ConfigError: not a container runtime.
        RolloutdError: the copy failed for another reason than a missing path.
    """
    binary, name = container_cli(runtime)
    return await asyncio.to_thread(
        _read_file, [binary, "cp", f"{name}:{path}", "-"], max_bytes, timeout_s
    )


def cli_stream(argv: list[str]) -> subprocess.Popen[bytes]:
    """A container CLI command whose standard output is read as a stream (a tar), in a
    session of its own (killed as a group), its standard error kept for the error."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    return proc


def _read_file(argv: list[str], max_bytes: int, timeout_s: float) -> ReadResult:
    proc = cli_stream(argv)
    assert proc.stdout is not None and proc.stderr is not None

    def kill() -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)

    timer = threading.Timer(timeout_s, kill)
    timer.start()
    result = ReadResult("missing")
    try:
        try:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                first = tar.next()
                if first is None:
                    pass
                elif not first.isreg():
                    result = ReadResult("not_a_file")
                elif first.size > max_bytes:
                    result = ReadResult("too_large")
                else:
                    f = tar.extractfile(first)
                    result = ReadResult("file", f.read() if f is not None else b"")
        except tarfile.ReadError:
            pass  # no archive: a missing path (podman says so on stderr)
        # what is left of one file's archive is its padding: more means something else
        if len(proc.stdout.read(DRAIN_BYTES)) >= DRAIN_BYTES:
            kill()
        stderr = proc.stderr.read(4096).decode(errors="replace")
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            kill()
        proc.stdout.close()
        proc.stderr.close()
    if result.kind == "missing" and "no such file" not in stderr.lower():
        raise RolloutdError(
            f"`{Path(argv[0]).name} cp {argv[2]} -` failed (exit {proc.returncode}): "
            f"{stderr.strip()[-300:]}"
        )
    return result


async def copy_tree_in(
    runtime: Runtime, source: Path, target: str, *, replace: bool = True, timeout_s: float = 120.0
) -> None:
    """Copy the host folder ``source`` to the folder ``target`` inside ``runtime``, through
    ``sh`` and ``tar`` in the runtime (a harness's step, never a verifier's).

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
