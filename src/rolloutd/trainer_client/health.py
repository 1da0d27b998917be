"""Fleet health for callers that wait: a dead fleet becomes a typed error within a minute,
not an empty wait.

A worker fleet is dead when no worker has polled its task queue for :data:`DEAD_AFTER_S`
(Temporal's DescribeTaskQueue: each poller with the time its last poll began; a fleet with
pollers and a backlog is busy, never dead). That time is when a long poll began, and an idle
worker's long poll lasts up to about a minute (measured on the dev server: ages reach 56 s
before the next poll), so the limit is 70 s, not 60 s: an idle live fleet is never dead. The engine
is dead when the gateway's ``/health``
says no healthy backend serves a policy version (a backend that refuses connections or times
out; a paused one is not dead) for :data:`ENGINE_DEAD_AFTER_S`. :func:`watch` waits for
something and checks the fleets every ``every_s`` while it waits; the first dead fleet
raises :class:`~rolloutd.errors.FleetUnavailableError`. Nothing is cancelled on the server:
the workflows keep running and complete once the fleet is back.
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
from temporalio.client import Client
from temporalio.service import RPCError

from rolloutd import task_queues
from rolloutd.errors import FleetUnavailableError
from rolloutd.http_client import HEALTH_PROBE, new_async_client

log = structlog.get_logger(__name__)

T = TypeVar("T")

#: a worker fleet is dead when no poll has begun on its queue for this long, seconds (an idle
#: worker's long poll lasts up to ~60 s: a shorter limit would call idle fleets dead)
DEAD_AFTER_S = 70.0
#: the engine is dead when no healthy backend has served a policy version for this long, s
ENGINE_DEAD_AFTER_S = 10.0
#: seconds between two checks while a caller waits
CHECK_EVERY_S = 10.0


class FleetHealth:
    """Checks the fleets a submitted task needs.

    Args:
        client: the Temporal client (its namespace is the one checked).
        gateway_url: the gateway's base URL, whose ``/health`` reports the backend pool;
            None skips the engine check.
        dead_after_s: a worker fleet's limit without a poller, seconds.
        engine_dead_after_s: the engine's limit without a healthy backend, seconds.
        transport: httpx transport for ``/health`` (tests).
        fleets: the worker fleets checked (default all four of
            :data:`rolloutd.task_queues.FLEET_QUEUES`).
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
    ) -> None:
        self.client = client
        self.queues = {
            fleet: queue
            for fleet, queue in task_queues.FLEET_QUEUES.items()
            if fleets is None or fleet in fleets
        }
        self.gateway_url = gateway_url.rstrip("/") if gateway_url else None
        self.dead_after_s = dead_after_s
        self.engine_dead_after_s = engine_dead_after_s
        self.transport = transport
        #: queue -> monotonic time this checker first found no poller listed on it (Temporal
        #: lists a stopped poller for a few minutes; one never seen counts from then)
        self._unlisted_since: dict[str, float] = {}

    async def check(self) -> None:
        """Raise for the first dead fleet; return when every fleet is alive (or could not be
        asked: an unanswered question is not a death).

        Raises:
            FleetUnavailableError: a fleet is dead (``fleet`` names it).
        """
        for fleet, queue in self.queues.items():
            age = await self._last_poll_s_ago(queue, workflow=fleet == "workflows")
            if age is False:
                continue
            if age is None:
                first = self._unlisted_since.setdefault(queue, time.monotonic())
                if time.monotonic() - first < self.dead_after_s:
                    continue
            else:
                self._unlisted_since.pop(queue, None)
            if age is None or age >= self.dead_after_s:
                seen = "no worker polls it" if age is None else f"its last poll was {age:.0f} s ago"
                raise FleetUnavailableError(
                    fleet,
                    f"no worker has polled task queue {queue!r} for "
                    f"{self.dead_after_s:g} s ({seen})",
                    unavailable_s=age,
                )
        await self._check_engine()

    async def _last_poll_s_ago(self, queue: str, *, workflow: bool) -> float | None | bool:
        """Seconds since the last poll of ``queue`` (None: no poller listed; False: Temporal
        did not answer)."""
        kind = (
            TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW
            if workflow
            else TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY
        )
        try:
            described = await self.client.workflow_service.describe_task_queue(
                DescribeTaskQueueRequest(
                    namespace=self.client.namespace,
                    task_queue_type=kind,
                    task_queue=TaskQueue(name=queue, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL),
                ),
                timeout=timedelta(seconds=5),
            )
        except RPCError as e:
            log.debug("fleet_health_not_read", task_queue=queue, error=str(e))
            return False
        now = datetime.now(UTC)
        ages = [
            max(0.0, (now - p.last_access_time.ToDatetime(UTC)).total_seconds())
            for p in described.pollers
            if p.HasField("last_access_time")
        ]
        return min(ages) if ages else None

    async def _check_engine(self) -> None:
        if self.gateway_url is None:
            return
        try:
            async with new_async_client(HEALTH_PROBE, transport=self.transport) as http:
                health: dict[str, Any] = (await http.get(f"{self.gateway_url}/health")).json()
        except (httpx.HTTPError, ValueError) as e:
            # an unanswering gateway is the gateway fleet's matter (its pollers say)
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
