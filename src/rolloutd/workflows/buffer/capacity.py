"""The buffer's in-flight target from the capacity it observes (docs/tenancy.md).

With ``BufferConfig.adapt_in_flight``, the buffer keeps at most
``min(num_in_flight, ceil(IN_FLIGHT_HEADROOM x sessions / num_samples))`` tasks running, where
``sessions`` is the fewest sessions the fleets run at once: the sandbox hosts'
``max_concurrent_sessions`` summed (fleet registry, local activity ``sandbox_capacity``) and
the gateway's bound of open sessions (``max_sessions_per_slot`` x engine slots, activity
``backend_capacity``). A side that states no bound (or does not answer) bounds nothing; with
neither, the target is ``num_in_flight``. The headroom keeps one more wave queued, so the
fleet never idles between a group's end and the next task's start, while a trainer's
``num_in_flight`` set for a larger fleet does not pile hundreds of sessions into the queues.
It is asked again every ``CAPACITY_CHECK_S``. Workflow code: deterministic, no I/O.
"""

from __future__ import annotations

import math
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from rolloutd import task_queues
    from rolloutd.activities.models import (
        BackendCapacityOutput,
        CapacityInput,
        SandboxCapacityOutput,
    )
    from rolloutd.activities.names import BACKEND_CAPACITY, SANDBOX_CAPACITY

#: sessions kept in flight per session the fleets run at once
IN_FLIGHT_HEADROOM = 2.0
#: how often the buffer asks the fleets their capacity again, seconds
CAPACITY_CHECK_S = 30.0
_TIMEOUT = timedelta(seconds=10)
_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=2)


def target(num_in_flight: int, num_samples: int, sessions: int | None) -> int:
    """Tasks to keep running.

    Args:
        num_in_flight: the configured target (>= 1).
        num_samples: sessions per task (>= 1).
        sessions: sessions the fleets run at once; None: unknown, unbounded.

    Returns:
        ``min(num_in_flight, max(1, ceil(IN_FLIGHT_HEADROOM x sessions / num_samples)))``.
    """
    if sessions is None:
        return num_in_flight
    return min(num_in_flight, max(1, math.ceil(IN_FLIGHT_HEADROOM * sessions / num_samples)))


async def observed_sessions() -> int | None:
    """The fewest sessions the sandbox fleet and the backends take at once (None: neither
    states a bound, or neither answered: a failed check bounds nothing)."""
    bounds: list[int] = []
    try:
        sandbox: SandboxCapacityOutput = await workflow.execute_local_activity(
            SANDBOX_CAPACITY,
            CapacityInput(),
            start_to_close_timeout=_TIMEOUT,
            retry_policy=_RETRY,
            result_type=SandboxCapacityOutput,
        )
        if sandbox.max_sessions is not None:
            bounds.append(sandbox.max_sessions)
    except ActivityError as e:
        workflow.logger.warning("sandbox capacity unknown: %s", e.cause or e)
    try:
        backends: BackendCapacityOutput = await workflow.execute_activity(
            BACKEND_CAPACITY,
            CapacityInput(),
            task_queue=task_queues.GATEWAY,
            start_to_close_timeout=_TIMEOUT,
            schedule_to_close_timeout=3 * _TIMEOUT,
            retry_policy=_RETRY,
            result_type=BackendCapacityOutput,
        )
        if backends.max_sessions is not None:
            bounds.append(backends.max_sessions)
    except ActivityError as e:
        workflow.logger.warning("backend capacity unknown: %s", e.cause or e)
    return min(bounds) if bounds else None
