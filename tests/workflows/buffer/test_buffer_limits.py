"""The buffer stays inside Temporal's limits with lowered thresholds (the real counts take
hours: the 500 x 8 run is ``benchmarks/buffer_scale.py``): real Temporal, the four fleets,
shell tasks in the local runtime.

- it holds groups by reference: no payload of its histories passes 1 MB (printed with each
  run's history size), and it continues as new after ``max_starts_per_run`` starts;
- tasks terminated or cancelled from outside never report their group: their running slots
  are freed by asking Temporal (``reap_every_s``), and the buffer goes on filling;
- what waits is bounded: no task starts while ``max_ready`` groups wait; a push past
  ``max_pushed`` is refused.
"""

from __future__ import annotations

import uuid

import pytest
from temporalio.client import WorkflowUpdateFailedError

from rolloutd.store import BlobStore
from rolloutd.trainer_client import RolloutClient
from rolloutd.workflows.buffer.models import BufferConfig, BufferState, RunningTask
from rolloutd.workflows.task import task_workflow_id
from tests.support.buffer_tasks import all_win, local_task, poll

pytestmark = [pytest.mark.temporal, pytest.mark.engine]

MB = 1024 * 1024


async def histories(client, workflow_id: str) -> list[tuple[int, int, int]]:
    """(events, bytes, largest event in bytes) of every run of a workflow, oldest first."""
    runs = []
    async for execution in client.list_workflows(f"WorkflowId = '{workflow_id}'"):
        history = await client.get_workflow_handle(
            workflow_id, run_id=execution.run_id
        ).fetch_history()
        sizes = [e.ByteSize() for e in history.events]
        runs.append((len(sizes), sum(sizes), max(sizes)))
    return runs[::-1]


def slow_task(task_id: str, gate) -> dict:
    """A one-session task that waits for the test's ``gate`` file, then wins."""
    return local_task(task_id, f"while [ ! -e {gate} ]; do sleep 0.1; done; touch won")


@pytest.mark.timeout(600)
async def test_ended_tasks_free_their_slots_and_runs_continue_as_new(fleets, tmp_path):
    u = uuid.uuid4().hex[:6]
    gate = tmp_path / "go"
    client = RolloutClient(fleets.client, BlobStore(fleets.store_url))
    buffer = await client.create_buffer(
        {
            "buffer_id": f"lim-{u}",
            "num_in_flight": 4,
            "num_samples": 2,
            "drop_zero_variance": False,
            "reap_every_s": 1,
            "max_starts_per_run": 5,
        }
    )
    await buffer.push([slow_task(f"lim-{u}-{i}", gate) for i in range(12)])
    stats = await poll(buffer.stats, lambda s: len(s.running) == 4, what="4 tasks running")
    killed = [r.workflow_id for r in stats.running[:3]]
    await fleets.client.get_workflow_handle(killed[0]).terminate("from outside")
    await fleets.client.get_workflow_handle(killed[1]).terminate("from outside")
    await fleets.client.get_workflow_handle(killed[2]).cancel()
    # the three slots come back; the buffer starts three more
    stats = await poll(
        buffer.stats,
        lambda s: s.state_counters.get("num_reaped", 0) == 3 and len(s.running) == 4,
        timeout_s=120,
        what="the ended tasks reaped and their slots refilled",
    )
    assert not {r.workflow_id for r in stats.running} & set(killed)
    gate.touch()
    groups = []
    while len(groups) < 9:
        batch = await buffer.take(3, timeout_s=180)
        await buffer.ack(batch.batch_id)
        groups += [g.group for g in batch.groups]
    assert all(g is not None and len(g.sessions) == 2 for g in groups)
    assert {g.task_id for g in groups} == {f"lim-{u}-{i}" for i in range(12)} - {
        k.removeprefix("task/") for k in killed
    }
    summary = await buffer.close()
    assert summary.state.num_reaped == 3 and summary.state.num_runs >= 3
    runs = await histories(fleets.client, f"buffer/lim-{u}")
    print(f"\nbuffer lim-{u}: {len(runs)} runs (12 starts, 5 a run), 3 tasks reaped")
    for i, (events, size, largest) in enumerate(runs):
        print(f"  run {i + 1}: {events} events, {size / 1024:.1f} KiB, largest {largest} bytes")
    assert max(largest for _, _, largest in runs) < MB


@pytest.mark.timeout(600)
async def test_ready_groups_hold_the_fill_back_and_pushes_are_bounded(fleets, tmp_path):
    u = uuid.uuid4().hex[:6]
    client = RolloutClient(fleets.client)  # no store: take reads each task's result
    buffer = await client.create_buffer(
        {
            "buffer_id": f"bound-{u}",
            "num_in_flight": 4,
            "num_samples": 1,
            "drop_zero_variance": False,
            "max_ready": 2,
            "max_pushed": 6,
        }
    )
    await buffer.push([local_task(f"bound-{u}-{i}", all_win()) for i in range(6)])
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await buffer.push([local_task(f"bound-{u}-x{i}", all_win()) for i in range(5)])
    assert "max_pushed (6)" in str(refused.value.cause), refused.value.cause
    # tasks start while fewer than 2 groups wait; once 2 or more wait, nothing starts: the
    # buffer settles with nothing running, groups waiting and pushed tasks left
    stats = await poll(
        buffer.stats,
        lambda s: not s.running and s.num_ready >= 2,
        timeout_s=120,
        what="the fill held back by waiting groups",
    )
    num_started = stats.state_counters["num_started"]
    assert num_started + stats.num_pending == 6 and stats.num_pending >= 1, stats
    # a ready group only ever held the fill back: every start came while fewer than 2 waited
    assert stats.num_ready <= 2 + 4 - 1
    batch = await buffer.take(stats.num_ready, timeout_s=60)
    assert all(g.group is not None and g.group.task_id == g.ref.task_id for g in batch.groups)
    await buffer.ack(batch.batch_id)
    # taken: the rest start
    stats = await poll(
        buffer.stats,
        lambda s: s.state_counters["num_started"] == 6 and not s.running,
        timeout_s=120,
        what="the rest started and finished",
    )
    assert stats.num_pending == 0
    await buffer.close()


async def test_pushed_tasks_are_bounded_in_bytes_and_pushed_in_small_updates(
    fleets, tmp_path, monkeypatch
):
    from rolloutd.trainer_client import buffer as buffer_module
    from rolloutd.types import TaskRequest

    u = uuid.uuid4().hex[:6]
    gate = tmp_path / "go"

    def long_task(i: int) -> dict:
        # ~2 KB of instruction: such tasks, 2,048 of them, would pass the 2 MB payload limit
        return {**local_task(f"bytes-{u}-{i}", "touch won"), "instruction": "x" * 2000}

    size = len(TaskRequest.model_validate(long_task(0)).model_dump_json())
    client = RolloutClient(fleets.client)
    buffer = await client.create_buffer(
        {
            "buffer_id": f"bytes-{u}",
            "num_in_flight": 1,
            "num_samples": 1,
            "drop_zero_variance": False,
            "max_pushed_bytes": 3 * size + size // 2,
        }
    )
    try:
        # the one slot runs a task that waits for the test: what is pushed next waits
        gated = local_task(f"bytes-{u}-gated", f"while [ ! -e {gate} ]; do sleep 0.1; done")
        await buffer.push([gated])
        await poll(buffer.stats, lambda s: len(s.running) == 1, what="the gated task running")
        # two tasks an update: the first update is queued, the second passes the bound
        monkeypatch.setattr(buffer_module, "PUSH_UPDATE_BYTES", 2 * size + 10)
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await buffer.push([long_task(i) for i in range(5)])
        assert "max_pushed_bytes" in str(refused.value.cause), refused.value.cause
        assert (await buffer.stats()).num_pending == 2
        assert await buffer.push([long_task(5)]) == 3  # within the bound still
        gate.touch()
        stats = await poll(
            buffer.stats,
            lambda s: s.state_counters["num_started"] == 4 and not s.running,
            timeout_s=120,
            what="the queued tasks started and finished",
        )
        assert stats.num_pending == 0
        # started tasks gave their bytes back: three fit again, in one update (were the four
        # started still counted, this push would be refused)
        monkeypatch.setattr(buffer_module, "PUSH_UPDATE_BYTES", 256 * 1024)
        await buffer.push([long_task(i) for i in (6, 7, 8)])
    finally:
        gate.touch()
        await buffer.close()


def test_ten_thousand_running_tasks_fit_one_continue_as_new_input() -> None:
    """The running list travels in every continue-as-new input: at the largest
    ``num_in_flight`` (10,000) and ids of 30 characters it stays near half a megabyte, so the
    pushed tasks' own bound (``max_pushed_bytes``) fits beside it under Temporal's 2 MB."""
    running = [
        RunningTask(task_id=f"swe-{uuid.uuid4().hex[:16]}-{i:09d}", policy_version=1234)
        for i in range(10_000)
    ]
    assert len(running[0].task_id) == 30
    assert running[0].workflow_id == task_workflow_id(running[0].task_id)
    size = len(BufferState(running=running).model_dump_json())
    print(f"10,000 running tasks: {size:,} bytes")
    assert size + BufferConfig(buffer_id="b").max_pushed_bytes < 2 * 2**20 - 256 * 2**10
