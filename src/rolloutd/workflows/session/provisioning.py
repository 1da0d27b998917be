"""Provisioning: the session waits for a sandbox host in the sandbox fleet's task queue, with a
deadline, in order, and records no event while it waits. Workflow code: deterministic, no I/O.

The wait is the queue (docs/decisions.md, "Dead versus saturated"): a host takes a
provisioning only while it has room (its slot supplier, :class:`rolloutd.workers.capacity.
RuntimeSlots`), so waiting sessions are a backlog that Temporal orders by priority and
fairness, and ``phases.capacity_wait_s`` is the activity's schedule-to-start deadline. A
saturated fleet is waited for however long; a dead one is told from the fleet registry's
heartbeats: a provisioning still waiting after :data:`WATCH_AFTER` of ``wait_s`` asks the
registry to signal it once the sandbox fleet has been dead (no process beating) for
``phases.provision_wait_s`` since the wait began (:mod:`rolloutd.workflows.fleet_watch`); it
is then cancelled and the session fails with ``NoSandboxWorkerError``. A provisioning that
ends after its session was cancelled has its runtime torn down.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import Priority
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from rolloutd import task_queues
    from rolloutd.activities.models import (
        ProvisionRuntimeInput,
        ProvisionRuntimeOutput,
        TeardownRuntimeInput,
    )
    from rolloutd.activities.names import PROVISION_RUNTIME, TEARDOWN_RUNTIME
    from rolloutd.errors import NoSandboxWorkerError
    from rolloutd.workflows.fleet_watch import FleetStates, unwatch_fleet, watch_fleet
    from rolloutd.workflows.session.failures import cause_text
    from rolloutd.workflows.session.policies import HEARTBEAT, INFRA_RETRY, LOST_HOST_TEARDOWN

#: a provisioning not done after this share of ``provision_wait_s`` watches the sandbox
#: fleet. The registry tells a watch at the same moment whenever it was placed before then
#: (``since`` is the wait's start: :func:`rolloutd.capabilities.dead_watch_due`), so a late
#: watch costs no detection time, and a session that waits a few seconds for a free slot of
#: a saturated fleet asks the registry nothing (two signals and their four events fewer)
WATCH_AFTER = 0.5


async def provision_waiting(
    input: ProvisionRuntimeInput,
    *,
    provision_s: float,
    wait_s: float,
    queue_wait_s: float,
    attempt: int,
    states: FleetStates,
    priority: Priority = Priority.default,
) -> ProvisionRuntimeOutput:
    """Provision a runtime: wait in the sandbox queue for a host with room (at most
    ``queue_wait_s``), giving up once the sandbox fleet has been dead for ``wait_s``.

    Args:
        input: the provisioning.
        provision_s: the activity's start-to-close timeout, seconds.
        wait_s: ``phases.provision_wait_s``: how long the fleet may be dead.
        queue_wait_s: ``phases.capacity_wait_s``: the wait's deadline in the queue.
        attempt: the session's attempt (names the activity and the watch).
        states: where the session's ``fleet_state`` signals land.
        priority: the task's Temporal priority (:func:`rolloutd.workflows.tenants.task_priority`).

    Raises:
        NoSandboxWorkerError: the sandbox fleet was dead for ``wait_s``.
        ActivityError: the provisioning failed, or no host took it within ``queue_wait_s``
            (a schedule-to-start timeout), as without the watch.
        asyncio.CancelledError: the session was cancelled (a runtime provisioned meanwhile is
            torn down first).
    """
    tag = f"provision-{attempt}"
    started = workflow.now()
    handle = workflow.start_activity(
        PROVISION_RUNTIME,
        input,
        task_queue=task_queues.SANDBOX,
        schedule_to_start_timeout=timedelta(seconds=queue_wait_s),
        start_to_close_timeout=timedelta(seconds=provision_s),
        heartbeat_timeout=HEARTBEAT,
        retry_policy=INFRA_RETRY,
        result_type=ProvisionRuntimeOutput,
        activity_id=tag,
        priority=priority,
        # a cancelled provisioning is awaited to its end: a runtime made meanwhile is torn down
        cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
    )
    watching = False
    try:
        try:
            await workflow.wait_condition(handle.done, timeout=wait_s * WATCH_AFTER)
        except TimeoutError:
            pass
        if not handle.done():
            watching = await watch_fleet("sandbox", "dead", tag=tag, after_s=wait_s, since=started)
            if watching:
                await workflow.wait_condition(lambda: handle.done() or states.told(tag))
            else:
                # no registry: no worker process of any fleet runs here; the fleet gets
                # wait_s from the start to show up
                left = wait_s - (workflow.now() - started).total_seconds()
                try:
                    await workflow.wait_condition(handle.done, timeout=max(0.001, left))
                except TimeoutError:
                    pass
        if not handle.done():
            told = states.by_tag.get(tag)
            handle.cancel()
            try:
                return await handle  # it ended before the cancel reached it
            except ActivityError:
                pass
            why = told.message if told is not None else "no sandbox worker process has started"
            raise NoSandboxWorkerError(
                f"no sandbox worker is alive to take the provisioning "
                f"(waited {wait_s:g} s for one): {why}"
            )
        return await handle
    except asyncio.CancelledError:
        handle.cancel()
        await _tear_down_late(handle)
        raise
    finally:
        if watching and tag not in states.by_tag:
            await unwatch_fleet(tag)


async def _tear_down_late(handle: workflow.ActivityHandle[ProvisionRuntimeOutput]) -> None:
    """The session was cancelled while its provisioning ran: wait for the provisioning to
    end (its cancellation waits for the host's answer) and tear down a runtime it made."""
    try:
        runtime = await handle
    except (ActivityError, asyncio.CancelledError):
        return
    workflow.logger.info("tearing down %s, provisioned after a cancel", runtime.runtime_id)
    try:
        await workflow.execute_activity(
            TEARDOWN_RUNTIME,
            TeardownRuntimeInput(runtime_id=runtime.runtime_id),
            task_queue=runtime.host_queue,
            start_to_close_timeout=LOST_HOST_TEARDOWN,
            schedule_to_close_timeout=3 * LOST_HOST_TEARDOWN,
            heartbeat_timeout=HEARTBEAT,
            retry_policy=INFRA_RETRY,
        )
    except ActivityError as e:
        workflow.logger.warning(
            "late runtime %s left to the host's reclaim: %s", runtime.runtime_id, cause_text(e)
        )
