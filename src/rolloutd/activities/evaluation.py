"""Eval-fleet activities: score a session and write the rewards into its trajectory; say
whether an evaluator name is in this host's registry (asked through the fleet registry)."""

from __future__ import annotations

import structlog
from temporalio import activity

from rolloutd.activities.heartbeat import heartbeating
from rolloutd.activities.models import EvaluateInput, EvaluateOutput
from rolloutd.capabilities import (
    CHECK_EVALUATOR_ACTIVITY,
    CheckEvaluatorInput,
    CheckEvaluatorOutput,
)
from rolloutd.errors import NotFoundError, to_application_error
from rolloutd.evaluators import (
    EvaluationContext,
    EvaluationOutcome,
    evaluator_names,
    get_evaluator,
)
from rolloutd.store import BlobStore
from rolloutd.trajectory import assign_rewards
from rolloutd.types import FailureCause, SessionStatus, Trajectory

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

    @activity.defn(name=CHECK_EVALUATOR_ACTIVITY)
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

    @activity.defn(name="evaluate")
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
            if input.forced_reward is not None:
                # the task decides this session's reward (a policy-accountable run timeout,
                # an invalid tool call): the evaluator is not asked
                outcome = EvaluationOutcome(reward=input.forced_reward, details={"forced": True})
            else:
                try:
                    async with heartbeating(phase="evaluate"):
                        outcome = await get_evaluator(input.evaluator).evaluate(ctx)
                except Exception as e:  # noqa: BLE001 - boundary
                    # the evaluator's own failure: a retry would raise again, and the session
                    # keeps its trajectory with the failure instead of failing its workflow
                    error = f"{type(e).__name__}: {e}"
                    log.warning("evaluator_raised", evaluator=input.evaluator.type, error=error)
                    if trajectory is not None and input.trajectory_ref:
                        trajectory.status = SessionStatus.FAILED
                        trajectory.failure = FailureCause(
                            kind="evaluator",
                            message=f"the evaluator raised: {error}"[:500],
                            phase="evaluate",
                            retryable=False,
                        )
                        self.store.put_json(input.trajectory_ref, trajectory)
                    return EvaluateOutput(error=error)
            if trajectory is not None and input.trajectory_ref:
                assign_rewards(trajectory.traces, outcome.reward, outcome.trace_rewards)
                trajectory.reward = outcome.reward
                self.store.put_json(input.trajectory_ref, trajectory)
        except Exception as e:
            log.warning("evaluation_failed", error=str(e))
            raise to_application_error(e) from e
        log.info("session_evaluated", evaluator=input.evaluator.type, reward=outcome.reward)
        return EvaluateOutput(
            reward=outcome.reward, trace_rewards=outcome.trace_rewards, details=outcome.details
        )
