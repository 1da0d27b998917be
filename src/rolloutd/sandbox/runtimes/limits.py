"""Resource limits of a runtime: a cgroup per runtime for processes and CPU, rlimits for memory.

``max_processes`` and ``cpus`` need a cgroup: RLIMIT_NPROC counts every process of the user on
the host and does not apply to root at all (kernel/fork.c exempts INIT_USER), so it cannot bound
one sandbox. Each runtime gets its own cgroup, ``{parent}/rolloutd/{runtime_id}``, below the
worker's own cgroup of each controller (read from ``/proc/self/cgroup``):

- cgroup v2 (``/sys/fs/cgroup/cgroup.controllers`` exists): ``pids.max``, ``cpu.max``
  (kernel Documentation/admin-guide/cgroup-v2.rst); the parent must have the controllers in
  ``cgroup.subtree_control`` (delegated);
- cgroup v1: ``/sys/fs/cgroup/pids/.../pids.max`` and ``/sys/fs/cgroup/cpu/.../cpu.cfs_quota_us``
  with ``cpu.cfs_period_us`` (Documentation/admin-guide/cgroup-v1/pids.rst, scheduler/
  sched-bwc.rst).

Every command joins the cgroup before it runs (see :func:`wrapper_argv`): a ``/bin/sh`` writes
``0`` ("the writing process") to each ``cgroup.procs``, sets ``ulimit -v`` for ``memory_mb``
(RLIMIT_AS, per process), and ``exec``s the command, so its pid, process group and children are
all inside from the first instruction. The pids controller counts tasks, threads included.
"""

from __future__ import annotations

import os
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
        procs_files: ``cgroup.procs`` files a command joins.
    """

    dirs: list[Path] = field(default_factory=list)
    procs_files: list[Path] = field(default_factory=list)

    @classmethod
    def create(cls, runtime_id: str, *, max_processes: int | None,
               cpus: float | None) -> RuntimeCgroup:
        """Create the cgroup and write its limits.

        Args:
            runtime_id: names the cgroup folder.
            max_processes: tasks (processes and threads) allowed at once; None: no limit.
            cpus: CPU cores of bandwidth; None: no limit.

        Returns:
            The cgroup; :meth:`remove` it when the runtime stops.

        Raises:
            ConfigError: no writable cgroup hierarchy with the needed controllers.
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
                    (folder / "cpu.max").write_text(f"{int(cpus * CPU_PERIOD_US)} "
                                                    f"{CPU_PERIOD_US}")
            elif version == 1:
                if max_processes:
                    folder = (CGROUP_ROOT / "pids" / _own_cgroup("pids").lstrip("/")
                              / "rolloutd" / runtime_id)
                    group._make(folder)
                    (folder / "pids.max").write_text(str(max_processes))
                if cpus:
                    folder = (CGROUP_ROOT / "cpu" / _own_cgroup("cpu").lstrip("/")
                              / "rolloutd" / runtime_id)
                    group._make(folder)
                    (folder / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
                    (folder / "cpu.cfs_quota_us").write_text(str(int(cpus * CPU_PERIOD_US)))
            else:
                raise ConfigError("no cgroup file system at /sys/fs/cgroup")
        except (OSError, ConfigError) as exc:
            group.remove(timeout_s=1.0)
            raise ConfigError(
                f"runtime limits max_processes/cpus need a writable cgroup (v{version}) with "
                f"the pids/cpu controllers: {exc}"
            ) from exc
        return group

    @classmethod
    def existing(cls, runtime_id: str) -> RuntimeCgroup:
        """The cgroup folders :meth:`create` would use for ``runtime_id`` that exist now (a
        dead worker's runtime, to :meth:`remove`); empty when there are none."""
        group = cls()
        version = cgroup_version()
        try:
            if version == 2:
                parents = [CGROUP_ROOT / _own_cgroup(None).lstrip("/")]
            elif version == 1:
                parents = [CGROUP_ROOT / c / _own_cgroup(c).lstrip("/") for c in ("pids", "cpu")]
            else:
                parents = []
        except (OSError, ConfigError):
            parents = []
        for parent in parents:
            folder = parent / "rolloutd" / runtime_id
            if folder.is_dir():
                group.dirs.append(folder)
                group.procs_files.append(folder / "cgroup.procs")
        return group

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
                        log.error("runtime_cgroup_not_removed", folder=str(folder),
                                  error=str(exc))
                        break
                    time.sleep(0.005)
        self.dirs.clear()
        self.procs_files.clear()


def wrapper_argv(procs_files: list[Path], memory_mb: int | None) -> list[str]:
    """The ``/bin/sh`` prefix that joins cgroups and sets RLIMIT_AS, then ``exec``s the rest.

    Args:
        procs_files: ``cgroup.procs`` files to join.
        memory_mb: RLIMIT_AS in MiB (``ulimit -v`` takes KiB); None: none.

    Returns:
        ``["/bin/sh", "-c", SCRIPT, "sh", *procs_files]``; append the command's argv. Empty
        when there is nothing to do.
    """
    if not procs_files and not memory_mb:
        return []
    steps = [f'echo 0 > "${i + 1}"' for i in range(len(procs_files))]
    if memory_mb:
        steps.append(f"ulimit -v {memory_mb * 1024}")
    script = " && ".join(steps) + f' && shift {len(procs_files)} && exec "$@"' \
        if procs_files else " && ".join(steps) + ' && exec "$@"'
    return ["/bin/sh", "-c", script, "sh", *(str(p) for p in procs_files)]
