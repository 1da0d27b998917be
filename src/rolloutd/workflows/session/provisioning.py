"""Provisioning that gives up when no sandbox worker polls (``phases.provision_wait_s``):
a dead fleet is told from a busy one by Temporal's pollers, not by time in the queue.
Workflow code: deterministic, no I/O."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import Priority, RetryPolicy
from temporalio.exceptions import ActivityError
from temporalio.exceptions import CancelledError as TemporalCancelledError

with workflow.unsafe.imports_passed_through():
    from rolloutd import task_queues
    from rolloutd.activities.models import (
        ProvisionRuntimeInput,
        ProvisionRuntimeOutput,
        TaskQueuePollersInput,
        TaskQueuePollersOutput,
    )
    from rolloutd.errors import NoSandboxWorkerError
    from rolloutd.workflows.session.failures import cause_text
    from rolloutd.workflows.session.policies import HEARTBEAT, INFRA_RETRY

#: how often a provisioning still in the queue asks whether a sandbox worker polls (at most;
#: a third of ``provision_wait_s`` when that is shorter, at least 1 s)
POLLER_CHECK_EVERY_S = 10.0
#: the poller check (a local activity: two Temporal RPCs)
POLLER_CHECK_TIMEOUT = timedelta(seconds=10)
POLLER_CHECK_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3)


async def provision_watched(
    input: ProvisionRuntimeInput,
    provision_s: float,
    wait_s: float,
    attempt: int,
    *,
    priority: Priority = Priority.default,
) -> ProvisionRuntimeOutput:
    """Provision a runtime, giving up when no sandbox worker picks it up: while the
    activity waits in the sandbox queue, a local activity asks Temporal every few seconds
    which pollers it saw there (DescribeTaskQueue); when none has polled for ``wait_s``,
    the activity is cancelled. A fleet that polls but is busy (a backlog) is waited for:
    it is saturated, not dead. Once a host picked the activity up, its own timeouts
    (start-to-close, heartbeat) govern.

    Args:
        input: the provisioning.
        provision_s: the activity's start-to-close timeout, seconds.
        wait_s: ``phases.provision_wait_s``.
        attempt: the session's attempt (names the activity, so the check finds it).
        priority: the task's Temporal priority (:func:`rolloutd.workflows.tenants.task_priority`).

    Raises:
        NoSandboxWorkerError: no sandbox worker polled for ``wait_s``.
        ActivityError: the provisioning failed, as without the check.
    """
    activity_id = f"provision-{attempt}"
    handle = workflow.start_activity(
        "provision_runtime",
        input,
        task_queue=task_queues.SANDBOX,
        start_to_close_timeout=timedelta(seconds=provision_s),
        heartbeat_timeout=HEARTBEAT,
        retry_policy=INFRA_RETRY,
        result_type=ProvisionRuntimeOutput,
        activity_id=activity_id,
        priority=priority,
    )
    every = max(1.0, min(POLLER_CHECK_EVERY_S, wait_s / 3))
    last_seen = workflow.now()  # the wait starts now: "not seen for wait_s" from here
    try:
        while True:
            try:
                await workflow.wait_condition(handle.done, timeout=every)
            except TimeoutError:
                pass
            if handle.done():
                return await handle
            try:
                pollers: TaskQueuePollersOutput = await workflow.execute_local_activity(
                    "task_queue_pollers",
                    TaskQueuePollersInput(task_queue=task_queues.SANDBOX, activity_id=activity_id),
                    start_to_close_timeout=POLLER_CHECK_TIMEOUT,
                    retry_policy=POLLER_CHECK_RETRY,
                    result_type=TaskQueuePollersOutput,
                )
            except ActivityError as e:
                if isinstance(e.cause, TemporalCancelledError):
                    raise asyncio.CancelledError() from e
                # no evidence either way: keep waiting; a failed check fails no session
                workflow.logger.warning("sandbox poller check failed: %s", cause_text(e))
                continue
            if pollers.picked_up:
                return await handle
            now = workflow.now()
            if pollers.last_poll_s_ago is not None:
                last_seen = max(last_seen, now - timedelta(seconds=pollers.last_poll_s_ago))
            if (now - last_seen).total_seconds() >= wait_s:
                handle.cancel()
                raise NoSandboxWorkerError(
                    f"no sandbox worker is polling task queue {task_queues.SANDBOX} "
                    f"(checked for {wait_s:g} s)"
                )
    except asyncio.CancelledError:
        # the session was cancelled while the provisioning waited: cancel it too, as
        # awaiting it directly would
        handle.cancel()
        raise
