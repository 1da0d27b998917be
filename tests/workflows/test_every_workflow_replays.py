"""Every workflow replays its own history: Temporal's ``Replayer`` over real histories.

The fleets run against a real Temporal dev server and the real engine with the workflows
fleet's cache at its smallest (``max_cached_workflows = 0``): every workflow task and every
query replays the workflow from its history, as a worker restart or a cache eviction does. The
histories come from what makes a session wait longest:

- sessions that wait for a tenant slot (a tenant with a quota of 1),
- sessions that wait for backend capacity (the gateway takes 1 open session per 2 engine
  slots: 2 of the engine's 4),
- sessions that wait for a sandbox host (a host of 1 runtime, while the gateway admits 2),

and from a task, a task whose group is returned by reference (stored in parts, then
assembled), a buffer (take and acknowledge) and a generation. While they run, a query of
each session's phase replays it again; every query must be answered. Afterwards every
history, printed with its size, must replay on today's workflow code without a
nondeterminism error, and the histories must show each wait: a tenant wait and a backend wait
in the sessions' phases, a sandbox-host wait in a provisioning's time in the sandbox queue
(``ProvisionRuntimeOutput.queue_wait_s``, read from the session histories).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.worker import Replayer

from rolloutd.activities.models import ProvisionRuntimeOutput
from rolloutd.activities.names import PROVISION_RUNTIME
from rolloutd.generation.commands import generate
from rolloutd.security.connection import data_converter
from rolloutd.store import BlobStore
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import TaskResult
from rolloutd.workers import every_workflow
from tests.support.generation_specs import true_rows_spec
from tests.support.namespaced_fleets import namespaced_fleets
from tests.support.tenancy import assert_all_completed, task

pytestmark = [pytest.mark.temporal, pytest.mark.engine, pytest.mark.sandbox]

#: every workflow the workflows fleet registers
WORKFLOWS = every_workflow()


@contextlib.asynccontextmanager
async def smallest_cache_fleets(
    address: str, engine_url: str, home: Path
) -> AsyncIterator[tuple[Client, str]]:
    """The four fleets in a fresh namespace: no workflow cached between tasks, a sandbox
    host of 1 runtime, a gateway taking 0.5 open sessions per engine slot (2 of 4): of the
    two sessions admitted at once, one waits for the host."""
    async with namespaced_fleets(
        address,
        home,
        engine_url,
        tag="replay",
        common={"max_cached_workflows": 0},
        gateway={"max_sessions_per_slot": 0.5},
        sandbox_host={"max_concurrent_sessions": 1},
    ) as fleets:
        yield fleets.client, fleets.store_url


async def query_phases(
    client: Client,
    workflow_ids: list[str],
    stop: asyncio.Event,
    answered: list[int],
    refused: list[str],
) -> None:
    """Query each workflow's phase until ``stop``: with no cache each query replays it."""
    while not stop.is_set():
        for workflow_id in workflow_ids:
            try:
                await client.get_workflow_handle(workflow_id).query("phase")
                answered[0] += 1
            except Exception as e:  # noqa: BLE001 - sorted out below: not started is fine
                if "not found" not in str(e).lower():
                    refused.append(f"{workflow_id}: {e}")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.3)


async def host_waits(events: list[HistoryEvent]) -> list[float]:
    """Seconds each provisioning of a session's history waited in the sandbox queue for a
    host with room (its result's ``queue_wait_s``, decoded as the workers decode it)."""
    converter = data_converter()
    provisions = {
        event.event_id
        for event in events
        if event.HasField("activity_task_scheduled_event_attributes")
        and event.activity_task_scheduled_event_attributes.activity_type.name == PROVISION_RUNTIME
    }
    waits = []
    for event in events:
        completed = event.activity_task_completed_event_attributes
        if event.HasField("activity_task_completed_event_attributes") and (
            completed.scheduled_event_id in provisions
        ):
            (output,) = await converter.decode(completed.result.payloads, [ProvisionRuntimeOutput])
            waits.append(output.queue_wait_s)
    return waits


@pytest.mark.timeout(900)
async def test_every_workflow_replays_its_history(temporal_server, engine, tmp_path: Path) -> None:
    async with smallest_cache_fleets(temporal_server.address, engine.url, tmp_path) as (
        client,
        store_url,
    ):
        rc = RolloutClient(client, BlobStore(store_url), check_capabilities=False)
        await rc.set_tenant_quota("quota-1", 1)
        u = uuid.uuid4().hex[:6]
        quota = await rc.submit(task(f"quota-{u}", "sleep 1", 3, tenant="quota-1", timeout_s=300))
        # over its 1 KiB inline limit: returned by reference (store_group_part, assemble_group)
        free = await rc.submit(
            task(f"free-{u}", "sleep 1", 4, timeout_s=300, inline_result_bytes=1024)
        )
        sessions = [f"task/{quota.task_id}/{i}" for i in range(3)] + [
            f"task/{free.task_id}/{i}" for i in range(4)
        ]
        stop, answered, refused = asyncio.Event(), [0], []
        querying = asyncio.create_task(query_phases(client, sessions, stop, answered, refused))
        buffer = await rc.create_buffer(
            {
                "buffer_id": f"replay-{u}",
                "num_in_flight": 1,
                "drop_zero_variance": False,
                "source": {"type": "push"},
            }
        )
        await buffer.push(
            [task(f"buf-{u}-{i}", "sleep 0.5", 2, inline_result_bytes=1024) for i in range(2)]
        )
        groups = [await quota.result(), await free.result()]
        batch = await buffer.take(2, timeout_s=300)
        await buffer.ack(batch.batch_id)
        await buffer.close()
        summary = await generate(client, true_rows_spec(f"replay-{u}", tmp_path, 2))
        stop.set()
        await querying
        for group in groups:
            assert_all_completed(group)
        own = await client.get_workflow_handle(
            f"task/{free.task_id}", result_type=TaskResult
        ).result()
        assert own.stored_key and own.sessions == [] and len(groups[1].sessions) == 4
        waits = {p.phase for g in groups for s in g.sessions for p in s.phases}
        assert {"tenant_wait", "backend_wait"} <= waits, waits
        assert summary.num_rows == 2
        assert answered[0] > 0 and not refused, refused[:3]

        replayer = Replayer(workflows=WORKFLOWS, data_converter=data_converter())
        failures, sizes, waited = [], {}, []
        async for execution in client.list_workflows():
            history = await client.get_workflow_handle(
                execution.id, run_id=execution.run_id
            ).fetch_history()
            if execution.workflow_type == "RolloutSessionWorkflow":
                waited += await host_waits(list(history.events))
            sizes[f"{execution.workflow_type} {execution.id}"] = (
                len(history.events),
                len(history.to_json()),
            )
            result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
            if result.replay_failure is not None:
                failures.append(f"{execution.id}: {result.replay_failure}")
    print(f"\n{len(sizes)} histories replayed; {answered[0]} queries answered")
    for name, (events, size) in sorted(sizes.items()):
        print(f"  {name}: {events} events, {size / 1024:.1f} KiB")
    kinds = {name.split()[0] for name in sizes}
    assert {
        "RolloutTaskWorkflow",
        "RolloutSessionWorkflow",
        "RolloutBufferWorkflow",
        "GenerationWorkflow",
        "TenantWorkflow",
    } <= kinds, kinds
    assert not failures, failures
    # the host's one runtime was taken while another admitted session was provisioned
    print(f"  longest wait for a sandbox host: {max(waited, default=0.0):.1f} s")
    assert max(waited, default=0.0) >= 0.5, sorted(waited)[-5:]
