"""``rolloutd store gc`` on real parts (Temporal dev server, the four fleets, shell tasks in the
local runtime): it deletes what is older than the retention, and never a running task's
sessions (their logs are open) nor a group a buffer has not had acknowledged. Ages are made
by setting the local store's file times back two days."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import pytest

from rolloutd.cli import main as cli_main
from rolloutd.cli.retention import gc
from rolloutd.store import BlobStore
from rolloutd.trainer_client import RolloutClient
from tests.support.buffer_tasks import all_win, local_task, poll

pytestmark = [pytest.mark.temporal, pytest.mark.engine]

DAY = 86_400


def age(root: Path, tag: str, seconds: float) -> None:
    """Set every file of this test's units (their names hold ``tag``) back by ``seconds``;
    other tests' objects in the shared store stay young, so they are kept."""
    then = time.time() - seconds
    for prefix in ("sessions", "groups", "tasks", "reverify"):
        for folder, _, files in os.walk(root / prefix):
            for name in files:
                path = Path(folder) / name
                if tag in str(path.relative_to(root)):
                    os.utime(path, (then, then))


@pytest.mark.timeout(600)
async def test_gc_deletes_old_units_but_not_running_tasks_or_unacked_groups(
    fleets, temporal_server, tmp_path
):
    u = uuid.uuid4().hex[:6]
    store = BlobStore(fleets.store_url)
    root = Path(fleets.store_url)
    client = RolloutClient(fleets.client, store)
    gate = tmp_path / "go"
    done = await (
        await client.submit({**local_task(f"old-{u}", all_win()), "num_samples": 2})
    ).result()
    running = await client.submit(
        local_task(f"run-{u}", f"while [ ! -e {gate} ]; do sleep 0.1; done; touch won")
    )
    buffer = await client.create_buffer(
        {"buffer_id": f"gc-{u}", "num_in_flight": 1, "num_samples": 2, "drop_zero_variance": False}
    )
    await buffer.push([local_task(f"buf-{u}", all_win())])
    await poll(buffer.stats, lambda s: s.num_ready == 1, timeout_s=120, what="the group ready")
    await poll(
        lambda: asyncio.to_thread(store.list, f"sessions/run-{u}"),
        bool,
        what="the running task's session in the store",
    )
    age(root, u, 2 * DAY)

    report = await gc(fleets.client, store, retention_s=DAY)
    deleted = set(report.deleted)
    assert f"sessions/{done.task_id}" in deleted
    assert not store.list(f"sessions/{done.task_id}")
    # held: the buffer's group (ready, not taken) with its sessions, the running task
    assert f"groups/buf-{u}.json" in report.kept_held
    assert f"sessions/buf-{u}" in report.kept_held
    assert not {k for k in deleted if k.endswith(f"run-{u}")}
    batch = await buffer.take(1, timeout_s=60)
    assert batch.groups[0].group.task_id == f"buf-{u}"  # read from the store
    # leased, not acknowledged: still held
    report = await gc(fleets.client, store, retention_s=DAY)
    assert f"groups/buf-{u}.json" in report.kept_held
    await buffer.ack(batch.batch_id)
    gate.touch()
    await running.result()
    age(root, u, 2 * DAY)
    # the command line, dry run first: nothing deleted
    argv = ["store", "gc", "--retention-days", "1", "--store-url", fleets.store_url]
    argv += ["--address", temporal_server.address]
    # the command runs its own event loop: in a thread
    assert await asyncio.to_thread(cli_main, [*argv, "--dry-run"]) == 0
    assert store.exists(f"groups/buf-{u}.json")
    assert await asyncio.to_thread(cli_main, argv) == 0
    assert not store.exists(f"groups/buf-{u}.json")
    assert not store.list(f"sessions/buf-{u}") and not store.list(f"sessions/run-{u}")
    await buffer.close()


def test_a_large_groups_parts_go_with_it_and_a_held_ones_stay(tmp_path: Path) -> None:
    from rolloutd.cli.retention import Held, collect
    from rolloutd.types import group_key, group_part_key

    store = BlobStore(str(tmp_path))
    for task_id in ("old", "held"):
        store.put_json(group_key(task_id), {})
        for part in range(2):
            store.put_json(group_part_key(task_id, part), {})
    age(tmp_path, "", 2 * DAY)
    report = collect(store, Held(unacked_groups={"held"}), retention_s=DAY)
    assert sorted(report.deleted) == ["groups/old", "groups/old.json"]
    assert not store.exists(group_part_key("old", 0)) and not store.exists(group_key("old"))
    assert store.exists(group_part_key("held", 1)) and store.exists(group_key("held"))


def test_a_finished_reverify_runs_journal_goes_and_a_running_ones_stays(tmp_path: Path) -> None:
    from rolloutd.cli.retention import Held, collect

    store = BlobStore(str(tmp_path))
    for run in ("done", "going"):
        store.put_json(f"reverify/{run}/sessions/000000.json", {})
        store.put_json(f"reverify/{run}/summary.json", {})
    store.put_json("sessions/going/t-0/state.json", {})  # a task named like the running run
    age(tmp_path, "", 2 * DAY)
    store.put_json("reverify/young/summary.json", {})
    report = collect(store, Held(running_reverify={"going"}), retention_s=DAY)
    assert sorted(report.deleted) == ["reverify/done", "sessions/going"]
    assert store.exists("reverify/going/summary.json")
    assert store.exists("reverify/young/summary.json")
