"""The trainer's handle on a :class:`~rolloutd.workflows.buffer.workflow.RolloutBufferWorkflow`.

Example::

    buffer = await client.create_buffer({"buffer_id": "run-7", "num_in_flight": 16,
                                         "source": {"type": "jsonl", "path": "tasks.jsonl"},
                                         "max_staleness": 1})
    batch = await buffer.take(8, lease_s=900)      # a Batch: 8 groups, leased
    ...train on batch.groups...
    await buffer.ack(batch.batch_id)               # committed: never offered again
    await buffer.set_policy_version(step + 1)

A trainer that dies between ``take`` and ``ack`` gets the same batch again from its next
``take`` once the lease has run out.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.service import RPCError

from rolloutd.errors import NotFoundError, RolloutdError
from rolloutd.payload import validate_strict
from rolloutd.store import BlobStore, whole_group
from rolloutd.tasksets import task_options
from rolloutd.trainer_client.health import CHECK_EVERY_S, FleetHealth
from rolloutd.types import GroupRef, TaskRequest, TaskResult
from rolloutd.workflows.buffer.models import (
    AckInput,
    AckOutput,
    Batch,
    BufferConfig,
    BufferStats,
    BufferSummary,
    CloseInput,
    PolicyVersionInput,
    PushTasksInput,
    PushTasksOutput,
    TakeBatchInput,
    TakeBatchOutput,
)
from rolloutd.workflows.buffer.workflow import RolloutBufferWorkflow

#: bytes (JSON) of tasks in one ``push_tasks`` update at most: far under Temporal's 2 MB
#: payload limit
PUSH_UPDATE_BYTES = 256 * 1024


class BufferExhaustedError(RolloutdError):
    """The buffer's file source is read to its end and every group was handed out."""


class RolloutBuffer:
    """A buffer workflow, seen from the trainer.

    Args:
        handle: the workflow handle (id ``buffer/{buffer_id}``).
        buffer_id: the buffer's business key.
    """

    #: how long to keep retrying an update the server could not deliver (continue-as-new).
    RETRY_S = 60.0

    def __init__(
        self,
        handle: WorkflowHandle[Any, BufferSummary],
        buffer_id: str,
        *,
        health: FleetHealth | None = None,
        client: Client | None = None,
        store: BlobStore | None = None,
    ) -> None:
        self.workflow = handle
        self.buffer_id = buffer_id
        #: checked while ``take`` waits (:mod:`rolloutd.trainer_client.health`)
        self.health = health
        #: where ``take`` reads whole groups: the blob store, else each task's own result
        self.client = client
        self.store = store

    async def _read_group(self, ref: GroupRef) -> TaskResult:
        """A group by its reference: from the blob store when this handle has one and the
        group was stored, else from its task workflow's result (kept by Temporal for the
        namespace's retention period)."""
        if self.store is not None and ref.key:
            with contextlib.suppress(NotFoundError):
                return await asyncio.to_thread(self.store.get_model, ref.key, TaskResult)
        if self.client is None:
            raise RolloutdError(
                f"group {ref.task_id} cannot be read: this buffer handle has no blob store "
                "and no Temporal client"
            )
        from rolloutd.workflows.task import task_workflow_id

        handle = self.client.get_workflow_handle(
            task_workflow_id(ref.task_id), result_type=TaskResult
        )
        # a large group is the task's result by reference (stored_key): read from the store
        return await asyncio.to_thread(whole_group, self.store, await handle.result())

    async def _whole(self, batch: Batch) -> Batch:
        """The batch with each group read whole (the buffer hands out references)."""
        groups = await asyncio.gather(*(self._read_group(g.ref) for g in batch.groups))
        for buffered, group in zip(batch.groups, groups, strict=True):
            buffered.group = group
        return batch

    async def _update(self, name: str, arg: Any, result_type: type) -> Any:
        """Execute an update; retry the server's transient refusals (a run continuing-as-new
        has no handler yet) for up to :attr:`RETRY_S`."""
        deadline = time.monotonic() + self.RETRY_S
        while True:
            try:
                return await self.workflow.execute_update(name, arg, result_type=result_type)
            except RPCError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def take(
        self, num_groups: int, *, lease_s: float | None = None, timeout_s: float = 300.0
    ) -> Batch:
        """Wait for a batch of ``num_groups`` groups and lease it.

        Args:
            num_groups: groups wanted (a re-offered batch keeps its own size).
            lease_s: lease length; default the buffer's ``lease_s``.
            timeout_s: overall wait.

        Returns:
            The batch; ``batch.num_offers > 1`` when it is a re-offer. A final batch may hold
            fewer groups when the source is exhausted.

        Raises:
            TimeoutError: no batch within ``timeout_s``.
            BufferExhaustedError: no group will ever come again.
            rolloutd.errors.FleetUnavailableError: a fleet the buffer's tasks need is dead
                (checked every :data:`~rolloutd.trainer_client.health.CHECK_EVERY_S` of the
                wait); the buffer keeps its tasks running: take again once it is back.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"no batch of {num_groups} from {self.buffer_id} within {timeout_s} s"
                )
            if self.health is not None:
                left = min(left, CHECK_EVERY_S)  # a slice of the wait, then a fleet check
            out: TakeBatchOutput = await self._update(
                "take_batch",
                TakeBatchInput(num_groups=num_groups, lease_s=lease_s, timeout_s=max(left, 0.5)),
                TakeBatchOutput,
            )
            if out.status in ("ok", "partial") and out.batch is not None:
                return await self._whole(out.batch)
            if out.status == "exhausted":
                raise BufferExhaustedError(f"buffer {self.buffer_id} is exhausted")
            # "retry" (continue-as-new in progress) and "timeout": ask again until deadline
            if out.status == "timeout" and self.health is not None:
                await self.health.check()

    async def ack(self, batch_id: str) -> AckOutput:
        """Commit a batch after training on it (idempotent).

        Raises:
            temporalio.client.WorkflowUpdateFailedError: the batch id is unknown.
        """
        return await self._update("ack", AckInput(batch_id=batch_id), AckOutput)

    async def push(self, tasks: Sequence[TaskRequest | Mapping[str, Any]]) -> int:
        """Queue tasks (validated here: a dict's unknown fields are refused by name); returns
        the number of tasks waiting to start.

        The tasks go in updates of at most :data:`PUSH_UPDATE_BYTES` each (Temporal refuses a
        payload over 2 MB), in order; a refused update leaves the earlier ones' tasks queued.

        Raises:
            pydantic.ValidationError: a task is malformed or names an unknown field.
            temporalio.client.WorkflowUpdateFailedError: the buffer refused a push (closed,
                or past ``max_pushed`` / ``max_pushed_bytes``: its cause says which).
        """
        requests = [
            t if isinstance(t, TaskRequest) else validate_strict(TaskRequest, dict(t))
            for t in tasks
        ]
        chunks: list[list[TaskRequest]] = [[]]
        size = 0
        for request in requests:
            n = len(request.model_dump_json())
            if chunks[-1] and size + n > PUSH_UPDATE_BYTES:
                chunks.append([])
                size = 0
            chunks[-1].append(request)
            size += n
        num_pending = 0
        for chunk in chunks:
            out = await self._update("push_tasks", PushTasksInput(tasks=chunk), PushTasksOutput)
            num_pending = out.num_pending
        return num_pending

    async def set_policy_version(self, policy_version: int) -> BufferStats:
        """Move the buffer's policy version (after a weight update); stale groups drop."""
        return await self._update(
            "set_policy_version", PolicyVersionInput(policy_version=policy_version), BufferStats
        )

    async def stats(self) -> BufferStats:
        """The buffer's counters, running tasks, ready groups and recent drops."""
        return await self.workflow.query(RolloutBufferWorkflow.stats)

    async def close(self, *, cancel_running: bool = True) -> BufferSummary:
        """End the buffer and wait for its final summary."""
        try:
            await self._update("close", CloseInput(cancel_running=cancel_running), BufferStats)
        except WorkflowUpdateFailedError:
            pass
        return await self.workflow.result()


async def create_buffer(
    client: Client,
    config: BufferConfig | Mapping[str, Any],
    *,
    health: FleetHealth | None = None,
    store: BlobStore | None = None,
) -> RolloutBuffer:
    """Start a buffer workflow ``buffer/{buffer_id}`` (or attach to the running one);
    ``health`` is checked while ``take`` waits; ``take`` reads whole groups from ``store``
    (else from each task's result).

    Raises:
        pydantic.ValidationError: the config is malformed or names an unknown field (a
            task set's options included), with the nearest known name.
    """
    from temporalio.common import WorkflowIDConflictPolicy

    from rolloutd import task_queues
    from rolloutd.workflows.buffer.models import BufferInput, buffer_workflow_id

    # what the trainer wrote is checked strictly, the options of a task set too (the workflow
    # reads them leniently)
    cfg = (
        config if isinstance(config, BufferConfig) else validate_strict(BufferConfig, dict(config))
    )
    if cfg.source.type in ("harbor", "swebench"):
        task_options(cfg.source.type, cfg.source.options or {}, strict=True)
    handle = await client.start_workflow(
        RolloutBufferWorkflow.run,
        BufferInput(config=cfg),
        id=buffer_workflow_id(cfg.buffer_id),
        task_queue=task_queues.WORKFLOWS,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    return RolloutBuffer(handle, cfg.buffer_id, health=health, client=client, store=store)


def get_buffer(
    client: Client,
    buffer_id: str,
    *,
    health: FleetHealth | None = None,
    store: BlobStore | None = None,
) -> RolloutBuffer:
    """The handle of a running buffer (a restarted trainer uses this)."""
    from rolloutd.workflows.buffer.models import buffer_workflow_id

    return RolloutBuffer(
        client.get_workflow_handle(buffer_workflow_id(buffer_id), result_type=BufferSummary),
        buffer_id,
        health=health,
        client=client,
        store=store,
    )
