"""A session's failure cause, decided from what its workflow recorded (docs/failures.md).

A reward measures the policy, never the infrastructure (docs/decisions.md, "Failure causes
and rewards"): a session is scored only when it ran to its end (``failure is None``) or when
its run phase timed out while the policy was accountable; every other session gets
``reward = None``. Pure, deterministic functions: the session workflow calls them
(:mod:`rolloutd.workflows.session.ending` gathers the facts).
"""

from __future__ import annotations

import dataclasses
import signal
from typing import Literal

from rolloutd.fault import Fault, refusal_fault
from rolloutd.types import FailureCause

#: exit codes of a command that could not start: found but not executable (126), not found
#: (127) -- POSIX shell, "Exit Status for Commands"
CANNOT_START_EXIT_CODES = (126, 127)
#: harnesses a task scripts itself: one that exits 0 without a model call is scored (a
#: scripted baseline, a test), where an agent CLI that made no call did not run
SCRIPTED_HARNESSES = frozenset({"shell", "oracle"})
#: ApplicationError types of a harness that could not be prepared (configuration, adapter)
HARNESS_ERROR_TYPES = frozenset({"HarnessError", "ConfigError", "InvalidRequestError"})


@dataclasses.dataclass
class SessionFacts:
    """What a session's last attempt and its evaluation recorded.

    Attributes:
        cancelled: the session was cancelled.
        failed_phase: the phase whose activity failed or timed out (``provision``, ``run``,
            ``collect``, ``eval_check``, ``evaluate``, ...), or None.
        error: what failed, in words.
        error_type: the failed activity's error type (``ApplicationError.type``:
            ``RuntimeStartError``, ``HarnessError``, ...), or None.
        non_retryable: the activity's error said a new attempt would fail again.
        timed_out: ``failed_phase``'s budget ran out.
        host_lost: the sandbox host was lost after the last attempt.
        no_sandbox_worker: no sandbox worker polled while provisioning waited.
        harness_type: the task's ``harness.type``.
        harness_ran: the harness activity returned (exit code, or stopped at its budget).
        harness_exit: the harness's exit code (negative: killed by that signal).
        signal_sent: the signal the sandbox sent the harness itself (at its budget).
        run_budget_shortened: the run budget was cut by the session deadline after an
            earlier attempt was lost (the lost time was not the policy's).
        num_completions: completions in the session's log (answered model calls).
        num_unrecovered_backend_errors: failed calls of the backend kind no completion
            made good (:func:`rolloutd.proxy.sessions.state.unrecovered_errors`).
        first_unrecovered_error: the first of them, in words.
        call_waiting_at_deadline: a call was waiting on the backend when the run budget
            ran out.
        backend_verdict: the gateway's verdict that stopped the harness: its model calls
            stood unanswered for ``backend_dead_after_s`` (None: not stopped for that).
        refused_call: the last call the gateway refused for the task's or the policy's
            reasons (413, a conversation over the context, a concurrency bound:
            :func:`rolloutd.fault.call_fault` is ``task``), in words; None: none.
        limit_reached: the runtime's ceiling the run reached, naming the limit (the sandbox
            stopped the harness then); None: none.
    """

    cancelled: bool = False
    failed_phase: str | None = None
    error: str | None = None
    error_type: str | None = None
    non_retryable: bool = False
    timed_out: bool = False
    host_lost: bool = False
    no_sandbox_worker: bool = False
    harness_type: str = "shell"
    harness_ran: bool = False
    harness_exit: int | None = None
    signal_sent: int | None = None
    run_budget_shortened: bool = False
    num_completions: int = 0
    num_unrecovered_backend_errors: int = 0
    first_unrecovered_error: str | None = None
    call_waiting_at_deadline: bool = False
    backend_verdict: str | None = None
    refused_call: str | None = None
    limit_reached: str | None = None


#: the reward of a session whose run reached a ceiling after an answered model call
LIMIT_REWARD = 0.0


def cause_text(e: BaseException) -> str:
    """An error in words: the innermost cause's message (an activity's own error under
    Temporal's ``ActivityError``), or its type's name when it has none."""
    while e.__cause__ is not None:
        e = e.__cause__
    return str(e) or type(e).__name__


#: signal names by number, read when the module is imported: Temporal's workflow sandbox
#: forbids every use of the ``signal`` module while a workflow runs (temporalio's sandbox
#: restrictions: ``signal`` is ``all_uses_runtime``)
SIGNAL_NAMES = {int(number): number.name for number in signal.Signals}


def _signal_name(number: int) -> str:
    return SIGNAL_NAMES.get(number, f"signal {number}")


def classify(facts: SessionFacts) -> FailureCause | None:
    """The failure cause of a session, or None when it ran to its end.

    Rules, first match wins (docs/failures.md gives them with their reasons):

    1. ``cancelled``: the session was cancelled.
    2. ``sandbox``: no sandbox worker polled, the runtime could not be provisioned, its host
       was lost after the last attempt, or the runtime failed under the harness or while
       collecting (not a harness preparation error).
       A ceiling reached in the run (processes, memory, disk, ``/tmp``): ``harness``, not
       retryable, naming the limit; the policy's (``policy_accountable``, reward forced to
       :data:`LIMIT_REWARD`) when the model answered at least one call. It comes before
       every rule but a lost host: the policy can reach a ceiling on purpose (and then make
       collection fail, a full disk), so it never earns "no reward" and never a replacement.
    3. ``backend``: a failed call of the backend kind stood unrecovered, or the gateway's
       verdict stopped the harness (its calls stood unanswered for ``backend_dead_after_s``);
       this wins over the harness's exit and over a run timeout (the harness failed because
       the model did not answer).
    4. ``timeout`` in the run phase: the policy's (``policy_accountable``) unless a call was
       waiting on the backend at the deadline or the budget was shortened by a lost attempt;
       a run timeout with no answered model call is never the policy's: ``harness`` (the
       harness hung before the model ever answered).
    5. ``harness``: its preparation failed, it exited 126/127, it was killed by a signal the
       session did not send, or it made no answered model call at all (which covers a
       non-zero exit before any model call; a ``shell`` script that exits 0 without one is
       scored: the task scripted it). A non-zero exit after answered calls is the policy's
       outcome and is scored. When the gateway refused a call for the task's reasons and
       no call was answered, the cause names the refusal and is not retryable (a
       replacement would be refused again).
    6. ``timeout`` of any other phase; ``evaluator`` for the evaluation runtime.

    Args:
        facts: what the session recorded.

    Returns:
        The cause, or None (the session is scored as usual).
    """
    if facts.cancelled:
        return FailureCause(kind="cancelled", message="cancelled", retryable=False)
    rules = (_ceiling_cause, _sandbox_cause, _backend_cause, _run_timeout_cause, _harness_cause)
    for rule in rules:
        if (cause := rule(facts)) is not None:
            return cause
    return _phase_cause(facts)


def _sandbox_cause(facts: SessionFacts) -> FailureCause | None:
    """Rule 2: no sandbox worker, a lost host, or a runtime that failed under the harness or
    while provisioning or collecting (a timeout there is that phase's)."""
    phase = facts.failed_phase
    error = facts.error or "failed"
    if facts.no_sandbox_worker:
        return FailureCause(kind="sandbox", message=error, phase="provision")
    if facts.host_lost:
        return FailureCause(kind="sandbox", message=error, phase=phase or "run")
    if refusal_fault(facts.error_type) is Fault.TASK:  # the task's, not the sandbox's
        return FailureCause(kind="refused", message=error, phase=phase, retryable=False)
    if phase in ("provision", "collect") or (
        phase == "run"
        and not facts.timed_out
        and not facts.harness_ran
        and facts.error_type not in HARNESS_ERROR_TYPES
    ):
        if facts.timed_out:
            return FailureCause(kind="timeout", message=error, phase=phase)
        return FailureCause(
            kind="sandbox", message=error, phase=phase, retryable=not facts.non_retryable
        )
    return None


def _ceiling_cause(facts: SessionFacts) -> FailureCause | None:
    """Rule 2, a ceiling: the run reached a limit of its runtime (whatever collection did
    next, unless the host was lost). After an answered call the
    policy's (reward forced to :data:`LIMIT_REWARD`); before any, ``harness`` with no reward;
    never retryable either way (a replacement would reach it again)."""
    if not (facts.harness_ran and facts.limit_reached) or facts.host_lost:
        return None
    if facts.num_completions == 0:
        return FailureCause(
            kind="harness",
            phase="run",
            retryable=False,
            message=f"the harness reached a ceiling before any answered model call: "
            f"{facts.limit_reached}",
        )
    return FailureCause(
        kind="harness",
        phase="run",
        retryable=False,
        policy_accountable=True,
        message=f"the run reached a ceiling: {facts.limit_reached}",
    )


def _backend_cause(facts: SessionFacts) -> FailureCause | None:
    """Rule 3: the gateway's verdict, or failed backend calls no completion made good."""
    if facts.backend_verdict and not facts.num_unrecovered_backend_errors:
        return FailureCause(kind="backend", phase="run", message=facts.backend_verdict)
    if facts.num_unrecovered_backend_errors:
        first = f"; first: {facts.first_unrecovered_error}" if facts.first_unrecovered_error else ""
        return FailureCause(
            kind="backend",
            phase="run",
            message=f"{facts.num_unrecovered_backend_errors} model call(s) got no usable answer "
            f"and were not recovered{first}",
        )
    return None


def _run_timeout_cause(facts: SessionFacts) -> FailureCause | None:
    """Rule 4: a run-phase timeout, the policy's unless the budget was shortened by a lost
    attempt or a call was waiting on the backend at the deadline."""
    if not (facts.failed_phase == "run" and facts.timed_out):
        return None
    error = facts.error or "failed"
    if facts.run_budget_shortened:
        return FailureCause(
            kind="timeout",
            phase="run",
            message=f"{error} (the budget was shortened by a lost earlier attempt)",
        )
    if facts.call_waiting_at_deadline:
        return FailureCause(
            kind="timeout",
            phase="run",
            message=f"{error} while a model call was waiting on the backend",
        )
    if facts.num_completions == 0:
        # the model never answered: nothing of the policy's was measured
        return _no_answered_call(facts, f"before its run budget ran out ({error})")
    return FailureCause(
        kind="timeout", phase="run", message=error, retryable=False, policy_accountable=True
    )


def _harness_cause(facts: SessionFacts) -> FailureCause | None:
    """Rule 5: the harness could not be prepared or start, was killed by a signal the session
    did not send, or made no answered model call (a scripted ``shell`` run that exits 0
    without one aside)."""
    if facts.failed_phase == "run" and not facts.harness_ran:
        return FailureCause(
            kind="harness",
            phase="run",
            message=facts.error or "failed",
            retryable=not facts.non_retryable,
        )
    if not facts.harness_ran:
        return None
    code = facts.harness_exit
    if code in CANNOT_START_EXIT_CODES:
        what = "not executable" if code == 126 else "not found"
        return FailureCause(
            kind="harness",
            phase="run",
            retryable=False,
            message=f"the harness could not start (exit {code}: {what})",
        )
    if code is not None and code < 0 and -code != facts.signal_sent:
        return FailureCause(
            kind="harness",
            phase="run",
            message=f"the harness was killed by {_signal_name(-code)}, "
            "which the session did not send",
        )
    if facts.num_completions == 0 and (
        code != 0 or facts.harness_type not in SCRIPTED_HARNESSES or facts.refused_call
    ):
        return _no_answered_call(facts, f"(exit {code})")
    return None


def _no_answered_call(facts: SessionFacts, how: str) -> FailureCause:
    """``harness``: the harness made no answered model call; when the gateway refused a
    call for the task's reasons the cause names it and is final (never replaced)."""
    if facts.refused_call:
        return FailureCause(
            kind="harness",
            phase="run",
            retryable=False,
            message=f"the harness made no answered model call {how}: the gateway refused "
            f"its call ({facts.refused_call})",
        )
    return FailureCause(
        kind="harness", phase="run", message=f"the harness made no answered model call {how}"
    )


def _phase_cause(facts: SessionFacts) -> FailureCause | None:
    """Rule 6: a timeout of any other phase; ``evaluator`` for the evaluation runtime;
    ``sandbox`` for another failed phase; None when no phase failed."""
    phase = facts.failed_phase
    if phase is None:
        return None
    error = facts.error or "failed"
    if facts.timed_out:
        return FailureCause(kind="timeout", message=error, phase=phase)
    if phase.startswith("eval"):
        return FailureCause(
            kind="evaluator", message=error, phase=phase, retryable=not facts.non_retryable
        )
    return FailureCause(
        kind="sandbox", message=error, phase=phase, retryable=not facts.non_retryable
    )


Scoring = Literal["evaluate", "force", "skip"]


def scoring(
    failure: FailureCause | None, timeout_reward: Literal["evaluate"] | float | None
) -> tuple[Scoring, float | None]:
    """Whether a session is scored, and how.

    Args:
        failure: its cause (:func:`classify`).
        timeout_reward: the task's ``timeout_reward``.

    Returns:
        ``("evaluate", None)``: run the evaluator (no failure, or a policy-accountable
        run timeout with ``timeout_reward == "evaluate"``); ``("force", r)``: the reward
        is ``r`` (a number ``timeout_reward``, or :data:`LIMIT_REWARD` for a ceiling the
        policy reached); ``("skip", None)``: not scored, ``reward = None``.
    """
    if failure is None:
        return "evaluate", None
    if failure.kind == "harness" and failure.policy_accountable:
        return "force", LIMIT_REWARD
    if failure.kind == "timeout" and failure.policy_accountable:
        if timeout_reward == "evaluate":
            return "evaluate", None
        if timeout_reward is not None:
            return "force", float(timeout_reward)
    return "skip", None
