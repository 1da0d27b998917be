"""A draining sandbox host hands its harness runs back (docs/decisions.md, "One drain"): the real
sandbox activities on a real bwrap runtime, run through temporalio's ActivityEnvironment (heartbeats
included). The whole drain, with Temporal, two hosts and sessions that start again, is
``tests/reliability/test_drain.py``."""

from __future__ import annotations

import asyncio
import shutil
import time

import pytest
from temporalio.exceptions import ActivityError, ApplicationError, RetryState
from temporalio.testing import ActivityEnvironment

from rolloutd.activities.models import (
    OpenSessionOutput,
    ProvisionRuntimeInput,
    RunHarnessInput,
)
from rolloutd.activities.sandbox import SandboxActivities
from rolloutd.settings import SandboxSettings
from rolloutd.store import BlobStore
from rolloutd.types import HarnessSpec, RuntimeSpec
from rolloutd.workflows.session.ending import host_lost
from tests.support.procs import processes_with

pytestmark = [
    pytest.mark.sandbox,
    pytest.mark.timeout(60),
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
]


def _session(session_id: str) -> OpenSessionOutput:
    # nothing listens here: the harness makes no call, and the verdict asks fail quietly
    base = "http://127.0.0.1:9/s/k"
    return OpenSessionOutput(
        session_id=session_id,
        session_key="k",
        openai_base_url=f"{base}/v1",
        anthropic_base_url=base,
        gemini_base_url=base,
        model="m",
        backend="b",
        host_queue="q",
    )


def _activity_error(cause: ApplicationError) -> ActivityError:
    error = ActivityError(
        "activity error",
        scheduled_event_id=1,
        started_event_id=2,
        identity="w",
        activity_type="run_harness",
        activity_id="1",
        retry_state=RetryState.NON_RETRYABLE_FAILURE,
    )
    error.__cause__ = cause
    return error


def test_a_draining_host_counts_as_lost():
    assert host_lost(_activity_error(ApplicationError("draining", type="HostDrainingError")))
    assert not host_lost(_activity_error(ApplicationError("bad", type="HarnessError")))


async def test_drain_hands_a_running_harness_back_and_removes_its_runtime(tmp_path):
    marker = f"rolloutd-drain-{time.time_ns()}"
    root = tmp_path / "runtimes"
    settings = SandboxSettings(
        host_id="drain-host",
        runtime_root=str(root),
        store_url=str(tmp_path / "store"),
        log_json=False,
    )
    acts = SandboxActivities(settings, BlobStore(settings.store_url))
    env = ActivityEnvironment()
    spec = RuntimeSpec(type="bwrap", max_processes=64)
    try:
        provisioned = await env.run(
            acts.provision_runtime, ProvisionRuntimeInput(session_id="drain/0", runtime=spec)
        )
        run = asyncio.ensure_future(
            env.run(
                acts.run_harness,
                RunHarnessInput(
                    runtime_id=provisioned.runtime_id,
                    session_id="drain/0",
                    harness=HarnessSpec(type="shell", command=f"sleep 300; true {marker}"),
                    instruction="x",
                    session=_session("drain/0"),
                    timeout_s=300,
                ),
            )
        )
        deadline = time.monotonic() + 20
        while not processes_with(marker):
            assert time.monotonic() < deadline and not run.done(), "harness did not start"
            await asyncio.sleep(0.1)  # polling /proc, bounded by the deadline
        t0 = time.monotonic()
        acts.start_drain()
        with pytest.raises(ApplicationError) as raised:
            await asyncio.wait_for(run, 10)
        handed_back_s = time.monotonic() - t0
        assert raised.value.type == "HostDrainingError"
        assert handed_back_s < 5, handed_back_s  # a heartbeat, the 1 s grace, the teardown
        assert acts.runtimes == {} and acts.num_handed_back == 1
        assert processes_with(marker) == []
        assert [p.name for p in root.iterdir() if p.name != ".owners"] == []

        # a provisioning during the drain is refused, retryably (Temporal retries elsewhere)
        with pytest.raises(ApplicationError) as refused:
            await env.run(
                acts.provision_runtime, ProvisionRuntimeInput(session_id="drain/1", runtime=spec)
            )
        assert refused.value.type == "HostDrainingError" and not refused.value.non_retryable
        assert acts.runtimes == {}
    finally:
        await acts.stop_all()
