"""Eval-fleet activities of ``rolloutd reverify``: plan the re-score of a stored session, score
it again from what its fresh runtime's check produced and append the evaluation record to its
stored trajectory (never rewriting its ``reward``), and summarise a run.

Each session's outcome is stored at ``reverify/{run_id}/sessions/{index:06d}.json``
(:func:`outcome_key`), the run's summary at ``reverify/{run_id}/summary.json``
(:func:`summary_key`): the run's workflow carries indexes, never the outcomes.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import structlog
from temporalio import activity

from rolloutd.activities.evaluation import scored_outcome
from rolloutd.activities.heartbeat import heartbeating
from rolloutd.activities.models import (
    RescoreInput,
    ReverifyPlan,
    ReverifyPlanInput,
    ReverifySummary,
    SessionRescore,
    SummarizeReverifyInput,
    VersionChange,
)
from rolloutd.activities.names import RESCORE_SESSION, REVERIFY_PLAN, SUMMARIZE_REVERIFY
from rolloutd.errors import EvaluatorError, NotFoundError, to_application_error
from rolloutd.evaluators import (
    CHECK_ARTIFACT,
    EvaluationContext,
    evaluator_names,
    evaluator_version,
    get_evaluator,
)
from rolloutd.final_state import FinalState
from rolloutd.store import BlobStore, final_state_key, session_prefix, trajectory_key
from rolloutd.types import EvaluationRecord, EvaluatorSpec, Trajectory

log = structlog.get_logger(__name__)

#: artifacts of the session's own check, replaced by the fresh runtime's
CHECK_ARTIFACTS = (CHECK_ARTIFACT, "patch_apply")
#: sessions of the changed list the workflow returns (the stored summary holds them all)
MAX_RETURNED_CHANGES = 1000
#: two rewards closer than this are the same reward
REWARD_TOLERANCE = 1e-9


def outcome_key(run_id: str, index: int) -> str:
    """Blob-store key of one session's outcome in a reverify run."""
    return f"reverify/{run_id}/sessions/{index:06d}.json"


def summary_key(run_id: str) -> str:
    """Blob-store key of a reverify run's whole summary."""
    return f"reverify/{run_id}/summary.json"


def rescore_session_id(session_id: str, run_id: str) -> str:
    """The id a re-score's fresh runtime and artifacts go under (a sibling of the session's
    folder, as a later attempt's is): ``{session_id}.reverify-{run_id}``."""
    return f"{session_id}.reverify-{run_id}"


def needs_runtime(spec: EvaluatorSpec) -> bool:
    """Whether scoring with ``spec`` needs a runtime step (a check command, or the
    evaluator's own ``collect``)."""
    if spec.command:
        return True
    return spec.type in evaluator_names() and hasattr(get_evaluator(spec), "collect")


def _changed(old: float | None, new: float | None) -> bool:
    if old is None or new is None:
        return old is not new
    return abs(old - new) > REWARD_TOLERANCE


class ReverifyActivities:
    """The eval fleet's reverify activities, over the blob store.

    Args:
        store: the blob store holding the sessions.
    """

    def __init__(self, store: BlobStore) -> None:
        self.store = store

    def _put_outcome(self, run_id: str, outcome: SessionRescore) -> SessionRescore:
        self.store.put_json(outcome_key(run_id, outcome.index), outcome)
        log.info(
            "session_reverified",
            session_id=outcome.session_id,
            status=outcome.status,
            old_reward=outcome.old_reward,
            new_reward=outcome.new_reward,
        )
        return outcome

    def _base(self, index: int, session_id: str) -> tuple[Trajectory | None, SessionRescore]:
        """The session's trajectory, and its outcome so far (the old score)."""
        outcome = SessionRescore(index=index, session_id=session_id, status="missing")
        try:
            trajectory = self.store.get_model(trajectory_key(session_id), Trajectory)
        except NotFoundError:
            outcome.detail = f"no trajectory at {trajectory_key(session_id)}"
            return None, outcome
        record = trajectory.evaluation
        outcome.task_id = trajectory.task_id
        outcome.old_reward = trajectory.reward
        if record is not None:
            outcome.old_evaluator, outcome.old_version = record.evaluator, record.version
        return trajectory, outcome

    @activity.defn(name=REVERIFY_PLAN)
    async def plan(self, input: ReverifyPlanInput) -> ReverifyPlan:
        """How the stored session is scored again: its final state, the runtime to restore it
        into, the evaluator spec (the session's, its type replaced as ``input.evaluators``
        says).
        A session that cannot be scored again has its outcome stored here, and ``skip`` says
        why."""
        structlog.contextvars.bind_contextvars(session_id=input.session_id)
        try:
            return await asyncio.to_thread(self._plan, input)
        except Exception as e:
            log.warning("reverify_plan_failed", error=str(e))
            raise to_application_error(e) from e

    def _plan(self, input: ReverifyPlanInput) -> ReverifyPlan:
        trajectory, outcome = self._base(input.index, input.session_id)

        def skip(status: Any, detail: str) -> ReverifyPlan:
            outcome.status, outcome.detail = status, detail
            self._put_outcome(input.run_id, outcome)
            return ReverifyPlan(skip=status)

        if trajectory is None:
            return skip("missing", outcome.detail or "")
        record = trajectory.evaluation
        if record is None and trajectory.reward is None:
            failure = trajectory.failure
            return skip(
                "not_scored",
                f"never evaluated: {failure.kind} ({failure.message})"[:500]
                if failure
                else f"never evaluated (status {trajectory.status.value})",
            )
        if record is not None and record.forced:
            return skip("forced", f"its reward was the task's: {record.reason or 'forced'}"[:500])
        try:
            state = self.store.get_model(final_state_key(input.session_id), FinalState)
        except NotFoundError:
            return skip(
                "no_final_state",
                "no final state stored (the task did not ask: store_final_state)",
            )
        if not state.stored:
            return skip("final_state_refused", (state.refused or state.error or "")[:500])
        spec = state.evaluator
        name = input.evaluators.get(spec.type) or input.evaluators.get("*")
        if name and name != spec.type:
            spec = spec.model_copy(update={"type": name})
        try:
            runtime = state.runtime if needs_runtime(spec) else None
        except EvaluatorError as e:
            return skip("failed", f"evaluator {spec.type!r}: {e}"[:500])
        if runtime is not None and runtime.network == "gateway":
            # there is no session to reach: the check runs without a network
            runtime = runtime.model_copy(update={"network": "none"})
        return ReverifyPlan(
            evaluator=spec,
            runtime=runtime,
            final_state_key=final_state_key(input.session_id),
            patch_key=state.patch_key,
            image_digest=state.image_digest,
        )

    @activity.defn(name=RESCORE_SESSION)
    async def rescore(self, input: RescoreInput) -> SessionRescore:
        """Score the stored session with ``input.evaluator`` from its stored artifacts and
        the fresh runtime's check, append the evaluation record (``source="reverify"``) to
        its trajectory's ``rescores``, and store the outcome. The trajectory's ``reward`` and
        its first record are never changed. A retry replaces the run's own record."""
        structlog.contextvars.bind_contextvars(session_id=input.session_id)
        try:
            trajectory, outcome = await asyncio.to_thread(self._base, input.index, input.session_id)
            if trajectory is None:
                return await asyncio.to_thread(self._put_outcome, input.run_id, outcome)
            if input.error is not None:
                outcome.status, outcome.detail = "failed", input.error[:2000]
                return await asyncio.to_thread(self._put_outcome, input.run_id, outcome)
            record = await self._score(input, trajectory)
            trajectory.rescores = [
                r for r in trajectory.rescores if r.run_id is None or r.run_id != input.run_id
            ] + [record]
            await asyncio.to_thread(
                self.store.put_json, trajectory_key(input.session_id), trajectory
            )
        except Exception as e:
            log.warning("rescore_failed", error=str(e))
            raise to_application_error(e) from e
        outcome.status = "evaluator_error" if record.error else "rescored"
        outcome.new_evaluator, outcome.new_version = record.evaluator, record.version
        outcome.new_reward, outcome.reason = record.reward, record.reason
        outcome.detail = record.error
        outcome.changed = _changed(outcome.old_reward, outcome.new_reward)
        outcome.image_changed = _image_changed(input)
        return await asyncio.to_thread(self._put_outcome, input.run_id, outcome)

    async def _score(self, input: RescoreInput, trajectory: Trajectory) -> EvaluationRecord:
        """The new evaluation record (with ``error`` when the evaluator raised)."""
        artifacts = await asyncio.to_thread(self._artifacts, input)
        harness = artifacts.get("harness")
        ctx = EvaluationContext(
            task_id=trajectory.task_id,
            session_id=input.session_id,
            status=trajectory.status,
            harness_exit_code=harness.get("exit_code") if isinstance(harness, dict) else None,
            num_completions=trajectory.stats.num_completions,
            num_traces=len(trajectory.traces),
            artifacts=artifacts,
            spec=input.evaluator,
        )
        version = ""
        note = (
            f" (the fresh runtime ran image {input.image_digest}, the session "
            f"{input.stored_image_digest})"
            if _image_changed(input)
            else ""
        )
        try:
            evaluator = get_evaluator(input.evaluator)
            version = evaluator_version(evaluator)
            async with heartbeating(phase="rescore"):
                outcome = scored_outcome(await evaluator.evaluate(ctx))
        except Exception as e:  # noqa: BLE001 - boundary: the evaluator's own failure
            error = f"{type(e).__name__}: {e}"
            log.warning("evaluator_raised", evaluator=input.evaluator.type, error=error)
            return EvaluationRecord(
                evaluator=input.evaluator.type,
                version=version,
                error=error[:2000],
                source="reverify",
                run_id=input.run_id,
                reason=note.strip() or None,
                evaluated_at=time.time(),
            )
        reason = outcome.details.get("reason")
        text = (str(reason) if reason is not None else "") + note
        return EvaluationRecord(
            evaluator=input.evaluator.type,
            version=version,
            reward=outcome.reward,
            trace_rewards=outcome.trace_rewards,
            reason=text.strip()[:2000] or None,
            tamper=outcome.tamper,
            source="reverify",
            run_id=input.run_id,
            evaluated_at=time.time(),
        )

    def _artifacts(self, input: RescoreInput) -> dict[str, Any]:
        """The session's stored artifacts (its own check's left out), then the fresh
        runtime's."""
        artifacts: dict[str, Any] = {}
        for key in self.store.list(f"{session_prefix(input.session_id)}/artifacts"):
            name = key.rsplit("/", 1)[-1].removesuffix(".json")
            if name not in CHECK_ARTIFACTS:
                artifacts[name] = self.store.get_json(key)
        for name, key in input.artifacts.items():
            try:
                artifacts[name] = self.store.get_json(key)
            except NotFoundError:
                log.warning("artifact_missing", artifact=name)
        return artifacts

    @activity.defn(name=SUMMARIZE_REVERIFY)
    async def summarize(self, input: SummarizeReverifyInput) -> ReverifySummary:
        """Read every session's outcome of the run, store the whole summary at
        :func:`summary_key`, and return it without its per-session list (and at most
        :data:`MAX_RETURNED_CHANGES` changed sessions). A session without an outcome (its
        re-score never finished) counts as ``failed``."""
        try:
            summary = await asyncio.to_thread(self._summarize, input)
        except Exception as e:
            raise to_application_error(e) from e
        return summary.model_copy(
            update={"sessions": [], "changed": summary.changed[:MAX_RETURNED_CHANGES]}
        )

    def _summarize(self, input: SummarizeReverifyInput) -> ReverifySummary:
        outcomes = []
        for index in range(input.num_sessions):
            try:
                outcomes.append(
                    self.store.get_model(outcome_key(input.run_id, index), SessionRescore)
                )
            except NotFoundError:
                outcomes.append(
                    SessionRescore(
                        index=index,
                        session_id="?",
                        status="failed",
                        detail="its re-score did not finish",
                    )
                )
        summary = summarize(input.run_id, outcomes)
        summary.stored_key = summary_key(input.run_id)
        self.store.put_json(summary.stored_key, summary)
        return summary


def summarize(run_id: str, outcomes: list[SessionRescore]) -> ReverifySummary:
    """A run's summary from its sessions' outcomes: counts by status, the changed sessions,
    and per pair of evaluator versions (old to new) how many changed, which way, and the
    mean rewards."""
    counts: dict[str, int] = {}
    groups: dict[tuple[Any, ...], list[SessionRescore]] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
        if o.status in ("rescored", "evaluator_error"):
            key = (o.old_evaluator, o.old_version, o.new_evaluator, o.new_version)
            groups.setdefault(key, []).append(o)
    by_version = []
    for (old_evaluator, old_version, new_evaluator, new_version), group in groups.items():
        old = [o.old_reward for o in group if o.old_reward is not None]
        new = [o.new_reward for o in group if o.new_reward is not None]
        moved = [o for o in group if o.changed]
        by_version.append(
            VersionChange(
                old_evaluator=old_evaluator,
                old_version=old_version,
                new_evaluator=new_evaluator,
                new_version=new_version,
                num_sessions=len(group),
                num_changed=len(moved),
                num_lower=sum(
                    1
                    for o in moved
                    if o.old_reward is not None
                    and (o.new_reward is None or o.new_reward < o.old_reward)
                ),
                num_higher=sum(
                    1
                    for o in moved
                    if o.new_reward is not None
                    and (o.old_reward is None or o.new_reward > o.old_reward)
                ),
                mean_old=sum(old) / len(old) if old else None,
                mean_new=sum(new) / len(new) if new else None,
            )
        )
    changed = [o for o in outcomes if o.changed]
    return ReverifySummary(
        run_id=run_id,
        num_sessions=len(outcomes),
        counts=dict(sorted(counts.items())),
        num_changed=len(changed),
        by_version=by_version,
        changed=changed,
        sessions=outcomes,
    )


def _image_changed(input: RescoreInput) -> bool:
    return bool(
        input.image_digest
        and input.stored_image_digest
        and input.image_digest != input.stored_image_digest
    )
