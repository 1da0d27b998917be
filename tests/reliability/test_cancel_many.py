"""Cancelling 100 running sessions at once: every session ends cancelled within 30 s and no
process or runtime is left behind (docs/faults.md, Cancellation)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError

from rolloutd.cli import reliability
from rolloutd.store import BlobStore
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import SessionResult, SessionStatus
from tests.reliability.conftest import Rig, new_ids, poll, processes_with
from tests.reliability.test_kills import connect

pytestmark = [pytest.mark.slow, pytest.mark.temporal, pytest.mark.sandbox, pytest.mark.timeout(400)]

NUM_SESSIONS = 100
CANCEL_WITHIN_S = 30.0


async def test_cancelling_100_running_sessions_leaves_nothing(rig: Rig):
    client = await connect(rig)
    task_id, marker = new_ids("cancel-100")
    handle = await RolloutClient(client, BlobStore(rig.stack.store_url)).submit(
        {
            "task_id": task_id,
            "instruction": "cancel me",
            "num_samples": NUM_SESSIONS,
            "harness": {"type": "shell", "command": f"sleep 600 # {marker}"},
            "runtime": {"type": "bwrap", "network": "none"},
            "phases": {"provision_s": 120, "run_s": 900},
            "timeout_s": 1200,
        }
    )
    children = [client.get_workflow_handle(f"task/{task_id}/{i}") for i in range(NUM_SESSIONS)]

    def num_running() -> int:
        """Runtimes whose harness runs now, from /proc (querying 100 workflows every poll
        would load the workflow worker the test is measuring)."""
        return len(running_runtimes(marker))

    await poll(
        lambda: num_running() >= NUM_SESSIONS, 240, f"{NUM_SESSIONS} sessions running", every_s=1.0
    )
    assert len(processes_with(marker)) >= NUM_SESSIONS

    t0 = time.monotonic()
    await handle.cancel()

    async def all_closed() -> bool:
        statuses = await asyncio.gather(*(h.describe() for h in children))
        return all(d.status != WorkflowExecutionStatus.RUNNING for d in statuses)

    await poll(all_closed, CANCEL_WITHIN_S, "every session to end", every_s=2.0)
    elapsed = time.monotonic() - t0
    await poll(lambda: not processes_with(marker), 5, "harness processes to be gone")
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    results = [await h.result() for h in children]
    sessions = [SessionResult.model_validate(r) if isinstance(r, dict) else r for r in results]
    statuses = [s.status for s in sessions]
    leftover = [p.name for p in rig.runtime_root.iterdir() if p.name != ".owners"]
    owners = list((rig.runtime_root / ".owners").glob("*.json"))
    reliability.record(
        "cancel 100 running sessions",
        sessions=NUM_SESSIONS,
        cancelled=statuses.count(SessionStatus.CANCELLED),
        seconds=elapsed,
        orphans=len(processes_with(marker)),
        leftover_runtimes=len(leftover),
        ok=elapsed <= CANCEL_WITHIN_S and not leftover,
    )
    assert statuses == [SessionStatus.CANCELLED] * NUM_SESSIONS
    assert elapsed <= CANCEL_WITHIN_S
    assert processes_with(marker) == []
    assert leftover == [] and owners == []


def running_runtimes(marker: str) -> set[str]:
    """Runtime ids of the processes whose command line holds ``marker``."""
    found = set()
    for pid in processes_with(marker):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        found |= {v.split(b"=", 1)[1] for v in environ if v.startswith(b"ROLLOUTD_RUNTIME_ID=")}
    return {r.decode() for r in found}
