"""A sample that failed for infrastructure is run again, and its group says whether it is
whole: real Temporal, the in-process fleets, shell harnesses in the local runtime.

The infrastructure failure is a provisioning that fails (a prepare step failing until marker
folders exist, outside the runtime); the fleet-down case runs its fleets in their own
namespace and starts the sandbox fleet only after the first session gave up on it.
"""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from pathlib import Path

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from rolloutd.settings import SandboxSettings
from rolloutd.trainer_client import RolloutClient
from rolloutd.workers import run_fleet
from rolloutd.workflows.task import RolloutTaskWorkflow
from tests.support.buffer_tasks import local_task, poll
from tests.test_loud_failures import fleets_in_namespace

pytestmark = [pytest.mark.temporal]


def failing_provisions(folder: Path, times: int) -> dict:
    """A prepare step whose first ``times`` runs fail (over every session using ``folder``)."""
    claims = "; ".join(f"mkdir {folder}/{n} 2>/dev/null && exit 1" for n in range(times))
    return {"type": "exec", "command": f"mkdir -p {folder}; {claims}; true"}


def task_failing(task_id: str, folder: Path, times: int, **overrides: object) -> dict:
    task = local_task(task_id, "touch won")
    task["runtime"]["prepare"] = [failing_provisions(folder, times)]
    return {**task, "num_samples": 2, **overrides}


@pytest.mark.engine
async def test_a_replacement_makes_the_group_whole_and_the_limit_holds(fleets, tmp_path):
    client = RolloutClient(fleets.client)
    u = uuid.uuid4().hex[:6]
    once = await client.submit(task_failing(f"once-{u}", tmp_path / "once", 1))
    twice = await client.submit(task_failing(f"twice-{u}", tmp_path / "twice", 2,
                                             max_replacements=1))
    whole, short = await once.result(), await twice.result()

    assert [s.reward for s in whole.sessions] == [1.0, 1.0]
    assert (whole.num_scored, whole.incomplete, whole.num_replacements) == (2, False, 1)
    [replaced] = whole.replaced
    # (its reward: None once the session workflow stops evaluating failed sessions)
    assert replaced.status == "failed" and "prepare[0] exited 1" in (replaced.error or "")
    replacement = whole.sessions[replaced.sample_index]
    assert replacement.session_id == f"once-{u}/{replaced.sample_index}/r1"
    assert whole.num_failed_by_kind == {} and whole.mean_reward == 1.0

    # both first sessions failed, one replacement was allowed: one sample stays failed
    assert (short.num_scored, short.incomplete, short.num_replacements) == (1, True, 1)
    assert sum(short.num_failed_by_kind.values()) == 1
    assert sorted(s.status.value for s in short.sessions) == ["completed", "failed"]
    assert short.mean_reward == 1.0 and short.reward_std == 0.0
    status = await client.status(f"twice-{u}")
    assert [s.session_id for s in status.replaced] == [s.session_id for s in short.replaced]


async def test_a_replacement_waits_for_a_dead_sandbox_fleet_without_counting(
        temporal_server, tmp_path):
    async with fleets_in_namespace(temporal_server.address, tmp_path, sandbox=False) as rig:
        client = RolloutClient(rig.client)
        task_id = f"fleetdown-{uuid.uuid4().hex[:6]}"
        handle = await client.submit({**local_task(task_id, "touch won"), "max_replacements": 0,
                                      "phases": {"provision_wait_s": 5}},
                                     check_capabilities=False)
        waiting = await poll(lambda: client.status(task_id),
                             lambda p: p.replacing == [0] or p.result is not None,
                             timeout_s=60, what="the replacement waiting for the fleet")
        assert waiting.replacing == [0], waiting
        assert "no sandbox worker is polling" in (waiting.replaced[0].error or "")
        async with contextlib.AsyncExitStack() as stack:
            root = stack.enter_context(tempfile.TemporaryDirectory(prefix="fleet-"))
            await stack.enter_async_context(run_fleet("sandbox", rig.client, SandboxSettings(
                temporal_address=rig.address, temporal_namespace=rig.namespace,
                store_url=rig.store_url, host_id="fleet-host", log_json=False,
                runtime_root=root)))
            group = await handle.result()
        history = await rig.client.get_workflow_handle(  # type: ignore[attr-defined]
            f"task/{task_id}").fetch_history()
    assert [s.session_id for s in group.sessions] == [f"{task_id}/0/r1"]
    assert group.sessions[0].reward == 1.0 and not group.incomplete
    assert group.num_replacements == 1 and group.num_failed_by_kind == {}
    # the poller checks and waits replay deterministically
    await Replayer(workflows=[RolloutTaskWorkflow],
                   data_converter=pydantic_data_converter).replay_workflow(history)
