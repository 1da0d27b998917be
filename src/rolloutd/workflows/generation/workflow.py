"""``GenerationWorkflow``: an offline generation over a dataset's rows, each row once.

Workflow id ``generation/{name}``. One run:

1. ``plan_generation`` (eval fleet) reads the dataset from where the previous run stopped and
   the journal's index (the names of its entries) and returns up to ``rows_per_run`` rows not
   yet journaled, each as its ``TaskRequest``; the journal's totals are counted from its
   entries once, by a chain's first run, then carried over continue-as-new (planning stays
   linear in the rows, not quadratic);
2. each row runs as a child ``RolloutTaskWorkflow`` whose id ``task/gen-{name}-{key}`` comes from
   the row's key, at most ``max_concurrent_rows`` at once; when that id is already taken (an
   earlier run started it, then was terminated or crashed before journaling), the earlier
   task is awaited (``await_task``) instead of started again: a row is never sampled twice;
3. each finished row is journaled (``journal_row``: one blob per row in the store, written
   once);
4. with rows left, the run continues as new (a history holds each row's task); else
   ``write_generation_outputs`` filters every journaled row's samples and writes the outputs,
   and the summary is the result.

The journal lives in the blob store, not in this workflow: it must outlive the workflow
(Temporal forgets closed workflows after their retention), serve a rerun and every firing of a
schedule, and be read by the output writer without passing token arrays through history.
Children are abandoned, never terminated, with their parent: a terminated generation's rows
finish, and the next run picks their results up.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import ChildWorkflowError, WorkflowAlreadyStartedError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from rolloutd import task_queues
    from rolloutd.activities.names import (
        AWAIT_TASK,
        JOURNAL_ROW,
        PLAN_GENERATION,
        WRITE_GENERATION_OUTPUTS,
    )
    from rolloutd.types import SessionResult, SessionStatus, TaskResult
    from rolloutd.workflows import metadata
    from rolloutd.workflows.generation.models import (
        PROGRESS_QUERY,
        AwaitTaskInput,
        GenerationInput,
        GenerationProgress,
        GenerationSummary,
        JournalEntry,
        JournalRowInput,
        JournalRowOutput,
        JournalTotals,
        PlanInput,
        PlannedRow,
        PlanOutput,
        WriteOutputsInput,
    )
    from rolloutd.workflows.task import RolloutTaskWorkflow, task_workflow_id
    from rolloutd.workflows.tenants import task_priority

IO_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=10,
    non_retryable_error_types=["GenerationSourceError"],
)
#: a re-found task is awaited by an activity that heartbeats while it waits
AWAIT_HEARTBEAT = timedelta(seconds=60)


def passing(result: TaskResult, pass_reward: float) -> bool:
    """Whether any session of a group has a reward ``>= pass_reward`` (a group returned by
    reference, ``stored_key``, answers from its ``max_reward``)."""
    if result.stored_key:
        return result.max_reward is not None and result.max_reward >= pass_reward
    return any(s.reward is not None and s.reward >= pass_reward for s in result.sessions)


def failed(result: TaskResult) -> bool:
    """Whether a group has no scored session (every sample failed for infrastructure)."""
    if result.stored_key:
        return result.num_scored == 0
    return not any(s.reward is not None for s in result.sessions)


@workflow.defn
class GenerationWorkflow:
    """Run a generation's rows not yet journaled; see the module docstring."""

    def __init__(self) -> None:
        self._progress: GenerationProgress | None = None

    @workflow.query(name=PROGRESS_QUERY)
    def progress(self) -> GenerationProgress | None:
        """Rows done (earlier runs included), failed, passing and running; None before the
        first workflow task ran."""
        return self._progress

    @workflow.run
    async def run(self, input: GenerationInput) -> GenerationSummary:
        spec = input.spec
        started_at = input.started_at or workflow.now()
        self._progress = GenerationProgress(name=spec.name, started_at=started_at)
        plan: PlanOutput = await workflow.execute_activity(
            PLAN_GENERATION,
            PlanInput(spec=spec, limit=spec.rows_per_run, start=input.cursor, totals=input.totals),
            task_queue=task_queues.EVAL,
            start_to_close_timeout=timedelta(minutes=5),
            retry_policy=IO_RETRY,
            result_type=PlanOutput,
        )
        self._progress = GenerationProgress(
            name=spec.name,
            status="running",
            num_rows=plan.num_rows,
            num_done=plan.num_journaled,
            num_failed=plan.num_journaled_failed,
            num_passing=plan.num_journaled_passing,
            started_at=started_at,
        )
        slots = asyncio.Semaphore(spec.max_concurrent_rows)
        pass_reward = spec.filters.pass_reward

        async def one(row: PlannedRow) -> None:
            async with slots:
                assert self._progress is not None
                self._progress.num_running += 1
                result = await self._run_row(row, spec.template.timeout_s)
                self._progress.num_running -= 1
                await workflow.execute_activity(
                    JOURNAL_ROW,
                    JournalRowInput(
                        name=spec.name,
                        entry=JournalEntry(
                            key=row.key,
                            task_id=row.task.task_id,
                            result=result,
                            journaled_at=workflow.now(),
                        ),
                    ),
                    task_queue=task_queues.EVAL,
                    start_to_close_timeout=timedelta(minutes=1),
                    retry_policy=IO_RETRY,
                    result_type=JournalRowOutput,
                )
                self._progress.num_done += 1
                self._progress.num_failed += failed(result)
                self._progress.num_passing += passing(result, pass_reward)

        await asyncio.gather(*(one(row) for row in plan.rows))
        num_run = input.num_rows_this_generation + len(plan.rows)
        if plan.num_pending > len(plan.rows):
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(
                GenerationInput(
                    spec=spec,
                    started_at=started_at,
                    num_rows_this_generation=num_run,
                    cursor=plan.next_start,
                    totals=JournalTotals(
                        num_journaled=self._progress.num_done,
                        num_failed=self._progress.num_failed,
                        num_passing=self._progress.num_passing,
                    ),
                )
            )
        self._progress.status = "writing"
        summary: GenerationSummary = await workflow.execute_activity(
            WRITE_GENERATION_OUTPUTS,
            WriteOutputsInput(spec=spec),
            task_queue=task_queues.EVAL,
            start_to_close_timeout=timedelta(minutes=30),
            heartbeat_timeout=timedelta(minutes=2),
            retry_policy=IO_RETRY,
            result_type=GenerationSummary,
        )
        self._progress.status = "completed"
        summary.num_rows_this_run = num_run
        summary.wall_time_s = (workflow.now() - started_at).total_seconds()
        return summary

    async def _run_row(self, row: PlannedRow, timeout_s: float) -> TaskResult:
        """The row's group: its task run as a child, or awaited when an earlier run started it."""
        workflow_id = task_workflow_id(row.task.task_id)
        try:
            return await workflow.execute_child_workflow(
                RolloutTaskWorkflow.run,
                row.task,
                id=workflow_id,
                task_queue=task_queues.WORKFLOWS,
                priority=task_priority(row.task),
                static_summary=metadata.task_summary(row.task),
                static_details=metadata.static_details(row.task),
                parent_close_policy=ParentClosePolicy.ABANDON,
                # a failed or terminated task may run again; a completed one never
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE_FAILED_ONLY,
            )
        except WorkflowAlreadyStartedError:
            workflow.logger.info("generation row already started, awaiting it: %s", workflow_id)
            return await workflow.execute_activity(
                AWAIT_TASK,
                AwaitTaskInput(workflow_id=workflow_id),
                task_queue=task_queues.EVAL,
                # the task's own sessions bound it; the margin covers queueing and replacement
                start_to_close_timeout=timedelta(seconds=4 * timeout_s + 600),
                heartbeat_timeout=AWAIT_HEARTBEAT,
                retry_policy=IO_RETRY,
                result_type=TaskResult,
            )
        except ChildWorkflowError as e:
            return TaskResult(
                task_id=row.task.task_id,
                sessions=[
                    SessionResult(
                        session_id=f"{row.task.task_id}/0",
                        task_id=row.task.task_id,
                        status=SessionStatus.FAILED,
                        error=f"task workflow failed: {e.cause or e}",
                    )
                ],
            )
