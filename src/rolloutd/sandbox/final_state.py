"""Storing a session's final state, and restoring it into a fresh runtime for a re-score
(``rolloutd reverify``). The records are :mod:`rolloutd.final_state`'s.

**What is stored** is what the session's evaluator needs to score it again
(:class:`~rolloutd.final_state.FinalStateParts`, the evaluator's choice): the whole workspace
(``workdir``; on a container runtime also what the container changed in its own file system
outside its mounts, its *system changes*), named workspace files (``files``: an answer file),
or nothing more than the session's git patch, already stored as its ``patch`` artifact
(``patch``).

**How it is read**: host-side, by the worker, after the run ended (every process of the
session was killed by then), never by a program inside the runtime. The workspace is walked
with :func:`os.fwalk` (``follow_symlinks=False``: folders are opened relative to their
parent's descriptor and a link is never descended into) and every file is opened relative to
its folder with ``O_NOFOLLOW`` (open(2)): a link is stored as a link, never followed, so
nothing outside the workspace is read. FIFOs, sockets and devices are not stored (counted in
``num_skipped``). Owners are not kept (the restoring runtime owns what it restores); modes
and times are. A container's system changes are listed by podman-diff(1) (read host-side,
:func:`rolloutd.sandbox.snapshot.changes`) and their entries taken from the container CLI's
own export of its file system (podman-export(1), ``docker export``: host-side, nothing inside
the container runs, so no program the session changed, a ``tar`` first on ``PATH`` included,
takes part), owners as the container sees them; the export is read as a stream and left as
soon as every changed path was found. Device nodes, FIFOs and hard links to a file that did
not change are not kept (counted).

**Bound**: all parts together hold at most ``max_bytes``
(``SandboxSettings.max_final_state_bytes``). A state over it is *refused* whole, never cut:
only the manifest is stored, its ``refused`` naming the bound (a truncated workdir would be
re-scored as another state than the session's). **Streamed**: each tar is written to a file
in the runtime's host folder as it is read (the bound checked on every write), then copied to
the blob store in chunks (:meth:`rolloutd.store.BlobStore.put_file`); never whole in memory.

**Restoring** (:func:`restore_final_state`) happens in a runtime started afresh from the
stored spec, before anything runs in it: system changes first (the deleted paths removed, then
the written entries unpacked at ``/`` as the container's root, both by the image's own ``sh``,
``rm`` and ``tar``, nothing of the session's being there yet; the restored container's own
podman-diff then lists what the session's did), then the workspace's contents are replaced by
the stored ones (``workdir``) or the stored files written over it (``files``), by
:mod:`tarfile` with its ``tar`` filter (no absolute name, nothing outside the workspace, no
write through a link restored before it; setuid, setgid and group/other write bits cleared)
and only files, folders and links extracted; then the runtime adopts them (its user owns
them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import stat
import tarfile
import threading
import time
from pathlib import Path, PurePosixPath
from typing import BinaryIO

import structlog

from rolloutd.errors import ArtifactTooLargeError, ConfigError, RolloutdError
from rolloutd.final_state import FinalState, FinalStateParts, StoredPart, SystemChanges
from rolloutd.sandbox.runtimes.base import Runtime
from rolloutd.sandbox.snapshot import CLI_TIMEOUT_S, changes, remove_paths, unpack_at_root
from rolloutd.sandbox.transfer import CONTAINER_RUNTIMES, cli_stream, container_cli
from rolloutd.store import BlobStore, final_state_key
from rolloutd.types import EvaluatorSpec

log = structlog.get_logger(__name__)

#: flags of a folder opened on the way to a named file (a link fails the open)
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: flags of a file read: no link, no blocking open of a FIFO
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
#: the staging folder of a state's tars, in the runtime's host folder (not seen inside)
STAGING = "final-state"


class _Bounded:
    """A binary file's writer that refuses a write past ``max_bytes`` in all."""

    def __init__(self, file: BinaryIO, max_bytes: int, what: str) -> None:
        self.file = file
        self.max_bytes = max_bytes
        self.what = what
        self.num_bytes = 0

    def write(self, data: bytes) -> int:
        if self.num_bytes + len(data) > self.max_bytes:
            raise ArtifactTooLargeError(
                f"the session's final state ({self.what}) is over max_final_state_bytes = "
                f"{self.max_bytes}"
            )
        self.num_bytes += len(data)
        return self.file.write(data)


def _entry(name: str, st: os.stat_result) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.mode = stat.S_IMODE(st.st_mode)
    info.mtime = int(st.st_mtime)
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


class _Packer:
    """Adds a workspace's entries to a tar, host-side, never following a link."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar = tar
        self.num_entries = 0
        self.num_skipped = 0

    def add(self, dir_fd: int, name: str, arcname: str) -> bool:
        """Add the entry ``name`` of the folder ``dir_fd`` as ``arcname``; False when it is
        not a file, folder or link (or vanished)."""
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        info = _entry(arcname, st)
        if stat.S_ISDIR(st.st_mode):
            info.type = tarfile.DIRTYPE
            self.tar.addfile(info)
        elif stat.S_ISLNK(st.st_mode):
            info.type, info.linkname = tarfile.SYMTYPE, os.readlink(name, dir_fd=dir_fd)
            self.tar.addfile(info)
        elif stat.S_ISREG(st.st_mode):
            try:
                fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
            except OSError:  # swapped for a link or a FIFO since the stat
                self.num_skipped += 1
                return False
            with os.fdopen(fd, "rb") as f:
                opened = os.fstat(fd)
                if not stat.S_ISREG(opened.st_mode):
                    self.num_skipped += 1
                    return False
                info.size = opened.st_size
                self.tar.addfile(info, f)
        else:
            self.num_skipped += 1
            return False
        self.num_entries += 1
        return True


def _open_parent(root_fd: int, parts: tuple[str, ...]) -> int:
    """The folder holding ``parts[-1]``, opened component by component below ``root_fd``
    with ``O_NOFOLLOW`` (a link on the way raises OSError)."""
    fd = os.dup(root_fd)
    try:
        for part in parts[:-1]:
            next_fd = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _relative(path: str) -> tuple[str, ...]:
    """The components of a workspace-relative path.

    Raises:
        ConfigError: absolute, empty, or with ``..``.
    """
    inside = PurePosixPath(path)
    parts = tuple(p for p in inside.parts if p != ".")
    if inside.is_absolute() or not parts or ".." in parts:
        raise ConfigError(f"final state file {path!r} is not a path inside the workspace")
    return parts


def pack_workspace(
    workspace: Path, out: BinaryIO, *, files: list[str] | None = None
) -> tuple[int, int, list[str]]:
    """Write the workspace (or only ``files`` of it) to ``out`` as an uncompressed tar
    stream, host-side (see the module docstring).

    Args:
        workspace: the workspace's host folder.
        out: where the tar goes (a bounded writer raises past its bound).
        files: workspace-relative paths; None: everything.

    Returns:
        ``(num_entries, num_skipped, missing)``: entries stored, entries not stored (FIFOs,
        sockets, devices), and the named ``files`` that are not regular files there.

    Raises:
        ArtifactTooLargeError: ``out`` refused a write.
        ConfigError: a named file is not a workspace-relative path.
    """
    missing: list[str] = []
    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        packer = _Packer(tar)
        if files is None:
            for dirpath, dirnames, filenames, dir_fd in os.fwalk(workspace, follow_symlinks=False):
                rel = PurePosixPath(Path(dirpath).relative_to(workspace).as_posix())
                dirnames.sort()
                # a link to a folder is listed with the folders and never descended into
                for name in sorted([*dirnames, *filenames]):
                    packer.add(dir_fd, name, str(rel / name) if str(rel) != "." else name)
        else:
            root_fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                for path in files:
                    parts = _relative(path)
                    try:
                        parent = _open_parent(root_fd, parts)
                    except OSError:
                        missing.append(path)
                        continue
                    try:
                        if not _is_file(parent, parts[-1]) or not packer.add(
                            parent, parts[-1], "/".join(parts)
                        ):
                            missing.append(path)
                    finally:
                        os.close(parent)
            finally:
                os.close(root_fd)
    return packer.num_entries, packer.num_skipped, missing


def _is_file(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def _owner(value: int, base: int) -> int:
    """A host uid or gid as the container sees it (its user namespace starts at ``base``)."""
    return value - base if base and value >= base else value


def pack_exported(
    argv: list[str], written: list[str], out: BinaryIO, *, base: int = 0
) -> tuple[int, int]:
    """Write the entries of the paths ``written`` from a container's export (``argv``:
    ``podman export NAME``, a tar of its whole file system on standard output) to ``out`` as
    a tar stream; the export is left as soon as every path was found.

    Args:
        argv: the export command.
        written: absolute paths to keep.
        out: where the tar goes (a bounded writer raises past its bound).
        base: the host uid the container's root is (its owners are shifted back by it).

    Returns:
        ``(num_entries, num_skipped)``: entries kept; written paths not kept (device nodes,
        FIFOs, hard links to a file not kept, paths the export did not hold).

    Raises:
        ArtifactTooLargeError: ``out`` refused a write.
        RolloutdError: the export failed or ran past :data:`CLI_TIMEOUT_S`.
    """
    wanted, kept = set(written), set()
    num_skipped = 0
    proc = cli_stream(argv)
    assert proc.stdout is not None and proc.stderr is not None
    timer = threading.Timer(CLI_TIMEOUT_S, proc.kill)
    timer.start()
    try:
        with (
            tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar,
            tarfile.open(fileobj=proc.stdout, mode="r|") as export,
        ):
            for member in export:
                path = "/" + member.name.removeprefix("./").strip("/")
                if path not in wanted:
                    continue
                wanted.discard(path)
                link = "/" + member.linkname.removeprefix("./").strip("/")
                if member.isdev() or member.isfifo() or (member.islnk() and link not in kept):
                    num_skipped += 1
                else:
                    member.uid, member.gid = _owner(member.uid, base), _owner(member.gid, base)
                    member.uname = member.gname = ""
                    tar.addfile(member, export.extractfile(member) if member.isreg() else None)
                    kept.add(path)
                if not wanted:
                    break
    finally:
        timer.cancel()
        finished = not wanted
        if proc.poll() is None:
            proc.kill()
        stderr = proc.stderr.read(4096).decode(errors="replace")
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    if not finished and proc.returncode != 0:
        raise RolloutdError(
            f"`{Path(argv[0]).name} export` failed (exit {proc.returncode}): {stderr[-300:]}"
        )
    return len(kept), num_skipped + len(wanted)


async def _store_system(
    runtime: Runtime, session_id: str, staging: Path, max_bytes: int
) -> tuple[SystemChanges, Path | None]:
    """The container's system changes, their entries packed into ``staging`` (bounded by
    ``max_bytes``); the pack's local file, or None when nothing was written."""
    found = await changes(runtime)
    system = SystemChanges(added=found.added, modified=found.modified, deleted=found.deleted)
    if not found.written:
        return system, None
    binary, name = container_cli(runtime)
    local = staging / "system.tar"
    with open(local, "wb") as f:
        bounded = _Bounded(f, max_bytes, "its system changes")
        entries, skipped = await asyncio.to_thread(
            pack_exported,
            [binary, "export", name],
            found.written,
            bounded,  # type: ignore[arg-type]  # a writer is all a tar stream needs
            base=int(getattr(runtime, "uid", 0) or 0),
        )
    system.num_skipped = skipped
    system.pack = StoredPart(
        key=final_state_key(session_id, "system.tar"),
        num_bytes=bounded.num_bytes,
        num_entries=entries,
    )
    return system, local


def image_digest(runtime: Runtime) -> str | None:
    """The id of the image ``runtime`` runs (container runtimes), else None."""
    value = getattr(runtime, "image_id", None)
    return str(value) if value else None


async def store_final_state(
    runtime: Runtime,
    store: BlobStore,
    *,
    session_id: str,
    evaluator: EvaluatorSpec,
    parts: FinalStateParts,
    max_bytes: int,
    patch_key: str | None = None,
) -> FinalState:
    """Store the final state of the session that ran in ``runtime`` (see the module
    docstring), and its manifest at :func:`rolloutd.store.final_state_key`. Call it after
    the run ended and before anything else runs in the runtime (a check may write files).

    Args:
        runtime: the session's runtime.
        store: the blob store.
        session_id: the session (its attempt's gateway session id).
        evaluator: the session's evaluator spec.
        parts: what to store (the evaluator's :meth:`~rolloutd.evaluators.Evaluator.
            final_state`).
        max_bytes: the bound of all parts together, bytes.
        patch_key: the ``patch`` artifact's key, when the session has one.

    Returns:
        The manifest as stored. A state over ``max_bytes`` is ``refused``; one that could not
        be read or stored has ``error``: either way nothing else was stored, and the session
        itself goes on (its own score does not depend on its stored state).
    """
    spec = (evaluator.runtime_spec or runtime.spec) if parts.kind == "patch" else runtime.spec
    state = FinalState(
        session_id=session_id,
        parts=parts,
        runtime=spec,
        evaluator=evaluator,
        image_digest=image_digest(runtime),
        max_bytes=max_bytes,
        patch_key=patch_key if parts.kind == "patch" else None,
    )
    staging = runtime.runtime_dir / STAGING
    try:
        if parts.kind != "patch":
            await asyncio.to_thread(staging.mkdir, exist_ok=True)
            workdir = staging / "workdir.tar"
            with open(workdir, "wb") as f:
                bounded = _Bounded(f, max_bytes, "its workspace")
                entries, skipped, missing = await asyncio.to_thread(
                    pack_workspace,
                    runtime.workspace,
                    bounded,  # type: ignore[arg-type]  # a writer is all a tar stream needs
                    files=parts.files if parts.kind == "files" else None,
                )
            size = bounded.num_bytes
            system_pack = None
            if parts.kind == "workdir" and runtime.type in CONTAINER_RUNTIMES:
                state.system, system_pack = await _store_system(
                    runtime, session_id, staging, max_bytes - size
                )
            # every part is read before any is stored: a state over its bound stores nothing
            key = final_state_key(session_id, "workdir.tar")
            await asyncio.to_thread(store.put_file, key, workdir)
            state.workdir = StoredPart(key=key, num_bytes=size, num_entries=entries)
            state.num_skipped, state.missing_files = skipped, missing
            if system_pack is not None and state.system and state.system.pack:
                await asyncio.to_thread(store.put_file, state.system.pack.key, system_pack)
                size += state.system.pack.num_bytes
            state.num_bytes = size
    except ArtifactTooLargeError as e:
        state.refused = e.message
    except (OSError, tarfile.TarError, RolloutdError) as e:
        state.error = f"{type(e).__name__}: {e}"[:1000]
    finally:
        await asyncio.to_thread(shutil.rmtree, staging, True)
    if not state.stored:
        state.workdir, state.system = None, None
        state.num_bytes = 0
    state.stored_at = time.time()
    await asyncio.to_thread(store.put_json, final_state_key(session_id), state)
    log.info(
        "final_state_stored",
        kind=parts.kind,
        num_bytes=state.num_bytes,
        refused=state.refused is not None,
        error=state.error,
    )
    return state


def _restore_filter(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
    """tarfile's ``tar`` filter, and nothing but files, folders and links."""
    if not (member.isreg() or member.isdir() or member.issym()):
        return None
    return tarfile.tar_filter(member, path)


def _clear(folder: Path) -> None:
    for child in list(folder.iterdir()):
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def _extract(tar_path: Path, workspace: Path, *, replace: bool) -> None:
    if replace:
        _clear(workspace)
    with tarfile.open(tar_path, mode="r:") as tar:
        tar.extractall(workspace, filter=_restore_filter)


async def restore_final_state(runtime: Runtime, store: BlobStore, state: FinalState) -> None:
    """Restore a stored final state into ``runtime``, started from ``state.runtime`` and
    nothing run in it yet (see the module docstring). A ``patch`` state restores nothing
    here: the collect step applies the patch.

    Raises:
        RolloutdError: the state was not stored (``refused`` or ``error``).
        NotFoundError: a stored part is gone from the store.
    """
    if not state.stored:
        raise RolloutdError(
            f"session {state.session_id} has no final state to restore: "
            f"{state.refused or state.error}"
        )
    if state.workdir is None:
        return
    staging = runtime.runtime_dir / STAGING
    await asyncio.to_thread(staging.mkdir, exist_ok=True)
    try:
        if state.system is not None:
            if runtime.type not in CONTAINER_RUNTIMES:
                raise ConfigError(
                    f"session {state.session_id}'s state holds system changes of a container "
                    f"runtime; runtime {runtime.runtime_id} is {runtime.type}"
                )
            if state.system.deleted:
                await remove_paths(runtime, state.system.deleted)
            if state.system.pack is not None:
                system = staging / "system.tar"
                await asyncio.to_thread(store.get_file, state.system.pack.key, system)
                await unpack_at_root(runtime, system)
        local = staging / "workdir.tar"
        await asyncio.to_thread(store.get_file, state.workdir.key, local)
        await asyncio.to_thread(
            _extract, local, runtime.workspace, replace=state.parts.kind == "workdir"
        )
    finally:
        with contextlib.suppress(OSError):
            await asyncio.to_thread(shutil.rmtree, staging, True)
    await runtime.adopt(runtime.workspace)
