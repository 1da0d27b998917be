"""A running task's ``status`` query answers a page of its ended sessions at a time, and the
client reads every page: real Temporal, the in-process fleets, shell harnesses in the local
runtime (no model calls)."""

from __future__ import annotations

import uuid

import pytest

from rolloutd.trainer_client import RolloutClient
from rolloutd.trainer_client.task_status import query_status
from rolloutd.types import StatusPage, TaskProgress
from rolloutd.workflows.task import STATUS_QUERY, task_workflow_id
from tests.support.buffer_tasks import local_task, poll
from tests.support.garbage_fleets import fleets_in_namespace

pytestmark = [pytest.mark.temporal]


@pytest.mark.timeout(300)
async def test_a_running_tasks_ended_sessions_are_read_a_page_at_a_time(temporal_server, tmp_path):
    u = uuid.uuid4().hex[:6]
    lock, release = tmp_path / f"lock-{u}", tmp_path / f"release-{u}"
    # the first session to take the lock waits for the test; the other five end at once
    command = (
        f"if mkdir {lock} 2>/dev/null; then while [ ! -e {release} ]; do sleep 0.1; done; fi; "
        "touch won"
    )
    async with fleets_in_namespace(temporal_server.address, tmp_path, sandbox=True) as rig:
        client = RolloutClient(rig.client)
        task_id = f"pages-{u}"
        handle = await client.submit({**local_task(task_id, command), "num_samples": 6})
        whole = await poll(
            lambda: client.status(task_id),
            lambda p: len(p.sessions) == 5,
            timeout_s=180,
            what="five sessions ended",
        )
        assert whole.status == "running" and whole.num_ended is None
        workflow = rig.client.get_workflow_handle(task_workflow_id(task_id))
        # one page of two: the counts say there are more
        first = await workflow.query(STATUS_QUERY, StatusPage(limit=2), result_type=TaskProgress)
        assert (len(first.sessions), first.num_ended, first.num_replaced) == (2, 5, 0)
        after = await workflow.query(
            STATUS_QUERY,
            StatusPage(first_sample=first.sessions[-1].sample_index + 1, limit=2),
            result_type=TaskProgress,
        )
        assert after.sessions[0].sample_index > first.sessions[-1].sample_index
        # pages of one, two and the default read the same five sessions, in order
        for size in (1, 2, None):
            paged = await query_status(workflow, page_size=size)
            assert paged is not None and paged.num_ended is None
            assert [s.session_id for s in paged.sessions] == [s.session_id for s in whole.sessions]
            assert [s.sample_index for s in paged.sessions] == sorted(
                s.sample_index for s in paged.sessions
            )
        release.touch()
        result = await handle.result()
        assert [s.reward for s in result.sessions] == [1.0] * 6
