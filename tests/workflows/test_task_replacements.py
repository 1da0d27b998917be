"""A sample that failed for infrastructure is run again, and its group says whether it is
whole: real Temporal, the in-process fleets, shell harnesses in the local runtime.

The infrastructure failure is a model call the backend fails (answered 500 by the engine's
tee: an unrecovered backend error); the fleet-down case runs its fleets in their own
namespace and starts the sandbox fleet only after the first session gave up on it.
"""

from __future__ import annotations

import contextlib
import tempfile
import uuid

import pytest
from temporalio.worker import Replayer

from rolloutd.security.connection import data_converter
from rolloutd.settings import SandboxSettings
from rolloutd.trainer_client import RolloutClient
from rolloutd.workers import run_fleet
from rolloutd.workflows.task import RolloutTaskWorkflow
from tests.support.buffer_tasks import local_task, poll
from tests.support.garbage_fleets import fleets_in_namespace
from tests.support.shell_calls import call

pytestmark = [pytest.mark.temporal]


def task_calling(task_id: str, **overrides: object) -> dict:
    """Two samples, each making one model call, then winning: a call the backend fails leaves
    an unrecovered backend error, a retryable infrastructure cause."""
    return {
        **local_task(task_id, f"{call('hi')}; touch won"),
        "num_samples": 2,
        "sampling": {"max_tokens": 4, "policy": "override"},
        **overrides,
    }


@pytest.mark.engine
async def test_a_replacement_makes_the_group_whole_and_the_limit_holds(fleets):
    client = RolloutClient(fleets.client)
    u = uuid.uuid4().hex[:6]
    try:
        fleets.engine_tee.fail_next_posts = 1  # one of the two first calls fails
        whole = await (await client.submit(task_calling(f"once-{u}"))).result()
        # both first calls fail, one replacement is allowed: one sample stays failed
        fleets.engine_tee.fail_next_posts = 2
        short = await (await client.submit(task_calling(f"twice-{u}", max_replacements=1))).result()
    finally:
        fleets.engine_tee.fail_next_posts = 0

    assert [s.reward for s in whole.sessions] == [1.0, 1.0]
    assert (whole.num_scored, whole.incomplete, whole.num_replacements) == (2, False, 1)
    [replaced] = whole.replaced
    assert replaced.status == "failed" and replaced.reward is None
    assert replaced.failure is not None and replaced.failure.kind == "backend"
    replacement = whole.sessions[replaced.sample_index]
    assert replacement.session_id == f"once-{u}/{replaced.sample_index}/r1"
    assert whole.num_failed_by_kind == {} and whole.mean_reward == 1.0

    assert (short.num_scored, short.incomplete, short.num_replacements) == (1, True, 1)
    assert short.num_failed_by_kind == {"backend": 1}
    assert sorted(s.status.value for s in short.sessions) == ["completed", "failed"]
    assert short.mean_reward == 1.0 and short.reward_std == 0.0
    status = await client.status(f"twice-{u}")
    assert [s.session_id for s in status.replaced] == [s.session_id for s in short.replaced]


async def test_a_replacement_waits_for_a_dead_sandbox_fleet_without_counting(
    temporal_server, tmp_path
):
    async with fleets_in_namespace(temporal_server.address, tmp_path, sandbox=False) as rig:
        client = RolloutClient(rig.client)
        task_id = f"fleetdown-{uuid.uuid4().hex[:6]}"
        handle = await client.submit(
            {
                **local_task(task_id, "touch won"),
                "max_replacements": 0,
                # the fleet gets as long to come back: starting one takes several seconds
                # on a loaded machine (5 s was missed at load 20)
                "phases": {"provision_wait_s": 20},
            },
            check_capabilities=False,
        )
        waiting = await poll(
            lambda: client.status(task_id),
            lambda p: p.replacing == [0] or p.result is not None,
            timeout_s=120,
            what="the replacement waiting for the fleet",
        )
        assert waiting.replacing == [0], waiting
        assert "no sandbox worker is alive" in (waiting.replaced[0].error or "")
        async with contextlib.AsyncExitStack() as stack:
            root = stack.enter_context(tempfile.TemporaryDirectory(prefix="fleet-"))
            await stack.enter_async_context(
                run_fleet(
                    "sandbox",
                    rig.client,
                    SandboxSettings(
                        temporal_address=rig.address,
                        temporal_namespace=rig.namespace,
                        store_url=rig.store_url,
                        host_id="fleet-host",
                        log_json=False,
                        runtime_root=root,
                    ),
                )
            )
            group = await handle.result()
        history = await rig.client.get_workflow_handle(  # type: ignore[attr-defined]
            f"task/{task_id}"
        ).fetch_history()
    assert [s.session_id for s in group.sessions] == [f"{task_id}/0/r1"]
    assert group.sessions[0].reward == 1.0 and not group.incomplete
    assert group.num_replacements == 1 and group.num_failed_by_kind == {}
    # the poller checks and waits replay deterministically
    await Replayer(
        workflows=[RolloutTaskWorkflow], data_converter=data_converter()
    ).replay_workflow(history)
