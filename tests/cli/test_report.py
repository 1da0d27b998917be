"""What `rolloutd submit` / `demo` report under their table, and when they exit non-zero:
unrecovered gateway/backend failures, failed sessions, tasks that never reached the model.
Recovered call errors and refused bad requests are reported, not failures."""

from __future__ import annotations

from typing import Any

from rolloutd.cli.report import call_errors_cell, exit_code, what_went_wrong
from rolloutd.types import SessionResult, SessionStatus, TaskResult


def session(index: int, **fields: Any) -> SessionResult:
    values: dict[str, Any] = {
        "session_id": f"t/{index}",
        "task_id": "t",
        "status": SessionStatus.COMPLETED,
        "num_completions": 3,
    }
    values.update(fields)
    return SessionResult(**values)


def test_recovered_call_errors_are_noted_and_do_not_fail_the_run() -> None:
    recovered = session(0, num_call_errors=2, last_call_error="502 BackendError: reset")
    refused = session(1, num_call_errors=1, last_call_error="400 ContextLengthError: long")
    results = [TaskResult(task_id="t", sessions=[recovered, refused])]
    failures, notes = what_went_wrong(results)
    assert failures == [] and exit_code(results) == 0
    assert notes == [
        "session t/0: 2 model call(s) failed, recovered or refused as bad "
        "requests; last: 502 BackendError: reset",
        "session t/1: 1 model call(s) failed, recovered or refused as bad "
        "requests; last: 400 ContextLengthError: long",
    ]
    assert call_errors_cell(recovered) == "2"


def test_unrecovered_5xx_failed_sessions_and_silent_tasks_fail_the_run() -> None:
    broken = session(
        0,
        num_completions=0,
        num_call_errors=2,
        num_unrecovered_call_errors=2,
        last_call_error="500 RolloutdError: internal error: AttributeError",
    )
    lost = session(
        1,
        num_completions=0,
        status=SessionStatus.FAILED,
        error="no sandbox worker is polling task queue rolloutd-sandbox (checked for 60 s)",
    )
    results = [TaskResult(task_id="t", sessions=[broken, lost])]
    failures, _ = what_went_wrong(results)
    assert exit_code(results) == 1
    assert failures == [
        "session t/0: 2 model call(s) failed, 2 with a gateway/backend error (5xx) the "
        "harness never recovered from; last: 500 RolloutdError: internal error: AttributeError",
        "session t/1 failed: no sandbox worker is polling task queue rolloutd-sandbox "
        "(checked for 60 s)",
        "task t: no session recorded a completion (no model call was answered)",
    ]
    assert call_errors_cell(broken) == "2 (2 unrecovered)"


def test_one_session_with_completions_keeps_a_task_from_failing() -> None:
    results = [TaskResult(task_id="t", sessions=[session(0, num_completions=0), session(1)])]
    assert exit_code(results) == 0


def test_a_scripted_harness_scored_without_a_model_call_does_not_fail_the_run() -> None:
    """An oracle or a do-nothing shell command makes no model call by design: sessions scored
    (1.00, 0.00) with 0 completions pass; the same sessions unscored (the control) fail the
    task for never reaching the model."""
    oracle = session(0, num_completions=0, reward=1.0)
    nop = session(1, num_completions=0, reward=0.0)
    assert what_went_wrong([TaskResult(task_id="t", sessions=[oracle, nop])]) == ([], [])
    unscored = [session(i, num_completions=0) for i in range(2)]
    results = [TaskResult(task_id="t", sessions=unscored)]
    assert exit_code(results) == 1
    assert what_went_wrong(results)[0] == [
        "task t: no session recorded a completion (no model call was answered)"
    ]


def test_a_cancelled_task_without_completions_is_not_a_silent_one() -> None:
    """Cancelled before any model call (``rolloutd tasks cancel``): its sessions say so; it
    is not reported as a task that never reached the model."""
    cancelled = session(0, num_completions=0, status=SessionStatus.CANCELLED)
    results = [TaskResult(task_id="t", sessions=[cancelled])]
    assert what_went_wrong(results)[0] == [] and exit_code(results) == 0
