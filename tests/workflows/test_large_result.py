"""A large group is returned by reference: the task workflow stores the group in the blob
store and returns its summary with the key; rolloutd's readers load the whole group. Real
Temporal, the real four fleets (the fleets fixture), shell harnesses in local runtimes.

1,024 sessions' results come to about 2.1 MB, over Temporal's 2 MB payload limit: returned
inline, the task's last workflow task fails on every attempt and the task never completes.
Here the task's inline limit is lowered to 1 KiB so that 6 sessions (about 2 KiB each) are
over it.
"""

from __future__ import annotations

import uuid

import httpx
import pytest

from rolloutd.rest import create_app
from rolloutd.store import BlobStore
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import SessionStatus, TaskResult, group_key
from rolloutd.workflows.task import task_workflow_id

pytestmark = [pytest.mark.temporal, pytest.mark.engine]

NUM_SAMPLES = 6
INLINE_BYTES = 1024


def small_limit_task(task_id: str) -> dict:
    return {
        "task_id": task_id,
        "instruction": "echo",
        "num_samples": NUM_SAMPLES,
        "harness": {"type": "shell", "command": "echo hello"},
        "runtime": {"type": "local"},
        "evaluator": {"type": "session_completed"},
        "timeout_s": 300,
        "inline_result_bytes": INLINE_BYTES,
    }


@pytest.mark.timeout(600)
async def test_a_group_over_the_inline_limit_is_returned_by_reference(fleets) -> None:
    store = BlobStore(fleets.store_url)
    client = RolloutClient(fleets.client, store)
    task_id = f"bigres-{uuid.uuid4().hex[:6]}"
    group = await (await client.submit(small_limit_task(task_id))).result()

    # the workflow's own result: the summary and the key, no session
    raw = fleets.client.get_workflow_handle(task_workflow_id(task_id), result_type=TaskResult)
    own = await raw.result()
    assert own.stored_key == group_key(task_id)
    assert own.sessions == [] and own.replaced == []
    assert own.num_sessions == NUM_SAMPLES and own.num_completed == NUM_SAMPLES
    assert own.mean_reward == 1.0 and own.max_reward == 1.0
    assert len(own.model_dump_json()) < INLINE_BYTES

    # the handle, the client by id and the stored group: every session
    assert [s.sample_index for s in group.sessions] == list(range(NUM_SAMPLES))
    assert {s.status for s in group.sessions} == {SessionStatus.COMPLETED}
    assert len(group.model_dump_json()) > INLINE_BYTES
    assert group.stored_key == ""
    assert (await client.result(task_id)).sessions == group.sessions
    assert store.get_model(group_key(task_id), TaskResult).sessions == group.sessions
    status = await client.status(task_id)
    assert status.status == "completed" and len(status.sessions) == NUM_SAMPLES
    assert status.result is not None and len(status.result.sessions) == NUM_SAMPLES

    # the REST facade: every session's result
    app = create_app(client)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://facade"
    ) as http:
        body = (await http.get(f"/rollout/task/{task_id}")).json()
    assert body["status"] == "completed"
    assert body["total_sessions"] == NUM_SAMPLES
    assert len(body["results"]) == NUM_SAMPLES

    # a client without the blob store says what it needs instead of an empty group
    with pytest.raises(Exception, match="blob store"):
        await RolloutClient(fleets.client).result(task_id)

    # a small group is still returned inline
    small_id = f"smallres-{uuid.uuid4().hex[:6]}"
    small = {**small_limit_task(small_id), "num_samples": 1, "inline_result_bytes": 1024 * 1024}
    await (await client.submit(small)).result()
    inline = await fleets.client.get_workflow_handle(
        task_workflow_id(small_id), result_type=TaskResult
    ).result()
    assert inline.stored_key == "" and len(inline.sessions) == 1
    assert not store.exists(group_key(small_id))


def test_group_parts_keep_every_session_in_order_under_the_limit() -> None:
    from rolloutd.types import SessionResult
    from rolloutd.workflows.task import group_parts, summarize

    sessions = [
        SessionResult(
            session_id=f"t/{i}",
            task_id="t",
            sample_index=i,
            status=SessionStatus.FAILED,
            error="e" * 300,
        )
        for i in range(10)
    ]
    replaced = [
        SessionResult(
            session_id="t/3/r0", task_id="t", sample_index=3, status=SessionStatus.FAILED, error="x"
        )
    ]
    group = summarize("t", sessions, replaced=replaced)
    parts = group_parts(group, 4096)
    assert len(parts) > 1
    assert [s for p in parts for s in p.sessions] == group.sessions
    assert [s for p in parts for s in p.replaced] == replaced
    assert [p.key for p in parts] == [f"groups/t/part-{n}.json" for n in range(len(parts))]
    for part in parts:
        members = [*part.sessions, *part.replaced]
        # a session larger than the limit alone is a part of its own
        assert len(members) == 1 or sum(len(s.model_dump_json()) for s in members) <= 4096
