"""A large task request is stored once and its sessions take its key: the task's history
holds the request once, not once per child. Real Temporal, the real four fleets (the fleets
fixture), shell harnesses in local runtimes.

Copied into every child's input, 1,024 samples of a 50 KB instruction put 1,024 x 50 KB =
51 MB into the task's history, past Temporal's 50 MB limit (the task is terminated). Here 16
samples of a 50 KB instruction: the history's size per child is measured and printed, with
what 1,024 samples would come to. The 1,024-sample run itself is the acceptance test
``test_1024_samples_of_a_50_kb_instruction``.
"""

from __future__ import annotations

import uuid

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.worker import Replayer

from rolloutd.security.connection import data_converter
from rolloutd.store import BlobStore
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import SessionStatus, TaskResult
from rolloutd.workflows.task import INLINE_REQUEST_BYTES, RolloutTaskWorkflow

pytestmark = [pytest.mark.temporal, pytest.mark.engine]

#: Temporal's history size limit, bytes (docs.temporal.io/cloud/limits)
HISTORY_LIMIT = 50 * 1024 * 1024
INSTRUCTION_BYTES = 50 * 1024


def big_task(task_id: str, num_samples: int) -> dict:
    return {
        "task_id": task_id,
        "instruction": "x" * INSTRUCTION_BYTES,
        "num_samples": num_samples,
        "harness": {"type": "shell", "command": "true"},
        "runtime": {"type": "local"},
        "evaluator": {"type": "session_completed"},
        "timeout_s": 300,
    }


async def task_history(client, task_id: str) -> tuple[int, int, list[int]]:
    """(events, bytes, each child's start payload in bytes) of a task's history."""
    history = await client.get_workflow_handle(f"task/{task_id}").fetch_history()
    children = [
        e.start_child_workflow_execution_initiated_event_attributes.input.ByteSize()
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    ]
    return len(history.events), sum(e.ByteSize() for e in history.events), children


@pytest.mark.timeout(600)
async def test_a_large_request_is_stored_once_and_each_child_takes_its_key(fleets) -> None:
    client = RolloutClient(fleets.client, BlobStore(fleets.store_url))
    task_id = f"big-{uuid.uuid4().hex[:6]}"
    group = await (await client.submit(big_task(task_id, 16))).result()
    assert [s.status for s in group.sessions] == [SessionStatus.COMPLETED] * 16
    events, size, children = await task_history(fleets.client, task_id)
    per_child = (size - INSTRUCTION_BYTES) / 16
    projected = INSTRUCTION_BYTES + 1024 * per_child
    print(
        f"\n16 samples of a {INSTRUCTION_BYTES // 1024} KB instruction: task history {events} "
        f"events, {size / 1024:.0f} KiB; child inputs {min(children)}-{max(children)} bytes; "
        f"about {per_child / 1024:.1f} KiB of history per child, so 1,024 samples come to "
        f"about {projected / 2**20:.1f} MiB (limit 50 MiB; copied, the inputs alone were 51 MB)"
    )
    assert len(children) == 16 and max(children) < INLINE_REQUEST_BYTES
    assert projected < HISTORY_LIMIT / 5
    stored = BlobStore(fleets.store_url).get_json(f"tasks/{task_id}/request.json")
    assert len(stored["instruction"]) == INSTRUCTION_BYTES
    # a small request is still copied inline (no activity, no store read)
    small_id = f"small-{uuid.uuid4().hex[:6]}"
    small = await (await client.submit({**big_task(small_id, 1), "instruction": "short"})).result()
    assert small.sessions[0].status == SessionStatus.COMPLETED
    assert not BlobStore(fleets.store_url).exists(f"tasks/{small_id}/request.json")


@pytest.mark.acceptance
@pytest.mark.timeout(3600)
async def test_1024_samples_of_a_50_kb_instruction(fleets) -> None:
    """1,024 samples of a 50 KB instruction run to the end, the task's history stays far
    under Temporal's 50 MB limit (measured and printed), and the group of 1,024 results
    (about 2.1 MB, over Temporal's 2 MB payload limit) completes the task by reference: the
    workflow's own result holds its key, the handle returns every session. About 33 minutes
    on a loaded 2-core machine (1,024 shell sessions on the fixture's 8-runtime host)."""
    client = RolloutClient(fleets.client, BlobStore(fleets.store_url))
    task_id = f"big1024-{uuid.uuid4().hex[:6]}"
    group = await (await client.submit(big_task(task_id, 1024))).result()
    events, size, children = await task_history(fleets.client, task_id)
    print(
        f"\n1,024 samples of a {INSTRUCTION_BYTES // 1024} KB instruction: "
        f"{group.num_completed} completed; task history {events} events, "
        f"{size / 2**20:.1f} MiB; child inputs at most {max(children)} bytes"
    )
    assert group.num_completed == 1024 and len(group.sessions) == 1024
    own = await fleets.client.get_workflow_handle(
        f"task/{task_id}", result_type=TaskResult
    ).result()
    assert own.stored_key and own.sessions == [] and own.num_sessions == 1024
    assert size < HISTORY_LIMIT / 4
    # its children started 128 a workflow task, with a timer between: the history replays
    history = await fleets.client.get_workflow_handle(f"task/{task_id}").fetch_history()
    await Replayer(
        workflows=[RolloutTaskWorkflow], data_converter=data_converter()
    ).replay_workflow(history)
