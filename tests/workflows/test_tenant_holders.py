"""A tenant's slot comes back when its holder ends however it ends: a holder that is
terminated (it sends no ``release``) is found by the tenant workflow asking Temporal, and the
waiting session gets the slot. Real Temporal dev server and the real workflows and eval
fleets (the eval fleet answers ``closed_workflows``); the
holders are a small test workflow that takes a slot with the session's own code
(:func:`rolloutd.workflows.tenants.acquire_slot`) and then waits, standing in for a session
whose harness runs (a real session needs the sandbox and gateway fleets for nothing this
checks). The check interval is lowered to 1 s (the product's default is 60 s).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from temporalio import workflow
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.worker import Worker

with workflow.unsafe.imports_passed_through():
    from rolloutd.activities.tenants import (
        GRANTED_SIGNAL,
        STATE_QUERY,
        TenantQuota,
        TenantState,
        tenant_workflow_id,
    )
    from rolloutd.settings import CommonSettings, EvalSettings
    from rolloutd.types import PhaseTiming, TaskRequest
    from rolloutd.workers import connect, run_fleet
    from rolloutd.workflows.tenants import TenantInput, TenantWorkflow, acquire_slot
    from tests.support.namespaces import fresh_namespace

pytestmark = [pytest.mark.temporal]

HOLDERS_QUEUE = "test-tenant-holders"


@workflow.defn(sandboxed=False)
class SlotHolder:
    """Takes a slot of its task's tenant, then holds it until cancelled or terminated."""

    def __init__(self) -> None:
        self._granted = False

    @workflow.signal(name=GRANTED_SIGNAL)
    def granted(self) -> None:
        self._granted = True

    @workflow.query
    def holds(self) -> bool:
        return self._granted

    @workflow.run
    async def run(self, task: TaskRequest) -> None:
        timings: list[PhaseTiming] = []
        await acquire_slot(task, lambda: self._granted, timings)
        await workflow.wait_condition(lambda: False)


async def _holds(client: Client, workflow_id: str) -> bool:
    return await client.get_workflow_handle(workflow_id).query(SlotHolder.holds)


@pytest.mark.timeout(120)
async def test_a_terminated_holder_gives_its_slot_back(temporal_server, tmp_path) -> None:
    namespace = await fresh_namespace(temporal_server.address, "holders")
    common = {
        "temporal_address": temporal_server.address,
        "temporal_namespace": namespace,
        "host_id": "holders",
        "log_json": False,
        "store_url": str(tmp_path / "store"),
    }
    settings = CommonSettings(**common)
    client = await connect(settings)
    tenant = f"t{uuid.uuid4().hex[:6]}"
    task = TaskRequest.model_validate(
        {
            "task_id": "holders",
            "instruction": "x",
            "harness": {"type": "shell", "command": "true"},
            "tenant": tenant,
        }
    )
    async with (
        run_fleet("workflows", client, settings),
        run_fleet("eval", client, EvalSettings(**common)),
        Worker(client, task_queue=HOLDERS_QUEUE, workflows=[SlotHolder]),
    ):
        tenant_handle = await client.start_workflow(
            TenantWorkflow.run,
            TenantInput(
                state=TenantState(tenant=tenant, quota=TenantQuota(max_sessions_in_flight=1)),
                check_holders_s=1.0,
            ),
            id=tenant_workflow_id(tenant),
            task_queue="rolloutd-workflows",
        )
        first = await client.start_workflow(
            SlotHolder.run, task, id=f"holder-1-{tenant}", task_queue=HOLDERS_QUEUE
        )
        deadline = time.monotonic() + 30
        while not await _holds(client, first.id):
            assert time.monotonic() < deadline, "the first holder got no slot"
            await asyncio.sleep(0.2)  # polling Temporal, bounded by the deadline
        second = await client.start_workflow(
            SlotHolder.run, task, id=f"holder-2-{tenant}", task_queue=HOLDERS_QUEUE
        )
        # the quota is full: the second waits while the first holds
        await asyncio.sleep(3)
        assert not await _holds(client, second.id)
        await first.terminate("the test ends it without a release")
        assert (await first.describe()).status == WorkflowExecutionStatus.TERMINATED
        t0 = time.monotonic()
        while not await _holds(client, second.id):
            assert time.monotonic() - t0 < 20, "the terminated holder's slot never came back"
            await asyncio.sleep(0.2)  # polling Temporal, bounded by the deadline
        freed_in = time.monotonic() - t0
        state = await tenant_handle.query(STATE_QUERY, result_type=TenantState)
        assert state.holders == [second.id]
        assert state.num_reaped == 1
        history = await tenant_handle.fetch_history()
        print(
            f"\nslot freed {freed_in:.1f} s after the terminate; tenant history "
            f"{len(history.events)} events, {len(history.to_json()) / 1024:.1f} KiB"
        )
        await second.terminate("done")
        await tenant_handle.terminate("done")
