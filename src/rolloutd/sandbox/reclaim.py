"""Reclaiming runtimes a dead sandbox worker left behind (docs/faults.md, "sandbox worker dies").

A sandbox worker records who owns each runtime before it creates it::

    {runtime_root}/.owners/{runtime_id}.json    {"pid": worker pid, "start_ticks": ..., "host_id"}

``start_ticks`` is field 22 of ``/proc/{pid}/stat`` (proc(5)): with the pid it names one process
for the life of the machine, so a recycled pid is never mistaken for the owner. When a worker
starts it calls :func:`reclaim_orphans`: every runtime whose owner is gone is reclaimed, that
is every process carrying ``ROLLOUTD_RUNTIME_ID={runtime_id}`` in its environment (every
runtime command starts with it; bwrap sandboxes also die with their worker through
``--die-with-parent``) is killed with its process group, the runtime's cgroups are emptied and
removed, its sized disk (:mod:`rolloutd.sandbox.runtimes.disk`) unmounted and its image
deleted, and its folder is deleted. Runtimes of live workers sharing the root are left alone.

Container runtimes (podman, docker) are found by label as well: every container whose label
``rolloutd.root`` names this root and whose ``rolloutd.runtime_id`` has no live owner is
removed with its anonymous volumes (``podman rm --force --volumes``), also when its runtime's
folder is already gone. (A container usually ends by itself when its worker dies: its exec
server exits when its control socket closes, and ``--rm`` removes it.)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from rolloutd.errors import RuntimeStartError
from rolloutd.processes import kill_process_group_of, process_start_ticks, processes_with_env
from rolloutd.sandbox.runtimes import disk
from rolloutd.sandbox.runtimes.limits import RuntimeCgroup
from rolloutd.sandbox.runtimes.podman import ROOT_LABEL, RUNTIME_LABEL, container_binaries

log = structlog.get_logger(__name__)

#: folder below the runtime root holding one owner record per runtime.
OWNERS_DIR = ".owners"


def owner_path(root: Path, runtime_id: str) -> Path:
    """Where the owner record of ``runtime_id`` lives."""
    return Path(root) / OWNERS_DIR / f"{runtime_id}.json"


def claim(root: Path, runtime_id: str, host_id: str) -> None:
    """Record this process as the owner of ``runtime_id`` (before the runtime is created)."""
    path = owner_path(root, runtime_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    pid = os.getpid()
    path.write_text(
        json.dumps({"pid": pid, "start_ticks": process_start_ticks(pid), "host_id": host_id})
    )


def release(root: Path, runtime_id: str) -> None:
    """Forget the owner record of a runtime that was torn down."""
    owner_path(root, runtime_id).unlink(missing_ok=True)


def _owner_alive(root: Path, runtime_id: str) -> bool:
    try:
        owner = json.loads(owner_path(root, runtime_id).read_text())
    except (OSError, ValueError):
        return False  # no record: created by no live worker of this version
    pid = owner.get("pid")
    if not isinstance(pid, int) or pid == os.getpid():
        return False  # this process is starting: nothing it owns is running yet
    return process_start_ticks(pid) == owner.get("start_ticks")


#: seconds a container CLI command of the reclaim may take.
CONTAINER_CLI_TIMEOUT_S = 60.0


def labelled_containers(root: Path) -> dict[str, list[tuple[str, str]]]:
    """Containers (running or not) labelled with this runtime root, by runtime id.

    Returns:
        runtime id -> ``[(binary, container id), ...]``; a CLI that fails (docker without a
        daemon) contributes nothing.
    """
    found: dict[str, list[tuple[str, str]]] = {}
    for binary in container_binaries():
        try:
            listing = subprocess.run(
                [
                    binary,
                    "ps",
                    "--all",
                    "--no-trunc",
                    "--filter",
                    f"label={ROOT_LABEL}={Path(root).absolute()}",
                    "--format",
                    f'{{{{.ID}}}} {{{{index .Labels "{RUNTIME_LABEL}"}}}}',
                ],
                capture_output=True,
                text=True,
                timeout=CONTAINER_CLI_TIMEOUT_S,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("container_list_failed", binary=binary, error=str(exc))
            continue
        if listing.returncode != 0:
            continue
        for line in listing.stdout.splitlines():
            container, _, runtime_id = line.strip().partition(" ")
            if container and runtime_id:
                found.setdefault(runtime_id, []).append((binary, container))
    return found


def _remove_containers(containers: list[tuple[str, str]]) -> int:
    """``rm --force --volumes`` each container; the number removed."""
    removed = 0
    for binary, container in containers:
        done = subprocess.run(
            [binary, "rm", "--force", "--volumes", container],
            capture_output=True,
            text=True,
            timeout=CONTAINER_CLI_TIMEOUT_S,
            check=False,
        )
        if done.returncode == 0:
            removed += 1
        else:
            log.warning("container_reclaim_failed", container=container, output=done.stdout[-300:])
    return removed


@dataclass
class ReclaimReport:
    """What :func:`reclaim_orphans` did.

    Attributes:
        runtime_ids: runtimes reclaimed (folders removed).
        num_killed: processes sent SIGKILL.
        remaining_pids: processes still alive when the deadline passed (should be empty).
        num_containers: containers removed (podman, docker).
    """

    runtime_ids: list[str] = field(default_factory=list)
    num_killed: int = 0
    remaining_pids: list[int] = field(default_factory=list)
    num_containers: int = 0


def reclaim_orphans(root: Path, *, timeout_s: float = 10.0) -> ReclaimReport:
    """Kill and remove every runtime under ``root`` whose owning worker is gone.

    Args:
        root: ``SandboxSettings.runtime_root``.
        timeout_s: how long to wait for killed processes to disappear.

    Returns:
        The :class:`ReclaimReport`.
    """
    root = Path(root)
    report = ReclaimReport()
    if not root.is_dir():
        return report
    candidates = {
        d.name
        for d in root.iterdir()
        if d.is_dir() and d.name not in (OWNERS_DIR, ".images", disk.DISKS_DIR)
    }
    owners_dir = root / OWNERS_DIR
    if owners_dir.is_dir():
        candidates |= {p.stem for p in owners_dir.glob("*.json")}
    if (root / disk.DISKS_DIR).is_dir():
        candidates |= {p.stem for p in (root / disk.DISKS_DIR).glob("*.img")}
    containers = labelled_containers(root)
    candidates |= set(containers)
    orphans = {r for r in candidates if not _owner_alive(root, r)}
    if not orphans:
        return report
    report.num_containers = _remove_containers(
        [c for runtime_id in sorted(orphans) for c in containers.get(runtime_id, [])]
    )
    deadline = time.monotonic() + timeout_s
    while pids := processes_with_env("ROLLOUTD_RUNTIME_ID", orphans):
        report.num_killed += sum(kill_process_group_of(pid) for pid in pids)
        if time.monotonic() > deadline:
            report.remaining_pids = sorted(pids)
            log.error("runtime_reclaim_incomplete", pids=report.remaining_pids[:20])
            break
        time.sleep(0.05)  # killed processes leave /proc once their parent reaps them
    for runtime_id in sorted(orphans):
        RuntimeCgroup.existing(runtime_id).remove(timeout_s=2.0)
        try:  # its sized disk, unmounted before its folder is removed
            disk.release(root / runtime_id, disk.image_path(root, runtime_id))
        except RuntimeStartError as exc:
            log.error("runtime_disk_not_released", runtime_id=runtime_id, error=str(exc))
        shutil.rmtree(root / runtime_id, ignore_errors=True)
        release(root, runtime_id)
        report.runtime_ids.append(runtime_id)
    log.info(
        "runtimes_reclaimed",
        num_runtimes=len(report.runtime_ids),
        num_killed=report.num_killed,
        num_containers=report.num_containers,
    )
    return report
