"""Fleet health for callers that wait: a dead fleet becomes a typed error within a minute,
not an empty wait.

Liveness has one rule, :func:`rolloutd.capabilities.fleet_liveness`: a worker fleet is alive
while one of its processes beat in the fleet registry within ``dead_after_s`` (45 s). Every
process beats from a task of its own that needs no free slot, so a saturated fleet (a sandbox
host whose runtimes are all taken, which polls no queue) is alive. The workflows fleet is the
one that answers the registry's query; when the registry does not answer (a workflows worker
buried in workflow tasks answers late), that fleet counts as alive while its workflow task
queue was polled within ``dead_after_s`` (workflow task slots turn over in milliseconds, so a
busy worker still polls): it is dead when the registry has not answered and no worker polled
its queue for ``dead_after_s``. No other fleet's queue polls are asked. A
fleet no process of which was ever seen counts from when this checker first looked (a stack
that is just starting). The engine is dead when the gateway's ``/health`` says no healthy
backend serves a policy version (a backend that refuses connections or times out; a paused
one is not dead) for :data:`ENGINE_DEAD_AFTER_S`.

:func:`watch` waits for something and checks the fleets every ``every_s`` while it waits; the
first dead fleet raises :class:`~rolloutd.errors.FleetUnavailableError`. Nothing is cancelled
on the server: the workflows keep running and complete once the fleet is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import httpx
import structlog
from temporalio.api.enums.v1 import TaskQueueKind, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.service import RPCError, RPCStatusCode

from rolloutd import task_queues
from rolloutd.capabilities import (
    CAPABILITIES_QUERY,
    DEAD_AFTER_S,
    REGISTRY_WORKFLOW_ID,
    FleetCapabilities,
    FleetLiveness,
    fleet_liveness,
)
from rolloutd.errors import FleetUnavailableError
from rolloutd.http_client import HEALTH_PROBE, new_async_client

log = structlog.get_logger(__name__)

T = TypeVar("T")

#: the engine is dead when no healthy backend has served a policy version for this long, s
ENGINE_DEAD_AFTER_S = 10.0
#: seconds between two checks while a caller waits
CHECK_EVERY_S = 10.0
#: one ask of the registry (or of Temporal about the workflows queue), seconds
QUERY_TIMEOUT = timedelta(seconds=10)
#: RPC statuses that mean Temporal itself did not answer: no evidence about the fleets
_UNREACHABLE = (RPCStatusCode.UNAVAILABLE, RPCStatusCode.UNAUTHENTICATED)


class FleetHealth:
    """Checks the fleets a submitted task needs.

    Args:
        client: the Temporal client (its namespace is the one checked).
        gateway_url: the gateway's base URL, whose ``/health`` reports the backend pool;
            None skips the engine check.
        dead_after_s: a worker fleet's limit without a heartbeat, seconds.
        engine_dead_after_s: the engine's limit without a healthy backend, seconds.
        transport: httpx transport for ``/health`` (tests).
        fleets: the worker fleets checked (default all four of
            :data:`rolloutd.task_queues.FLEET_QUEUES`).
        registry_id: the fleet registry's workflow id.
    """

    def __init__(
        self,
        client: Client,
        gateway_url: str | None = None,
        *,
        dead_after_s: float = DEAD_AFTER_S,
        engine_dead_after_s: float = ENGINE_DEAD_AFTER_S,
        transport: httpx.AsyncBaseTransport | None = None,
        fleets: list[str] | None = None,
        registry_id: str = REGISTRY_WORKFLOW_ID,
    ) -> None:
        self.client = client
        self.fleets = [f for f in task_queues.FLEET_QUEUES if fleets is None or f in fleets]
        self.gateway_url = gateway_url.rstrip("/") if gateway_url else None
        self.dead_after_s = dead_after_s
        self.engine_dead_after_s = engine_dead_after_s
        self.transport = transport
        self.registry_id = registry_id
        #: fleet -> monotonic time this checker first found it never seen (a stack starting)
        self._unseen_since: dict[str, float] = {}
        #: monotonic time the registry first did not answer (None: it answers)
        self._unanswered_since: float | None = None

    async def registry(self) -> FleetCapabilities | None:
        """The registry's answer: its processes and each fleet's latest beat; an empty
        answer when no registry runs (no process ever started); None when it did not
        answer (no workflows worker, or Temporal unreachable)."""
        try:
            return await self.client.get_workflow_handle(self.registry_id).query(
                CAPABILITIES_QUERY, result_type=FleetCapabilities, rpc_timeout=QUERY_TIMEOUT
            )
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                return FleetCapabilities()
            if e.status in _UNREACHABLE:
                log.debug("fleet_registry_unreachable", error=str(e))
                self._unanswered_since = None  # Temporal's own silence says nothing
                raise
            log.debug("fleet_registry_unanswered", error=str(e))
            return None
        except WorkflowQueryFailedError as e:
            log.debug("fleet_registry_failed", error=str(e))
            return None

    async def liveness(self) -> dict[str, FleetLiveness]:
        """Each checked fleet's liveness now (:func:`rolloutd.capabilities.fleet_liveness`),
        with this checker's grace for a fleet never seen and for a registry that does not
        answer. An empty dict when Temporal itself did not answer.
        """
        try:
            caps = await self.registry()
        except RPCError:
            return {}
        now = datetime.now(UTC)
        out: dict[str, FleetLiveness] = {}
        if caps is None:
            first = self._unanswered_since = self._unanswered_since or time.monotonic()
            silent_s = time.monotonic() - first
            if "workflows" in self.fleets:
                # a workflows worker buried in workflow tasks (1,024 sessions starting) answers
                # a query late: it is busy, not dead, while it still takes workflow tasks
                # (their slots turn over in milliseconds, so its pollers keep polling)
                polled_s = await self._workflow_poll_s_ago()
                alive = silent_s < self.dead_after_s or (
                    polled_s is not None and polled_s < self.dead_after_s
                )
                out["workflows"] = FleetLiveness(
                    fleet="workflows",
                    alive=alive,
                    num_processes=0,
                    last_heartbeat_s_ago=silent_s if polled_s is None else min(silent_s, polled_s),
                )
            return out
        self._unanswered_since = None
        for fleet in self.fleets:
            liveness = fleet_liveness(caps, fleet, now, dead_after_s=self.dead_after_s)
            if fleet == "workflows" and not liveness.alive:
                # the registry answered: a workflows worker runs it
                liveness = liveness.model_copy(update={"alive": True})
            if liveness.last_heartbeat_s_ago is None:
                first = self._unseen_since.setdefault(fleet, time.monotonic())
                if time.monotonic() - first < self.dead_after_s:
                    liveness = liveness.model_copy(update={"alive": True})
            else:
                self._unseen_since.pop(fleet, None)
            out[fleet] = liveness
        return out

    async def _workflow_poll_s_ago(self) -> float | None:
        """Seconds since a worker last polled the workflows fleet's workflow task queue
        (Temporal's DescribeTaskQueue); None when none is listed or Temporal did not answer.
        Asked only when the fleet registry, which the workflows fleet runs, does not answer."""
        try:
            described = await self.client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(
                    namespace=self.client.namespace,
                    task_queue=TaskQueue(
                        name=task_queues.WORKFLOWS, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL
                    ),
                    task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
                ),
                timeout=QUERY_TIMEOUT,
            )
        except RPCError as e:
            log.debug("workflow_pollers_not_read", error=str(e))
            return None
        now = datetime.now(UTC)
        ages = [
            max(0.0, (now - p.last_access_time.ToDatetime(UTC)).total_seconds())
            for p in described.pollers
            if p.HasField("last_access_time")
        ]
        return min(ages) if ages else None

    async def check(self) -> None:
        """Raise for the first dead fleet; return when every fleet is alive (or could not be
        asked: an unanswered question is not a death).

        Raises:
            FleetUnavailableError: a fleet is dead (``fleet`` names it).
        """
        for fleet, liveness in (await self.liveness()).items():
            if liveness.alive:
                continue
            if fleet == "workflows":
                message = (
                    f"the fleet registry has not answered for {self.dead_after_s:g} s: "
                    "no workflows worker runs"
                )
            else:
                message = liveness.describe(self.dead_after_s)
            raise FleetUnavailableError(fleet, message, unavailable_s=liveness.last_heartbeat_s_ago)
        await self._check_engine()

    async def _check_engine(self) -> None:
        if self.gateway_url is None:
            return
        try:
            async with new_async_client(HEALTH_PROBE, transport=self.transport) as http:
                health: dict[str, Any] = (await http.get(f"{self.gateway_url}/health")).json()
        except (httpx.HTTPError, ValueError) as e:
            # an unanswering gateway is the gateway fleet's matter (its heartbeats say)
            log.debug("engine_health_not_read", error=repr(e))
            return
        pool = health.get("backend_health") or {}
        for entry in pool.get("unavailable") or []:
            unhealthy_s = entry.get("unhealthy_s") or 0.0
            if unhealthy_s >= self.engine_dead_after_s:
                raise FleetUnavailableError(
                    "engine", str(entry.get("message")), unavailable_s=unhealthy_s
                )


async def watch(
    awaitable: Awaitable[T], health: FleetHealth | None, every_s: float = CHECK_EVERY_S
) -> T:
    """Wait for ``awaitable``, checking the fleets every ``every_s`` meanwhile.

    Raises:
        FleetUnavailableError: a fleet died while waiting (the wait is given up; what was
            awaited keeps running on the server).
    """
    if health is None:
        return await awaitable
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=every_s)
            if done:
                return task.result()
            await health.check()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
