"""A runtime's disk ceiling (``disk_mb``): its folder on a file system of that size.

A runtime's writable host folder (``{root}/{runtime_id}``: workspace, home, logs) is the mount
point of an ext4 file system made for it in a sparse image file of ``disk_mb`` MiB
(``{root}/.disks/{runtime_id}.img``), mounted through a loop device (mount(8) ``-o loop``:
the device is released when it is unmounted). The kernel refuses a write past the size at
once (``ENOSPC``: ``fallocate -l 50G`` stops at the ceiling), so the ceiling holds while the
session runs, whatever writes it and however fast; the image file takes on the host only the
blocks written to it. ``mkfs.ext4`` (e2fsprogs) makes it without a journal (the file system
lives as long as its runtime), with no blocks reserved for root (``-m 0``), and with lazy
inode-table initialisation: about 20 ms for 10 GiB. Mounted ``nosuid,nodev``.

This needs a root worker (mount(2) needs CAP_SYS_ADMIN), loop devices (``/dev/loop-control``,
and a free one: in a container, ``/dev`` holds only those the host had when it started) and
``mkfs.ext4``: :func:`sized_disks_available`. Without them the ceiling is weaker and said so
(a warning ``runtime_disk_unavailable`` when a mount failed): each command's files are bounded
by RLIMIT_FSIZE at ``disk_mb`` (a single file never grows past it; ``fallocate`` past it fails
with ``EFBIG``), and the runtime's folder is measured at each harness heartbeat
(:func:`folder_bytes`); the session is stopped once it is over (docs/runtimes.md, "Ceilings").
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import structlog

from rolloutd.errors import RuntimeStartError

log = structlog.get_logger(__name__)

#: folder below the runtime root holding each runtime's image file.
DISKS_DIR = ".disks"
#: seconds one mkfs, mount or umount may take.
COMMAND_TIMEOUT_S = 30.0
#: a file system with less than this free is full: the ceiling was reached (ext4 keeps a few
#: blocks for its own metadata, so "0 bytes free" is not always reached exactly), bytes.
FULL_BELOW_BYTES = 1 << 20


@functools.cache
def sized_disks_available() -> bool:
    """Whether this worker can give runtimes a sized file system: it is root, the host has
    loop devices, and ``mkfs.ext4`` and ``mount`` are installed."""
    return (
        os.geteuid() == 0
        and os.path.exists("/dev/loop-control")
        and shutil.which("mkfs.ext4") is not None
        and shutil.which("mount") is not None
    )


def image_path(root: Path, runtime_id: str) -> Path:
    """Where the image file of ``runtime_id``'s disk lives."""
    return Path(root) / DISKS_DIR / f"{runtime_id}.img"


def _run(argv: list[str]) -> None:
    try:
        subprocess.run(argv, check=True, capture_output=True, timeout=COMMAND_TIMEOUT_S)
    except subprocess.CalledProcessError as exc:
        raise RuntimeStartError(
            f"{argv[0]} failed ({exc.returncode}): {exc.stderr.decode(errors='replace')[-300:]}"
        ) from exc
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeStartError(f"{argv[0]} failed: {exc}") from exc


@dataclass
class RuntimeDisk:
    """The sized file system mounted at a runtime's folder.

    Attributes:
        mountpoint: the runtime's folder (``{root}/{runtime_id}``).
        image: its image file.
        size_mb: its size, MiB.
    """

    mountpoint: Path
    image: Path
    size_mb: int

    @classmethod
    def create(cls, root: Path, runtime_id: str, mountpoint: Path, size_mb: int) -> RuntimeDisk:
        """Make the image file, its file system, and mount it at ``mountpoint`` (created).

        Raises:
            RuntimeStartError: mkfs or mount failed (nothing is left mounted).
        """
        image = image_path(root, runtime_id)
        for attempt in range(3):  # another runtime's remove() may drop the folder meanwhile
            image.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            try:
                with open(image, "wb") as f:
                    f.truncate(size_mb * 2**20)
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
        disk = cls(mountpoint=mountpoint, image=image, size_mb=size_mb)
        try:
            _run(
                [
                    "mkfs.ext4",
                    "-q",
                    "-F",
                    "-m",
                    "0",
                    "-O",
                    "^has_journal",
                    "-E",
                    "lazy_itable_init=1,nodiscard",
                    str(image),
                ]
            )
            mountpoint.mkdir(parents=True, exist_ok=True)
            _run(["mount", "-o", "loop,nosuid,nodev", str(image), str(mountpoint)])
        except RuntimeStartError:
            image.unlink(missing_ok=True)
            raise
        return disk

    def free_bytes(self) -> int:
        """Bytes still free for the runtime (statvfs(3) ``f_bavail``)."""
        stat = os.statvfs(self.mountpoint)
        return stat.f_bavail * stat.f_frsize

    def full(self) -> bool:
        """Whether the runtime filled its disk (less than :data:`FULL_BELOW_BYTES` free)."""
        try:
            return self.free_bytes() < FULL_BELOW_BYTES
        except OSError:
            return False

    def remove(self) -> None:
        """Unmount (lazily when busy) and delete the image file; idempotent.

        Call after every process of the runtime is gone and before its folder is removed.
        """
        release(self.mountpoint, self.image)


def release(mountpoint: Path, image: Path) -> None:
    """Unmount ``mountpoint`` when a file system is mounted there, then delete ``image``, and
    its folder when it was the last (also for a runtime a dead worker left:
    :mod:`rolloutd.sandbox.reclaim`)."""
    if os.path.ismount(mountpoint):
        try:
            _run(["umount", str(mountpoint)])
        except RuntimeStartError as exc:  # a process still holds a file: detach it anyway
            log.warning("runtime_disk_busy", mountpoint=str(mountpoint), error=str(exc))
            _run(["umount", "--lazy", str(mountpoint)])
    image.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # not empty (another runtime's), or gone already
        image.parent.rmdir()


def folder_bytes(folder: Path) -> int:
    """Bytes of disk the files below ``folder`` take (allocated blocks, ``st_blocks``, so a
    sparse or preallocated file counts as what it holds); symlinks not followed."""
    total = 0
    for dirpath, dirs, files in os.walk(folder):
        for name in dirs + files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                continue
    return total
