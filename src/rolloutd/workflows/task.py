"""``RolloutTaskWorkflow``: a task's ``num_samples`` sessions as child workflows, and the group.

Workflow id ``task/{task_id}``; children ``task/{task_id}/{index}``; session ids
``{task_id}/{index}``. Cancelling the task cancels every session; each session tears its runtime
down and stores what it captured before it ends.

The query ``status`` answers every session that has ended, as it ends. A session's callback
(``callback_url``) starts after its result is stored here, as a detached child
(:mod:`rolloutd.workflows.callback`): the task ends when its sessions end, never later.
"""

from __future__ import annotations

import asyncio
import math
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ChildWorkflowError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from rolloutd import task_queues
    from rolloutd.activities.cancel import cancel_workflows
    from rolloutd.activities.models import PostCallbackInput
    from rolloutd.types import (
        SessionResult,
        SessionStatus,
        TaskProgress,
        TaskRequest,
        TaskResult,
    )
    from rolloutd.workflows import search
    from rolloutd.workflows.callback import CallbackInput, CallbackWorkflow, callback_workflow_id
    from rolloutd.workflows.session import RolloutSessionWorkflow, SessionInput


def task_workflow_id(task_id: str) -> str:
    """Workflow id of a task."""
    return f"task/{task_id}"


def session_id_of(task_id: str, sample_index: int) -> str:
    """Session id of one sample of a task."""
    return f"{task_id}/{sample_index}"


#: histories recorded before DETACHED_CALLBACKS_PATCH: callbacks ran inside the task, with
#: exponential backoff for about 10 minutes, and held it running meanwhile.
CALLBACK_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=15,
)
#: the signal a task sends to ``TaskRequest.report_to`` (RolloutBufferWorkflow) at its end.
GROUP_FINISHED_SIGNAL = "group_finished"
#: patch id of cancelling sessions directly (:func:`_cancel_sessions`), not as child cancels.
CANCEL_DIRECTLY_PATCH = "cancel-sessions-directly"
#: patch id of callbacks as detached children (:mod:`rolloutd.workflows.callback`).
DETACHED_CALLBACKS_PATCH = "detached-callbacks"
#: the query answering :class:`~rolloutd.types.TaskProgress`.
STATUS_QUERY = "status"


@workflow.defn
class RolloutTaskWorkflow:
    """Run ``num_samples`` sessions of one task and return the group with its stats."""

    def __init__(self) -> None:
        self._results: dict[int, SessionResult] = {}
        self._progress: TaskProgress | None = None

    @workflow.query
    def progress(self) -> dict[str, int]:
        """How many sessions have finished out of how many."""
        return {"finished": len(self._results)}

    @workflow.query(name=STATUS_QUERY)
    def status(self) -> TaskProgress | None:
        """Every session that has ended so far, with its outcome (None before the first
        workflow task ran). ``status`` is ``running`` here until the task's workflow ends;
        readers decide from the sessions (:meth:`RolloutClient.status
        <rolloutd.trainer_client.client.RolloutClient.status>`)."""
        if self._progress is None:
            return None
        return self._progress.model_copy(update={
            "sessions": [self._results[i] for i in sorted(self._results)]})

    @workflow.run
    async def run(self, task: TaskRequest) -> TaskResult:
        self._progress = TaskProgress(task_id=task.task_id, num_samples=task.num_samples)
        search.upsert(task_id=task.task_id, harness=task.harness.type, status="running")
        parent = workflow.info().workflow_id

        async def one(index: int) -> SessionResult:
            session_id = session_id_of(task.task_id, index)
            try:
                result = await workflow.execute_child_workflow(
                    RolloutSessionWorkflow.run,
                    SessionInput(task=task, sample_index=index, session_id=session_id),
                    id=f"{parent}/{index}",
                    task_queue=task_queues.WORKFLOWS,
                    execution_timeout=None,
                    cancellation_type=workflow.ChildWorkflowCancellationType.WAIT_CANCELLATION_COMPLETED,
                )
            except ChildWorkflowError as e:
                result = SessionResult(session_id=session_id, task_id=task.task_id,
                                       sample_index=index, status=SessionStatus.FAILED,
                                       error=f"session workflow failed: {e.cause or e}")
            self._results[index] = result
            if task.callback_url and not cancelling:
                if workflow.patched(DETACHED_CALLBACKS_PATCH):
                    await _start_callback(task.callback_url, parent, index, task, result)
                else:
                    await _post_callback(task.callback_url, result)
            return result

        cancelling = False
        sessions = [asyncio.ensure_future(one(i)) for i in range(task.num_samples)]
        try:
            # shielded: a cancelled task cancels its sessions itself (_cancel_sessions), then
            # waits for every one to end (its teardown done), as WAIT_CANCELLATION_COMPLETED
            results = await asyncio.gather(*(asyncio.shield(s) for s in sessions))
        except asyncio.CancelledError:
            cancelling = True
            self._progress.status = "cancelled"
            search.upsert(status=SessionStatus.CANCELLED.value)
            await _cancel_sessions(parent, sessions)
            await asyncio.gather(*sessions, return_exceptions=True)
            raise
        group = summarize(task.task_id, list(results))
        self._progress.status = "completed" if group.num_completed else "failed"
        search.upsert(status="completed", reward=group.mean_reward)
        if task.report_to:
            await _report(task.report_to, group)
        return group


async def _cancel_sessions(parent: str, sessions: list[asyncio.Future]) -> None:
    """Cancel the sessions still running: each directly by its workflow id (the local activity
    ``cancel_workflows``, about a second for 100), not by the task's child cancellation, which
    the server delivers at about one a second (:mod:`rolloutd.activities.cancel`). A session
    that call could not reach (not started yet), or every one when the activity fails, is
    cancelled as a child."""
    running = [i for i, s in enumerate(sessions) if not s.done()]
    fallback = running
    if workflow.patched(CANCEL_DIRECTLY_PATCH):
        try:
            failed = await workflow.execute_local_activity(
                cancel_workflows, [f"{parent}/{i}" for i in running],
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=2),
            )
            fallback = [i for i in running if f"{parent}/{i}" in set(failed)]
        except ActivityError as e:
            workflow.logger.warning("cancelling sessions directly failed (%s): cancelling "
                                    "them as children", e.cause or e)
    for i in fallback:
        sessions[i].cancel()


async def _start_callback(url: str, parent: str, index: int, task: TaskRequest,
                          result: SessionResult) -> None:
    """Start a session's callback as a detached child: it outlives the task, which never
    waits for it (the receiver's answers are in the child's ``state`` query)."""
    await workflow.start_child_workflow(
        CallbackWorkflow.run,
        CallbackInput(url=url, session=result, timeout_s=task.callback_timeout_s),
        id=callback_workflow_id(parent, index),
        task_queue=task_queues.WORKFLOWS,
        parent_close_policy=ParentClosePolicy.ABANDON,
    )


async def _post_callback(url: str, result: SessionResult) -> None:
    """POST a session's result to the task's callback URL; a receiver that stays down is
    logged, never a task failure (the result is kept in the task's group either way)."""
    try:
        await workflow.execute_activity(
            "post_callback", PostCallbackInput(url=url, session=result),
            task_queue=task_queues.EVAL,
            start_to_close_timeout=timedelta(seconds=60),
            retry_policy=CALLBACK_RETRY,
        )
    except ActivityError as e:
        workflow.logger.warning("callback to %s for %s gave up: %s", url, result.session_id,
                                e.cause or e)


async def _report(workflow_id: str, group: TaskResult) -> None:
    """Signal the task's group to the workflow that asked for it (its buffer). A buffer that
    has closed is not an error of the task."""
    try:
        await workflow.get_external_workflow_handle(workflow_id).signal(
            GROUP_FINISHED_SIGNAL, group)
    except Exception as e:  # noqa: BLE001 - boundary: the buffer may be gone
        workflow.logger.warning("could not report group %s to %s: %s", group.task_id,
                                workflow_id, e)


def summarize(task_id: str, sessions: list[SessionResult]) -> TaskResult:
    """Group stats of a task's sessions: mean and (population) std of the rewards."""
    rewards = [s.reward for s in sessions if s.reward is not None]
    mean = sum(rewards) / len(rewards) if rewards else None
    std = (math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
           if rewards and mean is not None else None)
    return TaskResult(
        task_id=task_id,
        sessions=sorted(sessions, key=lambda s: s.sample_index),
        mean_reward=mean,
        reward_std=std,
        num_completed=sum(s.status == SessionStatus.COMPLETED for s in sessions),
    )
