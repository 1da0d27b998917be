"""A waiting caller learns that a fleet is dead: no worker has polled its task queue for
``dead_after_s`` (Temporal's DescribeTaskQueue, real dev server), and the wait ends with
``FleetUnavailableError`` naming the fleet instead of going on empty; live fleets pass.

A stopped worker's poller stays listed with its last poll's time; that path takes the real
limit (70 s: an idle worker's long poll lasts up to a minute) and is left to the engine-kill
test's budget; here a fleet that never polled counts from when the checker first looked."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from rolloutd import task_queues
from rolloutd.trainer_client import FleetHealth, FleetUnavailableError
from rolloutd.trainer_client.health import watch
from tests.support.namespaces import fresh_namespace

pytestmark = [pytest.mark.temporal]

DEAD_AFTER_S = 3.0


@activity.defn(name="noop")
async def noop() -> None:
    """Nothing: a worker needs one activity to poll an activity queue."""


@workflow.defn(name="Noop")
class Noop:
    @workflow.run
    async def run(self) -> None:
        """Nothing: a worker needs one workflow to poll a workflow queue."""


async def test_live_fleets_pass_and_a_fleet_without_workers_is_named(temporal_server) -> None:
    namespace = await fresh_namespace(temporal_server.address, "fleet-health")
    client = await Client.connect(temporal_server.address, namespace=namespace)
    async with contextlib.AsyncExitStack() as stack:
        for fleet, queue in task_queues.FLEET_QUEUES.items():
            if fleet != "eval":  # the eval fleet never starts
                await stack.enter_async_context(
                    Worker(
                        client,
                        task_queue=queue,
                        activities=[noop],
                        workflows=[Noop] if fleet == "workflows" else [],
                        workflow_runner=UnsandboxedWorkflowRunner(),
                    )
                )
        live = FleetHealth(client, fleets=["workflows", "sandbox", "gateway"])
        deadline = time.monotonic() + 30
        while True:  # pollers show on the queues a moment after the workers start
            try:
                await live.check()
                break
            except FleetUnavailableError:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.5)  # polling Temporal, bounded by the deadline

        started = time.monotonic()
        with pytest.raises(FleetUnavailableError) as raised:
            await watch(
                asyncio.Event().wait(),
                FleetHealth(client, dead_after_s=DEAD_AFTER_S, fleets=["eval"]),
                every_s=0.5,
            )
        assert raised.value.fleet == "eval"
        assert DEAD_AFTER_S <= time.monotonic() - started < DEAD_AFTER_S + 10
