"""Waiting for a dead backend pool, from workflow code: the policy's engines (a replacement
waits for them before it starts) and the judge pool (a judging waits for it before it tries
again), the same way: the gateway's ``backend_health`` activity, asked every few seconds,
for at most ``wait_s`` (a durable timer between two asks). Deterministic code only.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from datetime import timedelta
from typing import Literal

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from rolloutd import task_queues
    from rolloutd.activities.models import BackendHealthInput, BackendHealthOutput
    from rolloutd.activities.names import BACKEND_HEALTH

#: one ask of the gateway, and its retries
CHECK_TIMEOUT = timedelta(seconds=10)
CHECK_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=3)
#: the longest pause between two asks while a pool is down, s
CHECK_EVERY_S = 5.0

Pool = Literal["policy", "judge"]


async def backend_health(pool: Pool = "policy") -> BackendHealthOutput | None:
    """The health of the gateway's ``pool`` (activity ``backend_health`` on the gateway
    fleet), or None when no gateway answered."""
    try:
        return await workflow.execute_activity(
            BACKEND_HEALTH,
            BackendHealthInput(pool=pool),
            task_queue=task_queues.GATEWAY,
            start_to_close_timeout=CHECK_TIMEOUT,
            schedule_to_close_timeout=3 * CHECK_TIMEOUT,
            retry_policy=CHECK_RETRY,
            result_type=BackendHealthOutput,
        )
    except ActivityError as e:
        workflow.logger.warning("backend health check failed: %s", e.cause or e)
        return None


async def pool_down(pool: Pool = "policy") -> bool:
    """Whether ``pool`` has a policy version without a healthy backend now (a pool with no
    backend registered is misconfigured, not down: False)."""
    health = await backend_health(pool)
    return health is not None and health.status == "unavailable"


async def wait_for_pool(
    pool: Pool, wait_s: float, cancelling: Callable[[], bool] = lambda: False
) -> bool:
    """Wait until ``pool`` has a healthy backend for every policy version again (the
    gateway's probes see a restarted engine), for at most ``wait_s``: a pool that stays dead
    reaches the caller as a failure, not a workflow held for its whole deadline.

    Returns:
        True when the pool is back; False when the wait gave up (or ``cancelling()``).
    """
    every = max(1.0, min(CHECK_EVERY_S, wait_s / 3))
    give_up_at = workflow.now() + timedelta(seconds=wait_s)
    while workflow.now() < give_up_at and not cancelling():
        health = await backend_health(pool)
        if health is not None and health.status != "unavailable":
            return True
        with contextlib.suppress(asyncio.TimeoutError):
            await workflow.wait_condition(cancelling, timeout=every)
    if not cancelling():
        workflow.logger.warning("%s pool still down after %g s", pool, wait_s)
    return False
