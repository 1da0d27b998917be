"""``RolloutSessionWorkflow``: one sample of a task, its lifecycle (docs/sessions.md).

1. open a gateway session; 2. provision the runtime; 3. when the evaluator asks for a fresh
runtime, provision it in parallel (prewarm); 4. run the harness on the runtime's host queue;
collect artifacts (the workspace's patch; the evaluator's check when it runs in the session's
runtime) while the runtime lives; 5. tear the runtime down, always; in the fresh evaluation
runtime, apply the patch and run the check, then tear it down, always; 6. close the gateway
session; 7. build the trajectory; 8. evaluate; 9. return the result.

Deterministic code only: no I/O, ``workflow.now()`` for time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.common import Priority
from temporalio.exceptions import ActivityError, TimeoutError, TimeoutType
from temporalio.exceptions import CancelledError as TemporalCancelledError

with workflow.unsafe.imports_passed_through():
    from rolloutd import task_queues
    from rolloutd.activities.models import (
        BuildTrajectoryInput,
        BuildTrajectoryOutput,
        CollectArtifactsInput,
        CollectArtifactsOutput,
        EvaluateInput,
        EvaluateOutput,
        OpenSessionInput,
        OpenSessionOutput,
        ProvisionRuntimeInput,
        ProvisionRuntimeOutput,
        RunHarnessInput,
        RunHarnessOutput,
    )
    from rolloutd.activities.tenants import GRANTED_SIGNAL
    from rolloutd.errors import NoSandboxWorkerError
    from rolloutd.observability import names
    from rolloutd.types import (
        FailureCause,
        PhaseTiming,
        SessionAttempt,
        SessionResult,
        SessionStatus,
        TaskRequest,
    )
    from rolloutd.workflows import backpressure, failures, metadata, search, tenants
    from rolloutd.workflows.outcome import (
        AttemptOutcome,
        cause_text,
        host_lost,
        note_error,
        session_facts,
    )
    from rolloutd.workflows.provisioning import HEARTBEAT, INFRA_RETRY, provision_watched
    from rolloutd.workflows.session_end import NO_RETRY, SessionEnding, _seconds
    from rolloutd.workflows.tenants import task_priority

#: heartbeats of the harness run: a dead sandbox worker is noticed within this time.
#: (the SDK sends heartbeats at most every 0.8 x this, so cancellation also lands within it).
#: 10 s, not less: a host running 100 harnesses on 2 busy cores misses 5 s beats while alive.
HARNESS_HEARTBEAT = timedelta(seconds=10)
#: a host-pinned activity not picked up by then: the host is gone (the session may restart).
HOST_QUEUE_START = timedelta(seconds=60)
#: counter of sessions ended with a failure cause (label ``kind``), from workflow code
#: through ``workflow.metric_meter()`` (replay-safe)
SESSION_FAILURES_METRIC = names.SESSION_FAILURES


def attempt_session_id(session_id: str, attempt: int) -> str:
    """The gateway session id of attempt ``attempt`` (1-based) of session ``session_id``:
    the session id itself, then ``{session_id}.attempt-{n}``."""
    return session_id if attempt == 1 else f"{session_id}.attempt-{attempt}"


class SessionInput(BaseModel):
    """Input of :class:`RolloutSessionWorkflow`."""

    task: TaskRequest
    sample_index: int = Field(ge=0)
    session_id: str
    #: gateway session ids of the sample's earlier sessions (a replaced session's attempts),
    #: newest first: replayed from when ``task.resume`` is ``replay``
    replay_from: list[str] = Field(default_factory=list)


@workflow.defn
class RolloutSessionWorkflow(SessionEnding):
    """One harness run in one runtime, with its trajectory and score."""

    def __init__(self) -> None:
        self._phase = "pending"
        self._num_completions = 0
        self._priority = Priority.default
        self._granted = False
        # the deadline's clock (None: not started) and the later attempts' queue waits, s
        self._clock: datetime | None = None
        self._waited_s = 0.0
        self._prewarm: asyncio.Task[ProvisionRuntimeOutput] | None = None
        self._start_prewarm: Callable[[], asyncio.Task[ProvisionRuntimeOutput]] | None = None

    @workflow.signal(name=GRANTED_SIGNAL)
    def tenant_slot_granted(self) -> None:
        """The tenant's quota workflow granted this session a slot."""
        self._granted = True

    @workflow.query
    def phase(self) -> str:
        """The phase the session is in (open, provision, run, collect, teardown, ...)."""
        return self._phase

    def _show(self, **final) -> None:
        """Current details for the Temporal UI (:mod:`rolloutd.workflows.metadata`); the
        completions are known once the gateway session closed."""
        workflow.set_current_details(
            metadata.current_details(
                phase=self._phase, num_completions=self._num_completions, **final
            )
        )

    @workflow.run
    async def run(self, input: SessionInput) -> SessionResult:
        task = input.task
        timings: list[PhaseTiming] = []
        search.upsert(task_id=task.task_id, harness=task.harness.type, status="running")
        self._show()
        self._priority = task_priority(task)
        self._phase = "tenant_wait"
        waited = await tenants.acquire_slot(task, lambda: self._granted, timings)
        holds_slot = waited is not None
        try:
            return await self._run(input, timings)
        finally:
            if holds_slot:
                await tenants.release_slot(task)

    async def _run(self, input: SessionInput, timings: list[PhaseTiming]) -> SessionResult:
        """Steps 1-9 (the module docstring)."""
        task = input.task
        phases = task.phases
        # the deadline ticks from the first runtime up: no capacity wait is charged
        self._clock = None
        # metric_meter() is replay-safe: nothing is emitted again when a history replays
        meter = workflow.metric_meter().with_additional_attributes({"harness": task.harness.type})
        meter.create_counter(names.SESSIONS_STARTED, "sessions started").add(1)
        phase_seconds = meter.create_histogram_float(
            names.SESSION_PHASE_SECONDS, "wall time of a session's phase, queue time included", "s"
        )

        def deadline_left() -> float:
            ticked = (workflow.now() - (self._clock or workflow.now())).total_seconds()
            return task.timeout_s - (ticked - self._waited_s)

        async def timed(phase: str, coro, *, current: bool = True):
            if current:
                self._phase = phase
                self._show()
            t0 = workflow.now()

            def record() -> None:
                t1 = workflow.now()
                timings.append(
                    PhaseTiming(
                        phase=phase,
                        duration_s=(t1 - t0).total_seconds(),
                        started_at=t0,
                        ended_at=t1,
                    )
                )
                phase_seconds.record((t1 - t0).total_seconds(), {"phase": phase})

            try:
                result = await coro
            except GeneratorExit:
                # the worker evicted the workflow from its cache and closes its coroutines:
                # no workflow clock to read, and no timing to keep
                raise
            except BaseException:
                record()
                raise
            record()
            return result

        fresh_eval = task.evaluator.runtime == "fresh"

        def start_prewarm() -> asyncio.Task[ProvisionRuntimeOutput]:
            # step 3: the evaluation runtime is provisioned while the harness runs
            return asyncio.ensure_future(
                timed(
                    "eval_provision",
                    workflow.execute_activity(
                        "provision_runtime",
                        ProvisionRuntimeInput(
                            session_id=input.session_id,
                            runtime=task.evaluator.runtime_spec or task.runtime,
                            purpose="evaluation",
                        ),
                        task_queue=task_queues.SANDBOX,
                        start_to_close_timeout=_seconds(phases.provision_s),
                        heartbeat_timeout=HEARTBEAT,
                        retry_policy=INFRA_RETRY,
                        priority=self._priority,
                        result_type=ProvisionRuntimeOutput,
                    ),
                    current=False,
                )
            )

        # once the session's runtime is up (else such runtimes fill a host)
        self._start_prewarm = start_prewarm if fresh_eval else None
        given_up: list[SessionAttempt] = []
        attempt = 0
        while True:
            attempt += 1
            session_id = attempt_session_id(input.session_id, attempt)
            wait = attempt == 1  # a replacement is not held back
            # the earlier attempts' sealed logs (newest first) answer the requests identical
            # to theirs: each conversation replays until its first difference (issue 25)
            replay_from = (
                [*(a.session_id for a in reversed(given_up)), *input.replay_from]
                if task.resume == "replay"
                else []
            )

            def open_once(sid=session_id, wait=wait, replay=replay_from):
                return timed(
                    "open",
                    workflow.execute_activity(
                        "open_session",
                        OpenSessionInput(
                            session_id=sid,
                            task_id=task.task_id,
                            owner=workflow.info().run_id,
                            sampling=task.sampling,
                            model=task.model,
                            replay_from=replay,
                            replay_max_staleness=task.replay_max_staleness,
                            wait_for_backends=wait,
                        ),
                        task_queue=task_queues.GATEWAY,
                        start_to_close_timeout=_seconds(phases.open_s),
                        retry_policy=INFRA_RETRY,
                        priority=self._priority,
                        result_type=OpenSessionOutput,
                    ),
                )

            opened: OpenSessionOutput = await (
                backpressure.open_when_backends_free(open_once, timings) if wait else open_once()
            )
            outcome = await self._attempt(
                input,
                session_id,
                opened,
                attempt,
                run_check=not fresh_eval,
                timed=timed,
                deadline_left=deadline_left,
            )
            if outcome.host_lost and attempt < task.max_session_attempts and deadline_left() > 1.0:
                # the attempt's log is sealed and kept under its own session id; the next
                # attempt starts from a fresh runtime and an empty log that replays this one
                # (task.resume; docs/faults.md)
                try:
                    closed = await self._close(opened, session_id, timed)
                finally:
                    await outcome.torn_down()
                given_up.append(
                    SessionAttempt(
                        attempt=attempt,
                        session_id=session_id,
                        error=outcome.error or "sandbox host lost",
                        num_completions=closed.num_completions,
                    )
                )
                workflow.logger.warning(
                    "session %s attempt %d given up: %s", input.session_id, attempt, outcome.error
                )
                continue
            break

        try:
            return await self._finish(
                input, outcome, opened, session_id, attempt, self._prewarm, given_up, timings, timed
            )
        finally:
            await outcome.torn_down()

    async def _finish(
        self,
        input: SessionInput,
        outcome: AttemptOutcome,
        opened: OpenSessionOutput,
        session_id: str,
        attempt: int,
        prewarm: asyncio.Task[ProvisionRuntimeOutput] | None,
        given_up: list[SessionAttempt],
        timings: list[PhaseTiming],
        timed,
    ) -> SessionResult:
        """Steps 5-9 after the last attempt: evaluation runtime, close, build, evaluate.

        The session's failure cause is decided from what was recorded
        (:func:`rolloutd.workflows.failures.classify`); only a session the policy is
        accountable for is scored (docs/failures.md).
        """
        task, phases = input.task, input.task.phases
        status, error, artifacts = outcome.status, outcome.error, outcome.artifacts
        cancelled = outcome.cancelled
        if outcome.host_lost:
            error = f"{error} (attempt {attempt} of {task.max_session_attempts}: giving up)"
            outcome.error = error
        eval_error: str | None = None
        if prewarm is not None:
            if outcome.no_sandbox_worker and not prewarm.done():
                prewarm.cancel()  # it waits in the same dead queue
            eval_error = await self._evaluate_in_fresh_runtime(
                input,
                prewarm,
                artifacts,
                run_check=not cancelled
                and status in (SessionStatus.COMPLETED, SessionStatus.TIMEOUT),
                timed=timed,
            )
            if eval_error and error is None:
                error = eval_error

        closed = await self._close(opened, session_id, timed, run_deadline_at=outcome.timed_out_at)
        self._num_completions = closed.num_completions

        failure = failures.classify(session_facts(outcome, closed, task.harness.type))
        if failure is None and eval_error is not None and eval_error != "cancelled":
            failure = FailureCause(kind="evaluator", message=eval_error, phase="eval_provision")
        how, forced = failures.scoring(failure, task.timeout_reward)
        if (
            how != "skip"
            and closed.num_invalid_tool_calls
            and task.invalid_tool_call_reward is not None
        ):
            # an unreadable tool call is the model's doing: the task sets its reward
            how, forced = "force", task.invalid_tool_call_reward
        if failure is not None and failure.kind not in ("timeout", "cancelled"):
            status = SessionStatus.FAILED
            error = error or failure.message
        evaluate = how != "skip"

        built: BuildTrajectoryOutput = await timed(
            "build",
            workflow.execute_activity(
                "build_trajectory",
                BuildTrajectoryInput(
                    session_id=session_id,
                    task_id=task.task_id,
                    sample_index=input.sample_index,
                    status=status,
                    builder=task.builder,
                    failure=failure,
                ),
                task_queue=task_queues.GATEWAY,
                start_to_close_timeout=_seconds(phases.build_s),
                retry_policy=INFRA_RETRY,
                priority=self._priority,
                result_type=BuildTrajectoryOutput,
            ),
        )

        reward: float | None = None
        trace_rewards: list[float] | None = None
        if evaluate:
            try:
                evaluated: EvaluateOutput = await timed(
                    "evaluate",
                    workflow.execute_activity(
                        "evaluate",
                        EvaluateInput(
                            session_id=session_id,
                            task_id=task.task_id,
                            evaluator=task.evaluator,
                            status=status,
                            harness_exit_code=outcome.harness_exit,
                            num_completions=self._num_completions,
                            trajectory_ref=built.trajectory_ref,
                            artifacts=artifacts,
                            forced_reward=forced,
                        ),
                        task_queue=task_queues.EVAL,
                        start_to_close_timeout=_seconds(phases.evaluate_s),
                        heartbeat_timeout=HEARTBEAT,
                        retry_policy=INFRA_RETRY,
                        priority=self._priority,
                        result_type=EvaluateOutput,
                    ),
                )
            except ActivityError as e:
                if isinstance(e.cause, TemporalCancelledError):
                    raise
                evaluated = EvaluateOutput(error=f"evaluation failed: {cause_text(e)}")
            if evaluated.error is not None:
                failure = FailureCause(
                    kind="evaluator",
                    phase="evaluate",
                    message=evaluated.error[:500],
                    retryable=False,
                )
                status, error = SessionStatus.FAILED, error or evaluated.error
            reward, trace_rewards = evaluated.reward, evaluated.trace_rewards

        await outcome.torn_down()
        self._phase = "done"
        versions = built.stats.policy_versions
        search.upsert(
            status=status.value,
            reward=reward,
            policy_version=max(versions) if versions else None,
            failure=failure.kind if failure is not None else None,
        )
        self._show(
            status=status.value,
            reward=reward,
            failure=failure.kind if failure is not None else None,
        )
        if failure is not None:
            workflow.metric_meter().create_counter(
                SESSION_FAILURES_METRIC, "sessions that ended with a failure cause, by kind"
            ).add(1, {"kind": failure.kind})
        workflow.metric_meter().create_counter(
            names.SESSIONS_ENDED, "sessions ended, by status and harness"
        ).add(1, {"status": status.value, "harness": input.task.harness.type})
        result = SessionResult(
            session_id=session_id,
            task_id=task.task_id,
            sample_index=input.sample_index,
            status=status,
            reward=reward,
            trace_rewards=trace_rewards,
            error=error,
            num_completions=self._num_completions,
            num_call_errors=closed.num_errors,
            num_unrecovered_call_errors=closed.num_unrecovered_errors,
            last_call_error=closed.last_error,
            num_traces=built.num_traces,
            num_trainable_tokens=built.stats.num_trainable_tokens,
            trajectory_ref=built.trajectory_ref,
            harness_exit_code=outcome.harness_exit,
            phases=timings,
            stats=built.stats,
            attempts=given_up,
            failure=failure,
            replay=closed.replay,
        )
        if cancelled:
            workflow.logger.info("session cancelled after cleanup: %s", input.session_id)
        return result

    async def _attempt(
        self,
        input: SessionInput,
        session_id: str,
        opened: OpenSessionOutput,
        attempt: int,
        *,
        run_check: bool,
        timed,
        deadline_left,
    ) -> AttemptOutcome:
        """One attempt on one runtime: provision, run, collect, tear down (always).

        Returns:
            The attempt's :class:`AttemptOutcome`; ``host_lost`` when the sandbox host died or
            restarted under it (the session may start again on a fresh runtime).
        """
        task, phases = input.task, input.task.phases
        out = AttemptOutcome()
        runtime: ProvisionRuntimeOutput | None = None
        try:
            provision_input = ProvisionRuntimeInput(session_id=session_id, runtime=task.runtime)
            runtime = await timed(
                "provision",
                provision_watched(
                    provision_input,
                    phases.provision_s,
                    phases.provision_wait_s,
                    attempt,
                    priority=self._priority,
                ),
            )
            if self._clock is None:
                self._clock = workflow.now()
            else:  # a later attempt's wait for a host
                self._waited_s += runtime.queue_wait_s
            if self._start_prewarm is not None and self._prewarm is None:
                self._prewarm = self._start_prewarm()
            run_budget = min(phases.run_s, max(1.0, deadline_left()))
            try:
                ran: RunHarnessOutput = await timed(
                    "run",
                    workflow.execute_activity(
                        "run_harness",
                        RunHarnessInput(
                            runtime_id=runtime.runtime_id,
                            session_id=session_id,
                            harness=task.harness,
                            instruction=task.instruction,
                            session=opened,
                            timeout_s=run_budget,
                        ),
                        task_queue=runtime.host_queue,
                        # the activity kills the harness at run_budget itself; this is the backstop
                        start_to_close_timeout=_seconds(run_budget + 30),
                        schedule_to_start_timeout=HOST_QUEUE_START,
                        heartbeat_timeout=HARNESS_HEARTBEAT,
                        retry_policy=NO_RETRY,
                        priority=self._priority,
                        cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                        result_type=RunHarnessOutput,
                    ),
                )
                out.harness_exit = ran.exit_code
                out.harness_ran, out.signal_sent = True, ran.signal_sent
                out.backend_verdict = ran.backend_verdict
                out.run_budget_shortened = attempt > 1 and run_budget < phases.run_s
                if ran.timed_out:
                    out.status = SessionStatus.TIMEOUT
                    out.error = f"run phase exceeded {run_budget:.0f} s"
                    out.failed_phase, out.timed_out = "run", True
                    out.timed_out_at = ran.timed_out_at
            except ActivityError as e:
                if isinstance(e.cause, TemporalCancelledError):
                    raise asyncio.CancelledError() from e
                out.failed_phase = "run"
                note_error(out, e)
                out.run_budget_shortened = attempt > 1 and run_budget < phases.run_s
                if host_lost(e):
                    out.host_lost = True
                    out.status = SessionStatus.FAILED
                    out.error = (
                        f"sandbox host {runtime.host_id} lost during the run "
                        f"(attempt {attempt}): {cause_text(e)}"
                    )
                elif isinstance(e.cause, TimeoutError) and e.cause.type in (
                    TimeoutType.START_TO_CLOSE,
                    TimeoutType.SCHEDULE_TO_CLOSE,
                ):
                    out.status, out.error = SessionStatus.TIMEOUT, "run phase timed out"
                    out.timed_out = True
                else:
                    out.status = SessionStatus.FAILED
                    out.error = f"harness run failed: {cause_text(e)}"
            if out.status in (SessionStatus.COMPLETED, SessionStatus.TIMEOUT):
                collected: CollectArtifactsOutput = await timed(
                    "collect",
                    workflow.execute_activity(
                        "collect_artifacts",
                        CollectArtifactsInput(
                            runtime_id=runtime.runtime_id,
                            session_id=session_id,
                            evaluator=task.evaluator,
                            run_check=run_check,
                        ),
                        task_queue=runtime.host_queue,
                        start_to_close_timeout=_seconds(
                            phases.collect_s + task.evaluator.timeout_s
                        ),
                        schedule_to_start_timeout=HOST_QUEUE_START,
                        heartbeat_timeout=HEARTBEAT,
                        retry_policy=NO_RETRY,
                        priority=self._priority,
                        result_type=CollectArtifactsOutput,
                    ),
                )
                out.artifacts = collected.artifacts
        except NoSandboxWorkerError as e:
            out.no_sandbox_worker = True
            out.status, out.error = SessionStatus.FAILED, str(e)
            out.failed_phase = "provision"
        except asyncio.CancelledError:
            out.cancelled = True
            out.status, out.error = SessionStatus.CANCELLED, "cancelled"
        except ActivityError as e:
            if isinstance(e.cause, TemporalCancelledError):
                out.cancelled = True
                out.status, out.error = SessionStatus.CANCELLED, "cancelled"
            else:
                out.status = SessionStatus.FAILED
                out.error = f"{self._phase} failed: {cause_text(e)}"
                out.failed_phase = self._phase
                note_error(out, e)
                if self._phase == "collect" and host_lost(e):
                    out.host_lost = True
                    out.error = (
                        f"sandbox host lost while collecting (attempt {attempt}): {cause_text(e)}"
                    )
        finally:
            if runtime is not None:
                # torn down while the gateway session closes and the trajectory is built
                out.teardown = asyncio.ensure_future(
                    self._teardown(
                        runtime,
                        timed,
                        host_lost=out.host_lost,
                        teardown_s=phases.teardown_s,
                        current=False,
                    )
                )
        return out
