"""Provisioning and teardown of sandbox runtimes through Temporal, from a test: two small
workflows that call the sandbox fleet's activities as a session does (one attempt each), run
on a task queue of the test's own."""

from __future__ import annotations

import uuid
from datetime import timedelta

from temporalio import workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import Worker

from rolloutd import task_queues
from rolloutd.activities.models import (
    ProvisionRuntimeInput,
    ProvisionRuntimeOutput,
    TeardownRuntimeInput,
)
from rolloutd.activities.names import PROVISION_RUNTIME, TEARDOWN_RUNTIME
from rolloutd.types import RuntimeSpec


@workflow.defn(name="WarmPoolProvision", sandboxed=False)
class WarmPoolProvision:
    """Provision one runtime in the sandbox queue (one attempt); its output, or the type of
    the error it failed with."""

    @workflow.run
    async def run(self, input: ProvisionRuntimeInput) -> ProvisionRuntimeOutput | str:
        try:
            return await workflow.execute_activity(
                PROVISION_RUNTIME,
                input,
                result_type=ProvisionRuntimeOutput,
                task_queue=task_queues.SANDBOX,
                start_to_close_timeout=timedelta(seconds=120),
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
        except ActivityError as e:
            cause = e.cause
            return (cause.type if isinstance(cause, ApplicationError) else None) or type(
                cause
            ).__name__


@workflow.defn(name="WarmPoolTeardown", sandboxed=False)
class WarmPoolTeardown:
    """Tear one runtime down on its host's queue."""

    @workflow.run
    async def run(self, runtime: ProvisionRuntimeOutput) -> None:
        await workflow.execute_activity(
            TEARDOWN_RUNTIME,
            TeardownRuntimeInput(runtime_id=runtime.runtime_id),
            task_queue=runtime.host_queue,
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )


class Sessions:
    """Runs the two workflows above on a queue of this test's own."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.queue = f"warm-pool-test-{uuid.uuid4().hex[:8]}"

    def worker(self) -> Worker:
        return Worker(
            self.client, task_queue=self.queue, workflows=[WarmPoolProvision, WarmPoolTeardown]
        )

    async def provision(self, spec: RuntimeSpec) -> ProvisionRuntimeOutput | str:
        return await self.client.execute_workflow(
            WarmPoolProvision.run,
            ProvisionRuntimeInput(session_id=f"s-{uuid.uuid4().hex[:8]}", runtime=spec),
            id=f"provision-{uuid.uuid4().hex}",
            task_queue=self.queue,
            result_type=ProvisionRuntimeOutput | str,  # type: ignore[arg-type]
        )

    async def teardown(self, runtime: ProvisionRuntimeOutput) -> None:
        await self.client.execute_workflow(
            WarmPoolTeardown.run, runtime, id=f"teardown-{uuid.uuid4().hex}", task_queue=self.queue
        )

    async def start_provision(self, spec: RuntimeSpec) -> WorkflowHandle:
        """Start a provisioning without waiting for it."""
        return await self.client.start_workflow(
            WarmPoolProvision.run,
            ProvisionRuntimeInput(session_id=f"s-{uuid.uuid4().hex[:8]}", runtime=spec),
            id=f"provision-{uuid.uuid4().hex}",
            task_queue=self.queue,
        )
