"""How a session ends: what an attempt ended with, the decision of its failure cause and
scoring, and the activity steps after the last attempt (docs/sessions.md, docs/failures.md).

- :class:`AttemptOutcome`: what one attempt recorded (:func:`host_lost`, :func:`note_error`
  read the activities' errors into it);
- :func:`decide`: the failure cause and how the session is scored (:class:`EndDecision`, by
  the rules of :func:`rolloutd.workflows.session.failures.classify`), once the gateway session
  is sealed;
- the steps, each one activity (or two) with explicit inputs and its output:
  :func:`teardown` (the runtime's, which always runs, beside close and build), :func:`close`
  (seal the gateway session), :func:`build` (the trajectory), :func:`evaluate` (the reward),
  :func:`evaluate_in_fresh_runtime` (the check in the prewarmed evaluation runtime), and
  :func:`report` (search attributes and metrics).

:meth:`rolloutd.workflows.session.workflow.RolloutSessionWorkflow._finish` runs them in order.
Workflow code: deterministic, no I/O.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any

from temporalio import workflow
from temporalio.common import Priority
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError, TimeoutType
from temporalio.exceptions import CancelledError as TemporalCancelledError

with workflow.unsafe.imports_passed_through():
    from rolloutd import task_queues
    from rolloutd.activities.models import (
        BuildTrajectoryInput,
        BuildTrajectoryOutput,
        CloseSessionInput,
        CloseSessionOutput,
        CollectArtifactsInput,
        CollectArtifactsOutput,
        EvaluateInput,
        EvaluateOutput,
        JudgeTarget,
        OpenSessionOutput,
        ProvisionRuntimeOutput,
        TeardownRuntimeInput,
    )
    from rolloutd.activities.names import (
        BUILD_TRAJECTORY,
        CLOSE_SESSION,
        COLLECT_ARTIFACTS,
        EVALUATE,
        TEARDOWN_RUNTIME,
    )
    from rolloutd.observability import names
    from rolloutd.rubrics import JUDGE_EVALUATOR
    from rolloutd.scoring import failure_key, judge_failure
    from rolloutd.types import (
        FailureCause,
        SessionStatus,
        TaskRequest,
    )
    from rolloutd.workflows import search
    from rolloutd.workflows.session import failures, judging
    from rolloutd.workflows.session.failures import cause_text
    from rolloutd.workflows.session.models import SessionInput
    from rolloutd.workflows.session.policies import (
        CLOSE_TIMEOUT,
        HEARTBEAT,
        INFRA_RETRY,
        LOST_HOST_TEARDOWN,
        NO_RETRY,
        PINNED_CLOSE,
        seconds,
    )

#: counter of sessions ended with a failure cause (label ``kind``), from workflow code
#: through ``workflow.metric_meter()`` (replay-safe)
SESSION_FAILURES_METRIC = names.SESSION_FAILURES
#: activity error types that mean the sandbox host is gone or going: rolloutd.errors', and
#: the SDK's for an activity still running when its worker's drain ran out of grace
HOST_LOST_ERRORS = ("RuntimeNotFoundError", "HostDrainingError", "WorkerShutdown")

#: ``timed(phase, awaitable, current=True)``: the session's phase timer (workflow.py)
Timed = Callable[..., Any]


def host_lost(error: ActivityError) -> bool:
    """Whether a host-pinned activity failed because its sandbox host died or restarted:
    no heartbeat in time, never picked up from the host's queue, the runtime is unknown
    to the host (a restarted worker), or the host handed the run back while it drained
    (``HostDrainingError``: SIGTERM), or the run outlived the drain's grace period
    (``WorkerShutdown``)."""
    cause = error.cause
    if isinstance(cause, TimeoutError):
        return cause.type in (TimeoutType.HEARTBEAT, TimeoutType.SCHEDULE_TO_START)
    return isinstance(cause, ApplicationError) and cause.type in HOST_LOST_ERRORS


@dataclasses.dataclass
class AttemptOutcome:
    """What one attempt ended with."""

    status: SessionStatus = SessionStatus.COMPLETED
    error: str | None = None
    harness_exit: int | None = None
    artifacts: dict[str, str] = dataclasses.field(default_factory=dict)
    cancelled: bool = False
    host_lost: bool = False
    #: provisioning was given up: no sandbox worker polls (the prewarm waits in vain too)
    no_sandbox_worker: bool = False
    #: what the failure cause is decided from (rolloutd.workflows.session.failures.SessionFacts)
    failed_phase: str | None = None
    error_type: str | None = None
    non_retryable: bool = False
    timed_out: bool = False
    harness_ran: bool = False
    signal_sent: int | None = None
    #: Unix time the run budget ran out (the harness was stopped then)
    timed_out_at: float | None = None
    run_budget_shortened: bool = False
    #: the gateway's verdict that stopped the harness (its calls stood unanswered)
    backend_verdict: str | None = None
    #: the runtime's ceiling the run reached, naming the limit
    limit_reached: str | None = None
    #: the runtime's teardown, running beside close and build (they do not depend on each other)
    teardown: asyncio.Future[None] | None = None

    async def torn_down(self) -> None:
        """Wait for the runtime's teardown when it runs in the background."""
        if self.teardown is not None:
            await self.teardown


def session_facts(
    outcome: AttemptOutcome, closed: CloseSessionOutput, harness_type: str
) -> failures.SessionFacts:
    """What :func:`rolloutd.workflows.session.failures.classify` decides from: the last
    attempt's outcome and what the gateway said when it sealed the session."""
    return failures.SessionFacts(
        cancelled=outcome.cancelled,
        failed_phase=outcome.failed_phase,
        error=outcome.error,
        error_type=outcome.error_type,
        non_retryable=outcome.non_retryable,
        timed_out=outcome.timed_out,
        host_lost=outcome.host_lost,
        no_sandbox_worker=outcome.no_sandbox_worker,
        harness_type=harness_type,
        harness_ran=outcome.harness_ran,
        harness_exit=outcome.harness_exit,
        signal_sent=outcome.signal_sent,
        run_budget_shortened=outcome.run_budget_shortened,
        num_completions=closed.num_completions,
        num_unrecovered_backend_errors=closed.num_unrecovered_errors,
        first_unrecovered_error=closed.first_unrecovered_error,
        call_waiting_at_deadline=closed.call_waiting_at_deadline,
        backend_verdict=outcome.backend_verdict,
        refused_call=closed.last_refusal,
        limit_reached=outcome.limit_reached,
    )


def note_error(out: AttemptOutcome, e: ActivityError) -> None:
    """Keep what a failed activity said about itself: its error type, whether a new attempt
    would fail again, whether its budget ran out."""
    cause = e.cause
    if isinstance(cause, ApplicationError):
        out.error_type, out.non_retryable = cause.type, cause.non_retryable
    elif isinstance(cause, TimeoutError) and cause.type in (
        TimeoutType.START_TO_CLOSE,
        TimeoutType.SCHEDULE_TO_CLOSE,
    ):
        out.timed_out = True


@dataclasses.dataclass
class EndDecision:
    """How a session ended, once its gateway session is sealed: its status and error, its
    failure cause, and how it is scored (:func:`rolloutd.workflows.session.failures.scoring`:
    ``evaluate``, ``force`` a reward, or ``skip``)."""

    status: SessionStatus
    error: str | None
    failure: FailureCause | None
    how: failures.Scoring
    forced: float | None = None
    #: why the reward was forced, for the evaluation record (None: the task's setting)
    forced_reason: str | None = None


def decide(
    task: TaskRequest,
    outcome: AttemptOutcome,
    closed: CloseSessionOutput,
    error: str | None,
    eval_error: str | None,
) -> EndDecision:
    """Decide the failure cause (:func:`~rolloutd.workflows.session.failures.classify`) and
    the scoring of a session from its last attempt and the sealed gateway session.

    Args:
        task: the session's task (``timeout_reward``, ``invalid_tool_call_reward``).
        outcome: the last attempt.
        closed: what the gateway said when it sealed the session.
        error: the session's error so far (the attempt's, or the evaluation runtime's).
        eval_error: the evaluation runtime's failure (``cancelled`` when it was cancelled).
    """
    status = outcome.status
    failure = failures.classify(session_facts(outcome, closed, task.harness.type))
    if failure is None and eval_error is not None and eval_error != "cancelled":
        failure = FailureCause(kind="evaluator", message=eval_error, phase="eval_provision")
    how, forced = failures.scoring(failure, task.timeout_reward)
    reason = failure.message if how == "force" and failure and failure.kind == "harness" else None
    if (
        how != "skip"
        and reason is None  # a ceiling reached keeps its 0.0
        and closed.num_invalid_tool_calls
        and task.invalid_tool_call_reward is not None
    ):
        # an unreadable tool call is the model's doing: the task sets its reward
        how, forced = "force", task.invalid_tool_call_reward
    if failure is not None and failure.kind not in ("timeout", "cancelled"):
        status = SessionStatus.FAILED
        error = error or failure.message
    return EndDecision(
        status=status, error=error, failure=failure, how=how, forced=forced, forced_reason=reason
    )


async def build(
    input: SessionInput,
    session_id: str,
    decided: EndDecision,
    timed: Timed,
    *,
    priority: Priority | None,
) -> BuildTrajectoryOutput:
    """Step 7: the gateway builds and stores the session's trajectory.

    Args:
        input: the session's input.
        session_id: the last attempt's session id (its completion log).
        decided: the session's status and failure cause.
        timed: the session's phase timer.
        priority: the session's task priority.
    """
    task = input.task
    return await timed(
        "build",
        workflow.execute_activity(
            BUILD_TRAJECTORY,
            BuildTrajectoryInput(
                session_id=session_id,
                task_id=task.task_id,
                sample_index=input.sample_index,
                status=decided.status,
                builder=task.builder,
                failure=decided.failure,
            ),
            task_queue=task_queues.GATEWAY,
            start_to_close_timeout=seconds(task.phases.build_s),
            retry_policy=INFRA_RETRY,
            priority=priority,
            result_type=BuildTrajectoryOutput,
        ),
    )


async def evaluate(
    input: SessionInput,
    session_id: str,
    outcome: AttemptOutcome,
    built: BuildTrajectoryOutput,
    decided: EndDecision,
    timed: Timed,
    *,
    priority: Priority | None,
    num_completions: int,
) -> EvaluateOutput:
    """Step 8: the evaluator's reward (or the forced one). An evaluator that fails makes
    the session ``failed`` with an ``evaluator`` cause (``decided`` is updated).

    Args:
        input: the session's input.
        session_id: the last attempt's session id.
        outcome: the last attempt (harness exit, artifacts).
        built: the stored trajectory.
        decided: the session's decision; updated when the evaluator fails.
        timed: the session's phase timer.
        priority: the session's task priority.
        num_completions: completions the sealed gateway session recorded.

    Returns:
        The reward, the per-trace rewards (None when the evaluator gave none) and the
        evaluation record; no reward when the evaluator failed.
    """
    task = input.task
    if task.evaluator.type == JUDGE_EVALUATOR and decided.forced is None:
        return await judge(input, session_id, built, decided, timed, priority=priority)
    try:
        evaluated: EvaluateOutput = await timed(
            "evaluate",
            workflow.execute_activity(
                EVALUATE,
                EvaluateInput(
                    session_id=session_id,
                    task_id=task.task_id,
                    evaluator=task.evaluator,
                    status=decided.status,
                    harness_exit_code=outcome.harness_exit,
                    num_completions=num_completions,
                    trajectory_ref=built.trajectory_ref,
                    artifacts=outcome.artifacts,
                    forced_reward=decided.forced,
                    forced_reason=decided.forced_reason,
                ),
                task_queue=task_queues.EVAL,
                start_to_close_timeout=seconds(task.phases.evaluate_s),
                heartbeat_timeout=HEARTBEAT,
                retry_policy=INFRA_RETRY,
                priority=priority,
                result_type=EvaluateOutput,
            ),
        )
    except ActivityError as e:
        if isinstance(e.cause, TemporalCancelledError):
            raise
        evaluated = EvaluateOutput(error=f"evaluation failed: {cause_text(e)}")
    if evaluated.error is not None:
        decided.failure = FailureCause(
            kind="evaluator", phase="evaluate", message=evaluated.error[:500], retryable=False
        )
        decided.status = SessionStatus.FAILED
        decided.error = decided.error or evaluated.error
        return EvaluateOutput(error=evaluated.error, evaluation=evaluated.evaluation)
    return evaluated


async def judge(
    input: SessionInput,
    session_id: str,
    built: BuildTrajectoryOutput,
    decided: EndDecision,
    timed: Timed,
    *,
    priority: Priority | None,
) -> EvaluateOutput:
    """Step 8 for a task scored by an LLM judge: a ``sample`` judge judges the stored
    trajectory now (:func:`rolloutd.workflows.session.judging.judge`); a ``group`` judge leaves the
    session unscored for its task to judge with its group. A judging given up makes the session
    ``failed`` with an ``evaluator`` cause in phase ``judge`` and no reward (``decided`` is
    updated).
    """
    task = input.task
    assert task.evaluator.judge is not None
    if task.evaluator.judge.mode == "group":
        search.upsert(judged_by_group=True)
        return EvaluateOutput()
    if not built.trajectory_ref:
        return EvaluateOutput()
    judged = await timed(
        "judge",
        judging.judge(
            task_id=task.task_id,
            evaluator=task.evaluator,
            targets=[JudgeTarget(session_id=session_id, trajectory_ref=built.trajectory_ref)],
            judge_session_id=f"{session_id}/judge",
            priority=priority,
            pool_wait_s=task.phases.provision_wait_s,
        ),
    )
    if judged.output is None:
        decided.failure = judge_failure(judged.error or "judging given up")
        decided.status = SessionStatus.FAILED
        decided.error = decided.error or decided.failure.message
        return EvaluateOutput(error=decided.failure.message)
    verdict = judged.output.judged[0]
    return EvaluateOutput(reward=verdict.reward, evaluation=verdict.evaluation)


def report(
    task: TaskRequest,
    decided: EndDecision,
    reward: float | None,
    built: BuildTrajectoryOutput,
) -> None:
    """Step 9's reports: search attributes and the metrics (the workflow shows the UI's current
    details itself)."""
    failure_kind = decided.failure.kind if decided.failure is not None else None
    counted = failure_key(decided.failure)
    versions = built.stats.policy_versions
    search.upsert(
        status=decided.status.value,
        reward=reward,
        policy_version=max(versions) if versions else None,
        failure=failure_kind,
    )
    if failure_kind is not None:
        workflow.metric_meter().create_counter(
            SESSION_FAILURES_METRIC, "sessions that ended with a failure cause, by kind"
        ).add(1, {"kind": counted})
    workflow.metric_meter().create_counter(
        names.SESSIONS_ENDED, "sessions ended, by status and harness"
    ).add(1, {"status": decided.status.value, "harness": task.harness.type})


async def teardown(
    runtime: ProvisionRuntimeOutput,
    timed: Timed,
    *,
    priority: Priority | None,
    host_lost: bool,
    teardown_s: float,
    current: bool = True,
) -> None:
    """Tear a runtime down on its host; a host that does not answer in time is left to
    reclaim the runtime when it starts again (rolloutd.sandbox.reclaim)."""
    try:
        await timed(
            "teardown",
            workflow.execute_activity(
                TEARDOWN_RUNTIME,
                TeardownRuntimeInput(runtime_id=runtime.runtime_id),
                task_queue=runtime.host_queue,
                start_to_close_timeout=seconds(teardown_s),
                schedule_to_close_timeout=(
                    LOST_HOST_TEARDOWN if host_lost else seconds(3 * teardown_s)
                ),
                heartbeat_timeout=HEARTBEAT,
                retry_policy=INFRA_RETRY,
                priority=priority,
            ),
            current=current,
        )
    except ActivityError as e:
        workflow.logger.warning(
            "teardown of %s on %s abandoned (reclaimed when the host restarts): %s",
            runtime.runtime_id,
            runtime.host_id,
            cause_text(e),
        )


async def close(
    opened: OpenSessionOutput,
    session_id: str,
    timed: Timed,
    *,
    priority: Priority | None,
    run_deadline_at: float | None = None,
) -> CloseSessionOutput:
    """Seal a gateway session on the gateway host serving it; when that host does not
    answer in time, any gateway seals it from the durable state in the store.

    Args:
        run_deadline_at: Unix time the run budget ran out: the output says whether a
            call was waiting on the backend then.
    """
    close_input = CloseSessionInput(session_id=session_id, run_deadline_at=run_deadline_at)
    try:
        return await timed(
            "close",
            workflow.execute_activity(
                CLOSE_SESSION,
                close_input,
                task_queue=opened.host_queue,
                start_to_close_timeout=CLOSE_TIMEOUT,
                schedule_to_close_timeout=PINNED_CLOSE,
                retry_policy=INFRA_RETRY,
                priority=priority,
                result_type=CloseSessionOutput,
            ),
        )
    except ActivityError as e:
        workflow.logger.warning(
            "gateway host %s did not close %s (%s): closing on any gateway",
            opened.host_queue,
            session_id,
            cause_text(e),
        )
        return await timed(
            "close",
            workflow.execute_activity(
                CLOSE_SESSION,
                close_input,
                task_queue=task_queues.GATEWAY,
                start_to_close_timeout=CLOSE_TIMEOUT,
                retry_policy=INFRA_RETRY,
                priority=priority,
                result_type=CloseSessionOutput,
            ),
        )


async def evaluate_in_fresh_runtime(
    input: SessionInput,
    prewarm: asyncio.Task[ProvisionRuntimeOutput],
    artifacts: dict[str, str],
    *,
    run_check: bool,
    timed: Timed,
    priority: Priority | None,
) -> str | None:
    """Apply the session's patch in the prewarmed runtime, run the check, tear it down.

    ``artifacts`` (name -> blob key) gains the ``check`` and ``patch_apply`` keys.

    Returns:
        An error message when the evaluation runtime failed, else None.
    """
    task, phases = input.task, input.task.phases
    eval_runtime: ProvisionRuntimeOutput | None = None
    error: str | None = None
    try:
        # shielded: a cancellation must not abandon a runtime that is being provisioned
        eval_runtime = await asyncio.shield(prewarm)
        if run_check:
            checked: CollectArtifactsOutput = await timed(
                "eval_check",
                workflow.execute_activity(
                    COLLECT_ARTIFACTS,
                    CollectArtifactsInput(
                        runtime_id=eval_runtime.runtime_id,
                        session_id=input.session_id,
                        evaluator=task.evaluator,
                        collect_outputs=False,
                        run_check=True,
                        apply_patch_ref=artifacts.get("patch"),
                    ),
                    task_queue=eval_runtime.host_queue,
                    start_to_close_timeout=seconds(phases.collect_s + task.evaluator.timeout_s),
                    heartbeat_timeout=HEARTBEAT,
                    retry_policy=NO_RETRY,
                    priority=priority,
                    result_type=CollectArtifactsOutput,
                ),
            )
            artifacts.update({k: v for k, v in checked.artifacts.items() if k != "harness"})
    except ActivityError as e:
        error = f"evaluation runtime failed: {cause_text(e)}"
    except asyncio.CancelledError:
        error = "cancelled"
    finally:
        if eval_runtime is None and not prewarm.done():
            try:
                eval_runtime = await prewarm
            except ActivityError:
                eval_runtime = None
        if eval_runtime is not None:
            await timed(
                "eval_teardown",
                workflow.execute_activity(
                    TEARDOWN_RUNTIME,
                    TeardownRuntimeInput(runtime_id=eval_runtime.runtime_id),
                    task_queue=eval_runtime.host_queue,
                    start_to_close_timeout=seconds(phases.teardown_s),
                    heartbeat_timeout=HEARTBEAT,
                    retry_policy=INFRA_RETRY,
                    priority=priority,
                ),
            )
    return error
