"""The trainer's client over Temporal's gRPC client: submit tasks, await, cancel, read traces.

Example::

    client = await RolloutClient.connect("localhost:7233", store_url="~/.rolloutd/store")
    handle = await client.submit({"task_id": "t1", "instruction": "...", "num_samples": 4,
                                  "harness": {"type": "qwen_code"}})
    group = await handle.result()
    trajectories = [client.trajectory(s) for s in group.sessions]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDReusePolicy
from temporalio.contrib.pydantic import pydantic_data_converter

from rolloutd import task_queues
from rolloutd.errors import ConfigError
from rolloutd.store import BlobStore
from rolloutd.types import SessionResult, TaskRequest, TaskResult, Trajectory
from rolloutd.workflows.task import RolloutTaskWorkflow, task_workflow_id


class InvalidTaskError(ConfigError):
    """A task request is malformed. ``errors`` lists ``(dotted.field.path, message)`` pairs."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        super().__init__("invalid TaskRequest: " + "; ".join(f"{p}: {m}" for p, m in errors))


def validate_task(task: TaskRequest | Mapping[str, Any]) -> TaskRequest:
    """Validate a task request before anything starts.

    Raises:
        InvalidTaskError: naming every malformed field by its dotted path.
    """
    if isinstance(task, TaskRequest):
        return task
    try:
        return TaskRequest.model_validate(dict(task))
    except ValidationError as e:
        raise InvalidTaskError([
            (".".join(str(p) for p in err["loc"]) or "(root)", err["msg"]) for err in e.errors()
        ]) from None


class RolloutHandle:
    """A submitted task: await its group, cancel it, or inspect its workflow."""

    def __init__(self, handle: WorkflowHandle[Any, TaskResult], task: TaskRequest) -> None:
        self.workflow = handle
        self.task = task

    @property
    def task_id(self) -> str:
        """The task's id."""
        return self.task.task_id

    async def result(self) -> TaskResult:
        """Wait for the task's group of sessions.

        Raises:
            temporalio.client.WorkflowFailureError: the task failed or was cancelled.
        """
        return await self.workflow.result()

    async def cancel(self) -> None:
        """Cancel the task: every session stops, tears its runtime down and keeps its traces."""
        await self.workflow.cancel()


class RolloutClient:
    """The trainer's entry point to rolloutd.

    Args:
        client: a Temporal client using the pydantic data converter.
        store: the blob store where trajectories are kept (optional for submit-only use).
    """

    def __init__(self, client: Client, store: BlobStore | None = None) -> None:
        self.client = client
        self.store = store

    @classmethod
    async def connect(
        cls, address: str = "localhost:7233", *, namespace: str = "default",
        store_url: str | None = None,
    ) -> RolloutClient:
        """Connect to Temporal (gRPC) and, optionally, to the blob store."""
        client = await Client.connect(address, namespace=namespace,
                                      data_converter=pydantic_data_converter)
        return cls(client, BlobStore(store_url) if store_url else None)

    async def submit(self, task: TaskRequest | Mapping[str, Any]) -> RolloutHandle:
        """Validate and start a task as workflow ``task/{task_id}``.

        Raises:
            InvalidTaskError: the request is malformed; no workflow was started.
            temporalio.exceptions.WorkflowAlreadyStartedError: the task id was used before
                (task ids are business keys).
        """
        request = validate_task(task)
        handle = await self.client.start_workflow(
            RolloutTaskWorkflow.run,
            request,
            id=task_workflow_id(request.task_id),
            task_queue=task_queues.WORKFLOWS,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
        )
        return RolloutHandle(handle, request)

    def get_handle(self, task_id: str) -> WorkflowHandle[Any, TaskResult]:
        """The workflow handle of an already submitted task."""
        return self.client.get_workflow_handle_for(RolloutTaskWorkflow.run,
                                                   task_workflow_id(task_id))

    async def result(self, task_id: str) -> TaskResult:
        """Wait for a submitted task's group (by id; a restarted trainer has no handle).

        Raises:
            temporalio.client.WorkflowFailureError: the task failed or was cancelled.
        """
        return await self.get_handle(task_id).result()

    async def cancel(self, task_id: str) -> None:
        """Cancel a task by id: its sessions stop, tear down and keep what they captured."""
        await self.get_handle(task_id).cancel()

    async def create_buffer(self, config: Any) -> Any:
        """Start (or attach to) a training run's buffer: see
        :func:`rolloutd.trainer_client.buffer.create_buffer`. Returns a ``RolloutBuffer``."""
        from rolloutd.trainer_client.buffer import create_buffer

        return await create_buffer(self.client, config)

    def get_buffer(self, buffer_id: str) -> Any:
        """The ``RolloutBuffer`` of a running buffer."""
        from rolloutd.trainer_client.buffer import get_buffer

        return get_buffer(self.client, buffer_id)

    def trajectory(self, session: SessionResult) -> Trajectory:
        """Load a session's trajectory from the blob store.

        Raises:
            ConfigError: the client was connected without ``store_url``, or the session has
                no trajectory.
        """
        if self.store is None:
            raise ConfigError("connect with store_url to read trajectories")
        if not session.trajectory_ref:
            raise ConfigError(f"session {session.session_id} has no trajectory")
        return self.store.get_model(session.trajectory_ref, Trajectory)
