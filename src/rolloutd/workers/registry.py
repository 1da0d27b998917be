"""A sandbox or eval host tells the fleet registry what it can run (:mod:`rolloutd.capabilities`).

``publish`` signal-with-starts the registry workflow (``rolloutd-fleets``) when the host's
workers have started; ``withdraw`` signals it when they stop. Neither blocks a fleet on the
workflows fleet: a signal-with-start needs only the Temporal server.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import structlog
from temporalio.client import Client
from temporalio.service import RPCError

from rolloutd import task_queues
from rolloutd.capabilities import (
    REGISTER_SIGNAL,
    REGISTRY_WORKFLOW_ID,
    UNREGISTER_SIGNAL,
    HostCapabilities,
    PublishingFleet,
)
from rolloutd.evaluators import evaluator_names
from rolloutd.sandbox.harnesses import harness_capabilities
from rolloutd.sandbox.runtimes import installed_runtimes
from rolloutd.workflows.fleets import FleetRegistryInput, FleetRegistryWorkflow

log = structlog.get_logger(__name__)


def host_capabilities(fleet: PublishingFleet, host_id: str) -> HostCapabilities:
    """What this host can run as a member of ``fleet``, probed now.

    Args:
        fleet: ``sandbox`` (harness adapters whose CLI is installed here; the caller adds
            the host's sandbox policy) or ``eval`` (the names in the evaluator registry).
        host_id: this host's id.
    """
    host = HostCapabilities(
        fleet=fleet,
        host_id=host_id,
        instance_id=uuid.uuid4().hex,
        started_at=datetime.now(UTC),
    )
    if fleet == "sandbox":
        host.harnesses, host.missing_harnesses = harness_capabilities()
        host.runtimes = installed_runtimes()
    else:
        host.evaluators = evaluator_names()
    return host


async def publish(client: Client, host: HostCapabilities) -> None:
    """Register ``host`` with the fleet registry, starting the registry if none runs."""
    await client.start_workflow(
        FleetRegistryWorkflow.run,
        FleetRegistryInput(),
        id=REGISTRY_WORKFLOW_ID,
        task_queue=task_queues.WORKFLOWS,
        start_signal=REGISTER_SIGNAL,
        start_signal_args=[host],
    )
    log.info(
        "fleet_capabilities_published",
        fleet=host.fleet,
        host_id=host.host_id,
        harnesses=host.harnesses,
        missing_harnesses=sorted(host.missing_harnesses),
        evaluators=host.evaluators,
    )


async def withdraw(client: Client, host: HostCapabilities) -> None:
    """Withdraw ``host``'s registration; a registry that is gone is not an error of a stop."""
    try:
        await client.get_workflow_handle(REGISTRY_WORKFLOW_ID).signal(
            UNREGISTER_SIGNAL, host.instance_id
        )
    except RPCError as e:
        log.warning("fleet_capabilities_not_withdrawn", fleet=host.fleet, error=str(e))
