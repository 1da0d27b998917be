"""``closed_workflows``: which of some workflows no longer run (an activity of the eval
fleet, which holds a Temporal client).

A workflow that holds something of another workflow (a tenant's slot, a buffer's running
slot) is told when its holder ends normally; one that was terminated, cancelled from the UI or
whose last signal failed tells nothing. The holder asks Temporal instead
(DescribeWorkflowExecution, https://docs.temporal.io/references/commands): closed in any way,
or unknown to the server, is closed.
"""

from __future__ import annotations

import asyncio

import structlog
from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from rolloutd.activities.names import CLOSED_WORKFLOWS

log = structlog.get_logger(__name__)


@activity.defn(name=CLOSED_WORKFLOWS)
async def closed_workflows(workflow_ids: list[str]) -> list[str]:
    """The ids among ``workflow_ids`` whose latest run is not running (completed, failed,
    cancelled, terminated, timed out, continued as new elsewhere) or that the server does not
    know, in the order given.

    Raises:
        temporalio.service.RPCError: Temporal did not answer (the caller asks again later).
    """
    client = activity.client()

    async def closed(workflow_id: str) -> bool:
        try:
            described = await client.get_workflow_handle(workflow_id).describe()
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                return True
            raise
        return described.status != WorkflowExecutionStatus.RUNNING

    found = await asyncio.gather(*(closed(w) for w in workflow_ids))
    out = [w for w, c in zip(workflow_ids, found, strict=True) if c]
    if out:
        log.info("closed_workflows", num_asked=len(workflow_ids), closed=out[:20])
    return out
