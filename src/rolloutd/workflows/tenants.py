"""Tenants: the Temporal priority of a task's work, and a tenant's quota of sessions in flight
(docs/tenancy.md).

Every activity and child workflow of a task carries :func:`task_priority`: Temporal's task
priority key (1 first) and fairness key (the tenant) with its weight, so a high-priority
evaluation overtakes a training job's backlog in every task queue, and tenants of equal
priority share the fleets by weight (docs.temporal.io/develop/task-queue-priority-fairness).

``TenantWorkflow`` (id ``tenant/{tenant}``) exists only for a tenant with a quota: it grants at most
``max_sessions_in_flight`` slots at once, each to a session that holds it from before it opens its
gateway session until it ends. Waiting requests are granted by priority, then in arrival order. It
is one tenant's counter, not a lock shared by tenants; sessions waiting for the fleet's capacity
still wait in the fleet's task queue (docs/decisions.md, "Dead versus saturated").

A holder gives its slot back when it ends, however it ends: a session that ends by itself
signals ``release``; one that cannot (terminated, or cancelled while its signal failed) is
found by asking Temporal (the activity ``closed_workflows`` on the eval fleet) every
``check_holders_s`` while requests wait and the quota is full, so a slot is never lost for good.
The workflow records nothing while no request waits.

Deterministic code only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import timedelta

from pydantic import Field
from temporalio import workflow
from temporalio.common import Priority, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from rolloutd import task_queues
    from rolloutd.activities.names import CLOSED_WORKFLOWS
    from rolloutd.activities.tenants import (
        ACQUIRE_SIGNAL,
        GRANTED_SIGNAL,
        RELEASE_SIGNAL,
        SET_QUOTA_UPDATE,
        STATE_QUERY,
        TenantQuota,
        TenantSlotRequest,
        TenantState,
        tenant_workflow_id,
    )
    from rolloutd.payload import Payload
    from rolloutd.types import PhaseTiming, TaskRequest
    from rolloutd.workflows import signals

#: history events after which the tenant workflow continues as new (at most)
MAX_HISTORY_EVENTS = 5_000
#: seconds between two checks of the holders while requests wait on a full quota
CHECK_HOLDERS_S = 60.0
#: one check of the holders (one activity, every holder described concurrently), queue time
#: included: a check that cannot run (no eval worker) holds the grants back this long at most
CHECK_HOLDERS_TIMEOUT = timedelta(seconds=30)
#: ``ApplicationError.type`` of a signal to a workflow that does not run
EXTERNAL_NOT_FOUND = "ExternalWorkflowExecutionNotFound"


def task_priority(task: TaskRequest) -> Priority:
    """The Temporal priority of every activity and child workflow of ``task``.

    Returns:
        ``Priority(priority_key=task.priority, fairness_key=task.tenant,
        fairness_weight=task.fairness_weight)``.
    """
    return Priority(
        priority_key=task.priority, fairness_key=task.tenant, fairness_weight=task.fairness_weight
    )


async def has_quota(task: TaskRequest) -> bool:
    """From a task workflow, before it starts its sessions: whether the task's tenant has a
    quota (its quota workflow runs), so that a session of a tenant without one does not ask
    for a slot (a signal that fails, two events in every session's history).

    The question is a ``release`` signal naming the task's own workflow, which holds and
    waits for nothing: a no-op for the quota workflow, and "not found" without one.

    Raises:
        temporalio.exceptions.ApplicationError: the signal failed for another reason than
            a missing tenant workflow.
    """
    try:
        await signals.send(
            tenant_workflow_id(task.tenant), RELEASE_SIGNAL, workflow.info().workflow_id
        )
    except ApplicationError as e:
        if e.type == EXTERNAL_NOT_FOUND:
            return False
        raise
    return True


async def acquire_slot(
    task: TaskRequest,
    granted: Callable[[], bool],
    timings: list[PhaseTiming],
    *,
    quota: bool | None = None,
) -> float | None:
    """From a session workflow: wait for a slot of the task's tenant when the tenant has a
    quota (its quota workflow runs). The wait is appended to ``timings`` as ``tenant_wait``.

    The request is a signal to the tenant's workflow sent by workflow code (a command whose
    outcome is an event of the session's own history), not a local activity: code that runs
    on a local activity's result may run in a later workflow task than the one that recorded
    the result, while a replay runs it in the same one, so what it decides (a patch, a
    ``workflow.now()``) can differ on replay.

    Args:
        task: the session's task (tenant, priority).
        granted: whether the session's ``tenant_slot_granted`` signal has arrived.
        timings: the session's phase timings.
        quota: what the task found (:func:`has_quota`) when it started the session; False
            asks nothing; None (a replacement, a session started by a client) asks.

    Returns:
        Seconds waited while a slot is now held (release it with :func:`release_slot`);
        None when the tenant has no quota.

    Raises:
        temporalio.exceptions.ApplicationError: the signal failed for another reason than
            a missing tenant workflow.
    """
    if quota is False:
        return None
    t0 = workflow.now()
    try:
        await signals.send(
            tenant_workflow_id(task.tenant),
            ACQUIRE_SIGNAL,
            TenantSlotRequest(workflow_id=workflow.info().workflow_id, priority=task.priority),
        )
    except ApplicationError as e:
        if e.type == EXTERNAL_NOT_FOUND:
            return None  # no quota workflow: the tenant has no quota
        raise
    except asyncio.CancelledError:
        await release_slot(task)  # the request may have landed: withdraw it
        raise
    try:
        await workflow.wait_condition(granted)
    except asyncio.CancelledError:
        await release_slot(task)
        raise
    t1 = workflow.now()
    waited = (t1 - t0).total_seconds()
    timings.append(PhaseTiming(phase="tenant_wait", duration_s=waited, started_at=t0, ended_at=t1))
    return waited


async def release_slot(task: TaskRequest) -> None:
    """From a session workflow: give its tenant slot back (or withdraw its request); a tenant
    workflow that is gone is not an error of the session."""
    try:
        await signals.send(
            tenant_workflow_id(task.tenant), RELEASE_SIGNAL, workflow.info().workflow_id
        )
    except Exception as e:  # noqa: BLE001 - boundary: the tenant workflow may be gone
        workflow.logger.warning("could not release the slot of tenant %s: %s", task.tenant, e)


class TenantInput(Payload):
    """The tenant workflow's state, carried over a continue-as-new."""

    state: TenantState
    max_history_events: int = Field(default=MAX_HISTORY_EVENTS, ge=10)
    check_holders_s: float = Field(
        default=CHECK_HOLDERS_S,
        gt=0,
        description="seconds between two checks that the holders still run, while requests "
        "wait on a full quota",
    )


@workflow.defn
class TenantWorkflow:
    """One tenant's quota of sessions in flight; see the module docstring."""

    @workflow.init
    def __init__(self, input: TenantInput) -> None:
        self._state = input.state.model_copy(deep=True)

    @workflow.run
    async def run(self, input: TenantInput) -> None:
        """Grant slots while the quota allows, until the history is long; then continue as
        new with the holders and the waiting requests. While requests wait on a full quota,
        the holders are checked every ``input.check_holders_s`` (a durable timer)."""
        while True:
            blocked = self._blocked()
            with contextlib.suppress(asyncio.TimeoutError):
                # a request that starts waiting on a full quota wakes this wait, to arm the timer
                await workflow.wait_condition(
                    lambda: (
                        self._grantable()
                        or self._continue_as_new_due(input)
                        or self._blocked() != blocked  # noqa: B023 - awaited in this iteration
                    ),
                    timeout=timedelta(seconds=input.check_holders_s) if blocked else None,
                )
            if blocked and self._blocked() and not self._continue_as_new_due(input):
                await self._reap_holders()
            while self._grantable():
                request = self._state.waiting.pop(0)
                self._state.holders.append(request.workflow_id)
                self._state.num_granted += 1
                try:
                    await workflow.get_external_workflow_handle(request.workflow_id).signal(
                        GRANTED_SIGNAL
                    )
                except Exception as e:  # noqa: BLE001 - boundary: the session may be gone
                    workflow.logger.warning(
                        "session %s gone before its grant: %s", request.workflow_id, e
                    )
                    self._release(request.workflow_id)
            if self._continue_as_new_due(input):
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(
                    TenantInput(
                        state=self._state,
                        max_history_events=input.max_history_events,
                        check_holders_s=input.check_holders_s,
                    )
                )

    @staticmethod
    def _continue_as_new_due(input: TenantInput) -> bool:
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() > input.max_history_events
        )

    async def _reap_holders(self) -> None:
        """Free the slots of holders that no longer run (ended without a ``release``)."""
        try:
            # an activity, not a local one: what follows a local activity's result may run in
            # another workflow task on replay than it did first (a nondeterminism error)
            closed: list[str] = await workflow.execute_activity(
                CLOSED_WORKFLOWS,
                list(self._state.holders),
                task_queue=task_queues.EVAL,
                schedule_to_close_timeout=CHECK_HOLDERS_TIMEOUT,
                retry_policy=RetryPolicy(maximum_attempts=2),
                result_type=list[str],
            )
        except ActivityError as e:
            workflow.logger.warning("holders of tenant %s not checked: %s", self._state.tenant, e)
            return
        for workflow_id in closed:
            workflow.logger.warning(
                "session %s ended without releasing its slot of tenant %s: freed",
                workflow_id,
                self._state.tenant,
            )
            self._release(workflow_id)
        self._state.num_reaped += len(closed)

    def _blocked(self) -> bool:
        """Requests wait while the quota is full."""
        return bool(self._state.waiting) and bool(self._state.holders) and not self._grantable()

    def _grantable(self) -> bool:
        limit = self._state.quota.max_sessions_in_flight
        return bool(self._state.waiting) and (limit is None or len(self._state.holders) < limit)

    @workflow.signal(name=ACQUIRE_SIGNAL)
    def acquire(self, request: TenantSlotRequest) -> None:
        """A session asks for a slot; a request repeated by a retried activity counts once."""
        if request.workflow_id in self._state.holders or any(
            w.workflow_id == request.workflow_id for w in self._state.waiting
        ):
            return
        # stable: by priority key (1 first), then arrival
        at = next(
            (i for i, w in enumerate(self._state.waiting) if w.priority > request.priority),
            len(self._state.waiting),
        )
        self._state.waiting.insert(at, request)

    @workflow.signal(name=RELEASE_SIGNAL)
    def release(self, workflow_id: str) -> None:
        """A session ended (or stopped waiting): its slot or its request is freed."""
        self._release(workflow_id)

    def _release(self, workflow_id: str) -> None:
        if workflow_id in self._state.holders:
            self._state.holders.remove(workflow_id)
        self._state.waiting = [w for w in self._state.waiting if w.workflow_id != workflow_id]

    @workflow.update(name=SET_QUOTA_UPDATE)
    def set_quota(self, quota: TenantQuota) -> TenantState:
        """Set the tenant's quota; slots already granted are kept (a lower quota takes effect
        as sessions end)."""
        self._state.quota = quota
        return self._state

    @workflow.query(name=STATE_QUERY)
    def state(self) -> TenantState:
        """The quota, the holders and the waiting requests."""
        return self._state
