"""The worker's file operations in a runtime's folders, which never follow a link out of them.

The worker (root on most hosts) reads and writes files in folders a session's processes write
too. A path that is resolved and checked first and opened afterwards lets a process that swaps
a folder or a file for a symbolic link in between make the worker read or write any host path
(a time-of-check to time-of-use race, CWE-367). Every operation here walks a path one component
at a time from an open descriptor of the root folder instead: each folder is opened relative to
the one before with ``O_NOFOLLOW | O_DIRECTORY`` (open(2)), so a symbolic link anywhere on the
way fails the open itself and is never followed; the last component is opened with
``O_NOFOLLOW`` (reads, ownership changes), or written under a fresh name (``O_CREAT | O_EXCL``)
and renamed over it (writes: rename(2) replaces a link, or a hard link, and does not follow it).
Paths arrive as components already normalised lexically (no ``..``, no ``.``, nothing empty:
:meth:`rolloutd.sandbox.runtimes.base.Runtime._locate`). openat2(2)'s ``RESOLVE_BENEATH`` would
do the walk in one call; Python has no binding for it, and the walk holds on every kernel.

A read opens the file with ``O_NONBLOCK`` (a FIFO cannot block the worker) and takes regular files
only, up to a size bound. Whatever the runtime's processes left in the way (a link, a file where
a folder belongs, a FIFO, a permission they set) raises :class:`PathRefusedError`, which the
collect step scores as the policy's doing.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Sequence
from pathlib import Path

from rolloutd.errors import ArtifactTooLargeError, NotFoundError, PathRefusedError

#: flags of a folder opened on the way (a link fails: ENOTDIR with O_PATH, ELOOP without).
DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: flags of a folder whose entries are listed or whose owner is changed.
READ_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: flags of a file read: no link, no blocking open of a FIFO, no controlling terminal.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
#: flags of the fresh file a write fills before renaming it over its target.
WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: bytes read or copied at a time.
CHUNK_BYTES = 2**20
#: folders a copy descends at most (each level holds two descriptors while it is copied).
MAX_DEPTH = 128
#: errors of an open that meant a link, a file where a folder belongs, or a permission set from
#: inside the runtime.
REFUSED_ERRNOS = {errno.ELOOP, errno.ENOTDIR, errno.EACCES, errno.EPERM, errno.EISDIR}

Owner = tuple[int, int] | None


def _refused(label: str, name: str, exc: OSError) -> PathRefusedError:
    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
        why = f"{name!r} is a symbolic link or not a folder"
    elif exc.errno == errno.EISDIR:
        why = f"{name!r} is a folder"
    else:
        why = f"{name!r}: {exc.strerror}"
    return PathRefusedError(
        f"runtime path {label!r}: {why}; the worker does not follow links or cross what the "
        "runtime's processes set up in a runtime's folders",
        path=label,
    )


def open_root(root: Path, *, readable: bool = False) -> int:
    """A descriptor of a runtime's root folder (its workspace or home on the host).

    The root's own path is the worker's (``{runtime_root}/{runtime_id}/workspace``): only its
    last component is opened without following a link.

    Raises:
        NotFoundError: the folder does not exist (the runtime was stopped).
    """
    try:
        return os.open(root, READ_DIR_FLAGS if readable else DIR_FLAGS)
    except FileNotFoundError as exc:
        raise NotFoundError(f"runtime folder {root} does not exist") from exc


def walk(
    root_fd: int, parts: Sequence[str], *, label: str, create: bool = False, owner: Owner = None
) -> int:
    """Open the folder ``parts`` below ``root_fd``, one component at a time, never following a
    link; with ``create``, make missing folders (mode 0755, handed to ``owner``).

    Args:
        root_fd: the root folder's descriptor (not closed here).
        parts: the folder's path components below it (may be empty: the root itself).
        label: the runtime path, for errors.
        create: make missing folders.
        owner: ``(uid, gid)`` of folders made (None: the worker's).

    Returns:
        A new ``O_PATH`` descriptor of the folder (the caller closes it).

    Raises:
        NotFoundError: a folder is missing (and not ``create``).
        PathRefusedError: a component is a link or not a folder, or cannot be crossed.
    """
    fd = os.dup(root_fd)
    try:
        for name in parts:
            try:
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError as exc:
                if not create:
                    raise NotFoundError(f"runtime path {label!r}: no folder {name!r}") from exc
                child = _make_dir(fd, name, label=label, owner=owner)
            except OSError as exc:
                if exc.errno in REFUSED_ERRNOS:
                    raise _refused(label, name, exc) from exc
                raise
            os.close(fd)
            fd = child
        return fd
    except BaseException:
        os.close(fd)
        raise


def _make_dir(parent_fd: int, name: str, *, label: str, owner: Owner) -> int:
    """Make the folder ``name`` (if still missing), hand it to ``owner``; return a readable
    descriptor of it."""
    try:
        os.mkdir(name, 0o755, dir_fd=parent_fd)
    except FileExistsError:
        pass  # made meanwhile: opened below like any other
    except OSError as exc:
        if exc.errno in REFUSED_ERRNOS:
            raise _refused(label, name, exc) from exc
        raise
    fd = _open_child_dir(parent_fd, name, label=label)
    if owner is not None:
        try:
            os.fchown(fd, *owner)
        except BaseException:
            os.close(fd)
            raise
    return fd


def read_file(root: Path, parts: Sequence[str], *, label: str, max_bytes: int) -> bytes:
    """The bytes of the regular file ``parts`` below ``root``, at most ``max_bytes``.

    Raises:
        NotFoundError: no such file (or a folder there).
        PathRefusedError: a link on the way or at the end, not a regular file, or no
            permission.
        ArtifactTooLargeError: larger than ``max_bytes`` (before reading, or while it grew).
    """
    root_fd = open_root(root)
    try:
        parent = walk(root_fd, parts[:-1], label=label)
    finally:
        os.close(root_fd)
    try:
        fd = os.open(parts[-1], READ_FLAGS, dir_fd=parent)
    except FileNotFoundError as exc:
        raise NotFoundError(f"runtime path {label!r}: no file") from exc
    except OSError as exc:
        if exc.errno in REFUSED_ERRNOS:
            raise _refused(label, parts[-1], exc) from exc
        raise
    finally:
        os.close(parent)
    with os.fdopen(fd, "rb", buffering=0) as f:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise NotFoundError(f"runtime path {label!r}: a folder, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise PathRefusedError(
                f"runtime path {label!r}: not a regular file (mode {stat.filemode(info.st_mode)})",
                path=label,
            )
        return _read_bounded(f, info.st_size, label, max_bytes)


def _too_large(label: str, size: int, max_bytes: int) -> ArtifactTooLargeError:
    return ArtifactTooLargeError(
        f"artifact {label!r} is {size} bytes, over the limit of {max_bytes} bytes "
        "(ROLLOUTD_MAX_ARTIFACT_BYTES)"
    )


def _read_bounded(f: object, size: int, label: str, max_bytes: int) -> bytes:
    if size > max_bytes:
        raise _too_large(label, size, max_bytes)
    chunks: list[bytes] = []
    read = 0
    while chunk := f.read(CHUNK_BYTES):  # type: ignore[attr-defined]
        read += len(chunk)
        if read > max_bytes:
            raise _too_large(label, read, max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def write_file(
    root: Path, parts: Sequence[str], data: bytes, *, label: str, owner: Owner = None
) -> None:
    """Write ``data`` to the file ``parts`` below ``root``, making its folders.

    The bytes go to a fresh file in the target's folder, which is then renamed over the
    target: a link (or a hard link) there is replaced, never written through. A regular file
    replaced keeps its mode; a new one gets 0644.

    Raises:
        PathRefusedError: a link or a file on the way, a folder at the end, or no permission.
    """
    root_fd = open_root(root)
    try:
        parent = walk(root_fd, parts[:-1], label=label, create=True, owner=owner)
    finally:
        os.close(root_fd)
    try:
        _write_at(parent, parts[-1], data, label=label, owner=owner)
    finally:
        os.close(parent)


def _write_at(
    parent: int, name: str, data: bytes, *, label: str, owner: Owner, mode: int = -1
) -> None:
    if mode < 0:
        try:
            old = os.stat(name, dir_fd=parent, follow_symlinks=False)
            mode = stat.S_IMODE(old.st_mode) if stat.S_ISREG(old.st_mode) else 0o644
        except FileNotFoundError:
            mode = 0o644
    temp = f".rolloutd-{secrets.token_hex(8)}.tmp"
    try:
        fd = os.open(temp, WRITE_FLAGS, mode & 0o777, dir_fd=parent)
    except OSError as exc:
        if exc.errno in REFUSED_ERRNOS:
            raise _refused(label, name, exc) from exc
        raise
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if owner is not None:
                os.fchown(f.fileno(), *owner)
            os.fchmod(f.fileno(), mode & 0o777)  # the umask narrowed the open's mode
        os.rename(temp, name, src_dir_fd=parent, dst_dir_fd=parent)
    except BaseException as exc:
        try:
            os.unlink(temp, dir_fd=parent)
        except OSError:
            pass  # not made, or the runtime's processes removed it
        if isinstance(exc, OSError) and exc.errno in REFUSED_ERRNOS | {errno.ENOTEMPTY}:
            raise _refused(label, name, exc) from exc
        raise


def chown_tree(root: Path, parts: Sequence[str], owner: tuple[int, int], *, label: str) -> None:
    """Hand ``parts`` below ``root`` (a file, a link or a folder with everything in it) to
    ``owner``, never following a link (fchownat(2) with ``AT_SYMLINK_NOFOLLOW``; folders
    walked by descriptor with :func:`os.fwalk`, which skips a folder swapped for a link).

    Raises:
        NotFoundError: no such path.
        PathRefusedError: a link or a file on the way, or no permission.
    """
    root_fd = open_root(root, readable=True)
    try:
        if not parts:
            os.fchown(root_fd, *owner)
            _chown_below(root_fd, owner)
            return
        parent = walk(root_fd, parts[:-1], label=label)
    finally:
        os.close(root_fd)
    try:
        name = parts[-1]
        try:
            os.chown(name, *owner, dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError as exc:
            raise NotFoundError(f"runtime path {label!r}: no such path") from exc
        try:
            fd = os.open(name, READ_DIR_FLAGS, dir_fd=parent)
        except OSError:
            return  # a file or a link: done
        try:
            _chown_below(fd, owner)
        finally:
            os.close(fd)
    finally:
        os.close(parent)


def _chown_below(dir_fd: int, owner: tuple[int, int]) -> None:
    for _, dirs, files, fd in os.fwalk(".", dir_fd=dir_fd, follow_symlinks=False):
        for name in dirs + files:
            try:
                os.chown(name, *owner, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue  # removed meanwhile


def copy_tree(
    source: int, target: int, *, label: str, owner: Owner = None, max_bytes: int | None = None
) -> int:
    """Copy the folder ``source`` into the folder ``target`` (both descriptors, readable), never
    following a link on either side: folders are merged, files replaced (:func:`write_file`'s
    rename), links copied as links, other kinds (FIFOs, sockets, devices) skipped; modes kept
    without set-user-ID and set-group-ID bits, owners set to ``owner``.

    Args:
        source, target: readable folder descriptors (not closed here).
        label: the runtime path, for errors.
        owner: ``(uid, gid)`` of everything made (None: the worker's).
        max_bytes: bytes of file contents copied at most (None: no bound).

    Returns:
        Bytes of file contents copied.

    Raises:
        PathRefusedError: a link or a file where the target needs a folder, deeper than
            :data:`MAX_DEPTH`, or no permission.
        ArtifactTooLargeError: more than ``max_bytes`` of contents.
    """
    copied = 0
    stack: list[tuple[int, int, int]] = [(os.dup(source), os.dup(target), 0)]
    try:
        while stack:
            src, dst, depth = stack.pop()
            try:
                with os.scandir(src) as entries:
                    listed = list(entries)
                for entry in listed:
                    info = entry.stat(follow_symlinks=False)
                    name = entry.name
                    if stat.S_ISDIR(info.st_mode):
                        if depth + 1 > MAX_DEPTH:
                            raise PathRefusedError(
                                f"runtime path {label!r}: folders deeper than {MAX_DEPTH} levels",
                                path=label,
                            )
                        child_src = _open_child_dir(src, name, label=label)
                        try:
                            child_dst = _make_dir(dst, name, label=label, owner=owner)
                        except BaseException:
                            os.close(child_src)
                            raise
                        stack.append((child_src, child_dst, depth + 1))
                    elif stat.S_ISREG(info.st_mode):
                        left = None if max_bytes is None else max_bytes - copied
                        data = _read_child(src, name, label=label, max_bytes=left)
                        copied += len(data)
                        mode = stat.S_IMODE(info.st_mode) & ~(stat.S_ISUID | stat.S_ISGID)
                        _write_at(dst, name, data, label=label, owner=owner, mode=mode)
                    elif stat.S_ISLNK(info.st_mode):
                        _copy_link(src, dst, name, label=label, owner=owner)
            finally:
                os.close(src)
                os.close(dst)
    finally:
        for src, dst, _ in stack:
            os.close(src)
            os.close(dst)
    return copied


def _open_child_dir(parent: int, name: str, *, label: str) -> int:
    try:
        return os.open(name, READ_DIR_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in REFUSED_ERRNOS or exc.errno == errno.ENOENT:
            raise _refused(label, name, exc) from exc
        raise


def _read_child(parent: int, name: str, *, label: str, max_bytes: int | None) -> bytes:
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=parent)
    except OSError as exc:
        if exc.errno in REFUSED_ERRNOS or exc.errno == errno.ENOENT:
            raise _refused(label, name, exc) from exc
        raise
    with os.fdopen(fd, "rb", buffering=0) as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise PathRefusedError(
                f"runtime path {label!r}: {name!r} is not a regular file", path=label
            )
        if max_bytes is None:
            return f.read()
        return _read_bounded(f, info.st_size, label, max_bytes)


def _copy_link(src: int, dst: int, name: str, *, label: str, owner: Owner) -> None:
    target = os.readlink(name, dir_fd=src)
    try:
        os.unlink(name, dir_fd=dst)
    except FileNotFoundError:
        pass
    except OSError as exc:
        if exc.errno in REFUSED_ERRNOS:
            raise _refused(label, name, exc) from exc
        raise
    os.symlink(target, name, dir_fd=dst)
    if owner is not None:
        os.chown(name, *owner, dir_fd=dst, follow_symlinks=False)
