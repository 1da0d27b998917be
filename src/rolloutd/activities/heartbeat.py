"""Heartbeats for activities that do not have a natural loop of their own.

Every long activity heartbeats so that a dead worker is noticed within its heartbeat timeout
(seconds), not its start-to-close timeout (minutes), and so that cancellation reaches it
(Temporal delivers an activity's cancellation in the answer to a heartbeat).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from temporalio import activity

#: seconds between heartbeats (the workflow side's heartbeat timeout is several times this).
EVERY_S = 1.0


@contextlib.asynccontextmanager
async def heartbeating(every_s: float = EVERY_S, **details: Any) -> AsyncIterator[None]:
    """Heartbeat every ``every_s`` seconds while the block runs, the first after ``every_s``
    (a no-op outside activities).

    Args:
        every_s: seconds between heartbeats.
        details: sent with each heartbeat (``elapsed_s`` is added).
    """
    if not activity.in_activity():
        yield
        return
    loop = asyncio.get_running_loop()
    began = loop.time()

    async def beat() -> None:
        # the first beat after one interval, not at once: the server's heartbeat timeout
        # runs from the activity's start, so a block shorter than ``every_s`` (most
        # provisionings, collections and teardowns) needs none and asks Temporal nothing
        while True:
            await asyncio.sleep(every_s)
            activity.heartbeat({**details, "elapsed_s": round(loop.time() - began, 1)})

    task = asyncio.create_task(beat(), name="rolloutd-heartbeat")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
