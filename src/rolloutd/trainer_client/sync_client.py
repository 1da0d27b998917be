"""A blocking wrapper of the async trainer client, for trainer loops that are not asyncio.

One background thread runs an event loop that owns the Temporal client; every method submits
a coroutine to it and waits. Example::

    client = SyncRolloutClient.connect("localhost:7233", store_url="~/.rolloutd/store")
    buffer = client.get_buffer("run-7")
    batch = buffer.take(8, lease_s=900)
    trajectories = [client.trajectory(s) for g in batch.groups for s in g.group.sessions]
    ...
    buffer.ack(batch.batch_id)
    client.close()
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from rolloutd.trainer_client.admin import BackendAdmin
from rolloutd.trainer_client.buffer import RolloutBuffer
from rolloutd.trainer_client.client import RolloutClient
from rolloutd.types import SessionResult, TaskProgress, TaskRequest, TaskResult, Trajectory
from rolloutd.workflows.buffer.models import AckOutput, Batch, BufferStats, BufferSummary

T = TypeVar("T")


class _Loop:
    """An event loop in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="rolloutd-client", daemon=True
        )
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


class SyncRolloutBuffer:
    """Blocking :class:`~rolloutd.trainer_client.buffer.RolloutBuffer`."""

    def __init__(self, buffer: RolloutBuffer, loop: _Loop) -> None:
        self._buffer = buffer
        self._loop = loop
        self.buffer_id = buffer.buffer_id

    def take(
        self, num_groups: int, *, lease_s: float | None = None, timeout_s: float = 300.0
    ) -> Batch:
        """See :meth:`RolloutBuffer.take`."""
        return self._loop.run(self._buffer.take(num_groups, lease_s=lease_s, timeout_s=timeout_s))

    def ack(self, batch_id: str) -> AckOutput:
        """See :meth:`RolloutBuffer.ack`."""
        return self._loop.run(self._buffer.ack(batch_id))

    def push(self, tasks: Sequence[TaskRequest | Mapping[str, Any]]) -> int:
        """See :meth:`RolloutBuffer.push`."""
        return self._loop.run(self._buffer.push(tasks))

    def set_policy_version(self, policy_version: int) -> BufferStats:
        """See :meth:`RolloutBuffer.set_policy_version`."""
        return self._loop.run(self._buffer.set_policy_version(policy_version))

    def stats(self) -> BufferStats:
        """See :meth:`RolloutBuffer.stats`."""
        return self._loop.run(self._buffer.stats())

    def close(self, *, cancel_running: bool = True) -> BufferSummary:
        """See :meth:`RolloutBuffer.close`."""
        return self._loop.run(self._buffer.close(cancel_running=cancel_running))


class SyncBackendAdmin:
    """Blocking :class:`~rolloutd.trainer_client.admin.BackendAdmin`."""

    def __init__(self, admin: BackendAdmin, loop: _Loop) -> None:
        self._admin = admin
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._admin, name)
        if not callable(method):
            return method
        return lambda *args, **kwargs: self._loop.run(method(*args, **kwargs))


class SyncRolloutClient:
    """Blocking :class:`~rolloutd.trainer_client.client.RolloutClient`.

    Build it with :meth:`connect`; call :meth:`close` when done (stops the loop thread).
    """

    def __init__(self, client: RolloutClient, loop: _Loop) -> None:
        self.aio = client
        self._loop = loop

    @classmethod
    def connect(
        cls,
        address: str = "localhost:7233",
        *,
        namespace: str = "default",
        store_url: str | None = None,
    ) -> SyncRolloutClient:
        """Connect to Temporal and, optionally, the blob store."""
        loop = _Loop()
        client = loop.run(RolloutClient.connect(address, namespace=namespace, store_url=store_url))
        return cls(client, loop)

    def close(self) -> None:
        """Stop the background loop."""
        self._loop.stop()

    def __enter__(self) -> SyncRolloutClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, task: TaskRequest | Mapping[str, Any]) -> str:
        """Validate and start a task; returns its ``task_id``. See ``RolloutClient.submit``."""
        return self._loop.run(self.aio.submit(task)).task_id

    def status(self, task_id: str) -> TaskProgress:
        """The task as it stands, each ended session's outcome. See ``RolloutClient.status``."""
        return self._loop.run(self.aio.status(task_id))

    def result(self, task_id: str) -> TaskResult:
        """Wait for a task's group."""
        return self._loop.run(self.aio.result(task_id))

    def cancel(self, task_id: str) -> None:
        """Cancel a task."""
        self._loop.run(self.aio.cancel(task_id))

    def trajectory(self, session: SessionResult) -> Trajectory:
        """Load a session's trajectory from the blob store."""
        return self.aio.trajectory(session)

    def create_buffer(self, config: Any) -> SyncRolloutBuffer:
        """Start (or attach to) a buffer."""
        return SyncRolloutBuffer(self._loop.run(self.aio.create_buffer(config)), self._loop)

    def get_buffer(self, buffer_id: str) -> SyncRolloutBuffer:
        """A running buffer."""
        return SyncRolloutBuffer(self.aio.get_buffer(buffer_id), self._loop)

    def admin(self, gateway_url: str, token: str | None) -> SyncBackendAdmin:
        """Backend-pool admin of a gateway."""
        return SyncBackendAdmin(BackendAdmin(gateway_url, token), self._loop)
