"""Resource limits of a runtime: a cgroup per runtime for processes, CPU and memory.

``max_processes`` and ``cpus`` need a cgroup: RLIMIT_NPROC counts every process of the user on
the host and does not apply to root at all (kernel/fork.c exempts INIT_USER), so it cannot bound
one sandbox. ``memory_mb`` is the memory cgroup's limit (resident memory and page cache of every
process of the runtime together, swap off), so a process that allocates beyond it is killed by
the kernel's OOM killer (counted in :meth:`RuntimeCgroup.oom_kills`); only without a writable
memory controller is it RLIMIT_AS instead (per process, address space, not memory). Each runtime
gets its own cgroup, ``{parent}/rolloutd/{runtime_id}``, below the worker's own cgroup of each
controller (read from ``/proc/self/cgroup``):

- cgroup v2 (``/sys/fs/cgroup/cgroup.controllers`` exists): ``pids.max``, ``cpu.max``,
  ``memory.max`` and ``memory.swap.max`` (kernel Documentation/admin-guide/cgroup-v2.rst); the
  parent must have the controllers in ``cgroup.subtree_control`` (delegated);
- cgroup v1: ``/sys/fs/cgroup/pids/.../pids.max``, ``/sys/fs/cgroup/cpu/.../cpu.cfs_quota_us``
  with ``cpu.cfs_period_us``, ``/sys/fs/cgroup/memory/.../memory.limit_in_bytes`` with
  ``memory.memsw.limit_in_bytes`` (when swap accounting is on) and ``memory.swappiness`` 0
  (Documentation/admin-guide/cgroup-v1/pids.rst, memory.rst, scheduler/sched-bwc.rst).

A process enters the cgroup by a write of its pid to each ``cgroup.procs``
(:meth:`RuntimeCgroup.attach`; the children it forks afterwards are born inside). Moving a process
waits for an RCU grace period in the kernel (cgroup_threadgroup_rwsem: milliseconds on a busy host,
docs/measurements.md), so the bwrap runtime attaches its sandbox's exec server while the sandbox is
still starting, before the exec server forks anything. The pids controller counts tasks, threads
included.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from rolloutd.errors import ConfigError

log = structlog.get_logger(__name__)

#: where cgroup file systems are mounted.
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: CFS period for ``cpus`` (microseconds).
CPU_PERIOD_US = 100_000


def _own_cgroup(controller: str | None) -> str:
    """The worker's cgroup path for ``controller`` (None: the v2 unified hierarchy)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        num, controllers, path = line.split(":", 2)
        if controller is None and num == "0":
            return path
        if controller is not None and controller in controllers.split(","):
            return path
    raise ConfigError(f"no cgroup for controller {controller or 'unified'} in /proc/self/cgroup")


def cgroup_version() -> int | None:
    """2 for a unified hierarchy at /sys/fs/cgroup, 1 for per-controller mounts, else None."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return 2
    if (CGROUP_ROOT / "pids" / "cgroup.procs").exists():
        return 1
    return None


@dataclass
class RuntimeCgroup:
    """The cgroup folders of one runtime (one per v1 controller, or one v2 folder).

    Attributes:
        dirs: folders created, in creation order.
        procs_files: ``cgroup.procs`` files a process joins.
        memory_dir: the folder holding the memory limit; None: memory is not limited here
            (no ``memory_mb``, or no writable memory controller: see :func:`rlimit_as`).
    """

    dirs: list[Path] = field(default_factory=list)
    procs_files: list[Path] = field(default_factory=list)
    memory_dir: Path | None = None

    @classmethod
    def create(
        cls,
        runtime_id: str,
        *,
        max_processes: int | None,
        cpus: float | None,
        memory_mb: int | None = None,
    ) -> RuntimeCgroup:
        """Create the cgroup and write its limits.

        Args:
            runtime_id: names the cgroup folder.
            max_processes: tasks (processes and threads) allowed at once; None: no limit.
            cpus: CPU cores of bandwidth; None: no limit.
            memory_mb: memory of all the runtime's processes together, MiB, swap off; None:
                no limit. Left out (``memory_dir`` None) when there is no writable memory
                controller: the caller falls back to RLIMIT_AS.

        Returns:
            The cgroup (possibly without folders, when nothing was asked); :meth:`remove` it
            when the runtime stops.

        Raises:
            ConfigError: ``max_processes`` or ``cpus`` without a writable cgroup hierarchy
                with the pids/cpu controllers.
        """
        group = cls()
        version = cgroup_version()
        try:
            if version == 2:
                folder = CGROUP_ROOT / _own_cgroup(None).lstrip("/") / "rolloutd" / runtime_id
                group._make(folder)
                if max_processes:
                    (folder / "pids.max").write_text(str(max_processes))
                if cpus:
                    (folder / "cpu.max").write_text(f"{int(cpus * CPU_PERIOD_US)} {CPU_PERIOD_US}")
                if memory_mb and (folder / "memory.max").exists():
                    (folder / "memory.max").write_text(str(memory_mb * 2**20))
                    if (folder / "memory.swap.max").exists():
                        (folder / "memory.swap.max").write_text("0")
                    group.memory_dir = folder
            elif version == 1:
                if max_processes:
                    folder = group._make_v1("pids", runtime_id)
                    (folder / "pids.max").write_text(str(max_processes))
                if cpus:
                    folder = group._make_v1("cpu", runtime_id)
                    (folder / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
                    (folder / "cpu.cfs_quota_us").write_text(str(int(cpus * CPU_PERIOD_US)))
                if memory_mb and (CGROUP_ROOT / "memory" / "cgroup.procs").exists():
                    group._memory_v1(runtime_id, memory_mb)
            elif max_processes or cpus:
                raise ConfigError("no cgroup file system at /sys/fs/cgroup")
        except (OSError, ConfigError) as exc:
            group.remove(timeout_s=1.0)
            raise ConfigError(
                f"runtime limits max_processes/cpus need a writable cgroup (v{version}) with "
                f"the pids/cpu controllers: {exc}"
            ) from exc
        return group

    def _make_v1(self, controller: str, runtime_id: str) -> Path:
        folder = (
            CGROUP_ROOT / controller / _own_cgroup(controller).lstrip("/") / "rolloutd" / runtime_id
        )
        self._make(folder)
        return folder

    def _memory_v1(self, runtime_id: str, memory_mb: int) -> None:
        """The v1 memory folder; skipped (RLIMIT_AS fallback) when it cannot be written."""
        try:
            folder = self._make_v1("memory", runtime_id)
        except (OSError, ConfigError) as exc:
            log.warning("runtime_memory_cgroup_unavailable", error=str(exc))
            return
        limit = str(memory_mb * 2**20)
        (folder / "memory.limit_in_bytes").write_text(limit)
        if (folder / "memory.memsw.limit_in_bytes").exists():  # swap accounting is on
            (folder / "memory.memsw.limit_in_bytes").write_text(limit)
        try:
            (folder / "memory.swappiness").write_text("0")
        except OSError:  # refused when the parent has use_hierarchy and its own swappiness
            pass
        self.memory_dir = folder

    @classmethod
    def existing(cls, runtime_id: str) -> RuntimeCgroup:
        """The cgroup folders :meth:`create` would use for ``runtime_id`` that exist now (a
        dead worker's runtime, to :meth:`remove`); empty when there are none."""
        group = cls()
        version = cgroup_version()
        parents = []
        if version == 2:
            with contextlib.suppress(OSError, ConfigError):
                parents.append(CGROUP_ROOT / _own_cgroup(None).lstrip("/"))
        elif version == 1:
            for controller in ("pids", "cpu", "memory"):
                with contextlib.suppress(OSError, ConfigError):
                    parents.append(CGROUP_ROOT / controller / _own_cgroup(controller).lstrip("/"))
        for parent in parents:
            folder = parent / "rolloutd" / runtime_id
            if folder.is_dir():
                group.dirs.append(folder)
                group.procs_files.append(folder / "cgroup.procs")
        return group

    def attach(self, pid: int) -> None:
        """Move process ``pid`` (not its existing children) into every folder of the cgroup.

        Raises:
            OSError: the process is gone, or the cgroup refused it.
        """
        for procs in self.procs_files:
            procs.write_text(str(pid))

    def oom_kills(self) -> int:
        """Processes the kernel's OOM killer killed in this cgroup so far (0 without a memory
        limit): ``oom_kill`` of ``memory.oom_control`` (v1) or ``memory.events`` (v2)."""
        if self.memory_dir is None:
            return 0
        for name in ("memory.events", "memory.oom_control"):
            try:
                text = (self.memory_dir / name).read_text()
            except FileNotFoundError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def forks_refused(self) -> int:
        """Forks the pids controller refused in this cgroup so far (``max`` of ``pids.events``,
        v1 and v2: kernel Documentation/admin-guide/cgroup-v1/pids.rst); 0 without one."""
        for procs in self.procs_files:
            events = procs.parent / "pids.events"
            try:
                text = events.read_text()
            except FileNotFoundError:
                continue
            for line in text.splitlines():
                key, _, value = line.partition(" ")
                if key == "max":
                    return int(value)
        return 0

    def _make(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.dirs.append(folder)
        self.procs_files.append(folder / "cgroup.procs")

    def pids(self) -> list[int]:
        """Pids in the cgroup now (any of its folders)."""
        found: set[int] = set()
        for procs in self.procs_files:
            try:
                found.update(int(x) for x in procs.read_text().split())
            except FileNotFoundError:
                continue
        return sorted(found)

    def kill_all(self, timeout_s: float = 5.0) -> bool:
        """SIGKILL every process in the cgroup until it is empty (a fork bomb races this).

        Returns:
            Whether the cgroup is empty.
        """
        deadline = time.monotonic() + timeout_s
        while pids := self.pids():
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
            if time.monotonic() > deadline:
                log.error("runtime_cgroup_not_empty", pids=pids[:20])
                return False
            time.sleep(0.005)  # exited tasks leave cgroup.procs when they are reaped
        return True

    def remove(self, timeout_s: float = 5.0) -> None:
        """Kill what is left and remove the folders (deepest first); idempotent."""
        self.kill_all(timeout_s)
        for folder in reversed(self.dirs):
            deadline = time.monotonic() + timeout_s
            while folder.exists():
                try:
                    folder.rmdir()
                except FileNotFoundError:
                    break
                except OSError as exc:  # EBUSY while the last task is being reaped
                    if time.monotonic() > deadline:
                        log.error("runtime_cgroup_not_removed", folder=str(folder), error=str(exc))
                        break
                    time.sleep(0.005)
        self.dirs.clear()
        self.procs_files.clear()


def rlimit_as(pid: int, memory_mb: int) -> None:
    """Set RLIMIT_AS of process ``pid`` (prlimit(2)); its later children inherit it.

    The fallback for ``memory_mb`` without a memory cgroup: it bounds each process's address
    space, not the runtime's memory.
    """
    limit = memory_mb * 2**20
    resource.prlimit(pid, resource.RLIMIT_AS, (limit, limit))


def rlimit_fsize(pid: int, disk_mb: int) -> None:
    """Set RLIMIT_FSIZE of process ``pid`` to ``disk_mb`` MiB (prlimit(2)); its later children
    inherit it: no file they write or ``fallocate`` grows past it (``EFBIG``).

    The per-file fallback for ``disk_mb`` without a sized disk
    (:mod:`rolloutd.sandbox.runtimes.disk`).
    """
    limit = disk_mb * 2**20
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, limit))
