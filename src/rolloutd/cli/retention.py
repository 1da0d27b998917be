"""``rolloutd store gc``: prune the blob store by a retention setting.

A training run writes every session's completion log, artifacts and trajectory, every large
task request and every finished group of a buffer into the blob store
(:mod:`rolloutd.store`); nothing else ever deletes them. ``gc`` deletes, per task, what is
older than the retention (``ROLLOUTD_STORE_RETENTION_DAYS``):

- ``sessions/{task_id}/`` (each session's state, log, artifacts, trajectory, result),
- ``tasks/{task_id}/`` (a request stored once for its sessions),
- ``groups/{task_id}.json`` (a group a buffer hands out by reference) and ``groups/{task_id}/``
  (the parts of a large group),
- ``reverify/{run_id}/`` (a re-verification run's per-session outcomes and summary: its
  journal; the scores themselves are evaluation records in the sessions' folders),

a unit at a time, judged by its newest object. It never deletes what is still held, asked of
Temporal first:

- a task whose workflow still runs (its sessions' logs are open, its request is read);
- a group a running buffer has not had acknowledged (ready, leased or offered again: its
  trainer reads the group and its sessions' trajectories when it takes the batch);
- a re-verification run whose workflow still runs (it resumes from that journal).

A generation's journal (``generations/``) is its record and is kept.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import structlog
from temporalio.client import Client

from rolloutd.store import BlobStore
from rolloutd.workflows.buffer.models import BufferStats
from rolloutd.workflows.buffer.workflow import RolloutBufferWorkflow

log = structlog.get_logger(__name__)

#: the folders pruned per task, and per re-verification run
UNITS = ("sessions", "tasks", "groups", "reverify")


@dataclass
class Held:
    """Task ids and re-verification runs whose objects must stay, and why."""

    running_tasks: set[str] = field(default_factory=set)
    unacked_groups: set[str] = field(default_factory=set)
    running_reverify: set[str] = field(default_factory=set)

    def __contains__(self, task_id: str) -> bool:
        return task_id in self.running_tasks or task_id in self.unacked_groups

    def holds(self, prefix: str, name: str) -> bool:
        """Whether the unit ``{prefix}/{name}`` must stay (``name``: a task id, or a
        re-verification run's id under ``reverify``)."""
        return name in self.running_reverify if prefix == "reverify" else name in self


@dataclass
class GcReport:
    """What a collection did (or would do, ``dry_run``)."""

    retention_s: float
    dry_run: bool
    deleted: list[str] = field(default_factory=list)
    kept_young: int = 0
    kept_held: list[str] = field(default_factory=list)
    num_bytes: int = 0


async def held(client: Client) -> Held:
    """What Temporal says is still in use: the running tasks, and the groups every running
    buffer has not had acknowledged (its ``stats`` query, ``held_task_ids``).

    Raises:
        temporalio.service.RPCError: Temporal did not answer (nothing may be deleted then).
        temporalio.client.WorkflowQueryFailedError: a buffer did not answer.
    """
    out = Held()
    async for wf in client.list_workflows(
        "WorkflowType='RolloutTaskWorkflow' AND ExecutionStatus='Running'"
    ):
        out.running_tasks.add(wf.id.removeprefix("task/"))
    async for wf in client.list_workflows(
        "WorkflowType='RolloutBufferWorkflow' AND ExecutionStatus='Running'"
    ):
        # a buffer that cannot say what it holds stops the collection (raises)
        stats = await client.get_workflow_handle(wf.id).query(
            RolloutBufferWorkflow.stats, result_type=BufferStats
        )
        out.unacked_groups.update(stats.held_task_ids)
    async for wf in client.list_workflows(
        "WorkflowType='ReverifyWorkflow' AND ExecutionStatus='Running'"
    ):
        out.running_reverify.add(wf.id.removeprefix("reverify/"))
    return out


def _mtime(info: dict[str, Any]) -> float | None:
    """An fsspec entry's modification time, Unix seconds (local: ``mtime``; S3:
    ``LastModified``; GCS: ``updated``)."""
    for name in ("mtime", "LastModified", "updated", "created"):
        value = info.get(name)
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return None


def _units(store: BlobStore) -> list[tuple[str, str, str]]:
    """``(prefix, name, key)`` of every prunable unit: ``sessions/{task_id}``,
    ``tasks/{task_id}``, ``groups/{task_id}.json``, ``reverify/{run_id}``."""
    out = []
    for prefix in UNITS:
        for key in store.list(prefix):
            name = key.removeprefix(f"{prefix}/")
            out.append((prefix, name.removesuffix(".json") if prefix == "groups" else name, key))
    return out


def collect(
    store: BlobStore,
    holding: Held,
    *,
    retention_s: float,
    now: float | None = None,
    dry_run: bool = False,
) -> GcReport:
    """Delete every unit (see the module docstring) whose newest object is older than
    ``retention_s`` and whose task is not in ``holding``.

    Args:
        store: the blob store.
        holding: what Temporal says is in use (:func:`held`), asked just before.
        retention_s: the age a unit's newest object must pass, seconds.
        now: Unix time to judge ages by (default: now).
        dry_run: report only.

    Returns:
        What was deleted (or would be) and what was kept.
    """
    now = time.time() if now is None else now
    report = GcReport(retention_s=retention_s, dry_run=dry_run)
    for prefix, name, key in _units(store):
        path = store._path(key)
        try:
            found = store.fs.find(path, detail=True, withdirs=False)
        except FileNotFoundError:
            continue
        entries = found.values() if isinstance(found, dict) else []
        times = [t for e in entries if (t := _mtime(e)) is not None]
        if not times:
            times = [t for t in [_mtime(store.fs.info(path))] if t is not None]
        if not times or now - max(times) < retention_s:
            report.kept_young += 1
            continue
        if holding.holds(prefix, name):
            report.kept_held.append(key)
            continue
        report.deleted.append(key)
        report.num_bytes += sum(int(e.get("size") or 0) for e in entries)
        if not dry_run:
            store.fs.rm(path, recursive=True)
    log.info(
        "store_gc",
        dry_run=dry_run,
        num_deleted=len(report.deleted),
        num_kept_young=report.kept_young,
        num_kept_held=len(report.kept_held),
        num_bytes=report.num_bytes,
    )
    return report


async def gc(
    client: Client, store: BlobStore, *, retention_s: float, dry_run: bool = False
) -> GcReport:
    """Ask Temporal what is held, then :func:`collect`.

    Raises:
        temporalio.service.RPCError: Temporal did not answer (nothing was deleted).
    """
    holding = await held(client)
    return await asyncio.to_thread(
        collect, store, holding, retention_s=retention_s, dry_run=dry_run
    )
