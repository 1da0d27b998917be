"""The end of a session's attempt, as steps of :class:`rolloutd.workflows.session.
RolloutSessionWorkflow`: tear a runtime down, seal the gateway session, evaluate in a fresh
runtime. Deterministic workflow code only (the session workflow's rules)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import TYPE_CHECKING

from temporalio import workflow
from temporalio.common import Priority, RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from rolloutd import task_queues
    from rolloutd.activities.models import (
        CloseSessionInput,
        CloseSessionOutput,
        CollectArtifactsInput,
        CollectArtifactsOutput,
        OpenSessionOutput,
        ProvisionRuntimeOutput,
        TeardownRuntimeInput,
    )
    from rolloutd.workflows.outcome import cause_text
    from rolloutd.workflows.provisioning import HEARTBEAT, INFRA_RETRY

if TYPE_CHECKING:
    from rolloutd.workflows.session import SessionInput

#: one try only: the harness is not retried blindly (a retry would start from a dirty
#: runtime), and a check that fails is an answer, not an infrastructure error
NO_RETRY = RetryPolicy(maximum_attempts=1)
#: all teardown attempts on a host already known lost (else 3 x ``phases.teardown_s``).
LOST_HOST_TEARDOWN = timedelta(seconds=15)
#: one close attempt (it waits for a call in flight, which a slow backend may hold for
#: minutes), and all attempts on the gateway host serving the session.
CLOSE_TIMEOUT = timedelta(seconds=300)
PINNED_CLOSE = timedelta(seconds=600)


def _seconds(s: float) -> timedelta:
    return timedelta(seconds=s)


class SessionEnding:
    """Steps 5 and 6 of the session workflow (teardown, close) and the fresh-runtime check;
    a base of the workflow class, sharing its ``_priority``."""

    _priority: Priority | None

    async def _teardown(
        self,
        runtime: ProvisionRuntimeOutput,
        timed,
        *,
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
                    "teardown_runtime",
                    TeardownRuntimeInput(runtime_id=runtime.runtime_id),
                    task_queue=runtime.host_queue,
                    start_to_close_timeout=_seconds(teardown_s),
                    schedule_to_close_timeout=(
                        LOST_HOST_TEARDOWN if host_lost else _seconds(3 * teardown_s)
                    ),
                    heartbeat_timeout=HEARTBEAT,
                    retry_policy=INFRA_RETRY,
                    priority=self._priority,
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

    async def _close(
        self,
        opened: OpenSessionOutput,
        session_id: str,
        timed,
        *,
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
                    "close_session",
                    close_input,
                    task_queue=opened.host_queue,
                    start_to_close_timeout=CLOSE_TIMEOUT,
                    schedule_to_close_timeout=PINNED_CLOSE,
                    retry_policy=INFRA_RETRY,
                    priority=self._priority,
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
                    "close_session",
                    close_input,
                    task_queue=task_queues.GATEWAY,
                    start_to_close_timeout=CLOSE_TIMEOUT,
                    retry_policy=INFRA_RETRY,
                    priority=self._priority,
                    result_type=CloseSessionOutput,
                ),
            )

    async def _evaluate_in_fresh_runtime(
        self,
        input: SessionInput,
        prewarm: asyncio.Task[ProvisionRuntimeOutput],
        artifacts: dict[str, str],
        *,
        run_check: bool,
        timed,
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
                        "collect_artifacts",
                        CollectArtifactsInput(
                            runtime_id=eval_runtime.runtime_id,
                            session_id=input.session_id,
                            evaluator=task.evaluator,
                            collect_outputs=False,
                            run_check=True,
                            apply_patch_ref=artifacts.get("patch"),
                        ),
                        task_queue=eval_runtime.host_queue,
                        start_to_close_timeout=_seconds(
                            phases.collect_s + task.evaluator.timeout_s
                        ),
                        heartbeat_timeout=HEARTBEAT,
                        retry_policy=NO_RETRY,
                        priority=self._priority,
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
                        "teardown_runtime",
                        TeardownRuntimeInput(runtime_id=eval_runtime.runtime_id),
                        task_queue=eval_runtime.host_queue,
                        start_to_close_timeout=_seconds(phases.teardown_s),
                        heartbeat_timeout=HEARTBEAT,
                        retry_policy=INFRA_RETRY,
                        priority=self._priority,
                    ),
                )
        return error
