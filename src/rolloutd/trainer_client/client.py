"""The trainer's client over Temporal's gRPC client: submit tasks, await, cancel, read traces.

Example::

    client = await RolloutClient.connect("localhost:7233", store_url="~/.rolloutd/store")
    handle = await client.submit({"task_id": "t1", "instruction": "...", "num_samples": 4,
                                  "harness": {"type": "qwen_code"}})
    group = await handle.result()
    trajectories = [client.trajectory(s) for s in group.sessions]

Before any workflow starts, :meth:`RolloutClient.submit` refuses what cannot run: a malformed
field, a harness type no registered sandbox host can run, an evaluator name no eval host has,
an evaluator import path that does not import on an eval host (:mod:`rolloutd.capabilities`).
:meth:`RolloutClient.status` shows every session's outcome as soon as it ends.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from pydantic import ValidationError
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowHandle,
    WorkflowQueryFailedError,
)
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from rolloutd import task_queues
from rolloutd.capabilities import (
    CAPABILITIES_QUERY,
    OPT_OUT,
    REGISTRY_WORKFLOW_ID,
    FleetCapabilities,
    check_task,
)
from rolloutd.errors import ConfigError, FleetRegistryError, NotFoundError
from rolloutd.payload import validate_strict
from rolloutd.security.connection import connect_temporal
from rolloutd.settings import CommonSettings
from rolloutd.store import BlobStore, whole_group
from rolloutd.trainer_client.health import FleetHealth, watch
from rolloutd.trainer_client.listing import TaskRow, list_tasks
from rolloutd.trainer_client.task_status import query_status
from rolloutd.trainer_client.tenants import TenantState, set_tenant_quota, tenant_state
from rolloutd.types import (
    DEFAULT_TENANT,
    CallbackStatus,
    EvaluatorSpec,
    SessionResult,
    SessionStatus,
    TaskProgress,
    TaskRequest,
    TaskResult,
    Trajectory,
)
from rolloutd.workflows.callback import CallbackWorkflow, callback_workflow_id
from rolloutd.workflows.metadata import static_details, task_memo, task_summary
from rolloutd.workflows.session.judging import (
    JudgeTarget,
    RejudgeInput,
    RejudgeOutput,
    RejudgeWorkflow,
    rejudge_workflow_id,
)
from rolloutd.workflows.task import RolloutTaskWorkflow, task_workflow_id
from rolloutd.workflows.tenants import task_priority

#: how long a query (capabilities, a task's or a callback's status) may take: a workflows
#: fleet that does not answer by then is reported, not waited for.
QUERY_TIMEOUT = timedelta(seconds=10)
#: how long a check waits for the first sandbox / eval host to register (workers start in
#: a few seconds after Temporal; `rolloutd up` and `demo` submit right after starting them).
REGISTRY_WAIT_S = 30.0
REGISTRY_POLL_S = 0.5


class InvalidTaskError(ConfigError):
    """A task request is malformed. ``errors`` lists ``(dotted.field.path, message)`` pairs."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        self.errors = errors
        super().__init__("invalid TaskRequest: " + "; ".join(f"{p}: {m}" for p, m in errors))


def validate_task(task: TaskRequest | Mapping[str, Any]) -> TaskRequest:
    """Validate a task request before anything starts: what a user wrote (a dict) is checked
    strictly, so an unknown field is refused by name (:func:`rolloutd.payload.validate_strict`).

    Raises:
        InvalidTaskError: naming every malformed or unknown field by its dotted path.
    """
    if isinstance(task, TaskRequest):
        return task
    try:
        return validate_strict(TaskRequest, dict(task))
    except ValidationError as e:
        raise InvalidTaskError(
            [(".".join(str(p) for p in err["loc"]) or "(root)", err["msg"]) for err in e.errors()]
        ) from None


class RolloutHandle:
    """A submitted task: await its group, cancel it, or inspect its workflow."""

    def __init__(
        self,
        handle: WorkflowHandle[Any, TaskResult],
        task: TaskRequest,
        client: RolloutClient | None = None,
    ) -> None:
        self.workflow = handle
        self.task = task
        self.client = client

    async def status(self) -> TaskProgress:
        """The task as it stands (see :meth:`RolloutClient.status`).

        Raises:
            ConfigError: the handle was made without its client.
        """
        if self.client is None:
            raise ConfigError("this RolloutHandle has no client; use RolloutClient.status")
        return await self.client.status(self.task_id)

    @property
    def task_id(self) -> str:
        """The task's id."""
        return self.task.task_id

    async def result(self) -> TaskResult:
        """Wait for the task's group of sessions, checking the fleets meanwhile (when the
        handle has its client: :mod:`rolloutd.trainer_client.health`).

        Raises:
            temporalio.client.WorkflowFailureError: the task failed or was cancelled.
            rolloutd.errors.FleetUnavailableError: a fleet the task needs died while waiting
                (the task keeps running; wait again once the fleet is back).
        """
        result = await watch(
            self.workflow.result(), self.client.fleet_health if self.client else None
        )
        return await self.client.whole(result) if self.client else whole_group(None, result)

    async def cancel(self) -> None:
        """Cancel the task: every session stops, tears its runtime down and keeps its traces."""
        await self.workflow.cancel()


class RolloutClient:
    """The trainer's entry point to rolloutd.

    Args:
        client: a Temporal client using the pydantic data converter.
        store: the blob store where trajectories are kept (optional for submit-only use).
        check_capabilities: refuse at submit what no registered host can run (default); False
            skips that check (syntax is checked either way).
        registry_wait_s: when no sandbox or no eval host has registered yet, how long a check
            waits for one (a stack that is just starting) before it refuses the task.
        gateway_url: the gateway's base URL; its ``/health`` tells a waiting caller that the
            engine is dead (None: only the worker fleets are checked).
        check_fleets: waits (:meth:`RolloutHandle.result`, a buffer's ``take``) raise
            ``FleetUnavailableError`` when a fleet dies; False waits without checking.

    Attributes:
        fleet_health: the check those waits use (None when ``check_fleets`` is False).
    """

    def __init__(
        self,
        client: Client,
        store: BlobStore | None = None,
        *,
        check_capabilities: bool = True,
        registry_wait_s: float = REGISTRY_WAIT_S,
        gateway_url: str | None = None,
        check_fleets: bool = True,
    ) -> None:
        self.client = client
        self.fleet_health = FleetHealth(client, gateway_url) if check_fleets else None
        self.store = store
        self.check_capabilities = check_capabilities
        self.registry_wait_s = registry_wait_s

    @classmethod
    async def connect(
        cls,
        address: str = "localhost:7233",
        *,
        namespace: str = "default",
        store_url: str | None = None,
        gateway_url: str | None = None,
        settings: CommonSettings | None = None,
    ) -> RolloutClient:
        """Connect to Temporal (gRPC) and, optionally, to the blob store; ``gateway_url``
        lets waits tell a dead engine (see the class). The payload codec, TLS and API key
        come from ``settings`` (default: ``ROLLOUTD_*`` variables;
        :func:`rolloutd.security.connection.connect_temporal`).

        Raises:
            ConfigError: bad codec keys or TLS files.
        """
        client = await connect_temporal(settings, address=address, namespace=namespace)
        return cls(client, BlobStore(store_url) if store_url else None, gateway_url=gateway_url)

    async def capabilities(self) -> FleetCapabilities:
        """What the registered sandbox and eval hosts can run (empty when none registered).

        Raises:
            FleetRegistryError: the registry exists but no workflows worker answered.
        """
        handle = self.client.get_workflow_handle(REGISTRY_WORKFLOW_ID)
        try:
            return await handle.query(
                CAPABILITIES_QUERY, result_type=FleetCapabilities, rpc_timeout=QUERY_TIMEOUT
            )
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                return FleetCapabilities()
            raise FleetRegistryError(
                f"the fleet registry did not answer ({e}); retry, or submit with {OPT_OUT}"
            ) from e
        except WorkflowQueryFailedError as e:
            raise FleetRegistryError(f"the fleet registry failed to answer: {e}") from e

    async def check_tasks(
        self,
        tasks: Iterable[TaskRequest | Mapping[str, Any]],
        *,
        check_capabilities: bool | None = None,
    ) -> list[TaskRequest]:
        """Validate tasks and refuse what no registered host can run, before any starts.

        Args:
            tasks: TaskRequests or their dicts.
            check_capabilities: override the client's setting for this call.

        Returns:
            The validated requests, in order.

        Raises:
            InvalidTaskError: naming each field by its dotted path (``harness.type``,
                ``evaluator.type``, ...); with several tasks, the messages name the task.
            FleetRegistryError: the registry did not answer.
        """
        requests = [validate_task(t) for t in tasks]
        check = self.check_capabilities if check_capabilities is None else check_capabilities
        if not check or not requests:
            return requests
        fleets = await self.capabilities()
        deadline = time.monotonic() + self.registry_wait_s
        while not (fleets.of("sandbox") and fleets.of("eval")) and time.monotonic() < deadline:
            await asyncio.sleep(REGISTRY_POLL_S)
            fleets = await self.capabilities()
        errors = []
        for request in requests:
            for path, message in check_task(request, fleets):
                if len(requests) > 1:
                    message = f"task {request.task_id}: {message}"
                errors.append((path, message))
        if errors:
            raise InvalidTaskError(errors)
        return requests

    async def submit(
        self, task: TaskRequest | Mapping[str, Any], *, check_capabilities: bool | None = None
    ) -> RolloutHandle:
        """Validate and start a task as workflow ``task/{task_id}``.

        Args:
            task: a TaskRequest or its dict.
            check_capabilities: override the client's setting (see :meth:`check_tasks`).

        Raises:
            InvalidTaskError: the request is malformed, or no registered host can run it; no
                workflow was started.
            FleetRegistryError: the registry did not answer; no workflow was started.
            temporalio.exceptions.WorkflowAlreadyStartedError: the task id was used before
                (task ids are business keys).
        """
        (request,) = await self.check_tasks([task], check_capabilities=check_capabilities)
        if request.callback_url and not request.callback_secret:
            # each callback is signed with the task's own key (rolloutd.security.callbacks);
            # the caller reads it from the handle's task
            request = request.model_copy(update={"callback_secret": secrets.token_urlsafe(32)})
        handle = await self.client.start_workflow(
            RolloutTaskWorkflow.run,
            request,
            id=task_workflow_id(request.task_id),
            task_queue=task_queues.WORKFLOWS,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            # the task's own workflow tasks too; it sets it on each session and activity
            priority=task_priority(request),
            # what the Temporal UI's list and detail pages show (rolloutd.workflows.metadata)
            static_summary=task_summary(request),
            static_details=static_details(request),
            # read by status() without a worker (closed tasks) and without the history
            memo=task_memo(request),
        )
        return RolloutHandle(handle, request, self)

    async def status(self, task_id: str) -> TaskProgress:
        """A task as it stands: every session that has ended, with its outcome, as it ends.

        A task whose sessions have all ended is ``completed`` (at least one session completed)
        or ``failed`` at once, also while its workflow is still finishing. Reads go through
        queries and results with the client's data converter, never through raw history.

        Raises:
            NotFoundError: no task has this id.
        """
        handle = self.get_handle(task_id)
        try:
            described = await handle.describe()
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                raise NotFoundError(f"task {task_id} not found") from None
            raise
        memo = await described.memo()
        num_samples = int(memo.get("num_samples") or 0)
        if described.status == WorkflowExecutionStatus.COMPLETED:
            group = await self.whole(await handle.result())
            progress = TaskProgress(
                task_id=task_id,
                num_samples=num_samples or len(group.sessions),
                sessions=group.sessions,
                replaced=group.replaced,
                result=group,
            )
            _settle(progress)
        else:
            progress = await self._query_progress(handle) or TaskProgress(task_id=task_id)
            progress.num_samples = progress.num_samples or num_samples
            if described.status == WorkflowExecutionStatus.RUNNING:
                progress.status = "running"
                if progress.num_samples and len(progress.sessions) >= progress.num_samples:
                    _settle(progress)
            else:
                progress.status = (
                    "cancelled"
                    if described.status == WorkflowExecutionStatus.CANCELED
                    else "failed"
                )
                progress.error = f"the task's workflow ended {described.status.name.lower()}"
        if memo.get("callback"):
            progress.callbacks = [
                await self._callback_status(task_id, s) for s in progress.sessions
            ]
        return progress

    async def task_tenant(self, task_id: str) -> str:
        """The tenant a task belongs to (its workflow's memo, set by the client or the buffer
        that started it; ``default`` for a task started without one), read without a worker.

        Raises:
            NotFoundError: no task has this id.
        """
        try:
            described = await self.get_handle(task_id).describe()
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:
                raise NotFoundError(f"task {task_id} not found") from None
            raise
        return str((await described.memo()).get("tenant") or DEFAULT_TENANT)

    async def _query_progress(self, handle: WorkflowHandle[Any, TaskResult]) -> TaskProgress | None:
        """The task's ``status`` query; None when no worker answered (then nothing ended is
        known)."""
        try:
            return await query_status(handle, rpc_timeout=QUERY_TIMEOUT)
        except (RPCError, WorkflowQueryFailedError):
            return None

    async def _callback_status(self, task_id: str, session: SessionResult) -> CallbackStatus:
        """One ended session's callback, from its workflow's ``state`` query."""
        handle = self.client.get_workflow_handle(
            callback_workflow_id(task_workflow_id(task_id), session.sample_index)
        )
        try:
            state = await handle.query(CallbackWorkflow.state, rpc_timeout=QUERY_TIMEOUT)
        except RPCError as e:
            if e.status == RPCStatusCode.NOT_FOUND:  # not started yet
                return CallbackStatus(session_id=session.session_id)
            return CallbackStatus(session_id=session.session_id, error=f"status unknown: {e}")
        except WorkflowQueryFailedError as e:
            return CallbackStatus(session_id=session.session_id, error=f"status unknown: {e}")
        return state or CallbackStatus(session_id=session.session_id)

    def get_handle(self, task_id: str) -> WorkflowHandle[Any, TaskResult]:
        """The workflow handle of an already submitted task."""
        return self.client.get_workflow_handle_for(
            RolloutTaskWorkflow.run, task_workflow_id(task_id)
        )

    async def result(self, task_id: str) -> TaskResult:
        """Wait for a submitted task's group (by id; a restarted trainer has no handle).

        Raises:
            temporalio.client.WorkflowFailureError: the task failed or was cancelled.
        """
        return await self.whole(await self.get_handle(task_id).result())

    async def whole(self, result: TaskResult) -> TaskResult:
        """A task's result with every session: a group the task's workflow returned by
        reference (``stored_key``, over ``TaskRequest.inline_result_bytes``) is read from the
        blob store (:func:`rolloutd.store.whole_group`).

        Raises:
            RolloutdError: the group is stored and this client has no blob store.
        """
        if not result.stored_key:
            return result
        return await asyncio.to_thread(whole_group, self.store, result)

    async def cancel(self, task_id: str) -> None:
        """Cancel a task by id: its sessions stop, tear down and keep what they captured."""
        await self.get_handle(task_id).cancel()

    async def list_tasks(
        self,
        *,
        status: str | None = None,
        prefix: str | None = None,
        tenant: str | None = None,
        limit: int = 100,
    ) -> list[TaskRow]:
        """Tasks on the stack, newest first, from Temporal's visibility (no task is queried):
        see :func:`rolloutd.trainer_client.listing.list_tasks`.

        Raises:
            ConfigError: a malformed filter.
        """
        return await list_tasks(
            self.client, status=status, prefix=prefix, tenant=tenant, limit=limit
        )

    async def set_tenant_quota(
        self, tenant: str, max_sessions_in_flight: int | None
    ) -> TenantState:
        """Bound a tenant's sessions in flight (None: unbounded); see
        :func:`rolloutd.trainer_client.tenants.set_tenant_quota`."""
        return await set_tenant_quota(self.client, tenant, max_sessions_in_flight)

    async def tenant_state(self, tenant: str) -> TenantState | None:
        """A tenant's quota, holders and waiting sessions (None: the tenant has no quota)."""
        return await tenant_state(self.client, tenant)

    async def create_buffer(self, config: Any) -> Any:
        """Start (or attach to) a training run's buffer: see
        :func:`rolloutd.trainer_client.buffer.create_buffer`. Returns a ``RolloutBuffer``."""
        from rolloutd.trainer_client.buffer import create_buffer

        return await create_buffer(self.client, config, health=self.fleet_health, store=self.store)

    def get_buffer(self, buffer_id: str) -> Any:
        """The ``RolloutBuffer`` of a running buffer."""
        from rolloutd.trainer_client.buffer import get_buffer

        return get_buffer(self.client, buffer_id, health=self.fleet_health, store=self.store)

    async def rejudge(
        self,
        task: TaskRequest | str,
        sessions: Iterable[SessionResult],
        *,
        run_id: str,
        max_concurrent: int = 4,
        evaluator: EvaluatorSpec | None = None,
    ) -> RejudgeOutput:
        """Judge stored sessions of ``task`` again with its judge (``RejudgeWorkflow``, id
        ``rejudge/{run_id}``): their stored trajectories only, never a new sample. Each
        verdict is appended to the session's ``rescores`` in the store; a session whose
        judging had failed (no reward) gets this reward and loses its judge failure.

        Args:
            task: the task (its ``evaluator`` is the ``llm_judge`` spec judged with), or its
                id when ``evaluator`` is given.
            sessions: the sessions to judge (those without a stored trajectory are left out).
            run_id: names the run (its workflow id; the run of an id that ran already
                answers again with its result: a new judging needs a new id).
            max_concurrent: sample judgings at once.
            evaluator: the ``llm_judge`` spec to judge with instead of the task's (a fixed
                rubric); required when ``task`` is an id.

        Raises:
            ConfigError: no ``llm_judge`` spec to judge with.
        """
        task_id = task if isinstance(task, str) else task.task_id
        spec = evaluator or (None if isinstance(task, str) else task.evaluator)
        if spec is None or spec.judge is None:
            raise ConfigError(f"task {task_id}: no llm_judge evaluator to judge with")
        targets = [
            JudgeTarget(session_id=s.session_id, trajectory_ref=s.trajectory_ref)
            for s in sessions
            if s.trajectory_ref
        ]
        try:
            handle = await self.client.start_workflow(
                RejudgeWorkflow.run,
                RejudgeInput(
                    run_id=run_id,
                    task_id=task_id,
                    evaluator=spec,
                    targets=targets,
                    max_concurrent=max_concurrent,
                ),
                id=rejudge_workflow_id(run_id),
                task_queue=task_queues.WORKFLOWS,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                result_type=RejudgeOutput,
            )
        except WorkflowAlreadyStartedError:
            # the run exists (a client that reconnects): its judge sessions are sealed, so
            # the same run is never judged twice; its result is answered again
            handle = self.client.get_workflow_handle(
                rejudge_workflow_id(run_id), result_type=RejudgeOutput
            )
        return await handle.result()

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


def _settle(progress: TaskProgress) -> None:
    """Mark a task whose sessions have all ended: ``completed`` when at least one session
    completed, else ``failed`` with the first session's error."""
    if any(s.status == SessionStatus.COMPLETED for s in progress.sessions):
        progress.status = "completed"
        return
    progress.status = "failed"
    first = next((s for s in progress.sessions if s.error), None)
    progress.error = (
        f"no session completed; {first.session_id}: {first.error}"
        if first
        else "no session completed"
    )
