"""What one attempt of a session ended with, and the facts its failure cause is decided from
(:mod:`rolloutd.workflows.failures`). Workflow code: deterministic, no I/O."""

from __future__ import annotations

import asyncio
import dataclasses

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError, TimeoutType

with workflow.unsafe.imports_passed_through():
    from rolloutd.activities.models import CloseSessionOutput
    from rolloutd.types import SessionStatus
    from rolloutd.workflows import failures


def host_lost(error: ActivityError) -> bool:
    """Whether a host-pinned activity failed because its sandbox host died or restarted:
    no heartbeat in time, never picked up from the host's queue, the runtime is unknown
    to the host (a restarted worker), or the host handed the run back while it drained
    (``HostDrainingError``: SIGTERM, DECISIONS ruling 9), or the run outlived the drain's
    grace period (``WorkerShutdown``)."""
    cause = error.cause
    if isinstance(cause, TimeoutError):
        return cause.type in (TimeoutType.HEARTBEAT, TimeoutType.SCHEDULE_TO_START)
    return isinstance(cause, ApplicationError) and cause.type in HOST_LOST_ERRORS


#: activity error types that mean the sandbox host is gone or going: rolloutd.errors', and
#: the SDK's for an activity still running when its worker's drain ran out of grace
HOST_LOST_ERRORS = ("RuntimeNotFoundError", "HostDrainingError", "WorkerShutdown")


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
    #: what the failure cause is decided from (rolloutd.workflows.failures.SessionFacts)
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
    #: the runtime's teardown, running beside close and build (they do not depend on each other)
    teardown: asyncio.Future[None] | None = None

    async def torn_down(self) -> None:
        """Wait for the runtime's teardown when it runs in the background."""
        if self.teardown is not None:
            await self.teardown


def session_facts(
    outcome: AttemptOutcome, closed: CloseSessionOutput, harness_type: str
) -> failures.SessionFacts:
    """What :func:`rolloutd.workflows.failures.classify` decides from: the last attempt's
    outcome and what the gateway said when it sealed the session."""
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


def cause_text(e: BaseException) -> str:
    while e.__cause__ is not None:
        e = e.__cause__
    return str(e) or type(e).__name__
