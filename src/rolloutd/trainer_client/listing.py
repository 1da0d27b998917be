"""Tasks on a stack, listed from Temporal's visibility: ``rolloutd tasks list`` and the REST
facade's ``GET /rollout/tasks``.

One ``list_workflows`` query over the task workflows, filtered by the search attributes every
task sets when it starts (``RolloutTaskId``, ``RolloutTenant``; :mod:`rolloutd.workflows.search`)
and by Temporal's ``ExecutionStatus``; no task is queried, so a listing costs the same for ten
tasks or ten thousand. The mean reward is the ``RolloutReward`` a task sets when it ends.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import Field
from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus

from rolloutd.errors import ConfigError
from rolloutd.payload import Payload
from rolloutd.workflows import search

#: what ``status`` filters on, as Temporal's ``ExecutionStatus`` names it
STATUSES: dict[str, str] = {
    "running": "Running",
    "completed": "Completed",
    "failed": "Failed",
    "cancelled": "Canceled",
    "terminated": "Terminated",
    "timed_out": "TimedOut",
}
TaskState = Literal["running", "completed", "failed", "cancelled", "terminated", "timed_out"]
#: the most rows one listing returns
MAX_LIMIT = 1000
#: a prefix or tenant is a task id's characters (``TASK_ID_PATTERN``): safe in a query
_SAFE = re.compile(r"^[A-Za-z0-9._-]*$")


class TaskRow(Payload):
    """One task as a listing shows it."""

    task_id: str
    status: TaskState = Field(description="its workflow's execution status")
    tenant: str | None = Field(default=None, description="RolloutTenant")
    harness: str | None = Field(default=None, description="RolloutHarness")
    mean_reward: float | None = Field(
        default=None, description="RolloutReward: the group's mean reward, set when it ended"
    )
    started_at: datetime | None = None
    closed_at: datetime | None = None


#: a workflow's execution status -> the listing's word for it
_STATES: dict[WorkflowExecutionStatus, TaskState] = {
    WorkflowExecutionStatus.RUNNING: "running",
    WorkflowExecutionStatus.COMPLETED: "completed",
    WorkflowExecutionStatus.FAILED: "failed",
    WorkflowExecutionStatus.CANCELED: "cancelled",
    WorkflowExecutionStatus.TERMINATED: "terminated",
    WorkflowExecutionStatus.TIMED_OUT: "timed_out",
    WorkflowExecutionStatus.CONTINUED_AS_NEW: "running",
}


def list_query(
    *,
    status: str | None = None,
    prefix: str | None = None,
    tenant: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    min_reward: float | None = None,
    max_reward: float | None = None,
    task_ids: list[str] | None = None,
) -> str:
    """The visibility query of a listing of tasks: ``rolloutd tasks list``, REST's
    ``GET /rollout/tasks`` and the viewer's runs page (:mod:`rolloutd.viewer.runs`).

    Args:
        status: only tasks in this state (:data:`STATUSES`).
        prefix: only tasks whose id starts with it.
        tenant / since / until: :func:`scope_clauses`.
        min_reward / max_reward: only tasks whose mean reward (``RolloutReward``) is at
            least / at most this.
        task_ids: only these tasks.

    Raises:
        ConfigError: an unknown status, or a prefix, tenant or task id with characters a
            task id cannot hold (named).
    """
    clauses = ["WorkflowType = 'RolloutTaskWorkflow'"]
    if status is not None:
        if status not in STATUSES:
            raise ConfigError(f"status must be one of {sorted(STATUSES)}, not {status!r}")
        clauses.append(f"ExecutionStatus = '{STATUSES[status]}'")
    if prefix is not None:
        clauses.append(f"{search.TASK_ID.name} STARTS_WITH '{_safe('prefix', prefix)}'")
    clauses += scope_clauses(tenant=tenant, since=since, until=until)
    if min_reward is not None:
        clauses.append(f"{search.REWARD.name} >= {float(min_reward)!r}")
    if max_reward is not None:
        clauses.append(f"{search.REWARD.name} <= {float(max_reward)!r}")
    if task_ids is not None:
        clauses.append(f"{search.TASK_ID.name} IN ({quoted(task_ids)})")
    return " AND ".join(clauses)


def scope_clauses(
    *, tenant: str | None = None, since: datetime | None = None, until: datetime | None = None
) -> list[str]:
    """The clauses a task's and its sessions' workflows share: a tenant (``RolloutTenant``)
    and a start time at or after ``since`` / at or before ``until`` (``StartTime``; a time
    without a zone is taken as UTC).

    Raises:
        ConfigError: a tenant with characters a task id cannot hold.
    """
    clauses = []
    if tenant is not None:
        clauses.append(f"{search.TENANT.name} = '{_safe('tenant', tenant)}'")
    if since is not None:
        clauses.append(f"StartTime >= '{_utc(since)}'")
    if until is not None:
        clauses.append(f"StartTime <= '{_utc(until)}'")
    return clauses


def quoted(values: list[str]) -> str:
    """Values as a visibility query's ``IN (...)`` list.

    Raises:
        ConfigError: a value with characters a task id cannot hold (a quote).
    """
    return ", ".join(f"'{_safe('value', v)}'" for v in values)


def _safe(name: str, value: str) -> str:
    if not _SAFE.match(value):
        raise ConfigError(f"{name} {value!r} has characters a task id cannot hold")
    return value


def _utc(moment: datetime) -> str:
    """RFC 3339 in UTC (a time without a zone is taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def list_tasks(
    client: Client,
    *,
    status: str | None = None,
    prefix: str | None = None,
    tenant: str | None = None,
    limit: int = 100,
) -> list[TaskRow]:
    """Tasks on the stack, newest first.

    Args:
        client: a Temporal client.
        status: only tasks in this state (:data:`STATUSES`).
        prefix: only tasks whose id starts with it (an eval run's tasks: ``{run}-``).
        tenant: only this tenant's tasks.
        limit: at most this many rows (1 to :data:`MAX_LIMIT`).

    Raises:
        ConfigError: a filter is malformed (:func:`list_query`).
    """
    query = list_query(status=status, prefix=prefix, tenant=tenant)
    rows = []
    async for wf in client.list_workflows(query, limit=max(1, min(limit, MAX_LIMIT))):
        rows.append(TaskRow(**task_fields(wf)))
    return rows


def task_fields(wf: WorkflowExecution) -> dict[str, Any]:
    """A task workflow's row fields as Temporal's visibility holds them: ``task_id``,
    ``status`` (a :data:`TaskState`; a continued-as-new run counts as running), ``tenant``,
    ``harness``, ``mean_reward`` (its search attributes) and ``started_at``/``closed_at``
    (UTC). The listing's rows and the viewer's runs page are both made from it."""
    attributes = wf.typed_search_attributes
    return {
        "task_id": attributes.get(search.TASK_ID) or wf.id.removeprefix("task/"),
        "status": _STATES.get(wf.status, "running") if wf.status else "running",
        "tenant": attributes.get(search.TENANT),
        "harness": attributes.get(search.HARNESS),
        "mean_reward": attributes.get(search.REWARD),
        "started_at": wf.start_time,
        "closed_at": wf.close_time,
    }


def rows_of(body: Any) -> list[TaskRow]:
    """The rows of the REST facade's listing (``{"tasks": [...]}``)."""
    return [TaskRow.model_validate(row) for row in body.get("tasks", [])]
