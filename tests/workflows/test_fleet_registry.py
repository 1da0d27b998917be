"""The fleet registry workflow on a real Temporal server (its own workflow id, so the registry
the fleets fixture's hosts publish to is left alone): a host's registration replaces an earlier
one of the same host, a stop withdraws it, and the history stays bounded by continue-as-new
while every registration is kept. ``rolloutd submit`` refuses a file with one task no host can
run before any of its tasks starts.
"""

from __future__ import annotations

import uuid

import pytest
from temporalio.service import RPCError, RPCStatusCode

from rolloutd import task_queues
from rolloutd.capabilities import (
    CAPABILITIES_QUERY,
    REGISTER_SIGNAL,
    REGISTRY_WORKFLOW_ID,
    UNREGISTER_SIGNAL,
    FleetCapabilities,
    HostCapabilities,
)
from rolloutd.cli.submission import submit_tasks
from rolloutd.workflows.fleets import FleetRegistryInput, FleetRegistryWorkflow
from tests.support.buffer_tasks import poll

pytestmark = [pytest.mark.temporal, pytest.mark.engine]


async def test_registrations_replace_withdraw_and_survive_continue_as_new(fleets):
    client = fleets.client
    started = await client.start_workflow(
        FleetRegistryWorkflow.run,
        FleetRegistryInput(max_history_events=20),
        id=f"test-fleets-{uuid.uuid4().hex[:6]}",
        task_queue=task_queues.WORKFLOWS,
    )
    first_run = started.result_run_id
    handle = client.get_workflow_handle(started.id)  # the latest run, whichever it is

    def host(host_id: str, instance_id: str) -> HostCapabilities:
        return HostCapabilities(
            fleet="sandbox", host_id=host_id, instance_id=instance_id, harnesses={"shell": None}
        )

    # at least one history event each, however the server batches them into workflow tasks:
    # past 20 events, so the registry continues as new
    for i in range(24):
        await handle.signal(REGISTER_SIGNAL, host(f"h{i}", f"i{i}"))
    await handle.signal(REGISTER_SIGNAL, host("h0", "i0-restarted"))
    await handle.signal(UNREGISTER_SIGNAL, "i1")

    async def hosts():
        caps = await handle.query(CAPABILITIES_QUERY, result_type=FleetCapabilities)
        return sorted(h.instance_id for h in caps.hosts)

    expected = sorted(["i0-restarted", *(f"i{i}" for i in range(2, 24))])
    assert await poll(hosts, lambda ids: ids == expected, timeout_s=30, what="registrations")

    async def run_id() -> str:
        return (await handle.describe()).run_id

    await poll(
        run_id,
        lambda current: current != first_run,
        timeout_s=30,
        what="the registry to continue as new",
    )
    assert await hosts() == expected  # the registrations carried over
    await handle.terminate("test done")


async def test_the_fleets_hosts_registered_what_they_can_run(fleets):
    caps = await fleets.client.get_workflow_handle(REGISTRY_WORKFLOW_ID).query(
        CAPABILITIES_QUERY, result_type=FleetCapabilities
    )
    sandbox = [h for h in caps.of("sandbox") if h.host_id == "test-host"]
    assert sandbox and sandbox[-1].harnesses["shell"] is None
    assert "qwen_code" in sandbox[-1].harnesses or "qwen_code" in sandbox[-1].missing_harnesses
    assert {"session_completed", "test_on_output", "swebench"} <= set(caps.evaluator_names())


async def test_cli_submit_refuses_every_task_before_any_starts(fleets, temporal_server):
    suffix = uuid.uuid4().hex[:6]
    runnable = {
        "task_id": f"cli-ok-{suffix}",
        "instruction": "x",
        "harness": {"type": "shell", "command": "true"},
        "runtime": {"type": "local"},
    }
    # an evaluator no eval host registered (harness types get adapters one by one)
    unrunnable = {
        **runnable,
        "task_id": f"cli-bad-{suffix}",
        "evaluator": {"type": "no_such_evaluator"},
    }
    with pytest.raises(SystemExit) as info:
        await submit_tasks([runnable, unrunnable], temporal_server.address, None)
    assert (
        f"task cli-bad-{suffix}: evaluator.type='no_such_evaluator' is not in the eval "
        "fleet's registry" in str(info.value)
    )
    with pytest.raises(RPCError) as missing:
        await fleets.client.get_workflow_handle(f"task/cli-ok-{suffix}").describe()
    assert missing.value.status == RPCStatusCode.NOT_FOUND
