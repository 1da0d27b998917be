"""One judging, from workflow code: open a judge session at the gateway (judge pool), run the
``judge`` activity on the judge queue, close the judge session; when the judging is given up,
write the failure into the stored trajectories.

Called by the session workflow (a task judged per sample, after its trajectory is built), the
task workflow (a task judged as a group, after its replacements) and :class:`RejudgeWorkflow`
(stored sessions judged again: workflow id ``rejudge/{run_id}``). A judging never samples
the policy again and never counts against ``max_replacements``: it reads stored trajectories
only.

A judging attempt that fails is tried again from the stored trajectories, never by sampling
again. What fails it decides whether it counts:

- the judge pool is down (the gateway's health of its ``judge`` pool says no healthy backend):
  the judging waits for it as a replacement waits for a dead engine
  (:func:`rolloutd.workflows.pool_watch.wait_for_pool`, up to ``pool_wait_s``, at most
  :data:`MAX_POOL_WAITS` times) and tries again, not counted;
- the pool lives but gave no answer (a judge call past ``judge.timeout_s``, a 5xx): counted,
  tried again after a back-off (2 s doubling, at most :data:`MAX_BACKOFF`), up to
  ``judge.max_attempts``.

Given up (the attempts spent, or the pool still down after its waits), the sessions have no
reward and an ``evaluator`` cause in phase ``judge`` (:func:`rolloutd.scoring.judge_failure`):
an infrastructure failure is never a reward; a re-judging scores them later. Deterministic
code only.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta

from temporalio import workflow
from temporalio.common import Priority, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import CancelledError as TemporalCancelledError

with workflow.unsafe.imports_passed_through():
    from pydantic import Field

    from rolloutd import task_queues
    from rolloutd.activities.models import (  # noqa: F401 - JudgeTarget: re-exported
        CloseSessionInput,
        CloseSessionOutput,
        JudgedSession,
        JudgeFailedInput,
        JudgeInput,
        JudgeOutput,
        JudgeTarget,
        OpenSessionInput,
        OpenSessionOutput,
    )
    from rolloutd.activities.names import CLOSE_SESSION, JUDGE, JUDGE_FAILED, OPEN_SESSION
    from rolloutd.payload import Payload
    from rolloutd.rubrics import num_group_chunks
    from rolloutd.types import EvaluatorSpec
    from rolloutd.workflows import pool_watch
    from rolloutd.workflows.session.failures import cause_text
    from rolloutd.workflows.session.policies import CLOSE_TIMEOUT, HEARTBEAT, INFRA_RETRY

#: the first and the longest wait between two counted judging attempts
FIRST_BACKOFF = timedelta(seconds=2)
MAX_BACKOFF = timedelta(seconds=60)
#: waits for a dead judge pool one judging makes at most (each up to ``pool_wait_s``), as a
#: group's replacements wait for a dead engine at most three times per sample
MAX_POOL_WAITS = 3
#: how long a judging waits for a dead judge pool when its caller names no time (a
#: re-judging), s
POOL_WAIT_S = 600.0
#: a judge session's open and the failure's write
STEP_TIMEOUT = timedelta(seconds=60)
#: the errors a judging does not retry: a spec that is not a judge's, a context that stays
#: exceeded (they would fail again)
NON_RETRYABLE = ["EvaluatorError", "ConfigError"]


@dataclasses.dataclass
class Judged:
    """A judging's end: its output, or why it was given up (the sessions then carry the
    failure in the store)."""

    output: JudgeOutput | None = None
    error: str | None = None


def activity_budget(evaluator: EvaluatorSpec, num_targets: int) -> timedelta:
    """One judging attempt's start-to-close budget: every call it may make at the judge's
    call limit (each verdict's parse attempts, a group's chunks, per-turn chunks bounded by
    32 per session), with room for halvings, 60 s at least; a dead worker is noticed by the
    heartbeat."""
    spec = evaluator.judge
    assert spec is not None
    chunks = (
        num_group_chunks(num_targets, spec.group_chunk_size)
        if spec.mode == "group"
        else num_targets
    )
    if spec.per_turn:
        chunks += 32 * num_targets
    calls_s = spec.timeout_s * spec.max_parse_attempts * chunks * 3
    return timedelta(seconds=min(86_400.0, max(60.0, calls_s)))


async def judge(
    *,
    task_id: str,
    evaluator: EvaluatorSpec,
    targets: list[JudgeTarget],
    judge_session_id: str,
    source: str = "judge",
    rescore: bool = False,
    priority: Priority | None = None,
    pool_wait_s: float = POOL_WAIT_S,
) -> Judged:
    """Judge stored sessions (module docstring).

    Args:
        task_id: the task.
        evaluator: the task's ``llm_judge`` spec.
        targets: the sessions, each with its stored trajectory.
        judge_session_id: the judge session's id (its completion log in the store), new per
            judging: ``{session_id}/judge`` for a sample, ``{task_id}/group-judge`` for a group.
        source: ``judge`` or ``group_judge`` (the records' source).
        rescore: a re-judging (records appended to ``rescores``).
        priority: the task's priority.
        pool_wait_s: how long one wait for a dead judge pool lasts at most, s (the task's
            ``phases.provision_wait_s``, as for a dead engine).

    Returns:
        The verdicts, or the error the sessions were left with.
    """
    spec = evaluator.judge
    assert spec is not None
    try:
        opened: OpenSessionOutput = await workflow.execute_activity(
            OPEN_SESSION,
            OpenSessionInput(
                session_id=judge_session_id, task_id=task_id, model=spec.model, pool="judge"
            ),
            task_queue=task_queues.GATEWAY,
            start_to_close_timeout=STEP_TIMEOUT,
            retry_policy=INFRA_RETRY,
            priority=priority,
            result_type=OpenSessionOutput,
        )
    except ActivityError as e:
        return await _given_up(
            task_id, evaluator, targets, f"no judge session: {cause_text(e)}", rescore, priority
        )
    judge_input = JudgeInput(
        task_id=task_id,
        evaluator=evaluator,
        targets=targets,
        base_url=opened.openai_base_url,
        session_key=opened.session_key,
        judge_session_id=judge_session_id,
        source=source,  # type: ignore[arg-type]
        rescore=rescore,
    )
    try:
        output, error = await _attempts(judge_input, spec.max_attempts, pool_wait_s, priority)
    finally:
        await _close(opened, priority)
    if output is None:
        return await _given_up(task_id, evaluator, targets, error, rescore, priority)
    return Judged(output=output)


async def _attempts(
    judge_input: JudgeInput, max_attempts: int, pool_wait_s: float, priority: Priority | None
) -> tuple[JudgeOutput | None, str]:
    """Run the ``judge`` activity until it answers (module docstring: a dead pool is waited
    for, uncounted; other failures count, up to ``max_attempts``).

    Returns:
        ``(output, "")``, or ``(None, why it was given up)``.
    """
    evaluator = judge_input.evaluator
    counted = pool_waits = 0
    while True:
        try:
            output: JudgeOutput = await workflow.execute_activity(
                JUDGE,
                judge_input,
                task_queue=task_queues.JUDGE,
                start_to_close_timeout=activity_budget(evaluator, len(judge_input.targets)),
                heartbeat_timeout=HEARTBEAT,
                # one attempt per activity: this loop decides whether a failure counts
                retry_policy=RetryPolicy(maximum_attempts=1),
                priority=priority,
                result_type=JudgeOutput,
            )
            return output, ""
        except ActivityError as e:
            if isinstance(e.cause, TemporalCancelledError):
                raise
            cause = cause_text(e)
            error_type = e.cause.type if isinstance(e.cause, ApplicationError) else None
            if error_type in NON_RETRYABLE:
                return None, f"judging given up: {cause}"
        if await pool_watch.pool_down("judge"):
            if pool_waits >= MAX_POOL_WAITS:
                return None, (
                    f"judging given up: the judge pool stayed down through {pool_waits} "
                    f"wait(s) of {pool_wait_s:g} s: {cause}"
                )
            pool_waits += 1
            workflow.logger.warning("judge pool down: judging waits for it (%s)", cause)
            if await pool_watch.wait_for_pool("judge", pool_wait_s):
                continue
            return None, (
                f"judging given up: the judge pool stayed down for {pool_wait_s:g} s: {cause}"
            )
        counted += 1
        if counted >= max_attempts:
            return None, f"judging given up after {counted} attempt(s): {cause}"
        backoff = min(MAX_BACKOFF, FIRST_BACKOFF * 2 ** (counted - 1))
        await workflow.sleep(backoff)


async def _close(opened: OpenSessionOutput, priority: Priority | None) -> None:
    """Seal the judge session on its gateway host (best effort: an open judge session holds
    nothing but its pin, and its log is complete)."""
    try:
        await workflow.execute_activity(
            CLOSE_SESSION,
            CloseSessionInput(session_id=opened.session_id),
            task_queue=opened.host_queue,
            start_to_close_timeout=CLOSE_TIMEOUT,
            schedule_to_close_timeout=CLOSE_TIMEOUT,
            retry_policy=INFRA_RETRY,
            priority=priority,
            result_type=CloseSessionOutput,
        )
    except ActivityError as e:
        workflow.logger.warning("judge session %s not closed: %s", opened.session_id, cause_text(e))


async def _given_up(
    task_id: str,
    evaluator: EvaluatorSpec,
    targets: list[JudgeTarget],
    message: str,
    rescore: bool,
    priority: Priority | None,
) -> Judged:
    """Write a given-up judging into the stored trajectories; the sessions keep no reward."""
    workflow.logger.warning("judging of %s given up: %s", task_id, message)
    await workflow.execute_activity(
        JUDGE_FAILED,
        JudgeFailedInput(
            task_id=task_id,
            evaluator=evaluator,
            targets=targets,
            message=message,
            rescore=rescore,
        ),
        task_queue=task_queues.EVAL,
        start_to_close_timeout=STEP_TIMEOUT,
        retry_policy=INFRA_RETRY,
        priority=priority,
    )
    return Judged(error=message)


def rejudge_workflow_id(run_id: str) -> str:
    """Workflow id of a re-judging run."""
    return f"rejudge/{run_id}"


class RejudgeInput(Payload):
    """Stored sessions judged again (their judging failed, or a new rubric): never sampled
    again, never counted against a task's replacements."""

    run_id: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
        description="names the run: its workflow id and its judge sessions' ids",
    )
    task_id: str
    evaluator: EvaluatorSpec = Field(description="the ``llm_judge`` spec to judge with")
    targets: list[JudgeTarget] = Field(min_length=1, max_length=4096)
    max_concurrent: int = Field(default=4, ge=1, le=256, description="sample judgings at once")
    pool_wait_s: float = Field(
        default=POOL_WAIT_S,
        gt=0,
        le=86_400,
        description="how long one wait for a dead judge pool lasts at most, s",
    )


class RejudgeOutput(Payload):
    """A re-judging run's verdicts, and the sessions it could not judge."""

    judged: list[JudgedSession] = Field(default_factory=list)
    errors: dict[str, str] = Field(
        default_factory=dict, description="session id -> why its judging was given up"
    )


@workflow.defn
class RejudgeWorkflow:
    """Judge stored sessions again (:class:`RejudgeInput`): a ``group`` judge judges them as
    one cohort, a ``sample`` judge each on its own (at most ``max_concurrent`` at once). Each
    verdict is appended to the session's ``rescores``; a session without a reward (its judging
    had failed) gets this one, and its judge failure is cleared."""

    @workflow.run
    async def run(self, input: RejudgeInput) -> RejudgeOutput:
        spec = input.evaluator.judge
        if spec is None:
            raise ApplicationError("evaluator.judge is required", non_retryable=True)
        out = RejudgeOutput()

        def keep(judged: Judged, targets: list[JudgeTarget]) -> None:
            if judged.output is not None:
                out.judged.extend(judged.output.judged)
            else:
                out.errors.update({t.session_id: judged.error or "" for t in targets})

        if spec.mode == "group":
            judged = await judge(
                task_id=input.task_id,
                evaluator=input.evaluator,
                targets=input.targets,
                judge_session_id=f"{input.task_id}/group-judge-{input.run_id}",
                source="group_judge",
                rescore=True,
                pool_wait_s=input.pool_wait_s,
            )
            keep(judged, input.targets)
            return out
        slots = asyncio.Semaphore(input.max_concurrent)

        async def one(target: JudgeTarget) -> None:
            async with slots:
                judged = await judge(
                    task_id=input.task_id,
                    evaluator=input.evaluator,
                    targets=[target],
                    judge_session_id=f"{target.session_id}/judge-{input.run_id}",
                    rescore=True,
                    pool_wait_s=input.pool_wait_s,
                )
                keep(judged, [target])

        await asyncio.gather(*(one(t) for t in input.targets))
        return out
