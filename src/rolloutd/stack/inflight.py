"""The work in flight, as the operator's status pages show it: the sessions in flight by phase
(every running ``RolloutSessionWorkflow`` asked its ``phase`` query), and the failure counts by
kind of the running and recent tasks. Read by ``rolloutd status``
(:mod:`rolloutd.stack.status`) and the REST facade's ``GET /stack/status``.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, Field
from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.service import RPCError

from rolloutd.scoring import failure_counts
from rolloutd.trainer_client.task_status import query_status
from rolloutd.types import SessionResult, TaskResult

#: the visibility query of the sessions in flight (Temporal list filter syntax).
SESSIONS_IN_FLIGHT = "WorkflowType = 'RolloutSessionWorkflow' AND ExecutionStatus = 'Running'"
#: sessions asked for their phase at most; beyond, they are not counted.
MAX_SESSIONS_QUERIED = 2000


async def sessions_by_phase(
    client: Client, timeout_s: float = 10.0, concurrency: int = 16
) -> dict[str, int]:
    """Count the sessions in flight by phase (``open``, ``provision``, ``run``, ...); a session
    that ends meanwhile, or whose workflow worker does not answer, counts as ``unknown``.

    Args:
        client: a Temporal client.
        timeout_s: bound on the whole count, s.
        concurrency: queries in flight at once.

    Raises:
        TimeoutError: Temporal did not answer within ``timeout_s``.
        RPCError: Temporal refused the listing.
    """
    sem = asyncio.Semaphore(concurrency)
    counts: Counter[str] = Counter()

    async def phase_of(workflow_id: str, run_id: str | None) -> None:
        async with sem:
            try:
                counts[
                    await client.get_workflow_handle(workflow_id, run_id=run_id).query("phase")
                ] += 1
            except (RPCError, WorkflowQueryFailedError):
                counts["unknown"] += 1

    async def count() -> None:
        ids = [
            (wf.id, wf.run_id)
            async for wf in client.list_workflows(SESSIONS_IN_FLIGHT, limit=MAX_SESSIONS_QUERIED)
        ]
        await asyncio.gather(*(phase_of(i, r) for i, r in ids))

    await asyncio.wait_for(count(), timeout_s)
    return dict(sorted(counts.items()))


#: the visibility query of tasks running or closed within the last hour (Temporal list filter)
TASKS_RECENT = (
    "WorkflowType = 'RolloutTaskWorkflow' AND (ExecutionStatus = 'Running' OR "
    "CloseTime > '{since}')"
)


class TaskFailures(BaseModel):
    """One running or recent task's failure counts (``rolloutd status``).

    Attributes:
        task_id: the task.
        status: its workflow's status (``running``, ``completed``, ...).
        num_sessions: sessions ended so far.
        num_failed_by_kind: failure kind -> sessions that ended with it.
    """

    task_id: str
    status: str
    num_sessions: int = 0
    num_failed_by_kind: dict[str, int] = Field(default_factory=dict)


async def task_failures(
    client: Client, *, recent_s: float = 3600.0, limit: int = 20, timeout_s: float = 10.0
) -> list[TaskFailures]:
    """Failure counts of the tasks running or closed within ``recent_s``, newest first: a
    running task through its ``status`` query, a completed one through its result (the
    client's data converter: ruling of one reading path, never raw history).

    Args:
        client: a Temporal client with rolloutd's data converter.
        recent_s: how far back closed tasks are shown, seconds.
        limit: tasks shown at most.
        timeout_s: bound on the whole listing, s.

    Raises:
        TimeoutError: Temporal did not answer within ``timeout_s``.
        RPCError: Temporal refused the listing.
    """
    since = (datetime.now(UTC) - timedelta(seconds=recent_s)).strftime("%Y-%m-%dT%H:%M:%SZ")

    async def one(workflow_id: str, status: str) -> TaskFailures:
        task_id = workflow_id.removeprefix("task/")
        handle = client.get_workflow_handle(workflow_id, result_type=TaskResult)
        sessions: list[SessionResult] = []
        try:
            if status == "completed":
                group = await handle.result()
                if group.stored_key:
                    # a large group returned by reference: its counts are in the summary
                    return TaskFailures(
                        task_id=task_id,
                        status=status,
                        num_sessions=group.num_sessions,
                        num_failed_by_kind=dict(group.num_failed_by_kind),
                    )
                sessions = group.sessions
            elif status == "running":
                progress = await query_status(handle)
                sessions = progress.sessions if progress is not None else []
        except (RPCError, WorkflowQueryFailedError):
            pass  # shown without counts: a task whose worker does not answer now
        return TaskFailures(
            task_id=task_id,
            status=status,
            num_sessions=len(sessions),
            num_failed_by_kind=failure_counts(sessions),
        )

    async def collect() -> list[TaskFailures]:
        found = [
            (wf.id, wf.status.name.lower() if wf.status else "unknown")
            async for wf in client.list_workflows(TASKS_RECENT.format(since=since), limit=limit)
        ]
        return list(await asyncio.gather(*(one(i, s) for i, s in found)))

    return await asyncio.wait_for(collect(), timeout_s)
