"""Sessions in flight by phase: every running ``RolloutSessionWorkflow`` asked its ``phase``
query. Shared by ``rolloutd status`` and the REST facade's ``GET /stack/status``.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.service import RPCError

#: the visibility query of the sessions in flight (Temporal list filter syntax).
SESSIONS_IN_FLIGHT = "WorkflowType = 'RolloutSessionWorkflow' AND ExecutionStatus = 'Running'"
#: sessions asked for their phase at most; beyond, they are not counted.
MAX_SESSIONS_QUERIED = 2000


async def sessions_by_phase(client: Client, timeout_s: float = 10.0,
                            concurrency: int = 16) -> dict[str, int]:
    """Count the sessions in flight by phase (``open``, ``provision``, ``run``, ...); a session
    that ends meanwhile, or whose workflow worker does not answer, counts as ``unknown``.

    Args:
        client: a Temporal client.
        timeout_s: bound on the whole count, s.
        concurrency: queries in flight at once.

    Raises:
        TimeoutError: Temporal did not answer within ``timeout_s``.
        RPCError: Temporal refused the listing.
    """
    sem = asyncio.Semaphore(concurrency)
    counts: Counter[str] = Counter()

    async def phase_of(workflow_id: str, run_id: str | None) -> None:
        async with sem:
            try:
                counts[await client.get_workflow_handle(workflow_id, run_id=run_id)
                       .query("phase")] += 1
            except (RPCError, WorkflowQueryFailedError):
                counts["unknown"] += 1

    async def count() -> None:
        ids = [(wf.id, wf.run_id) async for wf in
               client.list_workflows(SESSIONS_IN_FLIGHT, limit=MAX_SESSIONS_QUERIED)]
        await asyncio.gather(*(phase_of(i, r) for i, r in ids))

    await asyncio.wait_for(count(), timeout_s)
    return dict(sorted(counts.items()))
