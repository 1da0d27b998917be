"""Backpressure as task queues bounded by slot suppliers (docs/tenancy.md; docs/decisions.md,
"Dead versus saturated"): sessions waiting for capacity wait in a Temporal task queue, ordered
by priority and fairness, never in a loop of workflow code.

:class:`SessionSlots`: a gateway host admits a session's first open only while its backend pool
takes one more open session (``max_sessions_per_slot`` x slots).

:class:`RuntimeSlots`: a sandbox host's ``max_concurrent_sessions`` bounds its live runtimes, so
its running harnesses.

The host's provisioning worker (queue ``rolloutd-sandbox``) takes its activity slots from a
:class:`RuntimeSlots` supplier whose ``reserve_slot`` waits while the host's live runtimes plus
the slots already reserved reach the limit. A slot is reserved before the worker polls, so a
full host does not take new provisioning: the sessions wait in the fleet's task queue, ordered
by Temporal's priority and fairness, and no phase budget or session deadline ticks for them.
A runtime counts from its provisioning until its teardown (:meth:`RuntimeSlots.notify` is
called then), so a harness runs only on a runtime that holds a place.

:func:`size_pool_forever`: a host's warm pool is sized from the same queue's backlog, the
sessions waiting for a host (:meth:`rolloutd.sandbox.warm_pool.WarmPool.set_waiting`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

import structlog
from temporalio.api.enums.v1 import TaskQueueKind, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client
from temporalio.service import RPCError
from temporalio.worker import (
    CustomSlotSupplier,
    SlotMarkUsedContext,
    SlotPermit,
    SlotReleaseContext,
    SlotReserveContext,
)

from rolloutd import task_queues
from rolloutd.sandbox.warm_pool import WarmPool

log = structlog.get_logger(__name__)


class RuntimeSlots(CustomSlotSupplier):
    """Activity slots of a sandbox host's provisioning worker, bounded by its live runtimes.

    Invariant: ``reserved + live_runtimes() <= limit`` and ``reserved <= max_reserved``
    whenever a slot is handed out (a provisioning that finished counts twice for a moment,
    which only delays the next one).

    Args:
        limit: ``SandboxSettings.max_concurrent_sessions``, >= 1.
        live_runtimes: the number of runtimes the host holds now (provisioned, not torn down).
        max_reserved: provisionings at once (``SandboxSettings.max_concurrent_provisions``);
            None: ``limit``.

    Raises:
        ValueError: a bound below 1.
    """

    def __init__(
        self, limit: int, live_runtimes: Callable[[], int], max_reserved: int | None = None
    ) -> None:
        if limit < 1 or (max_reserved is not None and max_reserved < 1):
            raise ValueError(f"limit and max_reserved must be >= 1, not {limit}, {max_reserved}")
        self.limit = limit
        self.max_reserved = limit if max_reserved is None else max_reserved
        self._live_runtimes = live_runtimes
        self._lock = threading.Lock()
        self._reserved = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None

    @property
    def reserved(self) -> int:
        """Slots handed out and not released (polls waiting for a task, provisionings)."""
        return self._reserved

    @property
    def live(self) -> int:
        """Runtimes the host holds now (provisioned, not torn down)."""
        return self._live_runtimes()

    def _take(self) -> bool:
        with self._lock:
            if (
                self._reserved >= self.max_reserved
                or self._reserved + self._live_runtimes() >= self.limit
            ):
                return False
            self._reserved += 1
            return True

    async def reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit:
        """Wait until the host has room for one more runtime, then hand out a slot."""
        if self._changed is None:
            self._loop = asyncio.get_running_loop()
            self._changed = asyncio.Event()
        while True:
            self._changed.clear()
            if self._take():
                return SlotPermit()
            await self._changed.wait()

    def try_reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit | None:
        """Hand out a slot when the host has room now (eager activities), else None."""
        return SlotPermit() if self._take() else None

    def mark_slot_used(self, ctx: SlotMarkUsedContext) -> None:
        """Nothing to do: the slot was counted when reserved."""

    def release_slot(self, ctx: SlotReleaseContext) -> None:
        """A provisioning ended (its runtime, when made, is counted live now) or a poll gave
        its slot back."""
        with self._lock:
            self._reserved -= 1
        self.notify()

    def notify(self) -> None:
        """The counts changed (a slot released, a runtime torn down): wake a waiting
        reservation. Safe from any thread."""
        loop, changed = self._loop, self._changed
        if loop is None or changed is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            changed.set()
        else:
            loop.call_soon_threadsafe(changed.set)


class SessionSlots(CustomSlotSupplier):
    """Activity slots of a gateway host's admission worker (queue ``rolloutd-gateway-admit``),
    bounded by the open sessions its backend pool takes: a session's first open waits in that
    queue, not in workflow code, until a gateway has room (docs/tenancy.md).

    Invariant: ``reserved + open_sessions() <= max_sessions()`` whenever a slot is handed out
    (an open that finished counts twice for a moment, which only delays the next one).

    Args:
        room: ``(open sessions, bound)`` of the gateway's pool now (no I/O); a bound of None
            takes every open.
        refresh: learns the backends' slots (I/O); awaited before each reservation at most
            every :attr:`REFRESH_S`.
        every_s: how often a reservation waiting for room looks again, seconds (a session
            closing frees room; the counts are in this process's memory).
    """

    #: seconds between two refreshes of the backends' slots
    REFRESH_S = 30.0

    def __init__(
        self,
        room: Callable[[], tuple[int, int | None]],
        refresh: Callable[[], Awaitable[None]] | None = None,
        every_s: float = 0.2,
    ) -> None:
        self._room = room
        self._refresh = refresh
        self._refreshed_at = float("-inf")
        self.every_s = every_s
        self._lock = threading.Lock()
        self._reserved = 0

    @property
    def reserved(self) -> int:
        """Slots handed out and not released (polls waiting for an open, opens running)."""
        return self._reserved

    def _take(self) -> bool:
        num_open, bound = self._room()
        with self._lock:
            if bound is not None and self._reserved + num_open >= bound:
                return False
            self._reserved += 1
            return True

    async def reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit:
        """Wait until the pool has room for one more session, then hand out a slot."""
        while True:
            if self._refresh is not None and time.monotonic() - self._refreshed_at > self.REFRESH_S:
                self._refreshed_at = time.monotonic()
                try:
                    await self._refresh()
                except Exception as e:  # noqa: BLE001 - a slot count unknown is asked again later
                    log.warning("backend_slots_not_refreshed", error=repr(e))
            if self._take():
                return SlotPermit()
            await asyncio.sleep(self.every_s)

    def try_reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit | None:
        """Hand out a slot when the pool has room now, else None."""
        return SlotPermit() if self._take() else None

    def mark_slot_used(self, ctx: SlotMarkUsedContext) -> None:
        """Nothing to do: the slot was counted when reserved."""

    def release_slot(self, ctx: SlotReleaseContext) -> None:
        """An open ended (its session, when opened, counts in the pool now) or a poll gave its
        slot back."""
        with self._lock:
            self._reserved -= 1


#: seconds between two readings of the sandbox queue's backlog by a host with a warm pool.
POOL_SIZING_S = 2.0


async def sandbox_backlog(client: Client) -> tuple[int, int]:
    """The sessions waiting in the sandbox queue for a host, and the hosts polling it.

    Read with Temporal's DescribeTaskQueue (``report_stats``: ``approximate_backlog_count``
    of the ``rolloutd-sandbox`` activity queue, and its pollers, one per host process), which
    the server reports with a lag of its own (an approximation, by its name).

    Returns:
        ``(num_waiting, num_hosts)``.

    Raises:
        temporalio.service.RPCError: Temporal did not answer.
    """
    described = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(
                name=task_queues.SANDBOX, kind=TaskQueueKind.TASK_QUEUE_KIND_NORMAL
            ),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
            report_stats=True,
        ),
        timeout=timedelta(seconds=10),
    )
    hosts = {p.identity for p in described.pollers}
    return int(described.stats.approximate_backlog_count), len(hosts)


async def size_pool_forever(client: Client, pool: WarmPool) -> None:
    """Give ``pool`` its host's share of the sandbox queue's backlog (:func:`sandbox_backlog`:
    the backlog over the hosts polling, rounded up) every :data:`POOL_SIZING_S` seconds,
    until cancelled. A reading Temporal does not answer keeps the last size."""
    while True:
        try:
            waiting, hosts = await sandbox_backlog(client)
        except RPCError as e:
            log.debug("sandbox_backlog_not_read", error=str(e))
        else:
            pool.set_waiting(-(-waiting // max(1, hosts)))
        await asyncio.sleep(POOL_SIZING_S)
