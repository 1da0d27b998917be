"""``ReverifyWorkflow``: score stored sessions again, without sampling (``rolloutd reverify``).

For each session of the run (``reverify/{run_id}``), at most ``max_concurrent`` at once:

1. plan (eval fleet, ``reverify_plan``): its trajectory and stored final state; a session
   that cannot be scored again (no final state stored, never evaluated, a forced reward) has
   its outcome stored there and stops;
2. when its evaluator has a runtime step: a fresh runtime from the stored spec (sandbox
   fleet, ``provision_runtime``, waiting in the queue for a host's capacity), the final state
   restored into it (``restore_final_state``), the evaluator's check run there as in a session
   (``collect_artifacts``, the stored patch applied first when the state is a patch; its
   artifacts go under ``{session_id}.reverify-{run_id}``, never over the session's), and the
   runtime torn down, always;
3. scored (eval fleet, ``rescore_session``) with the evaluator as the eval fleet has it now:
   the record is appended to the stored trajectory's ``rescores``, its ``reward`` never
   rewritten; the outcome stored.

Then ``summarize_reverify`` stores the whole summary and the workflow returns it (without
its per-session list). Every ``SESSIONS_PER_RUN`` sessions the workflow continues as new, so
its history stays small. Deterministic code only.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from pydantic import Field

    from rolloutd import task_queues
    from rolloutd.activities.models import (
        CollectArtifactsInput,
        CollectArtifactsOutput,
        ProvisionRuntimeInput,
        ProvisionRuntimeOutput,
        RescoreInput,
        RestoreFinalStateInput,
        RestoreFinalStateOutput,
        ReverifyPlan,
        ReverifyPlanInput,
        ReverifySummary,
        SessionRescore,
        SummarizeReverifyInput,
        TeardownRuntimeInput,
    )
    from rolloutd.activities.names import (
        COLLECT_ARTIFACTS,
        PROVISION_RUNTIME,
        RESCORE_SESSION,
        RESTORE_FINAL_STATE,
        REVERIFY_PLAN,
        SUMMARIZE_REVERIFY,
        TEARDOWN_RUNTIME,
    )
    from rolloutd.payload import Payload
    from rolloutd.workflows.session.failures import cause_text
    from rolloutd.workflows.session.policies import (
        HEARTBEAT,
        HOST_QUEUE_START,
        INFRA_RETRY,
        NO_RETRY,
        seconds,
    )

#: sessions one run of the workflow handles before it continues as new
SESSIONS_PER_RUN = 200
#: the store activities' limit (a plan, a rescore, a summary of 10,000 outcomes)
STORE_TIMEOUT = timedelta(minutes=10)
#: the query answering ``{"num_done", "num_sessions"}``
PROGRESS_QUERY = "progress"


def reverify_workflow_id(run_id: str) -> str:
    """Workflow id of a reverify run."""
    return f"reverify/{run_id}"


class ReverifyInput(Payload):
    """A reverify run: the stored sessions to score again, and how."""

    run_id: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
        description="names the run (its workflow id, its records' ``run_id``, its store "
        "folder ``reverify/{run_id}``)",
    )
    session_ids: list[str] = Field(
        min_length=1, max_length=10_000, description="the stored sessions, in order"
    )
    evaluators: dict[str, str] = Field(
        default_factory=dict,
        description="registry names to score with instead of the sessions' own: old name -> "
        "new (a fixed or stricter verifier registered beside the old), ``*`` for every "
        "session; a session whose evaluator is not named is scored by its own, as the eval "
        "fleet has it now",
    )
    max_concurrent: int = Field(default=8, ge=1, le=256, description="sessions re-scored at once")
    provision_s: float = Field(
        default=1800.0, gt=0, le=86_400, description="a fresh runtime's start (image builds), s"
    )
    collect_s: float = Field(
        default=300.0,
        gt=0,
        le=86_400,
        description="restore and check, beside the evaluator's own budget, s",
    )
    teardown_s: float = Field(default=120.0, gt=0, le=3600, description="a teardown, s")
    evaluate_s: float = Field(
        default=900.0, gt=0, le=86_400, description="one scoring on the eval fleet, s"
    )
    start: int = Field(default=0, ge=0, description="the first session this run handles")


@workflow.defn
class ReverifyWorkflow:
    """Score stored sessions again; see the module docstring."""

    def __init__(self) -> None:
        self._num_done = 0
        self._num_sessions = 0

    @workflow.query(name=PROGRESS_QUERY)
    def progress(self) -> dict[str, int]:
        """Sessions done so far, and in all."""
        return {"num_done": self._num_done, "num_sessions": self._num_sessions}

    @workflow.run
    async def run(self, input: ReverifyInput) -> ReverifySummary:
        self._num_sessions = len(input.session_ids)
        self._num_done = input.start
        end = min(len(input.session_ids), input.start + SESSIONS_PER_RUN)
        slots = asyncio.Semaphore(input.max_concurrent)

        async def one(index: int) -> None:
            async with slots:
                await self._session(input, index)
                self._num_done += 1

        await asyncio.gather(*(one(i) for i in range(input.start, end)))
        if end < len(input.session_ids):
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(input.model_copy(update={"start": end}))
        return await workflow.execute_activity(
            SUMMARIZE_REVERIFY,
            SummarizeReverifyInput(run_id=input.run_id, num_sessions=len(input.session_ids)),
            task_queue=task_queues.EVAL,
            start_to_close_timeout=STORE_TIMEOUT,
            retry_policy=INFRA_RETRY,
            result_type=ReverifySummary,
        )

    async def _session(self, input: ReverifyInput, index: int) -> None:
        """Steps 1-3 of the module docstring for one session."""
        session_id = input.session_ids[index]
        plan: ReverifyPlan = await workflow.execute_activity(
            REVERIFY_PLAN,
            ReverifyPlanInput(
                run_id=input.run_id,
                index=index,
                session_id=session_id,
                evaluators=input.evaluators,
            ),
            task_queue=task_queues.EVAL,
            start_to_close_timeout=STORE_TIMEOUT,
            retry_policy=INFRA_RETRY,
            result_type=ReverifyPlan,
        )
        if plan.skip is not None or plan.evaluator is None:
            return
        rescore = RescoreInput(
            run_id=input.run_id,
            index=index,
            session_id=session_id,
            evaluator=plan.evaluator,
            stored_image_digest=plan.image_digest,
        )
        if plan.runtime is not None:
            try:
                await self._check(input, session_id, plan, rescore)
            except ActivityError as e:
                rescore.error = f"the fresh runtime failed: {cause_text(e)}"
        await workflow.execute_activity(
            RESCORE_SESSION,
            rescore,
            task_queue=task_queues.EVAL,
            start_to_close_timeout=seconds(input.evaluate_s),
            heartbeat_timeout=HEARTBEAT,
            retry_policy=INFRA_RETRY,
            result_type=SessionRescore,
        )

    async def _check(
        self, input: ReverifyInput, session_id: str, plan: ReverifyPlan, rescore: RescoreInput
    ) -> None:
        """Step 2: a fresh runtime with the session's final state, the check run there;
        ``rescore`` gains its artifacts and the image the runtime ran."""
        assert plan.runtime is not None and plan.evaluator is not None
        check_id = f"{session_id}.reverify-{input.run_id}"
        runtime: ProvisionRuntimeOutput = await workflow.execute_activity(
            PROVISION_RUNTIME,
            # the session's id names the runtime (a unix socket's path is short)
            ProvisionRuntimeInput(
                session_id=session_id, runtime=plan.runtime, purpose="evaluation"
            ),
            task_queue=task_queues.SANDBOX,
            start_to_close_timeout=seconds(input.provision_s),
            heartbeat_timeout=HEARTBEAT,
            retry_policy=INFRA_RETRY,
            result_type=ProvisionRuntimeOutput,
        )
        try:
            restored: RestoreFinalStateOutput = await workflow.execute_activity(
                RESTORE_FINAL_STATE,
                RestoreFinalStateInput(
                    runtime_id=runtime.runtime_id,
                    session_id=session_id,
                    final_state_key=plan.final_state_key or "",
                ),
                task_queue=runtime.host_queue,
                start_to_close_timeout=seconds(input.collect_s),
                schedule_to_start_timeout=HOST_QUEUE_START,
                heartbeat_timeout=HEARTBEAT,
                retry_policy=NO_RETRY,
                result_type=RestoreFinalStateOutput,
            )
            rescore.image_digest = restored.image_digest
            checked: CollectArtifactsOutput = await workflow.execute_activity(
                COLLECT_ARTIFACTS,
                CollectArtifactsInput(
                    runtime_id=runtime.runtime_id,
                    session_id=check_id,
                    evaluator=plan.evaluator,
                    collect_outputs=False,
                    run_check=True,
                    apply_patch_ref=plan.patch_key,
                ),
                task_queue=runtime.host_queue,
                start_to_close_timeout=seconds(input.collect_s + plan.evaluator.timeout_s),
                schedule_to_start_timeout=HOST_QUEUE_START,
                heartbeat_timeout=HEARTBEAT,
                retry_policy=NO_RETRY,
                result_type=CollectArtifactsOutput,
            )
            rescore.artifacts = {k: v for k, v in checked.artifacts.items() if k != "harness"}
        finally:
            try:
                await workflow.execute_activity(
                    TEARDOWN_RUNTIME,
                    TeardownRuntimeInput(runtime_id=runtime.runtime_id),
                    task_queue=runtime.host_queue,
                    start_to_close_timeout=seconds(input.teardown_s),
                    schedule_to_close_timeout=seconds(3 * input.teardown_s),
                    heartbeat_timeout=HEARTBEAT,
                    retry_policy=INFRA_RETRY,
                )
            except ActivityError as e:
                workflow.logger.warning(
                    "reverify teardown of %s abandoned (reclaimed when its host restarts): %s",
                    runtime.runtime_id,
                    cause_text(e),
                )
