"""The swebench-style example task through the whole stack: a correct patch scores 1.0, a
wrong one 0.0, and the fresh evaluation runtime is provisioned while the harness runs."""

from __future__ import annotations

import uuid

import pytest

from rolloutd.store import BlobStore
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import SessionStatus
from tests.evaluators.test_swebench import load_example

pytestmark = [pytest.mark.temporal, pytest.mark.engine, pytest.mark.sandbox]

#: the harness waits this long before applying its patch, so the run visibly overlaps the
#: evaluation runtime's provisioning (the patch itself applies in milliseconds).
SLOW_START = "sleep 2 && "


async def test_swebench_example_gold_scores_1_wrong_scores_0_with_prewarm(fleets):
    example = load_example()
    client = RolloutClient(fleets.client, BlobStore(fleets.store_url))
    handles = {}
    for patch_name in ("gold.patch", "wrong.patch"):
        harness = example.patch_harness(patch_name)
        harness["command"] = SLOW_START + harness["command"]
        task_id = f"swe-{patch_name.split('.')[0]}-{uuid.uuid4().hex[:6]}"
        handles[patch_name] = await client.submit(example.task(task_id, harness=harness))
    rewards = {}
    for patch_name, handle in handles.items():
        (session,) = (await handle.result()).sessions
        assert session.status == SessionStatus.COMPLETED, session.error
        rewards[patch_name] = session.reward
        phases = {p.phase: p for p in session.phases}
        assert {"eval_provision", "eval_check", "eval_teardown"} <= set(phases)
        run, prewarm = phases["run"], phases["eval_provision"]
        # prewarmed: the evaluation runtime was ready before the harness finished
        assert prewarm.started_at <= run.started_at + (run.ended_at - run.started_at)
        assert prewarm.ended_at <= run.ended_at, (prewarm, run)
        assert phases["eval_check"].started_at >= run.ended_at
        print(
            f"{patch_name}: "
            + ", ".join(
                f"{p.phase} {p.started_at:%H:%M:%S.%f}-{p.ended_at:%H:%M:%S.%f}"
                for p in session.phases
            )
        )
    assert rewards == {"gold.patch": 1.0, "wrong.patch": 0.0}
    root = fleets.runtime_root  # only the (empty) ownership bookkeeping folder stays
    assert [p.name for p in root.iterdir() if p.name != ".owners"] == []
    assert not (root / ".owners").exists() or list((root / ".owners").iterdir()) == []
