"""Counting processes from /proc, so tests count what is left rather than assume it."""

from __future__ import annotations

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
