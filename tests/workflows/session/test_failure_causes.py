"""The failure-cause rules (docs/failures.md) decided from recorded facts, which sessions are
scored, and how `rolloutd submit` reports and exits on them. Pure functions: no server."""

from __future__ import annotations

from typing import Any

import pytest

from rolloutd.cli.report import exit_code, failure_cell, what_went_wrong
from rolloutd.scoring import failure_counts
from rolloutd.types import FailureCause, SessionResult, SessionStatus, TaskResult
from rolloutd.workflows.session.failures import SessionFacts, classify, scoring


def ran(**fields: Any) -> SessionFacts:
    """Facts of a harness that ran (exit 0, three answered calls), with ``fields`` changed."""
    values: dict[str, Any] = {
        "harness_ran": True,
        "harness_exit": 0,
        "num_completions": 3,
        "harness_type": "qwen_code",
    }
    values.update(fields)
    return SessionFacts(**values)


def test_a_session_that_ran_to_its_end_has_no_failure_and_is_evaluated() -> None:
    assert classify(ran()) is None
    # a non-zero exit after answered calls is the policy's outcome
    assert classify(ran(harness_exit=1)) is None
    assert scoring(None, None) == ("evaluate", None)


@pytest.mark.parametrize(
    ("facts", "kind", "retryable"),
    [
        (ran(harness_exit=127), "harness", False),
        (ran(harness_exit=126), "harness", False),
        (ran(harness_exit=-11), "harness", True),  # SIGSEGV: not sent by the session
        (ran(num_completions=0), "harness", True),  # no model call at all
        (ran(harness_exit=2, num_completions=0, harness_type="shell"), "harness", True),
        (
            SessionFacts(
                failed_phase="run", error="bad", error_type="HarnessError", non_retryable=True
            ),
            "harness",
            False,
        ),  # its prepare step failed
        (
            SessionFacts(
                failed_phase="provision",
                error="no image",
                error_type="RuntimeStartError",
                non_retryable=True,
            ),
            "sandbox",
            False,
        ),
        (SessionFacts(failed_phase="provision", no_sandbox_worker=True), "sandbox", True),
        (SessionFacts(failed_phase="run", host_lost=True), "sandbox", True),
        (
            SessionFacts(
                failed_phase="run", error="exec server gone", error_type="ExecServerError"
            ),
            "sandbox",
            True,
        ),
        (ran(harness_exit=1, num_unrecovered_backend_errors=7), "backend", True),
        # stopped by the gateway's verdict (SIGTERM sent by the session; calls only waited)
        (
            ran(harness_exit=-15, signal_sent=15, backend_verdict="calls stood unanswered 61 s"),
            "backend",
            True,
        ),
        (SessionFacts(failed_phase="eval_check", error="x"), "evaluator", True),
        (SessionFacts(cancelled=True), "cancelled", False),
    ],
)
def test_each_kind_follows_its_rule(facts: SessionFacts, kind: str, retryable: bool) -> None:
    failure = classify(facts)
    assert failure is not None and (failure.kind, failure.retryable) == (kind, retryable)
    assert not failure.policy_accountable
    assert scoring(failure, "evaluate") == ("skip", None)


def test_a_scripted_shell_harness_that_exits_0_without_a_call_is_scored() -> None:
    assert classify(ran(num_completions=0, harness_type="shell")) is None


def test_a_run_timeout_with_no_answered_call_is_never_the_policys() -> None:
    """A harness that hangs before its first model call runs out its budget: the model
    never answered, so nothing of the policy's was measured: no reward, and the cause says
    the harness made no answered call (whatever the harness type)."""
    for harness_type in ("shell", "qwen_code"):
        hung = ran(
            num_completions=0,
            harness_type=harness_type,
            harness_exit=-15,
            signal_sent=15,
            failed_phase="run",
            timed_out=True,
            error="run phase exceeded 20 s",
        )
        failure = classify(hung)
        assert failure is not None
        assert (failure.kind, failure.phase, failure.policy_accountable) == (
            "harness",
            "run",
            False,
        )
        assert "no answered model call before its run budget ran out" in failure.message
        assert "run phase exceeded 20 s" in failure.message
        assert scoring(failure, "evaluate") == ("skip", None)
        assert scoring(failure, 0.0) == ("skip", None)


def test_a_call_the_gateway_refused_for_the_tasks_reasons_is_named_and_final() -> None:
    """The harness's only call was refused (413): no reward, the cause names the refusal,
    and no replacement is made (it would be refused again), even for a scripted shell
    harness that exits 0."""
    refusal = "413 RequestTooLargeError: the request body exceeds the limit of 10 bytes"
    for exit_code_, harness_type in ((1, "qwen_code"), (0, "shell")):
        failure = classify(
            ran(
                num_completions=0,
                harness_exit=exit_code_,
                harness_type=harness_type,
                refused_call=refusal,
            )
        )
        assert failure is not None and failure.kind == "harness"
        assert not failure.retryable and not failure.policy_accountable
        assert refusal in failure.message and "refused" in failure.message
        assert scoring(failure, "evaluate") == ("skip", None)
    # a refusal followed by answered calls is the policy's outcome: scored
    assert classify(ran(refused_call=refusal)) is None


def test_a_run_timeout_is_the_policys_only_while_the_model_kept_answering() -> None:
    timeout = ran(
        harness_exit=-15,
        signal_sent=15,
        failed_phase="run",
        timed_out=True,
        error="run phase exceeded 8 s",
    )
    mine = classify(timeout)
    assert mine is not None and (mine.kind, mine.phase, mine.policy_accountable) == (
        "timeout",
        "run",
        True,
    )
    assert scoring(mine, "evaluate") == ("evaluate", None)
    assert scoring(mine, 0.25) == ("force", 0.25)
    assert scoring(mine, None) == ("skip", None)
    for not_mine in (
        SessionFacts(**{**timeout.__dict__, "call_waiting_at_deadline": True}),
        SessionFacts(**{**timeout.__dict__, "run_budget_shortened": True}),
    ):
        failure = classify(not_mine)
        assert failure is not None and failure.kind == "timeout"
        assert not failure.policy_accountable
        assert scoring(failure, "evaluate") == ("skip", None)
    backend = classify(SessionFacts(**{**timeout.__dict__, "num_unrecovered_backend_errors": 1}))
    assert backend is not None and backend.kind == "backend"


LIMIT = "max_processes=1024 reached: the kernel refused 3 fork(s) (pids cgroup)"


def test_a_ceiling_reached_after_an_answered_call_is_the_policys_and_scores_0() -> None:
    """A ceiling is the operator's and the policy can reach it on purpose: never "no reward",
    never a replacement. It wins over the harness's exit, a failed backend call and a run
    timeout (the sandbox stopped the harness at the ceiling)."""
    for facts in (
        ran(limit_reached=LIMIT),
        ran(limit_reached=LIMIT, harness_exit=-15, signal_sent=15),
        ran(limit_reached=LIMIT, num_unrecovered_backend_errors=1),
        ran(limit_reached=LIMIT, failed_phase="run", timed_out=True),
        # a full disk can make collection fail next: still the policy's ceiling
        ran(limit_reached=LIMIT, failed_phase="collect", error="git diff failed"),
    ):
        failure = classify(facts)
        assert failure is not None and (failure.kind, failure.phase) == ("harness", "run")
        assert failure.policy_accountable and not failure.retryable
        assert LIMIT in failure.message
        assert scoring(failure, None) == ("force", 0.0)
        assert scoring(failure, "evaluate") == ("force", 0.0)
    # the control: the same run without the ceiling is evaluated
    assert scoring(classify(ran(harness_exit=-15, signal_sent=15)), None) == ("evaluate", None)


def test_a_ceiling_reached_before_any_answered_call_gets_no_reward_and_no_retry() -> None:
    for harness in ("qwen_code", "shell"):
        failure = classify(ran(limit_reached=LIMIT, num_completions=0, harness_type=harness))
        assert failure is not None and (failure.kind, failure.phase) == ("harness", "run")
        assert not failure.policy_accountable and not failure.retryable
        assert "before any answered model call" in failure.message and LIMIT in failure.message
        assert scoring(failure, 0.0) == ("skip", None)


def test_a_lost_host_still_wins_over_a_ceiling() -> None:
    failure = classify(ran(limit_reached=LIMIT, failed_phase="run", host_lost=True))
    assert failure is not None and failure.kind == "sandbox"


def result(index: int, failure: FailureCause | None = None, **fields: Any) -> SessionResult:
    values: dict[str, Any] = {
        "session_id": f"t/{index}",
        "task_id": "t",
        "sample_index": index,
        "status": SessionStatus.COMPLETED,
        "num_completions": 3,
        "failure": failure,
    }
    values.update(fields)
    return SessionResult(**values)


def test_submit_fails_on_an_infrastructure_cause_no_replacement_made_good() -> None:
    backend = FailureCause(kind="backend", phase="run", message="2 model call(s) got no answer")
    policy = FailureCause(
        kind="timeout",
        phase="run",
        message="run phase exceeded 8 s",
        retryable=False,
        policy_accountable=True,
    )
    replaced = [
        TaskResult(
            task_id="t",
            sessions=[
                result(0, backend, status=SessionStatus.FAILED),
                result(0),
                result(1, policy),
            ],
        )
    ]
    assert exit_code(replaced) == 0
    failures, notes = what_went_wrong(replaced)
    assert failures == [] and any("(replaced)" in n for n in notes)
    broken = [TaskResult(task_id="t", sessions=[result(0, backend), result(1)])]
    assert exit_code(broken) == 1
    assert what_went_wrong(broken)[0] == [
        "session t/0: backend in run: 2 model call(s) got no answer"
    ]
    # a call error the harness recovered from does not count
    assert exit_code([TaskResult(task_id="t", sessions=[result(0, num_call_errors=1)])]) == 0
    assert [failure_cell(s) for s in replaced[0].sessions] == [
        "backend/run",
        "-",
        "timeout/run (policy)",
    ]
    assert failure_counts(replaced[0].sessions, count_none=True) == {
        "backend": 1,
        "none": 1,
        "timeout": 1,
    }
