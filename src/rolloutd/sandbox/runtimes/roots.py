"""What a bwrap sandbox's root is made of: the host's system or an image folder's entries, the
Python installation the exec server runs, the account files, the mount points to create.

Helpers of :mod:`~rolloutd.sandbox.runtimes.bwrap` (see its docstring); bubblewrap's options
are bwrap(1)'s, of bubblewrap 0.8.
"""

from __future__ import annotations

import _ctypes
import _socket
import array
import functools
import os
import select
import subprocess
import sys
from pathlib import Path

#: host folders bound read-only when they exist (and are real folders, not symlinks).
SYSTEM_DIRS = ("/usr", "/etc", "/opt")
#: top-level entries that are symlinks into /usr on merged-/usr systems, or folders otherwise.
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: HOME inside the sandbox.
HOME_INSIDE = "/home/agent"
#: name of the user and group commands run as inside (the runtime's uid under a root worker).
SANDBOX_USER = "agent"
#: where, with ``spec.image``, the worker's Python installation and the libraries it needs
#: are bound read-only (``python/`` and ``lib/``) for the exec server.
HOST_INSIDE = "/run/rolloutd-host"
#: top-level entries of an image the sandbox provides itself.
IMAGE_OWN_ENTRIES = ("tmp", "proc", "dev", "run")


@functools.cache
def account_files(etc: Path, uid: int, gid: int) -> tuple[bytes, bytes]:
    """The sandbox's ``/etc/passwd`` and ``/etc/group``: those of ``etc`` (the host's, or the
    image's), plus user and group :data:`SANDBOX_USER` with ``uid``/``gid`` and HOME
    ``/home/agent`` (tools such as node's ``os.userInfo()`` and ``whoami`` need the entry)."""
    files = []
    for name, entry, taken in (
        ("passwd", f"{SANDBOX_USER}:x:{uid}:{gid}::{HOME_INSIDE}:/bin/sh", uid),
        ("group", f"{SANDBOX_USER}:x:{gid}:", gid),
    ):
        try:
            lines = (etc / name).read_text().splitlines()
        except (OSError, UnicodeDecodeError):
            lines = []
        kept = [
            line
            for line in lines
            if line.split(":")[:1] != [SANDBOX_USER] and line.split(":")[2:3] != [str(taken)]
        ]
        files.append(("\n".join([*kept, entry]) + "\n").encode())
    return files[0], files[1]


def python_dirs() -> list[Path]:
    """Folders of the worker's Python installation (base prefix and venv prefix)."""
    return sorted({Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()})


def image_root(image: str) -> tuple[list[str], tuple[str, ...]]:
    """bwrap options composing the root from an image folder's top-level entries, read-only,
    except ``/tmp``, ``/proc``, ``/dev`` and ``/run`` (the sandbox's own: a private tmpfs, the
    sandbox's proc and dev, and a ``/run`` on bwrap's root tmpfs for the exec server's files).

    The root itself stays bwrap's tmpfs, so the sandbox can add mount points (the workdir,
    :data:`HOST_INSIDE`) that the image lacks, and is made read-only afterwards.

    Returns:
        (options, the top-level paths they bind: mount points below them must exist in the
        image).
    """
    args: list[str] = []
    bound: list[str] = []
    for entry in sorted(os.scandir(image), key=lambda e: e.name):
        if entry.name in IMAGE_OWN_ENTRIES:
            continue
        inside = f"/{entry.name}"
        if entry.is_symlink():
            args += ["--symlink", os.readlink(entry.path), inside]
        else:
            args += ["--ro-bind", entry.path, inside]
        bound.append(inside)
    return args, tuple(bound)


@functools.cache
def host_python() -> tuple[Path, str, dict[str, Path]]:
    """What the exec server needs to run inside an image: the worker's base Python
    installation, its executable (relative to it), and every shared library the interpreter and
    the exec server's extension modules load, the dynamic loader included (ldd(1)), by the name
    they are looked up under.

    Raises:
        OSError, subprocess.CalledProcessError: ``ldd`` is missing or fails.
        ValueError: no dynamic loader found (a static Python needs none; not supported).
    """
    executable = Path(sys.executable).resolve()
    prefix = Path(sys.base_prefix).resolve()
    objects = [executable] + [
        Path(m.__file__) for m in (_ctypes, _socket, array, select) if getattr(m, "__file__", None)
    ]
    libs: dict[str, Path] = {}
    for path in objects:
        out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[1] == "=>" and parts[2].startswith("/"):
                libs[parts[0]] = Path(parts[2]).resolve()
            elif parts and parts[0].startswith("/"):  # the loader, by its absolute path
                libs[Path(parts[0]).name] = Path(parts[0]).resolve()
    if not any(name.startswith("ld-") for name in libs):
        raise ValueError(f"no dynamic loader among the libraries of {executable}")
    return prefix, str(executable.relative_to(prefix)), libs


def system_binds() -> list[str]:
    """bwrap options binding the host system read-only (``/usr``, ``/etc``, ``/opt``, links)."""
    args: list[str] = []
    for d in SYSTEM_DIRS:
        if os.path.isdir(d) and not os.path.islink(d):
            args += ["--ro-bind", d, d]
    for d in SYSTEM_LINKS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    return args


def parents_to_create(paths: list[str], existing: tuple[str, ...]) -> list[str]:
    """Proper ancestors of ``paths`` (absolute, inside the sandbox), parents first, without
    ``/``, ``/tmp`` and what lies in the ``existing`` bound folders (read-only: they must hold
    their mount points themselves)."""
    found: dict[str, None] = {}
    for path in paths:
        for parent in reversed(Path(path).parents):
            text = str(parent)
            if text in ("/", "/tmp") or any(parent.is_relative_to(d) for d in existing):
                continue
            found[text] = None
    return list(found)
