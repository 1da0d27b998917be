"""Backend backpressure in the session workflow: open the gateway session only once the
inference backends have room (docs/tenancy.md). Workflow code: deterministic, no I/O.

The gateway refuses a new session with ``BackendSaturatedError`` while its pool holds
``max_sessions_per_slot`` x slots open sessions (:mod:`rolloutd.proxy.backends.saturation`);
the session then waits on a durable timer (1 s, doubling to 10 s, with jitter so waiting
sessions do not ask at once) and asks again. The wait comes before provisioning, so it is
charged to no phase budget (no activity runs), and with tenancy the session deadline starts
only once the first runtime is up, so it does not tick either.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from rolloutd.activities.models import OpenSessionOutput
    from rolloutd.backoff import Backoff
    from rolloutd.errors import BackendSaturatedError
    from rolloutd.types import PhaseTiming

#: pauses between two asks while the backends are saturated: 1 s, doubled, at most 10 s
#: (before jitter)
WAIT_BACKOFF = Backoff(initial_s=1.0, max_s=10.0)


def saturated(error: ActivityError) -> bool:
    """Whether an ``open_session`` failure is the gateway's "backends saturated" refusal."""
    cause = error.cause
    return isinstance(cause, ApplicationError) and cause.type == BackendSaturatedError.__name__


async def open_when_backends_free(
    open_session: Callable[[], Awaitable[OpenSessionOutput]], timings: list[PhaseTiming]
) -> OpenSessionOutput:
    """Open the gateway session, waiting while the gateway says its backends are saturated.

    Args:
        open_session: runs the ``open_session`` activity with ``wait_for_backends`` set.
        timings: the session's phases; gains one ``backend_wait`` entry when it waited.

    Returns:
        The opened session.

    Raises:
        ActivityError: the open failed for another reason (as without the wait).
    """
    started = workflow.now()
    num_refusals = 0
    try:
        while True:
            try:
                return await open_session()
            except ActivityError as e:
                if not saturated(e):
                    raise
            num_refusals += 1
            # jitter: sessions refused together do not all ask again together
            pause_s = WAIT_BACKOFF.delay_s(num_refusals)
            await asyncio.sleep(pause_s * (0.5 + workflow.random().random()))
    finally:
        if num_refusals:
            ended = workflow.now()
            timings.append(
                PhaseTiming(
                    phase="backend_wait",
                    started_at=started,
                    ended_at=ended,
                    duration_s=(ended - started).total_seconds(),
                )
            )
            workflow.logger.info(
                "waited %.1f s for backend capacity (%d refusals)",
                (ended - started).total_seconds(),
                num_refusals,
            )
