"""Eval-fleet activities: score a session and write the rewards into its trajectory; say
whether an evaluator name is in this host's registry (asked through the fleet registry); store
a large task request once and read it back for its sessions; store a buffer's group."""

from __future__ import annotations

import asyncio
import time

import structlog
from temporalio import activity

from rolloutd.activities.heartbeat import heartbeating
from rolloutd.activities.models import (
    AssembleGroupInput,
    EvaluateInput,
    EvaluateOutput,
    StoredTaskRequest,
    StoreGroupPartInput,
    StoreTaskRequestInput,
)
from rolloutd.activities.names import (
    ASSEMBLE_GROUP,
    CHECK_EVALUATOR,
    EVALUATE,
    READ_TASK_REQUEST,
    STORE_GROUP,
    STORE_GROUP_PART,
    STORE_TASK_REQUEST,
)
from rolloutd.activities.refused import merged, refused_paths
from rolloutd.capabilities import (
    CheckEvaluatorInput,
    CheckEvaluatorOutput,
)
from rolloutd.errors import NotFoundError, to_application_error
from rolloutd.evaluators import (
    EvaluationContext,
    EvaluationOutcome,
    evaluator_names,
    evaluator_version,
    get_evaluator,
)
from rolloutd.store import BlobStore
from rolloutd.trajectory import assign_rewards
from rolloutd.types import (
    EvaluationRecord,
    FailureCause,
    SessionResult,
    SessionStatus,
    TaskRequest,
    TaskResult,
    Trajectory,
    group_key,
)

log = structlog.get_logger(__name__)


class EvalActivities:
    """Evaluators with access to the blob store.

    Args:
        store: the blob store holding artifacts and trajectories.
        host_id: this host's id (named in import checks).
    """

    def __init__(self, store: BlobStore, host_id: str | None = None) -> None:
        self.store = store
        self.host_id = host_id

    @activity.defn(name=STORE_TASK_REQUEST)
    async def store_task_request(self, input: StoreTaskRequestInput) -> StoredTaskRequest:
        """Store a task's request once, under ``tasks/{task_id}/request.json``, for its
        sessions to read (:func:`task_request_key`): a request copied into each of 1,024 child
        workflows' inputs would pass Temporal's 50 MB history limit of their parent. Writing
        it again (a retry) writes the same bytes."""
        key = task_request_key(input.task.task_id)
        data = input.task.model_dump_json().encode()
        await asyncio.to_thread(self.store.put_bytes, key, data)
        return StoredTaskRequest(key=key, num_bytes=len(data))

    @activity.defn(name=STORE_GROUP)
    async def store_group(self, group: TaskResult) -> str:
        """Store a finished group for the buffer that started its task, under
        :func:`rolloutd.types.group_key`; the buffer keeps the key, and ``take`` reads the
        group from the store. Writing it again (a retry) writes the same bytes.

        Returns:
            The key.
        """
        key = group_key(group.task_id)
        await asyncio.to_thread(self.store.put_bytes, key, group.model_dump_json().encode())
        return key

    @activity.defn(name=STORE_GROUP_PART)
    async def store_group_part(self, input: StoreGroupPartInput) -> int:
        """Store one part of a large group's sessions under ``input.key``
        (:func:`rolloutd.types.group_part_key`), for ``assemble_group``. Writing it again (a
        retry) writes the same bytes.

        Returns:
            The part's size, bytes.
        """
        data = input.model_dump_json().encode()
        await asyncio.to_thread(self.store.put_bytes, input.key, data)
        return len(data)

    @activity.defn(name=ASSEMBLE_GROUP)
    async def assemble_group(self, input: AssembleGroupInput) -> str:
        """Read a large group's parts (``store_group_part``), in order, and store the whole
        group under :func:`rolloutd.types.group_key`, where the task's result refers
        (``TaskResult.stored_key``) and a buffer reads it. The parts stay (a retry reads them
        again).

        Returns:
            The whole group's key.

        Raises:
            temporalio.exceptions.ApplicationError: a part is not in the store.
        """

        def assemble() -> str:
            sessions: list[SessionResult] = []
            replaced: list[SessionResult] = []
            for key in input.part_keys:
                part = self.store.get_model(key, StoreGroupPartInput)
                sessions.extend(part.sessions)
                replaced.extend(part.replaced)
            group = input.group.model_copy(
                update={"sessions": sessions, "replaced": replaced, "stored_key": ""}
            )
            key = group_key(group.task_id)
            self.store.put_bytes(key, group.model_dump_json().encode())
            return key

        try:
            return await asyncio.to_thread(assemble)
        except NotFoundError as e:
            raise to_application_error(e) from e

    @activity.defn(name=READ_TASK_REQUEST)
    async def read_task_request(self, key: str) -> TaskRequest:
        """A task's request stored by ``store_task_request``.

        Raises:
            temporalio.exceptions.ApplicationError: not in the store (``NotFoundError``).
        """
        try:
            data = await asyncio.to_thread(self.store.get_bytes, key)
        except Exception as e:
            raise to_application_error(e) from e
        return TaskRequest.model_validate_json(data)

    @activity.defn(name=CHECK_EVALUATOR)
    async def check_evaluator(self, input: CheckEvaluatorInput) -> CheckEvaluatorOutput:
        """Whether ``input.type`` is a name in this host's evaluator registry.

        Nothing a request names is imported: an import path is answered with a refusal.
        """
        names = evaluator_names()
        if input.type in names:
            return CheckEvaluatorOutput(host_id=self.host_id)
        log.info("evaluator_checked", evaluator=input.type, ok=False)
        return CheckEvaluatorOutput(
            error=f"{input.type!r} is not in the evaluator registry ({', '.join(names)})",
            host_id=self.host_id,
        )

    @activity.defn(name=EVALUATE)
    async def evaluate(self, input: EvaluateInput) -> EvaluateOutput:
        """Score a session with its evaluator; rewards are written into the stored trajectory.

        Re-running it (a retry after a crash) recomputes the same reward from the same stored
        artifacts and overwrites the trajectory with the same values.
        """
        structlog.contextvars.bind_contextvars(
            session_id=input.session_id, task_id=input.task_id, attempt=activity.info().attempt
        )
        try:
            artifacts = {}
            for name, key in input.artifacts.items():
                try:
                    artifacts[name] = self.store.get_json(key)
                except NotFoundError:
                    log.warning("artifact_missing", artifact=name)
            trajectory = (
                self.store.get_model(input.trajectory_ref, Trajectory)
                if input.trajectory_ref
                else None
            )
            ctx = EvaluationContext(
                task_id=input.task_id,
                session_id=input.session_id,
                status=input.status,
                harness_exit_code=input.harness_exit_code,
                num_completions=input.num_completions,
                artifacts=artifacts,
                spec=input.evaluator,
                num_traces=len(trajectory.traces) if trajectory else 0,
            )
            version = ""
            refused = refused_paths(artifacts)
            if input.forced_reward is not None:
                # the task decides this session's reward (a policy-accountable run timeout,
                # an invalid tool call, a limit hit): the evaluator is not asked
                details: dict[str, object] = {"forced": True}
                if input.forced_reason:
                    details["reason"] = input.forced_reason
                outcome = EvaluationOutcome(reward=input.forced_reward, details=details)
            elif refused is not None:
                # the collect step refused a path the session left (a link out of its
                # runtime): the check did not run, and the session scores as tampered
                outcome = EvaluationOutcome(reward=0.0, details={"refused_paths": True})
            else:
                try:
                    evaluator = get_evaluator(input.evaluator)
                    version = evaluator_version(evaluator)
                    async with heartbeating(phase="evaluate"):
                        outcome = await evaluator.evaluate(ctx)
                except Exception as e:  # noqa: BLE001 - boundary
                    # the evaluator's own failure: a retry would raise again, and the session
                    # keeps its trajectory with the failure instead of failing its workflow
                    error = f"{type(e).__name__}: {e}"
                    log.warning("evaluator_raised", evaluator=input.evaluator.type, error=error)
                    record = EvaluationRecord(
                        evaluator=input.evaluator.type,
                        version=version,
                        error=error[:2000],
                        evaluated_at=time.time(),
                    )
                    if trajectory is not None and input.trajectory_ref:
                        trajectory.status = SessionStatus.FAILED
                        trajectory.failure = FailureCause(
                            kind="evaluator",
                            message=f"the evaluator raised: {error}"[:500],
                            phase="evaluate",
                            retryable=False,
                        )
                        trajectory.evaluation = record
                        self.store.put_json(input.trajectory_ref, trajectory)
                    return EvaluateOutput(error=error, evaluation=record)
            if refused is not None:
                outcome = outcome.model_copy(update={"tamper": merged(outcome.tamper, refused)})
            outcome = scored_outcome(outcome)
            record = evaluation_record(input.evaluator.type, version, outcome, input)
            if trajectory is not None and input.trajectory_ref:
                assign_rewards(trajectory.traces, outcome.reward, outcome.trace_rewards)
                trajectory.reward = outcome.reward
                trajectory.evaluation = record
                self.store.put_json(input.trajectory_ref, trajectory)
        except Exception as e:
            log.warning("evaluation_failed", error=str(e))
            raise to_application_error(e) from e
        log.info(
            "session_evaluated",
            evaluator=input.evaluator.type,
            reward=outcome.reward,
            tampered=bool(outcome.tamper and outcome.tamper.tampered),
        )
        return EvaluateOutput(
            reward=outcome.reward,
            trace_rewards=outcome.trace_rewards,
            details=outcome.details,
            evaluation=record,
        )


def scored_outcome(outcome: EvaluationOutcome) -> EvaluationOutcome:
    """The outcome as scored: a tamper report with findings makes the reward 0.0 (every trace
    0.0 too), whatever the evaluator computed; the policy's doing, so the session keeps
    ``failure = None`` (docs/failures.md)."""
    if outcome.tamper is None or not outcome.tamper.tampered:
        return outcome
    first = outcome.tamper.findings[0]
    reason = (
        f"tampered: {len(outcome.tamper.findings)} path(s) a verifier must not trust were "
        f"changed; first: {first.path} ({first.category}, {first.change})"
    )
    details = {**outcome.details, "reason": reason, "reward_before_tamper": outcome.reward}
    return outcome.model_copy(
        update={
            "reward": 0.0,
            "trace_rewards": [0.0] * len(outcome.trace_rewards)
            if outcome.trace_rewards is not None
            else None,
            "details": details,
        }
    )


def evaluation_record(
    evaluator: str, version: str, outcome: EvaluationOutcome, input: EvaluateInput
) -> EvaluationRecord:
    """The evaluation record of one scoring (:class:`rolloutd.types.EvaluationRecord`)."""
    reason = outcome.details.get("reason")
    return EvaluationRecord(
        evaluator=evaluator,
        version=version,
        reward=outcome.reward,
        trace_rewards=outcome.trace_rewards,
        reason=str(reason)[:2000] if reason is not None else None,
        tamper=outcome.tamper,
        forced=input.forced_reward is not None,
        evaluated_at=time.time(),
    )


def task_request_key(task_id: str) -> str:
    """Blob store key of a task's stored request: ``tasks/{task_id}/request.json``."""
    return f"tasks/{task_id}/request.json"
