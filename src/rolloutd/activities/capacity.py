"""``sandbox_capacity``: the sandbox fleet's bound of running sessions, from the fleet
registry (a local activity of the workflow worker, which the buffer sizes its fill by).

Whether a fleet lives is not asked here: :func:`rolloutd.capabilities.fleet_liveness` is the
one rule, from the registry's heartbeats.
"""

from __future__ import annotations

import structlog
from temporalio import activity
from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.service import RPCError

from rolloutd.activities.models import CapacityInput, SandboxCapacityOutput
from rolloutd.activities.names import SANDBOX_CAPACITY
from rolloutd.capabilities import CAPABILITIES_QUERY, REGISTRY_WORKFLOW_ID, FleetCapabilities

log = structlog.get_logger(__name__)


class CapacityActivities:
    """Activities that ask Temporal about the fleets' capacity.

    Args:
        client: the workflow worker's Temporal client (its namespace is the one asked about).
    """

    def __init__(self, client: Client) -> None:
        self.client = client

    @activity.defn(name=SANDBOX_CAPACITY)
    async def sandbox_capacity(self, input: CapacityInput) -> SandboxCapacityOutput:
        """The sandbox hosts' ``max_concurrent_sessions`` summed, from the fleet registry
        (one per host id: its latest registration)."""
        try:
            registered = await self.client.get_workflow_handle(REGISTRY_WORKFLOW_ID).query(
                CAPABILITIES_QUERY, result_type=FleetCapabilities
            )
        except (RPCError, WorkflowQueryFailedError) as e:
            log.warning("fleet_registry_unanswered", error=str(e))
            return SandboxCapacityOutput()
        limits = {
            h.host_id: h.max_concurrent_sessions
            for h in registered.hosts
            if h.fleet == "sandbox" and h.max_concurrent_sessions is not None
        }
        return SandboxCapacityOutput(
            max_sessions=sum(limits.values()) if limits else None, num_hosts=len(limits)
        )
