"""The viewer's list of runs: tasks on the stack, filtered by tenant, status, mean reward,
failure kind and start time, read from Temporal's visibility (the page:
:func:`rolloutd.viewer.pages.tasks_page`).

Every filter is a visibility query over the search attributes that tasks and sessions set
(:mod:`rolloutd.workflows.search`): ``RolloutTenant``, ``RolloutReward`` (a task's mean reward,
set when it ends), Temporal's ``ExecutionStatus`` and ``StartTime``. A failure kind is a
session's (``RolloutFailure``): the tasks shown are those with at least one session that ended
with that kind, replaced ones included. No workflow is queried, so a page costs two or three
visibility calls whatever the number of tasks: the tasks, the sessions of the failure kind
(when filtered on it), and the failed sessions of the tasks shown.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from typing import get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator
from temporalio.client import Client

from rolloutd.records import FailureKind
from rolloutd.trainer_client.listing import STATUSES, list_query, quoted, scope_clauses, task_fields
from rolloutd.types import TASK_ID_PATTERN
from rolloutd.workflows import search

__all__ = ["FAILURE_KINDS", "TASK_STATES", "TaskFilter", "TaskListing", "TaskRow", "list_runs"]

#: the filter's task states -> Temporal's ``ExecutionStatus`` values (the task listing's)
TASK_STATES: dict[str, str] = STATUSES
#: every failure kind (docs/failures.md), the filter's choices
FAILURE_KINDS: tuple[str, ...] = get_args(FailureKind)
#: the most task ids one failure filter collects from its sessions
MAX_FAILED_TASKS = 500


class TaskFilter(BaseModel):
    """What the list shows (every field optional; the page's query string).

    A tenant's token sees its own tenant's tasks only: the route sets ``tenant``.
    """

    model_config = ConfigDict(extra="forbid")

    tenant: str | None = Field(default=None, description="only this tenant's tasks")
    status: str | None = Field(default=None, description=f"one of {sorted(TASK_STATES)}")
    failure: str | None = Field(
        default=None, description="only tasks with a session that ended with this kind"
    )
    min_reward: float | None = Field(default=None, description="mean reward at least this")
    max_reward: float | None = Field(default=None, description="mean reward at most this")
    since: datetime | None = Field(default=None, description="started at or after (UTC)")
    until: datetime | None = Field(default=None, description="started at or before (UTC)")
    limit: int = Field(default=100, ge=1, le=1000, description="at most this many rows")

    @field_validator(
        "tenant", "status", "failure", "min_reward", "max_reward", "since", "until", mode="before"
    )
    @classmethod
    def _blank_is_none(cls, value: object) -> object:
        # an HTML form sends an empty field as ""
        return None if value == "" else value

    @field_validator("tenant")
    @classmethod
    def _tenant(cls, value: str | None) -> str | None:
        # a tenant is a task id's characters (types.check_tenant): safe inside a query
        if value is not None and not TASK_ID_PATTERN.match(value):
            raise ValueError(f"tenant {value!r} has characters a tenant name cannot hold")
        return value

    @field_validator("status")
    @classmethod
    def _status(cls, value: str | None) -> str | None:
        if value is not None and value not in TASK_STATES:
            raise ValueError(f"status must be one of {sorted(TASK_STATES)}, not {value!r}")
        return value

    @field_validator("failure")
    @classmethod
    def _failure(cls, value: str | None) -> str | None:
        if value is not None and value not in FAILURE_KINDS:
            raise ValueError(f"failure must be one of {list(FAILURE_KINDS)}, not {value!r}")
        return value

    def task_query(self, task_ids: list[str] | None = None) -> str:
        """The visibility query of the tasks (``task_ids``: only these): the task
        listing's (:func:`rolloutd.trainer_client.listing.list_query`)."""
        return list_query(
            status=self.status,
            tenant=self.tenant,
            since=self.since,
            until=self.until,
            min_reward=self.min_reward,
            max_reward=self.max_reward,
            task_ids=task_ids,
        )

    def session_query(self, kinds: list[str], task_ids: list[str] | None = None) -> str:
        """The visibility query of the sessions that ended with one of ``kinds``: of
        ``task_ids``, or (None) of every task the filter's tenant and times allow."""
        clauses = [
            "WorkflowType = 'RolloutSessionWorkflow'",
            f"{search.FAILURE.name} IN ({quoted(kinds)})",
        ]
        if task_ids is not None:
            clauses.append(f"{search.TASK_ID.name} IN ({quoted(task_ids)})")
        else:
            clauses += scope_clauses(tenant=self.tenant, since=self.since, until=self.until)
        return " AND ".join(clauses)


@dataclass
class TaskRow:
    """One task as the list shows it.

    Attributes:
        task_id / status / tenant / harness: its id, state (:data:`TASK_STATES`), tenant
            and harness type.
        mean_reward: the group's mean reward, set when the task ended (None before, or
            without a scored session).
        started_at / closed_at: from Temporal (UTC).
        failed_sessions: ``(session_id, failure kind)`` of its sessions that ended with a
            cause, replaced ones included.
    """

    task_id: str
    status: str
    tenant: str | None = None
    harness: str | None = None
    mean_reward: float | None = None
    started_at: datetime | None = None
    closed_at: datetime | None = None
    failed_sessions: list[tuple[str, str]] = field(default_factory=list)

    @property
    def failures(self) -> dict[str, int]:
        """Failure kind -> sessions."""
        return dict(sorted(Counter(kind for _, kind in self.failed_sessions).items()))


@dataclass
class TaskListing:
    """A page of tasks, newest first, and whether the failure filter was cut at
    :data:`MAX_FAILED_TASKS` tasks."""

    rows: list[TaskRow]
    truncated: bool = False


async def list_runs(client: Client, where: TaskFilter) -> TaskListing:
    """The tasks ``where`` selects, newest first, each with its failed sessions.

    Args:
        client: a Temporal client (the viewer's trainer client's).
        where: the filters.

    Returns:
        :class:`TaskListing`.
    """
    task_ids: list[str] | None = None
    truncated = False
    if where.failure is not None:
        found: list[str] = []
        async for wf in client.list_workflows(where.session_query([where.failure])):
            task_id = wf.typed_search_attributes.get(search.TASK_ID)
            if task_id is not None and task_id not in found:
                found.append(task_id)
                if len(found) >= MAX_FAILED_TASKS:
                    truncated = True
                    break
        if not found:
            return TaskListing(rows=[])
        task_ids = found
    rows: list[TaskRow] = []
    async for wf in client.list_workflows(where.task_query(task_ids), limit=where.limit):
        rows.append(TaskRow(**task_fields(wf)))
    if rows:
        by_task = {row.task_id: row for row in rows}
        query = where.session_query(list(FAILURE_KINDS), list(by_task))
        async for wf in client.list_workflows(query):
            attributes = wf.typed_search_attributes
            row = by_task.get(attributes.get(search.TASK_ID) or "")
            kind = attributes.get(search.FAILURE)
            if row is not None and kind is not None:
                row.failed_sessions.append((wf.id.removeprefix("task/"), kind))
        for row in rows:
            row.failed_sessions.sort()
    return TaskListing(rows=rows, truncated=truncated)
