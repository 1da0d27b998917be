"""No failure is silent: `rolloutd submit` against a gateway whose backend answers garbage
exits non-zero and prints each session's call errors; a session whose provisioning no sandbox
worker picks up fails within ``phases.provision_wait_s``, saying so; one a host picked up is
left to its own timeouts.

The fleets here run in their own Temporal namespace on the shared dev server, so their task
queues are theirs alone (no shared fleet picks up their work).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import uuid
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.worker import Replayer, Worker

from rolloutd import task_queues
from rolloutd.activities.models import (
    ProvisionRuntimeInput,
    ProvisionRuntimeOutput,
    TeardownRuntimeInput,
    TeardownRuntimeOutput,
)
from rolloutd.capabilities import HostCapabilities
from rolloutd.security.connection import data_converter
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import SessionResult, SessionStatus
from rolloutd.workers.registry import beat, publish
from rolloutd.workflows.session.workflow import RolloutSessionWorkflow
from tests.support.garbage_fleets import REPO, fleets_in_namespace, rolloutd_command

pytestmark = [pytest.mark.temporal]


#: two chat calls; the harness carries on (and exits 0) whatever it gets
TWO_CALLS = "; ".join(
    [
        "curl -sS -o /dev/null -w '%{http_code}\\n' \"$OPENAI_BASE_URL/chat/completions\" "
        "-H \"Authorization: Bearer $OPENAI_API_KEY\" -H 'Content-Type: application/json' "
        '-d \'{"model": "m", "max_tokens": 8, "messages": [{"role": "user", '
        f'"content": "call {n}"}}]}}\' >> codes.txt'
        for n in (1, 2)
    ]
    + ["cat codes.txt"]
)


def shell_task(task_id: str, command: str, **overrides: object) -> dict:
    task: dict = {
        "task_id": task_id,
        "instruction": "test",
        "harness": {"type": "shell", "command": command},
        "runtime": {"type": "bwrap"},
        "evaluator": {"type": "session_completed"},
        "phases": {"run_s": 60},
        "timeout_s": 120,
    }
    task.update(overrides)
    return task


@pytest.mark.sandbox
async def test_submit_exits_non_zero_and_prints_call_errors_when_the_backend_is_garbage(
    temporal_server, tmp_path: Path
) -> None:
    task_id = f"garbage-{uuid.uuid4().hex[:6]}"
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(shell_task(task_id, TWO_CALLS, num_samples=2)) + "\n")
    async with fleets_in_namespace(temporal_server.address, tmp_path, sandbox=True) as rig:
        env = {
            **os.environ,
            "ROLLOUTD_TEMPORAL_NAMESPACE": rig.namespace,
            "COLUMNS": "200",
            "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
        }
        proc = await asyncio.create_subprocess_exec(
            *rolloutd_command(),
            "submit",
            str(tasks),
            "--address",
            rig.address,
            "--store-url",
            rig.store_url,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout=180)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    text = out.decode()
    assert proc.returncode == 1, text
    assert "call errors" in text
    rows = [line for line in text.splitlines() if line.startswith(f"{task_id}/")]
    assert len(rows) == 2 and all("2 (2 unrecovered)" in row for row in rows), text
    failures = [line for line in text.splitlines() if line.startswith("FAILED: session")]
    assert len(failures) == 2 and all("last: 502 BackendError" in f for f in failures), text
    assert f"FAILED: task {task_id}: no session recorded a completion" in text


async def wait_phase(client, workflow_id: str, phase: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(RPCError):
            if await client.get_workflow_handle(workflow_id).query("phase") == phase:
                return
        await asyncio.sleep(0.2)
    raise AssertionError(f"{workflow_id} never reached phase {phase}")


async def test_a_session_fails_when_no_sandbox_worker_lives(
    temporal_server, tmp_path: Path
) -> None:
    """... and one cancelled while it waits ends cancelled at once."""
    async with fleets_in_namespace(temporal_server.address, tmp_path, sandbox=False) as rig:
        client = RolloutClient(rig.client)
        started = time.monotonic()
        handle = await client.submit(
            shell_task(f"nosandbox-{uuid.uuid4().hex[:6]}", "true", phases={"provision_wait_s": 3}),
            check_capabilities=False,
        )
        waiting = await client.submit(
            shell_task(
                f"cancelled-{uuid.uuid4().hex[:6]}", "true", phases={"provision_wait_s": 60}
            ),
            check_capabilities=False,
        )
        [session] = (await asyncio.wait_for(handle.result(), timeout=60)).sessions
        waited_s = time.monotonic() - started
        history = await rig.client.get_workflow_handle(  # type: ignore[attr-defined]
            f"task/{session.session_id}"
        ).fetch_history()
        waiting_session = rig.client.get_workflow_handle(  # type: ignore[attr-defined]
            f"task/{waiting.task_id}/0", result_type=SessionResult
        )
        await wait_phase(rig.client, waiting_session.id, "provision")
        cancelled_at = time.monotonic()
        await waiting.cancel()
        cancelled = await asyncio.wait_for(waiting_session.result(), timeout=30)
        cancel_s = time.monotonic() - cancelled_at
        cancel_events = [
            e
            async for e in waiting_session.fetch_history_events()
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED
        ]
    assert session.status == SessionStatus.FAILED
    assert session.error == (
        "no sandbox worker is alive to take the provisioning (waited 3 s for one): "
        "no worker process of fleet 'sandbox' has ever beaten"
    )
    assert session.failure is not None and session.reward is None
    assert (session.failure.kind, session.failure.phase) == ("sandbox", "provision")
    assert waited_s < 20, waited_s
    assert cancelled.status == SessionStatus.CANCELLED and cancel_s < 10, (cancelled, cancel_s)
    assert len(cancel_events) == 1  # the waiting provisioning was cancelled, not left queued
    # the checks (timers, local activities, the cancel) replay deterministically
    await Replayer(
        workflows=[RolloutSessionWorkflow], data_converter=data_converter()
    ).replay_workflow(history)


async def test_a_provisioning_a_host_picked_up_is_not_cut_by_the_wait(
    temporal_server, tmp_path: Path
) -> None:
    """A sandbox host that took the provisioning and works on it past ``provision_wait_s``
    (then fails it) is not mistaken for a dead fleet."""
    busy_s = 6.0

    @activity.defn(name="provision_runtime")
    async def slow_provision(input: ProvisionRuntimeInput) -> ProvisionRuntimeOutput:
        deadline = time.monotonic() + busy_s
        while time.monotonic() < deadline:
            activity.heartbeat()
            await asyncio.sleep(0.5)
        raise ApplicationError("no runtime today", non_retryable=True)

    async with fleets_in_namespace(temporal_server.address, tmp_path, sandbox=False) as rig:
        # one slot: while it provisions, the host does not poll (its last poll ages past
        # the wait), as a full sandbox host does; it beats in the fleet registry as every
        # sandbox worker process does
        host = HostCapabilities(fleet="sandbox", host_id="slow-host", instance_id="slow-1")
        await publish(rig.client, host)
        beating = asyncio.create_task(beat(rig.client, host, 1.0))
        async with Worker(
            rig.client,
            task_queue=task_queues.SANDBOX,
            activities=[slow_provision],
            max_concurrent_activities=1,
        ):
            handle = await RolloutClient(rig.client).submit(
                shell_task(
                    f"slowprov-{uuid.uuid4().hex[:6]}", "true", phases={"provision_wait_s": 2}
                ),
                check_capabilities=False,
            )
            [session] = (await asyncio.wait_for(handle.result(), timeout=60)).sessions
        beating.cancel()
    assert session.status == SessionStatus.FAILED
    assert "no runtime today" in (session.error or ""), session.error
    # a provisioning error that says a new attempt would fail again is not retryable
    assert session.failure is not None and session.failure.kind == "sandbox"
    assert not session.failure.retryable and session.reward is None


async def test_a_runtime_provisioned_after_its_session_was_cancelled_is_torn_down(
    temporal_server, tmp_path: Path
) -> None:
    """A host finishes a provisioning after the session was cancelled (the cancel reached it
    while its runtime was starting): the session waits for that answer and tears the runtime
    down on the host's own queue, instead of leaving it running. The host is a test worker
    on the real queues (a real runtime cannot be made to finish after its cancel on cue)."""
    started, torn = asyncio.Event(), []

    @activity.defn(name="provision_runtime")
    async def late_provision(input: ProvisionRuntimeInput) -> ProvisionRuntimeOutput:
        started.set()
        try:
            while True:
                activity.heartbeat()
                await asyncio.sleep(0.3)
        except asyncio.CancelledError:
            await asyncio.sleep(1)  # the runtime comes up after all
        return ProvisionRuntimeOutput(
            runtime_id=f"late-{input.session_id}",
            host_id="late-host",
            host_queue=task_queues.host_queue("sandbox", "late-host"),
            workdir=str(tmp_path),
        )

    @activity.defn(name="teardown_runtime")
    async def teardown(input: TeardownRuntimeInput) -> TeardownRuntimeOutput:
        torn.append(input.runtime_id)
        return TeardownRuntimeOutput(found=True)

    async with fleets_in_namespace(temporal_server.address, tmp_path, sandbox=False) as rig:
        async with (
            Worker(rig.client, task_queue=task_queues.SANDBOX, activities=[late_provision]),
            Worker(
                rig.client,
                task_queue=task_queues.host_queue("sandbox", "late-host"),
                activities=[teardown],
            ),
        ):
            handle = await RolloutClient(rig.client).submit(
                shell_task(f"late-{uuid.uuid4().hex[:6]}", "true"), check_capabilities=False
            )
            await asyncio.wait_for(started.wait(), timeout=60)
            session_handle = rig.client.get_workflow_handle(  # type: ignore[attr-defined]
                f"task/{handle.task_id}/0", result_type=SessionResult
            )
            await handle.cancel()
            session = await asyncio.wait_for(session_handle.result(), timeout=60)
            history = await session_handle.fetch_history()
    assert session.status == SessionStatus.CANCELLED
    assert torn == [f"late-{handle.task_id}/0"], torn
    await Replayer(
        workflows=[RolloutSessionWorkflow], data_converter=data_converter()
    ).replay_workflow(history)
