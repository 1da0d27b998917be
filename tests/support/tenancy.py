"""Tasks of sleeping harnesses and the process-table sampler the tenancy and backpressure tests
measure with, and their check that every session of a group completed."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from rolloutd.types import SessionStatus, TaskResult
from tests.conftest import have_bwrap


def task(task_id: str, command: str, num_samples: int, **fields: object) -> dict:
    """A task of ``num_samples`` sessions running ``command`` in a real runtime, with a
    session deadline (``timeout_s``) far shorter than the queue they wait in."""
    return {
        "task_id": task_id,
        "instruction": "wait",
        "num_samples": num_samples,
        "harness": {"type": "shell", "command": command},
        "runtime": {"type": "bwrap" if have_bwrap() else "local"},
        "evaluator": {"type": "session_completed"},
        "phases": {"run_s": 30},
        "timeout_s": 12,
        "max_replacements": 0,
        **fields,
    }


def count_processes(needles: list[str]) -> list[int]:
    """How many processes of the process table have each of ``needles`` as an argument."""
    counts = [0] * len(needles)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not argv or not argv[0].endswith(b"sleep"):
            continue
        for i, needle in enumerate(needles):
            if needle.encode() in argv:
                counts[i] += 1
    return counts


@dataclass
class Sampler:
    """Samples the process table every 50 ms until stopped: the most harnesses of each
    needle seen at once, and of all together."""

    needles: list[str]
    most: list[int] = field(default_factory=list)
    most_total: int = 0
    samples: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        self.most = [0] * len(self.needles)
        while not stop.is_set():
            counts = await asyncio.to_thread(count_processes, self.needles)
            self.most = [max(a, b) for a, b in zip(self.most, counts)]
            self.most_total = max(self.most_total, sum(counts))
            self.samples += 1
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)


@contextlib.asynccontextmanager
async def sampling(needles: list[str]) -> AsyncIterator[Sampler]:
    sampler, stop = Sampler(needles), asyncio.Event()
    running = asyncio.create_task(sampler.run(stop))
    try:
        yield sampler
    finally:
        stop.set()
        await running


def assert_all_completed(group: TaskResult) -> None:
    bad = [
        (s.session_id, s.status.value, s.error)
        for s in group.sessions
        if s.status != SessionStatus.COMPLETED
    ]
    assert not bad, f"sessions that did not complete: {bad}"
