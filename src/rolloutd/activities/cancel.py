"""``cancel_workflows``: cancel a task's sessions directly, one API call each (a local activity of
the workflow worker).

Why not the parent's own child cancellation: every ``RequestCancelExternal`` a parent issues is
delivered by the server's transfer queue, which records each delivery in the *parent* and so
takes the parent's lock once per child; 100 of them contend for that one lock and are delivered
at about one a second. A client ``RequestCancelWorkflowExecution`` touches only the child:
100 of them land within seconds (docs/measurements.md).
"""

from __future__ import annotations

import asyncio

import structlog
from temporalio import activity
from temporalio.service import RPCError

from rolloutd.activities.names import CANCEL_WORKFLOWS

log = structlog.get_logger(__name__)


@activity.defn(name=CANCEL_WORKFLOWS)
async def cancel_workflows(workflow_ids: list[str]) -> list[str]:
    """Request cancellation of each workflow, concurrently.

    Returns:
        The ids whose request failed (not started yet, already closed, ...): the caller
        cancels those its own way.
    """
    client = activity.client()

    async def one(workflow_id: str) -> str | None:
        try:
            await client.get_workflow_handle(workflow_id).cancel()
        except RPCError as e:
            log.info("cancel_request_failed", workflow_id=workflow_id, error=str(e))
            return workflow_id
        return None

    failed = await asyncio.gather(*(one(w) for w in workflow_ids))
    return [w for w in failed if w is not None]
