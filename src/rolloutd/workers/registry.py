"""A worker process tells the fleet registry what it can run and that it lives
(:mod:`rolloutd.capabilities`).

``publish`` signal-with-starts the registry workflow (``rolloutd-fleets``) when the process's
workers have started; ``beat`` does so every ``fleet_heartbeat_s`` until the process stops
(its own asyncio task, which needs no activity slot: a full sandbox host beats on);
``withdraw`` signals it when the workers stop. None blocks a fleet on the workflows fleet: a
signal-with-start needs only the Temporal server.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import structlog
from temporalio.client import Client
from temporalio.service import RPCError

from rolloutd import task_queues
from rolloutd.capabilities import (
    HEARTBEAT_SIGNAL,
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
            the host's sandbox policy), ``eval`` (the names in the evaluator registry),
            ``workflows`` or ``gateway`` (nothing to publish but that the process lives).
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
    elif fleet == "eval":
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
        start_signal_args=[host.model_copy(update={"heartbeat_at": datetime.now(UTC)})],
    )
    log.info(
        "fleet_capabilities_published",
        fleet=host.fleet,
        host_id=host.host_id,
        harnesses=host.harnesses,
        missing_harnesses=sorted(host.missing_harnesses),
        evaluators=host.evaluators,
    )


async def beat(client: Client, host: HostCapabilities, every_s: float) -> None:
    """Beat for ``host`` every ``every_s`` until cancelled (the process's liveness:
    :func:`rolloutd.capabilities.fleet_liveness`). A beat Temporal refuses is logged and the
    next one tried: the registry's readers see the gap."""
    while True:
        await asyncio.sleep(every_s)
        beating = host.model_copy(update={"heartbeat_at": datetime.now(UTC)})
        try:
            await client.start_workflow(
                FleetRegistryWorkflow.run,
                FleetRegistryInput(),
                id=REGISTRY_WORKFLOW_ID,
                task_queue=task_queues.WORKFLOWS,
                start_signal=HEARTBEAT_SIGNAL,
                start_signal_args=[beating],
            )
        except RPCError as e:
            log.warning("fleet_heartbeat_failed", fleet=host.fleet, error=str(e))


async def withdraw(client: Client, host: HostCapabilities) -> None:
    """Withdraw ``host``'s registration; a registry that is gone is not an error of a stop."""
    try:
        await client.get_workflow_handle(REGISTRY_WORKFLOW_ID).signal(
            UNREGISTER_SIGNAL, host.instance_id
        )
    except RPCError as e:
        log.warning("fleet_capabilities_not_withdrawn", fleet=host.fleet, error=str(e))


async def export_liveness(client: Client, every_s: float) -> None:
    """Export each fleet's liveness as the gauge ``rolloutd_fleet_alive`` every ``every_s``
    until cancelled (the workflows process runs it: the same rule as ``submit`` and the
    client's waits, :func:`rolloutd.capabilities.fleet_liveness`)."""
    from rolloutd.observability.metrics import set_fleet_alive
    from rolloutd.trainer_client.health import FleetHealth

    health = FleetHealth(client)
    while True:
        try:
            for fleet, liveness in (await health.liveness()).items():
                set_fleet_alive(fleet, liveness.alive)
        except Exception as e:  # noqa: BLE001 - boundary: the next round asks again
            log.warning("fleet_liveness_not_read", error=repr(e))
        await asyncio.sleep(every_s)
