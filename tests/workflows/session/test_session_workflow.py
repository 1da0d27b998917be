"""Session and task workflows on real parts: Temporal dev server, gateway, llama-server, bwrap.

The harness here is the ``shell`` harness (a real process in a real sandbox), so phase
timeouts, cancellation and validation are checked without waiting on an agent.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.service import RPCError

from rolloutd.store import BlobStore, CompletionLog, artifact_key
from rolloutd.trainer_client import InvalidTaskError, RolloutClient
from rolloutd.trajectory import check_invariants
from rolloutd.types import SessionStatus
from tests.support.procs import processes_with

pytestmark = [pytest.mark.temporal, pytest.mark.engine, pytest.mark.sandbox]

CURL_ONE_CALL = (
    'curl -sS -f "$OPENAI_BASE_URL/chat/completions" -H "Authorization: Bearer $OPENAI_API_KEY" '
    "-H 'Content-Type: application/json' "
    '-d \'{"model": "m", "max_tokens": 8, '
    '"messages": [{"role": "user", "content": "Say hi"}]}\' > reply.json'
)


def shell_task(task_id: str, command: str, **overrides: object) -> dict:
    task: dict = {
        "task_id": task_id,
        "instruction": "test",
        "harness": {"type": "shell", "command": command},
        "runtime": {"type": "bwrap"},
    }
    task.update(overrides)
    return task


async def wait_phase(client, workflow_id: str, phase: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if await client.get_workflow_handle(workflow_id).query("phase") == phase:
                return
        except RPCError:
            pass
        await asyncio.sleep(0.2)
    raise AssertionError(f"{workflow_id} never reached phase {phase}")


async def test_malformed_task_is_refused_before_any_workflow_starts(fleets):
    client = RolloutClient(fleets.client)
    task_id = f"bad-{uuid.uuid4().hex[:6]}"
    with pytest.raises(InvalidTaskError) as info:
        await client.submit(shell_task(task_id, "true", num_samples=0))
    assert "num_samples" in str(info.value)
    with pytest.raises(InvalidTaskError) as info:
        await client.submit(
            {"task_id": task_id, "instruction": "x", "harness": {"type": "no-such-harness"}}
        )
    assert "harness.type" in str(info.value)
    with pytest.raises(InvalidTaskError) as info:
        await client.submit(
            {
                "task_id": "../escape",
                "instruction": "x",
                "harness": {"type": "shell", "command": "true"},
            }
        )
    assert "task_id" in str(info.value)
    with pytest.raises(RPCError):
        await client.get_handle(task_id).describe()


async def test_shell_session_records_scores_and_builds(fleets):
    client = RolloutClient(fleets.client, BlobStore(fleets.store_url))
    task_id = f"shell-{uuid.uuid4().hex[:6]}"
    handle = await client.submit(
        shell_task(
            task_id,
            CURL_ONE_CALL,
            num_samples=2,
            evaluator={"type": "test_on_output", "command": "test -s reply.json"},
        )
    )
    group = await handle.result()
    assert [s.status for s in group.sessions] == [SessionStatus.COMPLETED] * 2
    for session in group.sessions:
        assert session.reward == 1.0
        assert session.num_completions == 1
        trajectory = client.trajectory(session)
        completions = CompletionLog(client.store, session.session_id).read_all()
        check_invariants(trajectory.traces, completions)
        assert trajectory.reward == 1.0
        assert {p.phase for p in session.phases} >= {
            "open",
            "provision",
            "run",
            "teardown",
            "close",
            "build",
            "evaluate",
        }


async def test_run_phase_timeout_yields_timeout_and_what_was_captured(fleets):
    client = RolloutClient(fleets.client, BlobStore(fleets.store_url))
    marker = f"rolloutd-timeout-{uuid.uuid4().hex[:8]}"
    task_id = f"timeout-{uuid.uuid4().hex[:6]}"
    handle = await client.submit(
        shell_task(
            task_id,
            f"{CURL_ONE_CALL} && sleep 600; echo {marker}",
            phases={"run_s": 8},
        )
    )
    group = await handle.result()
    (session,) = group.sessions
    assert session.status == SessionStatus.TIMEOUT
    assert session.num_completions == 1
    trajectory = client.trajectory(session)
    assert trajectory.status == SessionStatus.TIMEOUT
    assert sum(len(t.completion_indices) for t in trajectory.traces) == 1
    assert processes_with(marker) == []


async def test_cancelling_a_task_ends_sessions_within_10_s_and_leaves_no_process(fleets):
    client = RolloutClient(fleets.client, BlobStore(fleets.store_url))
    marker = f"rolloutd-cancel-{uuid.uuid4().hex[:8]}"
    task_id = f"cancel-{uuid.uuid4().hex[:6]}"
    # a command after the sleep keeps the shell (and the marker in its command line) alive:
    # `sh -c "sleep 600 # marker"` may exec sleep and drop the marker
    handle = await client.submit(shell_task(task_id, f"sleep 600; echo {marker}", num_samples=2))
    for i in range(2):
        await wait_phase(fleets.client, f"task/{task_id}/{i}", "run")
    # phase "run" is set when the run is scheduled: the harness starts a moment later
    deadline = time.monotonic() + 30
    while len(processes_with(marker)) < 2:
        assert time.monotonic() < deadline, processes_with(marker)
        await asyncio.sleep(0.1)
    t0 = time.monotonic()
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    for i in range(2):
        child = fleets.client.get_workflow_handle(f"task/{task_id}/{i}")
        deadline = time.monotonic() + 10
        while (await child.describe()).status == WorkflowExecutionStatus.RUNNING:
            assert time.monotonic() < deadline, "session still running 10 s after cancel"
            await asyncio.sleep(0.1)
    elapsed = time.monotonic() - t0
    assert elapsed <= 10, elapsed
    assert processes_with(marker) == []


async def test_a_harness_over_its_memory_limit_is_oom_killed_and_reported(fleets):
    """``runtime.memory_mb`` is a memory cgroup: a harness allocating 512 MiB under a 128 MiB
    limit is killed by the kernel, and the session's ``harness`` artifact counts the kill."""
    client = RolloutClient(fleets.client, BlobStore(fleets.store_url))
    task_id = f"oom-{uuid.uuid4().hex[:6]}"
    handle = await client.submit(
        shell_task(
            task_id,
            "python3 -c 'b = bytearray(512 << 20); b[::4096] = b\"x\" * len(b[::4096])'",
            runtime={"type": "bwrap", "memory_mb": 128},
        )
    )
    [session] = (await handle.result()).sessions
    assert session.harness_exit_code not in (0, None)
    harness = client.store.get_json(artifact_key(session.session_id, "harness"))
    assert harness["num_oom_kills"] >= 1, harness


async def test_a_failed_model_call_is_counted_in_the_session_result(fleets):
    """A call the gateway cannot serve (a prompt longer than the model's context) is answered
    with an error and counted in ``SessionResult.num_call_errors``; nothing enters the log. The
    refusal was the task's (no call answered, so nothing of the policy was measured): the
    session gets no reward, a cause naming the refusal, and is not retried."""
    client = RolloutClient(fleets.client, BlobStore(fleets.store_url))
    task_id = f"callerr-{uuid.uuid4().hex[:6]}"
    make_body = (
        "python3 -c \"import json; print(json.dumps({'model': 'm', 'max_tokens': 8, "
        "'messages': [{'role': 'user', 'content': 'hello ' * 40000}]}))\" > big.json"
    )
    post = (
        "curl -sS -o answer.json -w '%{http_code}' \"$OPENAI_BASE_URL/chat/completions\" "
        "-H \"Authorization: Bearer $OPENAI_API_KEY\" -H 'Content-Type: application/json' "
        "-d @big.json > status.txt"
    )
    handle = await client.submit(
        shell_task(
            task_id,
            f"{make_body} && {post}",
            evaluator={
                "type": "test_on_output",
                "command": "cat status.txt",
                "expected_output": "400",
            },
        )
    )
    group = await handle.result()
    [session] = group.sessions
    assert session.status == SessionStatus.FAILED, session.error
    assert session.reward is None
    assert session.failure is not None and not session.failure.retryable, session.failure
    assert "refused its call (400 ContextLengthError" in session.failure.message
    assert not group.replaced  # a refusal is final: a replacement would be refused again
    assert session.num_call_errors == 1 and session.num_completions == 0
