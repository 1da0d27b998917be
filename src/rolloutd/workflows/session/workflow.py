"""``RolloutSessionWorkflow``: one sample of a task, its lifecycle (docs/sessions.md).

1. open a gateway session; 2. provision the runtime; 3. when the evaluator asks for a fresh
runtime, provision it in parallel (prewarm); 4. run the harness on the runtime's host queue;
collect artifacts (the workspace's patch; the evaluator's check when it runs in the session's
runtime) while the runtime lives; 5. tear the runtime down, always; in the fresh evaluation
runtime, apply the patch and run the check, then tear it down, always; 6. close the gateway
session; 7. build the trajectory; 8. evaluate; 9. return the result.

The whole class is here: the attempts (steps 1-4) and the end (``_finish``, steps 5-9), which
runs the steps of :mod:`rolloutd.workflows.session.ending` (free functions: what each takes
and gives is explicit) and decides the failure cause there. Deterministic code only: no I/O,
``workflow.now()`` for time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import Priority
from temporalio.exceptions import ActivityError, TimeoutError, TimeoutType
from temporalio.exceptions import CancelledError as TemporalCancelledError

with workflow.unsafe.imports_passed_through():
    from rolloutd import task_queues
    from rolloutd.activities.models import (
        CollectArtifactsInput,
        CollectArtifactsOutput,
        EvaluateOutput,
        OpenSessionInput,
        OpenSessionOutput,
        ProvisionRuntimeInput,
        ProvisionRuntimeOutput,
        RunHarnessInput,
        RunHarnessOutput,
    )
    from rolloutd.activities.names import (
        COLLECT_ARTIFACTS,
        OPEN_SESSION,
        PROVISION_RUNTIME,
        READ_TASK_REQUEST,
        RUN_HARNESS,
    )
    from rolloutd.activities.tenants import GRANTED_SIGNAL
    from rolloutd.capabilities import FLEET_STATE_SIGNAL, FleetState
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
    from rolloutd.workflows import metadata, search, tenants
    from rolloutd.workflows.fleet_watch import FleetStates
    from rolloutd.workflows.session import ending
    from rolloutd.workflows.session.ending import (
        AttemptOutcome,
        Timed,
        host_lost,
        note_error,
    )
    from rolloutd.workflows.session.failures import cause_text
    from rolloutd.workflows.session.models import SessionInput, attempt_session_id
    from rolloutd.workflows.session.policies import (
        HARNESS_HEARTBEAT,
        HEARTBEAT,
        HOST_QUEUE_START,
        INFRA_RETRY,
        NO_RETRY,
        seconds,
    )
    from rolloutd.workflows.session.provisioning import provision_waiting
    from rolloutd.workflows.tenants import task_priority

__all__ = ["RolloutSessionWorkflow", "SessionInput", "attempt_session_id"]

#: reading a stored task request (one blob) from the eval fleet
READ_TASK_TIMEOUT = timedelta(seconds=30)
#: a first open that waited this long or more in the admission queue shows a ``backend_wait``
#: phase (every open waits a few milliseconds for a poll)
BACKEND_WAIT_SHOWN_S = 0.5


@workflow.defn
class RolloutSessionWorkflow:
    """One harness run in one runtime, with its trajectory and score."""

    def __init__(self) -> None:
        self._phase = "pending"
        self._num_completions = 0
        self._priority: Priority | None = Priority.default
        self._granted = False
        # the deadline's clock (None: not started) and the later attempts' queue waits, s
        self._clock: datetime | None = None
        self._waited_s = 0.0
        self._prewarm: asyncio.Task[ProvisionRuntimeOutput] | None = None
        self._start_prewarm: Callable[[], asyncio.Task[ProvisionRuntimeOutput]] | None = None
        self._fleet_states = FleetStates()

    @workflow.signal(name=GRANTED_SIGNAL)
    def tenant_slot_granted(self) -> None:
        """The tenant's quota workflow granted this session a slot."""
        self._granted = True

    @workflow.signal(name=FLEET_STATE_SIGNAL)
    def fleet_state(self, state: FleetState) -> None:
        """The fleet registry answers a watch (:mod:`rolloutd.workflows.fleet_watch`): the
        sandbox fleet died while a provisioning waited for it."""
        self._fleet_states.add(state)

    @workflow.query
    def phase(self) -> str:
        """The phase the session is in (open, provision, run, collect, teardown, ...)."""
        return self._phase

    def _show(self, **final: Any) -> None:
        """Current details for the Temporal UI (:mod:`rolloutd.workflows.metadata`); the
        completions are known once the gateway session closed."""
        workflow.set_current_details(
            metadata.current_details(
                phase=self._phase, num_completions=self._num_completions, **final
            )
        )

    @workflow.run
    async def run(self, input: SessionInput) -> SessionResult:
        if input.task is None:
            # a large request is stored once by the task: read it here, into this
            # session's own history only
            self._phase = "read_task"
            stored: TaskRequest = await workflow.execute_activity(
                READ_TASK_REQUEST,
                input.task_key,
                task_queue=task_queues.EVAL,
                start_to_close_timeout=READ_TASK_TIMEOUT,
                retry_policy=INFRA_RETRY,
                result_type=TaskRequest,
            )
            input = input.model_copy(update={"task": stored, "task_key": None})
        task = input.task
        assert task is not None  # one of the two, by SessionInput's validator
        timings: list[PhaseTiming] = []
        # its task starts it with these (search.started); a session started by a client
        # upserts them
        search.upsert_unless_started(
            task_id=task.task_id, harness=task.harness.type, tenant=task.tenant
        )
        self._show()
        self._priority = task_priority(task)
        self._phase = "tenant_wait"
        waited = await tenants.acquire_slot(
            task, lambda: self._granted, timings, quota=input.tenant_quota
        )
        holds_slot = waited is not None
        try:
            return await self._run(input, timings)
        finally:
            if holds_slot:
                await tenants.release_slot(task)

    async def _run(self, input: SessionInput, timings: list[PhaseTiming]) -> SessionResult:
        """Steps 1-9 (the module docstring): attempts until one ends without losing its host
        (or the attempts or the deadline are spent), then the end of the session."""
        task = input.task
        # the deadline ticks from the first runtime up: no capacity wait is charged
        self._clock = None
        timed = self._phase_timer(task, timings)
        fresh_eval = task.evaluator.runtime == "fresh"
        # once the session's runtime is up (else such runtimes fill a host)
        self._start_prewarm = (lambda: self._prewarm_runtime(input, timed)) if fresh_eval else None
        given_up: list[SessionAttempt] = []
        attempt = 0
        while True:
            attempt += 1
            session_id = attempt_session_id(input.session_id, attempt)
            try:
                opened = await self._open(input, session_id, attempt, given_up, timings, timed)
            except ActivityError as e:
                if attempt > 1 or not _queue_deadline(e):
                    raise
                return self._not_admitted(input, timings)
            outcome = await self._attempt(
                input, session_id, opened, attempt, run_check=not fresh_eval, timed=timed
            )
            if (
                not outcome.host_lost
                or attempt >= task.max_session_attempts
                or self._deadline_left(task) <= 1.0
            ):
                break
            given_up.append(await self._give_up(input, outcome, opened, session_id, attempt, timed))
        try:
            return await self._finish(
                input, outcome, opened, session_id, attempt, given_up, timings, timed
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
        given_up: list[SessionAttempt],
        timings: list[PhaseTiming],
        timed: Timed,
    ) -> SessionResult:
        """Steps 5-9 after the last attempt (:mod:`rolloutd.workflows.session.ending`):
        evaluation runtime, close, build, evaluate.

        The session's failure cause is decided from what was recorded
        (:func:`~rolloutd.workflows.session.ending.decide`); only a session the policy is
        accountable for is scored (docs/failures.md).
        """
        task = input.task
        error = outcome.error
        if outcome.host_lost:
            error = f"{error} (attempt {attempt} of {task.max_session_attempts}: giving up)"
            outcome.error = error
        eval_error: str | None = None
        if self._prewarm is not None:
            if outcome.no_sandbox_worker and not self._prewarm.done():
                self._prewarm.cancel()  # it waits in the same dead queue
            eval_error = await ending.evaluate_in_fresh_runtime(
                input,
                self._prewarm,
                outcome.artifacts,
                run_check=not outcome.cancelled
                and outcome.status in (SessionStatus.COMPLETED, SessionStatus.TIMEOUT),
                timed=timed,
                priority=self._priority,
            )
            if eval_error and error is None:
                error = eval_error

        closed = await ending.close(
            opened,
            session_id,
            timed,
            priority=self._priority,
            run_deadline_at=outcome.timed_out_at,
        )
        self._num_completions = closed.num_completions
        decided = ending.decide(task, outcome, closed, error, eval_error)
        built = await ending.build(input, session_id, decided, timed, priority=self._priority)
        evaluated = EvaluateOutput()
        if decided.how != "skip":
            evaluated = await ending.evaluate(
                input,
                session_id,
                outcome,
                built,
                decided,
                timed,
                priority=self._priority,
                num_completions=self._num_completions,
            )
        reward, trace_rewards = evaluated.reward, evaluated.trace_rewards

        await outcome.torn_down()
        self._phase = "done"
        ending.report(task, decided, reward, built)
        failure_kind = decided.failure.kind if decided.failure is not None else None
        self._show(status=decided.status.value, reward=reward, failure=failure_kind)
        if outcome.cancelled:
            workflow.logger.info("session cancelled after cleanup: %s", input.session_id)
        return SessionResult(
            session_id=session_id,
            task_id=task.task_id,
            sample_index=input.sample_index,
            status=decided.status,
            reward=reward,
            trace_rewards=trace_rewards,
            error=decided.error,
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
            failure=decided.failure,
            replay=closed.replay,
            evaluation=evaluated.evaluation,
        )

    def _not_admitted(self, input: SessionInput, timings: list[PhaseTiming]) -> SessionResult:
        """The session's result when no gateway admitted it within
        ``phases.capacity_wait_s``: nothing was opened or provisioned, nothing to score."""
        task = input.task
        message = (
            "no gateway had backend capacity for the session within "
            f"phases.capacity_wait_s ({task.phases.capacity_wait_s:g} s)"
        )
        failure = FailureCause(kind="backend", phase="open", message=message, retryable=False)
        self._phase = "done"
        search.upsert(status=SessionStatus.FAILED.value, failure=failure.kind)
        self._show(status=SessionStatus.FAILED.value, failure=failure.kind)
        return SessionResult(
            session_id=input.session_id,
            task_id=task.task_id,
            sample_index=input.sample_index,
            status=SessionStatus.FAILED,
            error=message,
            phases=timings,
            failure=failure,
        )

    def _deadline_left(self, task: TaskRequest) -> float:
        """Seconds left of the session's ``timeout_s``: counted from the first runtime up,
        less the later attempts' waits for a host."""
        ticked = (workflow.now() - (self._clock or workflow.now())).total_seconds()
        return task.timeout_s - (ticked - self._waited_s)

    def _phase_timer(self, task: TaskRequest, timings: list[PhaseTiming]) -> Timed:
        """The session's phase timer: ``timed(phase, awaitable, current=True)`` awaits and
        appends a :class:`PhaseTiming` (and a metric) whether it succeeds or fails;
        ``current`` makes it the phase the ``phase`` query shows."""
        # metric_meter() is replay-safe: nothing is emitted again when a history replays
        meter = workflow.metric_meter().with_additional_attributes({"harness": task.harness.type})
        meter.create_counter(names.SESSIONS_STARTED, "sessions started").add(1)
        phase_seconds = meter.create_histogram_float(
            names.SESSION_PHASE_SECONDS, "wall time of a session's phase, queue time included", "s"
        )

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

        return timed

    def _prewarm_runtime(
        self, input: SessionInput, timed: Timed
    ) -> asyncio.Task[ProvisionRuntimeOutput]:
        """Step 3: the evaluation runtime is provisioned while the harness runs."""
        task = input.task
        return asyncio.ensure_future(
            timed(
                "eval_provision",
                workflow.execute_activity(
                    PROVISION_RUNTIME,
                    ProvisionRuntimeInput(
                        session_id=input.session_id,
                        runtime=task.evaluator.runtime_spec or task.runtime,
                        purpose="evaluation",
                    ),
                    task_queue=task_queues.SANDBOX,
                    start_to_close_timeout=seconds(task.phases.provision_s),
                    heartbeat_timeout=HEARTBEAT,
                    retry_policy=INFRA_RETRY,
                    priority=self._priority,
                    result_type=ProvisionRuntimeOutput,
                ),
                current=False,
            )
        )

    async def _open(
        self,
        input: SessionInput,
        session_id: str,
        attempt: int,
        given_up: list[SessionAttempt],
        timings: list[PhaseTiming],
        timed: Timed,
    ) -> OpenSessionOutput:
        """Step 1: open the attempt's gateway session. The first attempt waits in the
        admission queue until a gateway's backends have room (its slot supplier,
        :class:`rolloutd.workers.capacity.SessionSlots`), at most ``phases.capacity_wait_s``;
        a later attempt (a lost host) is not held back."""
        task = input.task
        wait = attempt == 1
        # the earlier attempts' sealed logs (newest first) answer the requests identical to
        # theirs: each conversation replays until its first difference
        replay_from = (
            [*(a.session_id for a in reversed(given_up)), *input.replay_from]
            if task.resume == "replay"
            else []
        )

        opened: OpenSessionOutput = await timed(
            "open",
            workflow.execute_activity(
                OPEN_SESSION,
                OpenSessionInput(
                    session_id=session_id,
                    task_id=task.task_id,
                    owner=workflow.info().run_id,
                    sampling=task.sampling,
                    model=task.model,
                    replay_from=replay_from,
                    replay_max_staleness=task.replay_max_staleness,
                ),
                task_queue=task_queues.GATEWAY_ADMIT if wait else task_queues.GATEWAY,
                schedule_to_start_timeout=seconds(task.phases.capacity_wait_s) if wait else None,
                start_to_close_timeout=seconds(task.phases.open_s),
                retry_policy=INFRA_RETRY,
                priority=self._priority,
                result_type=OpenSessionOutput,
            ),
        )
        if opened.queue_wait_s >= BACKEND_WAIT_SHOWN_S:
            ended = workflow.now()
            started = ended - timedelta(seconds=opened.queue_wait_s)
            timings.append(
                PhaseTiming(
                    phase="backend_wait",
                    started_at=started,
                    ended_at=ended,
                    duration_s=opened.queue_wait_s,
                )
            )
        return opened

    async def _give_up(
        self,
        input: SessionInput,
        outcome: AttemptOutcome,
        opened: OpenSessionOutput,
        session_id: str,
        attempt: int,
        timed: Timed,
    ) -> SessionAttempt:
        """An attempt whose host was lost: its log is sealed and kept under its own session
        id; the next attempt starts from a fresh runtime and an empty log that replays this
        one (``task.resume``; docs/faults.md)."""
        try:
            closed = await ending.close(opened, session_id, timed, priority=self._priority)
        finally:
            await outcome.torn_down()
        workflow.logger.warning(
            "session %s attempt %d given up: %s", input.session_id, attempt, outcome.error
        )
        return SessionAttempt(
            attempt=attempt,
            session_id=session_id,
            error=outcome.error or "sandbox host lost",
            num_completions=closed.num_completions,
        )

    async def _attempt(
        self,
        input: SessionInput,
        session_id: str,
        opened: OpenSessionOutput,
        attempt: int,
        *,
        run_check: bool,
        timed: Timed,
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
                provision_waiting(
                    provision_input,
                    provision_s=phases.provision_s,
                    wait_s=phases.provision_wait_s,
                    queue_wait_s=phases.capacity_wait_s,
                    attempt=attempt,
                    states=self._fleet_states,
                    priority=self._priority,
                ),
            )
            if self._clock is None:
                self._clock = workflow.now()
            else:  # a later attempt's wait for a host
                self._waited_s += runtime.queue_wait_s
            if self._start_prewarm is not None and self._prewarm is None:
                self._prewarm = self._start_prewarm()
            await self._run_harness(input, session_id, opened, attempt, runtime, out, timed)
            if out.status in (SessionStatus.COMPLETED, SessionStatus.TIMEOUT):
                out.artifacts = await self._collect(input, session_id, runtime, run_check, timed)
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
                if self._phase == "provision" and _queue_deadline(e):
                    # a replacement would wait in the same full queue again
                    out.non_retryable = True
                    out.error = (
                        "no sandbox host had room for the session within "
                        f"phases.capacity_wait_s ({phases.capacity_wait_s:g} s)"
                    )
                if self._phase == "collect" and host_lost(e):
                    out.host_lost = True
                    out.error = (
                        f"sandbox host lost while collecting (attempt {attempt}): {cause_text(e)}"
                    )
        finally:
            if runtime is not None:
                # torn down while the gateway session closes and the trajectory is built
                out.teardown = asyncio.ensure_future(
                    ending.teardown(
                        runtime,
                        timed,
                        priority=self._priority,
                        host_lost=out.host_lost,
                        teardown_s=phases.teardown_s,
                        current=False,
                    )
                )
        return out

    async def _run_harness(
        self,
        input: SessionInput,
        session_id: str,
        opened: OpenSessionOutput,
        attempt: int,
        runtime: ProvisionRuntimeOutput,
        out: AttemptOutcome,
        timed: Timed,
    ) -> None:
        """Step 4: run the harness on the runtime's host, within the run budget (cut to the
        session's deadline); what it ended with goes into ``out``.

        Raises:
            asyncio.CancelledError: the session was cancelled while the harness ran.
        """
        task, phases = input.task, input.task.phases
        run_budget = min(phases.run_s, max(1.0, self._deadline_left(task)))
        out.run_budget_shortened = attempt > 1 and run_budget < phases.run_s
        try:
            ran: RunHarnessOutput = await timed(
                "run",
                workflow.execute_activity(
                    RUN_HARNESS,
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
                    start_to_close_timeout=seconds(run_budget + 30),
                    schedule_to_start_timeout=HOST_QUEUE_START,
                    heartbeat_timeout=HARNESS_HEARTBEAT,
                    retry_policy=NO_RETRY,
                    priority=self._priority,
                    cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                    result_type=RunHarnessOutput,
                ),
            )
        except ActivityError as e:
            if isinstance(e.cause, TemporalCancelledError):
                raise asyncio.CancelledError() from e
            out.failed_phase = "run"
            note_error(out, e)
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
            return
        out.harness_exit = ran.exit_code
        out.harness_ran, out.signal_sent = True, ran.signal_sent
        out.backend_verdict = ran.backend_verdict
        out.limit_reached = ran.limit_reached
        if ran.timed_out:
            out.status = SessionStatus.TIMEOUT
            out.error = f"run phase exceeded {run_budget:.0f} s"
            out.failed_phase, out.timed_out = "run", True
            out.timed_out_at = ran.timed_out_at

    async def _collect(
        self,
        input: SessionInput,
        session_id: str,
        runtime: ProvisionRuntimeOutput,
        run_check: bool,
        timed: Timed,
    ) -> dict[str, str]:
        """Step 4's collection while the runtime lives: the workspace's patch and files, and
        the evaluator's check when it runs in the session's runtime.

        Returns:
            Artifact name -> blob key.
        """
        task = input.task
        collected: CollectArtifactsOutput = await timed(
            "collect",
            workflow.execute_activity(
                COLLECT_ARTIFACTS,
                CollectArtifactsInput(
                    runtime_id=runtime.runtime_id,
                    session_id=session_id,
                    evaluator=task.evaluator,
                    run_check=run_check,
                    store_final_state=task.store_final_state,
                ),
                task_queue=runtime.host_queue,
                start_to_close_timeout=seconds(task.phases.collect_s + task.evaluator.timeout_s),
                schedule_to_start_timeout=HOST_QUEUE_START,
                heartbeat_timeout=HEARTBEAT,
                retry_policy=NO_RETRY,
                priority=self._priority,
                result_type=CollectArtifactsOutput,
            ),
        )
        return collected.artifacts


def _queue_deadline(error: ActivityError) -> bool:
    """Whether an activity failed because no worker took it from its queue in time (its
    schedule-to-start timeout: the wait for capacity's deadline)."""
    cause = error.cause
    return isinstance(cause, TimeoutError) and cause.type == TimeoutType.SCHEDULE_TO_START
