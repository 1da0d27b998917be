"""A real trainer process is SIGKILLed between ``take_batch`` and ``ack``: the restarted trainer
gets the same batch again, no group is delivered twice after an ack, and no group is lost.

The buffer is also forced to continue-as-new during the run (a small ``max_history_events``),
so the hand-off survives a change of workflow run.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from rolloutd.trainer_client import RolloutClient
from tests.support.buffer_tasks import first_wins, local_task, poll

pytestmark = [pytest.mark.temporal, pytest.mark.engine]

TRAINER = Path(__file__).resolve().parents[2] / "support" / "buffer_trainer.py"


def events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def start_trainer(
    address: str, buffer_id: str, out: Path, mode: str, num_groups: int, lease_s: float
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            str(TRAINER),
            address,
            buffer_id,
            str(out),
            mode,
            str(num_groups),
            str(lease_s),
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(out.with_suffix(".err"), "ab"),
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


async def test_trainer_killed_after_take_gets_the_batch_again_exactly_once(
    fleets, temporal_server, tmp_path
):
    u = uuid.uuid4().hex[:6]
    task_ids = [f"k{i}-{u}" for i in range(3)]
    client = RolloutClient(fleets.client)
    buffer = await client.create_buffer(
        {"buffer_id": f"crash-{u}", "num_in_flight": 3, "num_samples": 2, "max_history_events": 60}
    )
    await buffer.push([local_task(t, first_wins(tmp_path / t)) for t in task_ids])
    out = tmp_path / "trainer.jsonl"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        hung = start_trainer(temporal_server.address, buffer.buffer_id, out, "hang", 3, 3.0)
        procs.append(hung)
        taken = await poll(
            lambda: asyncio.to_thread(events, out),
            lambda e: len(e) == 1,
            timeout_s=120,
            what="first trainer took a batch",
        )
        os.kill(hung.pid, signal.SIGKILL)  # after take_batch, before ack
        hung.wait()
        lost = taken[0]

        restarted = start_trainer(temporal_server.address, buffer.buffer_id, out, "train", 3, 30.0)
        procs.append(restarted)
        deadline = time.monotonic() + 180
        while restarted.poll() is None:
            assert time.monotonic() < deadline, "restarted trainer did not finish"
            await asyncio.sleep(0.2)
        assert restarted.returncode == 0, out.with_suffix(".err").read_text()[-2000:]

        log = events(out)
        again = [e for e in log[1:] if e["event"] == "taken" and e["batch_id"] == lost["batch_id"]]
        assert again and again[0]["task_ids"] == lost["task_ids"] and again[0]["num_offers"] >= 2
        acked = [t for e in log if e["event"] == "acked" for t in e["task_ids"]]
        assert sorted(acked) == sorted(task_ids)  # every group once: none lost, none twice
        stats = await buffer.stats()
        assert stats.state_counters["num_groups_acked"] == 3
        assert not stats.leased_batch_ids and not stats.reoffer_batch_ids
        assert stats.state_counters["num_runs"] >= 2  # it continued-as-new on the way
    finally:
        for proc in procs:
            stop(proc)
        await buffer.close()
