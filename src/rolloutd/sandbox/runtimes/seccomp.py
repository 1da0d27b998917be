"""The seccomp filter of bwrap sandboxes: the system calls a sandbox's processes may not make.

bwrap loads it (``--seccomp FD``, bwrap(1)) right before it executes the exec server, so every
process of the sandbox runs under it, the exec server included, and no process can drop it
(seccomp filters are inherited across fork and execve; bwrap sets ``PR_SET_NO_NEW_PRIVS``).
It is built with libseccomp (through ``pyseccomp``, a ctypes binding of libseccomp's own
Python API) and exported as BPF.

What it denies, each with ``EPERM`` unless said otherwise: every call Docker's default seccomp
profile (moby ``profiles/seccomp/default.json``) denies to a container without extra
capabilities, and ``ptrace`` and ``process_vm_readv``/``writev`` too (Docker allows them on
kernels >= 4.8; a session has no debugger to run and no other process to read):

- namespaces: ``unshare``, ``setns``, ``clone`` with any ``CLONE_NEW*`` flag (so no new user
  namespace, where a process would hold every capability again), and ``clone3`` with
  ``ENOSYS`` (its flags live in memory a filter cannot read; C libraries fall back to
  ``clone`` on ``ENOSYS``, as under Docker);
- mounts: ``mount``, ``umount``/``umount2``, ``pivot_root``, the new mount API (``fsopen``,
  ``fsconfig``, ``fsmount``, ``fspick``, ``move_mount``, ``open_tree``, ``mount_setattr``);
- the kernel's keyring: ``keyctl``, ``add_key``, ``request_key``;
- kernel code and state: ``bpf``, ``perf_event_open``, ``kexec_load``, ``kexec_file_load``,
  ``init_module``, ``finit_module``, ``delete_module``, ``create_module``, ``query_module``,
  ``get_kernel_syms``, ``reboot``, ``swapon``, ``swapoff``, ``acct``, ``syslog``, ``quotactl``,
  ``quotactl_fd``, ``nfsservctl``, ``_sysctl``, ``sysfs``, ``ustat``, ``uselib``,
  ``lookup_dcookie``, ``userfaultfd``, ``io_uring_setup``/``enter``/``register``;
- clocks: ``settimeofday``, ``clock_settime``, ``clock_adjtime``, ``stime``;
- other processes and hardware: ``ptrace``, ``process_vm_readv``, ``process_vm_writev``,
  ``kcmp``, ``name_to_handle_at``, ``open_by_handle_at``, ``ioperm``, ``iopl``, ``vm86``,
  ``vm86old``, ``mbind``, ``set_mempolicy``, ``get_mempolicy``, ``move_pages``.

Everything else is allowed (a deny list, as bubblewrap's own users build theirs: an agent runs
arbitrary programs). A name the host's kernel headers or libseccomp do not know is skipped.
On x86-64 the 32-bit (x86) calls are filtered the same way; a call of an architecture the
filter does not list kills the process (libseccomp's default for a bad architecture).
tests/sandbox/test_seccomp_bwrap.py probes ``unshare -U``, ``keyctl``, ``mount`` and a
``clone`` of a user namespace inside a sandbox (denied) beside control commands that work.
"""

from __future__ import annotations

import errno
import functools
import os
import tempfile
from typing import Any

from rolloutd.errors import ConfigError

#: system calls denied with EPERM (see the module docstring).
DENIED = (
    # namespaces
    "unshare",
    "setns",
    # mounts
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    # keyring
    "keyctl",
    "add_key",
    "request_key",
    # kernel code and state
    "bpf",
    "perf_event_open",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "query_module",
    "get_kernel_syms",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "syslog",
    "quotactl",
    "quotactl_fd",
    "nfsservctl",
    "_sysctl",
    "sysfs",
    "ustat",
    "uselib",
    "lookup_dcookie",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    # clocks
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "stime",
    # other processes and hardware
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "name_to_handle_at",
    "open_by_handle_at",
    "ioperm",
    "iopl",
    "vm86",
    "vm86old",
    "mbind",
    "set_mempolicy",
    "get_mempolicy",
    "move_pages",
)

#: ``clone`` flags that make a new namespace (linux/sched.h): CLONE_NEWTIME, CLONE_NEWNS,
#: CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET.
CLONE_NEW_FLAGS = 0x00000080 | 0x00020000 | 0x7E000000


@functools.cache
def filter_bpf() -> bytes:
    """The filter as BPF, built once per process (the input of bwrap's ``--seccomp``).

    Returns:
        The BPF program: ``struct sock_filter`` entries, 8 bytes each.

    Raises:
        ConfigError: libseccomp or its Python binding is not installed.
    """
    try:
        import pyseccomp as seccomp
    except (ImportError, OSError) as exc:  # OSError: no libseccomp.so.2 for ctypes
        raise ConfigError(
            "bwrap runtime: the seccomp filter needs libseccomp (apt-get install libseccomp2) "
            f"and pyseccomp: {exc}"
        ) from exc
    rules = seccomp.SyscallFilter(seccomp.ALLOW)
    if seccomp.system_arch() == seccomp.Arch.X86_64:
        rules.add_arch(seccomp.Arch.X86)
    for name in DENIED:
        _deny(rules, seccomp, seccomp.ERRNO(errno.EPERM), name)
    # ``clone``'s flags are its first argument on every architecture but s390 (its second):
    # one rule per namespace flag, each matching when that bit is set
    flags = 1 if seccomp.system_arch() == seccomp.Arch.S390X else 0
    for bit in range(64):
        if CLONE_NEW_FLAGS >> bit & 1:
            rules.add_rule(
                seccomp.ERRNO(errno.EPERM),
                "clone",
                seccomp.Arg(flags, seccomp.MASKED_EQ, 1 << bit, 1 << bit),
            )
    _deny(rules, seccomp, seccomp.ERRNO(errno.ENOSYS), "clone3")
    with tempfile.TemporaryFile() as f:
        rules.export_bpf(f)
        f.seek(0)
        return f.read()


def _deny(rules: Any, seccomp: Any, action: int, name: str) -> None:
    """Add ``name`` -> ``action``, skipping a name the host's libseccomp does not know."""
    try:
        rules.add_rule(action, name)
    except (ValueError, OSError, RuntimeError):
        return


def filter_fd() -> int:
    """A file descriptor holding :func:`filter_bpf` at offset 0 (a memfd), for bwrap's
    ``--seccomp FD``; the caller passes it to bwrap and closes it after bwrap started."""
    fd = os.memfd_create("rolloutd-seccomp", os.MFD_CLOEXEC)
    try:
        os.write(fd, filter_bpf())
        os.lseek(fd, 0, os.SEEK_SET)
    except OSError:
        os.close(fd)
        raise
    return fd
