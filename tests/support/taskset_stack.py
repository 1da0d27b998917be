"""The four fleets for task-set tests on podman: real Temporal (a namespace of their own), the
operator's policy these tasks need (podman, the copied task folders as image roots and upload
sources, network for image builds), real llama-server behind the gateway; and helpers that
submit tasks at once and print each session's figures."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from rolloutd.store import BlobStore
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import TaskRequest, TaskResult
from tests.support.namespaced_fleets import namespaced_fleets


@dataclass
class Rig:
    """The fleets of these tests and where the task sets were copied."""

    client: RolloutClient
    tasks: Path
    store: BlobStore


@contextlib.asynccontextmanager
async def taskset_rig(
    temporal_address: str, engine_url: str, task_root: Path, name: str
) -> AsyncIterator[Rig]:
    """The four fleets in a fresh namespace named after ``name``, on the engine at
    ``engine_url``, with a policy that allows the task sets copied below ``task_root``. The
    base image the sets' Dockerfiles build on is the sandbox host's to make when missing, as on
    a fresh machine."""
    policy = {
        "runtimes": ["podman"],
        "networks": ["gateway", "none"],
        "image_roots": [str(task_root)],
        "upload_sources": [str(task_root)],
        "build_network": True,
    }
    with tempfile.TemporaryDirectory(prefix="ts-") as home:
        async with namespaced_fleets(
            temporal_address,
            Path(home),
            engine_url,
            tag=name,
            gateway={"tool_parser": "hermes_lenient"},
            # more slots than a test runs sessions at once: a full host makes no provisioning
            # poll, which the client's fleet-health check would read as a dead fleet
            sandbox_host={"max_concurrent_sessions": 8, "sandbox_policy": policy},
        ) as fleets:
            store = BlobStore(fleets.store_url)
            yield Rig(RolloutClient(fleets.client, store), task_root, store)


async def run_all(
    rig: Rig, tasks: list[TaskRequest]
) -> list[tuple[TaskRequest, TaskResult, float]]:
    """Submit every task at once; each one's group and wall time (submit to result)."""
    suffix = uuid.uuid4().hex[:6]

    async def one(task: TaskRequest) -> tuple[TaskRequest, TaskResult, float]:
        t0 = time.monotonic()
        handle = await rig.client.submit(
            task.model_copy(update={"task_id": f"{task.task_id}-{suffix}"})
        )
        return task, await handle.result(), time.monotonic() - t0

    return await asyncio.gather(*(one(t) for t in tasks))


def rewards_of(results) -> dict[str, list[float | None]]:
    """Task id -> its sessions' rewards."""
    return {task.task_id: [s.reward for s in group.sessions] for task, group, _ in results}


def report(label: str, results) -> None:
    """Print each session's reward, status, model calls and wall time (and the reason its
    evaluation record gives)."""
    for task, group, wall in results:
        for s in group.sessions:
            reason = s.evaluation.reason if s.evaluation and s.evaluation.reason else ""
            print(
                f"{label} {task.task_id}: reward {s.reward}, status {s.status.value}, "
                f"completions {s.num_completions}, wall {wall:.0f} s"
                + (f", error {s.error[:200]}" if s.error else "")
                + (f", reason: {reason[:300]}" if reason else "")
            )
