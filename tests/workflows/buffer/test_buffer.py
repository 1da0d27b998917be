"""RolloutBufferWorkflow on real parts: Temporal dev server, the four fleets, shell tasks in
the local runtime whose rewards the test controls (no model calls).

Covers: a JSONL source read in chunks, DAPO zero-variance drops, staleness drops after the
policy version moves, tasks still running carried into the next step, cancel_surplus, lease
expiry and re-offer, idempotent and unknown acks.
"""

from __future__ import annotations

import json
import uuid

import pytest
from temporalio.client import WorkflowUpdateFailedError

from rolloutd.scoring import scored_rewards
from rolloutd.trainer_client import BufferExhaustedError, RolloutClient
from tests.support.buffer_tasks import all_win, first_wins, local_task, poll

pytestmark = [pytest.mark.temporal, pytest.mark.engine]


def rewards(batch) -> list[list[float]]:
    return [[s.reward for s in g.group.sessions] for g in batch.groups]


async def test_zero_variance_and_stale_groups_drop_running_tasks_carry_over(fleets, tmp_path):
    u = uuid.uuid4().hex[:6]
    gate_c, gate_e = tmp_path / "go-c", tmp_path / "go-e"
    rows = [
        local_task(f"a-{u}", all_win()),  # zero variance
        local_task(f"b-{u}", first_wins(tmp_path / "b")),  # mixed, fast
        local_task(f"c-{u}", first_wins(tmp_path / "c", gate_c)),  # mixed, gated
        local_task(f"e-{u}", first_wins(tmp_path / "e", gate_e)),  # mixed, gated
    ]
    source = tmp_path / "tasks.jsonl"
    source.write_text("# a comment line\n" + "\n".join(json.dumps(r) for r in rows) + "\n")
    client = RolloutClient(fleets.client)
    buffer = await client.create_buffer(
        {
            "buffer_id": f"buf-{u}",
            "num_in_flight": 4,
            "num_samples": 4,
            "max_staleness": 1,
            "source": {"type": "jsonl", "path": str(source), "chunk_size": 3},
        }
    )
    try:
        # step 0: the first informative group is B; A's all-equal group was dropped
        batch = await buffer.take(1, timeout_s=120)
        assert [g.group.task_id for g in batch.groups] == [f"b-{u}"]
        assert sorted(rewards(batch)[0]) == [0.0, 0.0, 0.0, 1.0]
        assert batch.groups[0].policy_version == 0
        # C and E are still running after the hand-out: they carry into the next step (E may
        # start after the take: staleness admission holds 2 groups ready or running here)
        stats = await poll(
            buffer.stats,
            lambda s: any(d.task_id == f"a-{u}" for d in s.dropped) and len(s.running) == 2,
            what="A dropped, C and E running",
        )
        assert [(d.task_id, d.reason) for d in stats.dropped] == [(f"a-{u}", "zero_variance")]
        assert {r.task_id for r in stats.running} == {f"c-{u}", f"e-{u}"}
        assert stats.source_exhausted and stats.state_counters["cursor"] == 4
        assert (await buffer.ack(batch.batch_id)).num_groups == 1

        # step 1: policy moves to 1; C (started at 0) finishes and is 1 version old: kept
        await buffer.set_policy_version(1)
        gate_c.touch()
        batch = await buffer.take(1, timeout_s=120)
        assert [g.group.task_id for g in batch.groups] == [f"c-{u}"]
        assert batch.groups[0].policy_version == 0 and batch.policy_version == 1
        await buffer.ack(batch.batch_id)

        # step 2: policy moves to 2; E (started at 0) is 2 versions old when it ends: dropped
        await buffer.set_policy_version(2)
        gate_e.touch()
        stats = await poll(
            buffer.stats,
            lambda s: any(d.task_id == f"e-{u}" for d in s.dropped),
            timeout_s=120,
            what="E dropped",
        )
        assert ("e-" + u, "stale") in [(d.task_id, d.reason) for d in stats.dropped]
        assert stats.num_ready == 0 and not stats.running
        assert stats.state_counters["num_dropped_stale"] == 1
        assert stats.state_counters["num_dropped_zero_variance"] == 1
        assert stats.state_counters["num_groups_acked"] == 2
        with pytest.raises(BufferExhaustedError):
            await buffer.take(1, timeout_s=30)
    finally:
        gate_c.touch()
        gate_e.touch()
        await buffer.close()


async def test_lease_expiry_reoffers_the_same_batch_and_acks_are_exactly_once(fleets, tmp_path):
    u = uuid.uuid4().hex[:6]
    client = RolloutClient(fleets.client)
    buffer = await client.create_buffer(
        {"buffer_id": f"lease-{u}", "num_in_flight": 2, "num_samples": 2, "lease_s": 600}
    )
    try:
        await buffer.push([local_task(f"m0-{u}", first_wins(tmp_path / "m0"))])
        first = await buffer.take(1, lease_s=1.0, timeout_s=120)
        # not acked: after its 1 s lease the very same batch comes back
        again = await buffer.take(1, timeout_s=60)
        assert again.batch_id == first.batch_id and again.num_offers == 2
        assert [g.group.task_id for g in again.groups] == [g.group.task_id for g in first.groups]
        assert (await buffer.ack(again.batch_id)).num_groups == 1
        assert (await buffer.ack(again.batch_id)).already_acked
        with pytest.raises(WorkflowUpdateFailedError):
            await buffer.ack(f"lease-{u}/batch/999")
        await buffer.push([local_task(f"m1-{u}", first_wins(tmp_path / "m1"))])
        second = await buffer.take(1, timeout_s=120)
        assert second.batch_id != first.batch_id
        assert second.groups[0].group.task_id != first.groups[0].group.task_id
        await buffer.ack(second.batch_id)
        stats = await buffer.stats()
        assert stats.state_counters["num_groups_acked"] == 2 and not stats.leased_batch_ids
    finally:
        await buffer.close()


async def test_cancel_surplus_stops_running_tasks_when_a_batch_is_handed_out(fleets, tmp_path):
    u = uuid.uuid4().hex[:6]
    client = RolloutClient(fleets.client)
    buffer = await client.create_buffer(
        {"buffer_id": f"surplus-{u}", "num_in_flight": 2, "num_samples": 2, "cancel_surplus": True}
    )
    gate = tmp_path / "never"
    try:
        await buffer.push(
            [
                local_task(f"fast-{u}", first_wins(tmp_path / "f")),
                local_task(f"slow-{u}", first_wins(tmp_path / "s", gate)),
            ]
        )
        batch = await buffer.take(1, timeout_s=120)
        assert batch.groups[0].group.task_id == f"fast-{u}"
        stats = await poll(
            buffer.stats,
            lambda s: s.state_counters["num_cancelled"] == 1,
            what="slow task cancelled",
        )
        assert (f"slow-{u}", "cancelled") in [(d.task_id, d.reason) for d in stats.dropped]
        slow = client.get_handle(f"slow-{u}")
        await poll(
            slow.describe,
            lambda d: d.status is not None and d.status.name != "RUNNING",
            what="slow task ended",
        )
    finally:
        gate.touch()
        await buffer.close()


def incomplete_task(task_id: str, folder) -> dict:
    """Three samples, the first provisioning fails, no replacement: two scored sessions, one
    winning (a mixed, incomplete group)."""
    task = local_task(task_id, first_wins(folder))
    task["runtime"]["prepare"] = [
        {
            "type": "exec",
            "command": f"mkdir -p {folder}; mkdir {folder}/failed 2>/dev/null && exit 1; true",
        }
    ]
    return {**task, "num_samples": 3, "max_replacements": 0}


async def test_an_incomplete_group_is_handed_out_or_dropped_as_configured(fleets, tmp_path):
    u = uuid.uuid4().hex[:6]
    client = RolloutClient(fleets.client)
    keep = await client.create_buffer({"buffer_id": f"keep-{u}"})
    drop = await client.create_buffer({"buffer_id": f"drop-{u}", "incomplete_groups": "drop"})
    try:
        # a pushed task's tenant is in its workflow's memo, as for a task a client submits
        await keep.push([{**incomplete_task(f"k-{u}", tmp_path / "k"), "tenant": "team-k"}])
        await drop.push([incomplete_task(f"d-{u}", tmp_path / "d")])
        batch = await keep.take(1, timeout_s=120)
        [group] = [g.group for g in batch.groups]
        assert (group.incomplete, group.num_scored, sorted(scored_rewards(group))) == (
            True,
            2,
            [0.0, 1.0],
        )
        assert await client.task_tenant(f"k-{u}") == "team-k"
        stats = await poll(drop.stats, lambda s: bool(s.dropped), what="the group dropped")
        assert [(d.task_id, d.reason) for d in stats.dropped] == [(f"d-{u}", "incomplete")]
        assert stats.state_counters["num_dropped_incomplete"] == 1
        for buffer in (keep, drop):
            assert sum((await buffer.stats()).num_failed_by_kind.values()) == 1
    finally:
        await keep.close()
        await drop.close()


async def test_staleness_admission_starts_no_task_that_would_go_stale(fleets, tmp_path):
    """With ``max_staleness`` 0 and batches of 1 group, once the trainer has taken a batch the
    buffer holds at most one group ready or running (AReaL's staleness control): one task at a
    time starts, and after the policy moves the batch it gives was sampled by the new policy.
    Without admission, every pushed task starts whatever the trainer does."""
    u = uuid.uuid4().hex[:6]
    client = RolloutClient(fleets.client)
    tasks = [local_task(f"s{i}-{u}", first_wins(tmp_path / f"s{i}")) for i in range(6)]
    buffer = await client.create_buffer(
        {"buffer_id": f"adm-{u}", "num_in_flight": 4, "num_samples": 2, "max_staleness": 0}
    )
    try:
        await buffer.push(tasks)
        batch = await buffer.take(1, timeout_s=120)
        assert batch.groups[0].policy_version == 0
        await buffer.ack(batch.batch_id)
        await buffer.set_policy_version(1)
        # the take set the bound to 1 group: one more task started at version 0 (its group is
        # dropped as stale once the policy moves), then one at version 1
        stats = await poll(
            buffer.stats,
            lambda s: s.num_ready == 1 and not s.running,
            timeout_s=120,
            what="one version-1 group ready",
        )
        assert stats.state_counters["num_started"] == 3, stats.state_counters
        assert stats.num_pending == 3 and stats.state_counters["batch_groups"] == 1
        assert stats.state_counters["num_dropped_stale"] == 1
        batch = await buffer.take(1, timeout_s=60)
        assert batch.groups[0].policy_version == 1 and batch.policy_version == 1
        await buffer.ack(batch.batch_id)
    finally:
        await buffer.close()

    free = await client.create_buffer(
        {
            "buffer_id": f"free-{u}",
            "num_in_flight": 4,
            "num_samples": 2,
            "max_staleness": 0,
            "staleness_admission": False,
        }
    )
    try:
        await free.push([{**t, "task_id": "f" + t["task_id"]} for t in tasks])
        batch = await free.take(1, timeout_s=120)
        await free.ack(batch.batch_id)
        stats = await poll(
            free.stats,
            lambda s: s.state_counters["num_started"] == 6,
            timeout_s=120,
            what="every pushed task started",
        )
        assert stats.num_pending == 0
    finally:
        await free.close()
