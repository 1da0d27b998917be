"""A fresh container for a verifier, out of the agent's reach, and the tamper report of what
the agent changed (:class:`rolloutd.types.TamperReport`; the rules in
:mod:`rolloutd.sandbox.tamper`).

**What the verifier sees.** A new runtime starts from the agent's image (the same spec: image
or build, workdir, limits, the task's files), with the verifier's network policy (checked
against the agent runtime's sandbox policy). By default it gets the agent's workdir and
nothing else of the agent's file system:

- the workspace (a bind mount of a host folder) is replaced, host-side, by a copy of the
  agent's (links copied as links; ``__pycache__`` folders left out: Python compiles the sources
  again, and a cache is code a reader of the sources does not see);
- what the agent's container changed outside its mounts (podman-diff(1): added, changed and
  deleted paths of its own file system) is not carried: the programs, libraries, interpreter
  and shell start-up files the verifier runs with are the image's. The changed paths a
  verifier must not trust are listed in the report's ``ignored``.

With ``carry_system_changes`` (a task set's choice, for tasks whose answer is a change to the
system, such as a configuration file in ``/etc``) those changes are carried too, and every
changed program, library, interpreter path, runner configuration, shell profile, git
configuration or verifier folder among them is a finding (the session scores 0.0 and nothing
is carried). Only when there is none are they packed: by ``tar`` *inside* the agent's
container, so owners are the container's own (its root is a shifted host uid: a ``podman
commit`` would store the shifted uids, which a new user namespace cannot map); that ``tar``,
its libraries and its loader's configuration are then the image's (any change to them is a
finding). The pack streams to a host file, never whole in the worker's memory, and is bounded
(``max_pack_bytes``; over it the verifier does not run: :attr:`FreshRuntime.pack_too_large`).
Its entries are checked against the diff (names, hard links, types, modes: an executable file
is a finding), then the deleted paths are removed and the pack unpacked in the fresh container
by the image's own ``rm`` and ``tar``, before anything of the agent's is there.

**What is examined.** Both ways, the workspace is compared with the task image's workdir (the
fresh container's, seeded from the image before the agent's copy replaces it): a runner
configuration the task did not ship, a git hook, ... (:func:`rolloutd.sandbox.tamper.
examine_workdir`) is a finding, and the verifier does not run on it.

Nothing of the agent's runs in the fresh container and its HOME (the harness's configuration,
the session key) is not carried over. The runtime's own mounts (workspace, HOME, the exec
server, the host's Python and harness CLIs) are never carried over either.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import shutil
import tarfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import structlog

from rolloutd.errors import ArtifactTooLargeError, RolloutdError, RuntimeStartError
from rolloutd.records import TamperFinding, TamperReport
from rolloutd.sandbox import tamper
from rolloutd.sandbox.runtimes import create_runtime, podman_images
from rolloutd.sandbox.runtimes.base import Runtime
from rolloutd.sandbox.runtimes.process import BoundedOutput, drain
from rolloutd.sandbox.transfer import container_cli
from rolloutd.types import RuntimeSpec

log = structlog.get_logger(__name__)

#: seconds a diff, a pack or an unpack may take
CLI_TIMEOUT_S = 600.0
#: bytes the pack of the agent's system changes may hold at most (a task may ask for less)
MAX_PACK_BYTES = 2 << 30
#: folders whose contents are never carried over: kernel file systems, the runtime's own
#: mounts, the files podman writes into every container, and a Harbor harness's own input and
#: logs (``/solution``, which the oracle copies in, and ``/logs/agent``: Harbor's
#: ``EnvironmentPaths``), which are no part of an answer
NEVER_CARRIED = (
    "/solution",
    "/logs/agent",
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
#: the pack of changes, in the agent's runtime folder on the host (never visible inside)
PACK_NAME = "changes.tar"
#: bytes read from the pack's stream at a time
_CHUNK_BYTES = 1 << 20


@dataclass
class Changes:
    """What a container changed in its own file system (podman-diff(1)), absolute paths, the
    runtime's own mounts left out."""

    added: list[str] = field(default_factory=list)
    modified: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    @property
    def written(self) -> list[str]:
        """Added or modified paths, sorted."""
        return sorted({*self.added, *self.modified})

    def leaves(self) -> set[str]:
        """The changed paths but the folders above another changed path (a diff lists
        every folder above a change as changed)."""
        return set(tamper.leaves([*self.added, *self.modified, *self.deleted]))


async def _ask(runtime: Runtime, what: str, *args: str) -> str:
    """Run the container CLI command ``args`` on the runtime's container (its name last); its
    stdout.

    Raises:
        ConfigError: not a container runtime.
        RuntimeStartError: the command failed (``what`` names it).
    """
    binary, name = container_cli(runtime)
    code, out = await podman_images.cli(
        binary, *args, name, timeout_s=CLI_TIMEOUT_S, merge_stderr=False
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


async def changes(runtime: Runtime) -> Changes:
    """What the agent's container changed in its own file system, the runtime's own mounts
    left out (``podman diff --format json``, read host-side).

    Raises:
        ConfigError: not a container runtime.
        RuntimeStartError: the diff failed.
    """
    out = await _ask(runtime, "diff", "diff", "--format", "json")
    diff: dict[str, Any] = json.loads(out or "{}")
    excluded = _excluded(runtime)

    def kept(key: str) -> list[str]:
        return sorted(p for p in diff.get(key) or [] if _kept(p, excluded))

    return Changes(added=kept("added"), modified=kept("changed"), deleted=kept("deleted"))


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


def path_folders(runtime: Runtime, env: dict[str, str], name: str) -> tuple[str, ...]:
    """The folders of the search path variable ``name`` (``PATH``, ``PYTHONPATH``) that a
    command of ``runtime`` gets with the extra environment ``env``."""
    base = getattr(runtime, "_base_env", dict)()  # the runtime's own environment
    value = {**base, **runtime.spec.env, **env}.get(name, "")
    return tuple(value.split(":")) if value else ()


async def pack_changes(runtime: Runtime, written: list[str], target: Path, max_bytes: int) -> int:
    """Pack the paths ``written`` of ``runtime``'s file system into the host file ``target``
    (``tar --no-recursion`` inside the runtime: folders without their contents, each changed
    file listed on its own; owners as the container sees them), streamed to disk.

    Returns:
        The pack's size, bytes.

    Raises:
        ArtifactTooLargeError: the pack grew past ``max_bytes``, or past what the disk of
            ``target`` holds (a runtime's folder is its sized disk: ``disk_mb``); ``target``
            is removed.
        RolloutdError: ``tar`` failed.
    """
    # _launch, not exec: exec keeps a command's output in memory
    process = await runtime._launch(
        ["tar", "-c", "--no-recursion", "--null", "-T", "-", "-f", "-"],
        env=None,
        cwd="/",
        name="pack",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    pipes = process.process
    errors = BoundedOutput(4096)
    reader = asyncio.ensure_future(drain(pipes.stderr, errors))  # type: ignore[arg-type]
    # fed while the pack is read: tar writes as it reads names, and a full pipe stops it
    feeder = asyncio.ensure_future(_feed(pipes.stdin, b"\0".join(p.encode() for p in written)))
    size = 0
    try:
        with open(target, "wb") as out:
            async with asyncio.timeout(CLI_TIMEOUT_S):
                while chunk := await pipes.stdout.read(_CHUNK_BYTES):  # type: ignore[union-attr]
                    size += len(chunk)
                    if size > max_bytes:
                        raise ArtifactTooLargeError(
                            f"the agent's changes outside its workdir pack to more than "
                            f"{max_bytes} bytes (the verifier's max_pack_bytes)"
                        )
                    try:
                        await asyncio.to_thread(out.write, chunk)
                    except OSError as exc:
                        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                            raise
                        # the runtime's folder is on its sized disk: the agent filled it
                        raise ArtifactTooLargeError(
                            f"the agent's changes outside its workdir do not fit beside its "
                            f"workspace on the runtime's disk (disk_mb): {exc.strerror}"
                        ) from exc
            code = await process.wait(CLI_TIMEOUT_S)
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    finally:
        if process.alive():
            await process.kill()
        reader.cancel()
        feeder.cancel()
        process.close_pipes()
    if code not in (0, 1):  # 1: a file changed while read (tar(1)): kept
        target.unlink(missing_ok=True)
        raise RolloutdError(f"packing the agent's changes failed (exit {code}): {errors.text()}")
    return size


async def _feed(stdin: asyncio.StreamWriter | None, data: bytes) -> None:
    """Write ``data`` to a command's standard input, then close it (an early exit is fine)."""
    assert stdin is not None
    try:
        stdin.write(data)
        await stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        return
    finally:
        stdin.close()


def check_pack(pack: Path, written: list[str]) -> list[TamperFinding]:
    """Read the pack's entries (headers only, from disk) against the diff.

    Returns:
        The findings among them: an executable file (any ``x`` bit), a link at or above the
        verifier's folders, a device node.

    Raises:
        RolloutdError: an entry the diff does not list, twice the same entry, or a hard link
            to a file outside the pack (the pack is not the agent's changes).
    """
    expected, seen = set(written), set()
    findings: list[TamperFinding] = []
    above_verifier = {
        str(p) for v in tamper.VERIFIER_PATHS for p in [PurePosixPath(v), *PurePosixPath(v).parents]
    }
    with tarfile.open(pack, mode="r:") as tar:
        for member in tar:
            path = "/" + member.name.removeprefix("./").strip("/")
            if path not in expected or path in seen:
                raise RolloutdError(f"the pack of the agent's changes holds {path!r} unexpectedly")
            seen.add(path)
            if member.islnk() and "/" + member.linkname.removeprefix("./").lstrip("/") not in seen:
                raise RolloutdError(f"the pack links {path!r} to a file outside it")
            if member.issym() and path in above_verifier:
                findings.append(
                    TamperFinding(
                        path=path, category="verifier_path", detail="a link on the verifier's path"
                    )
                )
            elif member.isreg() and member.mode & 0o111:
                findings.append(
                    TamperFinding(path=path, category="executable", detail="an executable file")
                )
            elif member.isdev():
                findings.append(
                    TamperFinding(path=path, category="executable", detail="a device node")
                )
    return findings


def _replace_tree(source: Path, target: Path) -> None:
    for child in list(target.iterdir()):
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    shutil.copytree(
        source,
        target,
        symlinks=True,
        dirs_exist_ok=True,
        ignore=shutil.ignore_patterns("__pycache__"),
    )


class FreshRuntime:
    """An async context manager: the started fresh runtime (see the module docstring); on
    exit it is stopped.

    Args:
        source: the agent's started runtime (a container runtime).
        network: the fresh runtime's network policy (``none`` or ``host``).
        env: its extra environment (on top of ``source.spec.env``).
        carry_system_changes: carry the agent's changes outside its workdir (see the module).
        max_pack_bytes: the pack's bound, bytes (at most :data:`MAX_PACK_BYTES`).
        verifier_env: the environment the verifier's command gets on top (its ``PATH`` and
            ``PYTHONPATH`` decide which workdir folders are examined as such).
        purpose: a short word in its runtime id (``v``): its folder holds a unix socket, whose
            path must fit in 108 bytes (unix(7)).

    Attributes:
        report: the tamper report, once entered; with findings, nothing of the agent's was
            carried and the verifier must not run.
        pack_too_large: why the verifier must not run because the pack passed its bound (the
            report is then of the system changes alone), or None.
    """

    def __init__(
        self,
        source: Runtime,
        *,
        network: str,
        env: dict[str, str],
        carry_system_changes: bool = False,
        max_pack_bytes: int = MAX_PACK_BYTES,
        verifier_env: dict[str, str] | None = None,
        purpose: str = "v",
    ) -> None:
        self.source = source
        self.network = network
        self.env = env
        self.carry = carry_system_changes
        self.max_pack_bytes = min(max_pack_bytes, MAX_PACK_BYTES)
        self.verifier_env = verifier_env or {}
        self.purpose = purpose
        self.runtime: Runtime | None = None
        self.report: TamperReport | None = None
        self.pack_too_large: str | None = None

    def _system(self, found: Changes) -> list[TamperFinding]:
        """The changed system paths a verifier must not trust, by name."""
        path_dirs = path_folders(self.source, {**self.env, **self.verifier_env}, "PATH")
        listed: list[TamperFinding] = []
        leaves = found.leaves()
        for change, paths in (
            ("added", found.added),
            ("modified", found.modified),
            ("deleted", found.deleted),
        ):
            for path in paths:
                if path not in leaves or tamper.is_bytecode_cache(path):
                    continue
                if kind := tamper.classify_system_path(path, change, path_dirs=path_dirs):
                    listed.append(
                        TamperFinding(path=path, category=kind[0], change=change, detail=kind[1])
                    )
        return listed

    async def __aenter__(self) -> Runtime:
        source = self.source
        found = await changes(source)
        system = self._system(found)
        findings = list(system) if self.carry else []
        pack: Path | None = None
        written = [p for p in found.written if not tamper.is_bytecode_cache(p)]
        if self.carry and not findings and (written or found.deleted):
            pack = source.runtime_dir / PACK_NAME
            try:
                if written:
                    await pack_changes(source, written, pack, self.max_pack_bytes)
                    findings += await asyncio.to_thread(check_pack, pack, written)
            except ArtifactTooLargeError as exc:
                self.pack_too_large = exc.message
                pack = None
        try:
            return await self._start(found, system, findings, pack)
        finally:
            if pack is not None:
                pack.unlink(missing_ok=True)

    async def _start(
        self,
        found: Changes,
        system: list[TamperFinding],
        findings: list[TamperFinding],
        pack: Path | None,
    ) -> Runtime:
        source = self.source
        updates: dict[str, Any] = {
            "network": self.network,
            "env": {**source.spec.env, **self.env},
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
            # the fresh workspace holds what the image (and the task's files) put there
            verifier_env = {**self.env, **self.verifier_env}
            workdir = await asyncio.to_thread(
                tamper.examine_workdir,
                runtime.workspace,
                source.workspace,
                workdir=source.workdir,
                path_dirs=path_folders(runtime, verifier_env, "PATH"),
                python_path_dirs=path_folders(runtime, verifier_env, "PYTHONPATH"),
            )
            findings = [*findings, *workdir.findings]
            self.report = tamper.report(
                findings,
                [] if self.carry else system,
                num_changed_paths=len(found.leaves()) + workdir.num_changed,
                carried_system_changes=self.carry,
            )
            if findings or self.pack_too_large:
                log.info(
                    "fresh_runtime_not_carried",
                    runtime_id=runtime.runtime_id,
                    num_findings=len(findings),
                    pack_too_large=bool(self.pack_too_large),
                )
                return runtime
            if self.carry and found.deleted:
                await remove_paths(runtime, found.deleted)
            if pack is not None and pack.exists():
                await unpack_at_root(runtime, pack)
            await asyncio.to_thread(_replace_tree, source.workspace, runtime.workspace)
            await runtime.adopt(runtime.workspace)
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        log.info(
            "fresh_runtime_started",
            runtime_id=runtime.runtime_id,
            carried_system_changes=self.carry,
            num_changed=self.report.num_changed_paths,
            num_ignored=len(self.report.ignored),
        )
        return runtime

    async def __aexit__(self, *exc: object) -> None:
        if self.runtime is not None:
            await self.runtime.stop()
            self.runtime = None


async def _run(runtime: Runtime, command: str, stdin: bytes) -> None:
    """Run ``command`` by the image's ``sh`` in the fresh runtime (nothing of the agent's is
    there yet).

    Raises:
        RolloutdError: it failed.
    """
    result = await runtime.exec(
        ["/bin/sh", "-c", command], stdin=stdin, cwd="/", timeout_s=CLI_TIMEOUT_S
    )
    if result.exit_code != 0:
        raise RolloutdError(
            f"carrying the agent's changes over failed ({command}): {result.stderr[-300:]}"
        )


async def remove_paths(runtime: Runtime, paths: list[str]) -> None:
    """Remove the absolute ``paths`` (and what is below them) in a fresh runtime, by the
    image's ``sh`` and ``rm`` (nothing of the agent's is there yet).

    Raises:
        RolloutdError: it failed.
    """
    await _run(runtime, "xargs -0 -r rm -rf --", b"\0".join(map(str.encode, paths)))


async def unpack_at_root(runtime: Runtime, pack: Path) -> None:
    """Unpack the host file ``pack`` at ``/`` of a fresh runtime as its root, owners kept,
    by the image's ``tar`` reading the file itself (never whole in memory; nothing of the
    agent's is there yet).

    Raises:
        RolloutdError: tar failed.
    """
    with open(pack, "rb") as stdin:
        process = await runtime._launch(
            ["/bin/sh", "-c", "tar -x -p --same-owner -C / -f -"],
            env=None,
            cwd="/",
            name="unpack",
            stdin=stdin,  # type: ignore[arg-type]  # an open file: the exec server takes its fd
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
    errors = BoundedOutput(4096)
    reader = asyncio.ensure_future(drain(process.process.stderr, errors))  # type: ignore[arg-type]
    try:
        code = await process.wait(CLI_TIMEOUT_S)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(reader, 1.0)
    finally:
        if process.alive():
            await process.kill()
        reader.cancel()
        process.close_pipes()
    if code != 0:
        raise RolloutdError(f"unpacking the agent's changes failed (exit {code}): {errors.text()}")
