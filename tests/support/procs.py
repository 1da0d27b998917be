"""Counting processes from /proc, so tests count what is left rather than assume it."""

from __future__ import annotations

import os
from pathlib import Path


def processes_with(marker: str) -> list[int]:
    """Pids whose command line contains ``marker``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def our_processes(runtime_ids: set[str], container_ids: set[str]) -> list[str]:
    """conmon and runc processes of these runtimes' containers: conmon names its container
    (``-n rolloutd-{runtime id}``, ``-c {container id}``); a ``runc`` process is ours when its
    parent is such a conmon or its cgroup names one of the containers."""
    names = [f"rolloutd-{r}".encode() for r in runtime_ids] + [c.encode() for c in container_ids]
    table: dict[int, tuple[int, bytes, bytes]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/cgroup", "rb") as f:
                cgroup = f.read()
        except OSError:
            continue
        if fields[0] != b"Z":
            table[int(entry)] = (int(fields[1]), cmdline, cgroup)
    conmons = {
        pid
        for pid, (_, cmdline, _) in table.items()
        if b"conmon" in cmdline.split(b"\0")[0] and any(n in cmdline for n in names)
    }
    runcs = {
        pid
        for pid, (ppid, cmdline, cgroup) in table.items()
        if b"runc" in cmdline.split(b"\0")[0]
        and (ppid in conmons or any(c.encode() in cgroup for c in container_ids))
    }
    return [table[pid][1].replace(b"\0", b" ")[:120].decode() for pid in conmons | runcs]
