"""``task_queue_pollers``: whether a fleet is polling a task queue, and whether a scheduled
activity was picked up (a local activity of the workflow worker, which stays up when other
fleets die).

A fleet is dead when no poller has been seen on its task queue for a while; a fleet with
pollers and a backlog is saturated, never dead. Both come from Temporal's DescribeTaskQueue
(the pollers of the last few minutes, each with the time of its last poll):
https://docs.temporal.io/references/commands#describe-task-queue .
"""

from __future__ import annotations

from datetime import UTC, datetime

import structlog
from temporalio import activity
from temporalio.api.enums.v1 import PendingActivityState, TaskQueueKind, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.service import RPCError

from rolloutd import task_queues
from rolloutd.activities.models import (
    CapacityInput,
    SandboxCapacityOutput,
    TaskQueuePollersInput,
    TaskQueuePollersOutput,
)
from rolloutd.capabilities import CAPABILITIES_QUERY, REGISTRY_WORKFLOW_ID, FleetCapabilities
from rolloutd.task_queues import host_queue

log = structlog.get_logger(__name__)

#: a shared sandbox queue whose last poll is older than this: ask the hosts' own queues too
FULL_HOST_S = 1.0
#: the longest a worker's poll waits on an empty queue before it polls again (the server's
#: ``matching.longPollExpirationInterval``, 1 min, and a margin)
LONG_POLL_S = 70.0


class FleetHealthActivities:
    """Activities that ask Temporal about the fleets.

    Args:
        client: the workflow worker's Temporal client (its namespace is the one asked about).
    """

    def __init__(self, client: Client) -> None:
        self.client = client

    @activity.defn(name="task_queue_pollers")
    async def task_queue_pollers(self, input: TaskQueuePollersInput) -> TaskQueuePollersOutput:
        """The activity pollers of ``input.task_queue`` and, when ``input.activity_id`` is
        given, whether that activity of the calling workflow has left the queue (started,
        or no longer pending).

        Raises:
            temporalio.service.RPCError: Temporal did not answer (the local activity's retry
                policy governs).
        """
        ages = await self._poll_ages(input.task_queue)
        if input.task_queue == task_queues.SANDBOX and (not ages or min(ages) > FULL_HOST_S):
            # a full host does not poll the shared queue (its provisioning slots wait for
            # room: rolloutd.workers.capacity) but still polls its own: saturated, not dead
            # a poll waits on an idle queue for up to a long poll (DescribeTaskQueue shows
            # when it started): a host queue polled within one is polled still
            for host_id in await self._sandbox_hosts():
                ages += [
                    max(0.0, age - LONG_POLL_S)
                    for age in await self._poll_ages(host_queue("sandbox", host_id))
                ]
        picked_up = False
        if input.activity_id:
            info = activity.info()
            description = await self.client.get_workflow_handle(
                info.workflow_id, run_id=info.workflow_run_id
            ).describe()
            pending = {
                a.activity_id: a.state for a in description.raw_description.pending_activities
            }
            picked_up = (
                pending.get(input.activity_id)
                != PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED
            )
        out = TaskQueuePollersOutput(
            num_pollers=len(ages), last_poll_s_ago=min(ages) if ages else None, picked_up=picked_up
        )
        log.debug(
            "task_queue_pollers",
            task_queue=input.task_queue,
            num_pollers=out.num_pollers,
            last_poll_s_ago=out.last_poll_s_ago,
            picked_up=picked_up,
        )
        return out

    @activity.defn(name="sandbox_capacity")
    async def sandbox_capacity(self, input: CapacityInput) -> SandboxCapacityOutput:
        """The sandbox hosts' ``max_concurrent_sessions`` summed, from the fleet registry
        (one per host id: its latest registration)."""
        try:
            registered = await self.client.get_workflow_handle(REGISTRY_WORKFLOW_ID).query(
                CAPABILITIES_QUERY, result_type=FleetCapabilities
            )
        except (RPCError, WorkflowQueryFailedError) as e:
            log.warning("fleet_registry_unanswered", error=str(e))
            return SandboxCapacityOutput()
        limits = {
            h.host_id: h.max_concurrent_sessions
            for h in registered.hosts
            if h.fleet == "sandbox" and h.max_concurrent_sessions is not None
        }
        return SandboxCapacityOutput(
            max_sessions=sum(limits.values()) if limits else None, num_hosts=len(limits)
        )

    async def _poll_ages(self, task_queue: str) -> list[float]:
        """Seconds since each activity poller of ``task_queue`` last polled."""
        described = await self.client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=self.client.namespace,
                task_queue=TaskQueue(name=task_queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
            )
        )
        now = datetime.now(UTC)
        return [
            max(0.0, (now - p.last_access_time.ToDatetime(UTC)).total_seconds())
            for p in described.pollers
            if p.HasField("last_access_time")
        ]

    async def _sandbox_hosts(self) -> list[str]:
        """Host ids of the sandbox hosts in the fleet registry (none when it does not
        answer: then only the shared queue's pollers count)."""
        try:
            registered = await self.client.get_workflow_handle(REGISTRY_WORKFLOW_ID).query(
                CAPABILITIES_QUERY, result_type=FleetCapabilities
            )
        except (RPCError, WorkflowQueryFailedError) as e:
            log.warning("fleet_registry_unanswered", error=str(e))
            return []
        return sorted({h.host_id for h in registered.hosts if h.fleet == "sandbox"})
