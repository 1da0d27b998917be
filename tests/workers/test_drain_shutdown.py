"""An activity that outlives its worker's drain (``graceful_shutdown_timeout``) fails with a
retryable ``WorkerShutdown`` error, not as cancelled (which a session would read as its own
cancellation), and a session counts it as a lost host: a real Temporal dev server and real
workers. rolloutd.workers.drain and rolloutd.workflows.session.ending rely on this SDK behaviour."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import CancelledError as TemporalCancelledError
from temporalio.worker import Worker

from rolloutd.workflows.session.ending import host_lost

pytestmark = [pytest.mark.temporal, pytest.mark.timeout(60)]

started = asyncio.Event()


@activity.defn(name="drain_test_slow")
async def slow() -> str:
    started.set()
    while True:  # heartbeats: a drain's cancellation, like any, arrives through the SDK
        activity.heartbeat()
        await asyncio.sleep(0.2)


@workflow.defn(name="DrainTestWorkflow", sandboxed=False)
class DrainTestWorkflow:
    @workflow.run
    async def run(self, queue: str) -> str:
        try:
            await workflow.execute_activity(
                "drain_test_slow",
                task_queue=queue,
                start_to_close_timeout=timedelta(seconds=60),
                heartbeat_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
        except ActivityError as e:
            if isinstance(e.cause, TemporalCancelledError):
                return "cancelled"
            if isinstance(e.cause, ApplicationError):
                return (
                    f"{e.cause.type} non_retryable={e.cause.non_retryable} host_lost={host_lost(e)}"
                )
            return type(e.cause).__name__
        return "completed"


async def test_an_activity_cut_by_the_drain_fails_retryably(temporal_server):
    client = await Client.connect(temporal_server.address)
    tag = uuid.uuid4().hex[:8]
    wf_queue, act_queue = f"drain-wf-{tag}", f"drain-act-{tag}"
    started.clear()
    async with Worker(client, task_queue=wf_queue, workflows=[DrainTestWorkflow]):
        act_worker = Worker(
            client,
            task_queue=act_queue,
            activities=[slow],
            graceful_shutdown_timeout=timedelta(seconds=0.5),
        )
        run = asyncio.ensure_future(act_worker.run())
        handle = await client.start_workflow(
            DrainTestWorkflow.run, act_queue, id=f"drain-{tag}", task_queue=wf_queue
        )
        await asyncio.wait_for(started.wait(), 30)
        await act_worker.shutdown()  # what SIGTERM does: rolloutd.workers.drain
        await run
        outcome = await asyncio.wait_for(handle.result(), 30)
    assert outcome == "WorkerShutdown non_retryable=False host_lost=True", outcome
