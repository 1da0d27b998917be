"""Failure causes on the real stack (Temporal, llama-server, the in-process fleets, the shell
harness): a harness that cannot start, an evaluator that raises, a failing check on a healthy
stack, a run timeout while the model answers, a backend that answers 5xx with and without
the harness recovering (docs/failures.md)."""

from __future__ import annotations

import uuid

import pytest

from rolloutd.cli.report import exit_code
from rolloutd.store import BlobStore
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import SessionStatus
from tests.support.shell_calls import call

pytestmark = [pytest.mark.temporal, pytest.mark.engine]


def task(name: str, command: str, **overrides: object) -> dict:
    """A shell task on the local runtime (no isolation needed here: cheap on 2 cores)."""
    value: dict = {
        "task_id": f"{name}-{uuid.uuid4().hex[:6]}",
        "instruction": "test",
        "harness": {"type": "shell", "command": command},
        "runtime": {"type": "local"},
        "evaluator": {"type": "test_on_output", "command": "test -s reply.json"},
        "sampling": {"max_tokens": 8, "policy": "override"},
        "phases": {"run_s": 60},
        "timeout_s": 180,
    }
    value.update(overrides)
    return value


async def run_all(fleets, *tasks: dict) -> list:
    client = RolloutClient(fleets.client, BlobStore(fleets.store_url))
    handles = [await client.submit(t, check_capabilities=False) for t in tasks]
    return [await h.result() for h in handles]


async def test_infrastructure_and_evaluator_failures_get_no_reward(fleets):
    """A missing script (exit 127) gives ``harness``; an evaluator that raises gives
    ``evaluator`` and keeps the trajectory; a failing check on a healthy stack gives 0.0; a
    prepare step that fails gives ``sandbox``, not retryable."""
    store = BlobStore(fleets.store_url)
    missing, raising, failing, unprepared = await run_all(
        fleets,
        task("missing", "./no-such-script.sh"),
        task(
            "raising",
            call("hi"),
            evaluator={"type": "tests_raising"},
        ),
        task(
            "failing",
            call("hi"),
            evaluator={"type": "test_on_output", "command": "test -f no-such-file"},
        ),
        task(
            "unprepared",
            call("hi"),
            runtime={"type": "local", "prepare": [{"type": "exec", "command": "exit 3"}]},
        ),
    )
    [s] = missing.sessions
    assert s.failure is not None and s.failure.kind == "harness", s
    assert not s.failure.retryable and s.reward is None and s.status == SessionStatus.FAILED
    assert "evaluate" not in {p.phase for p in s.phases}  # not evaluated at all
    [s] = raising.sessions
    assert s.failure is not None and s.failure.kind == "evaluator", s
    assert "ZeroDivisionError" in s.failure.message and s.reward is None
    assert s.trajectory_ref is not None and s.num_completions == 1
    trajectory = RolloutClient(fleets.client, store).trajectory(s)
    assert trajectory.failure is not None and trajectory.failure.kind == "evaluator"
    assert len(trajectory.traces) == 1
    [s] = failing.sessions
    assert s.failure is None and s.reward == 0.0 and s.status == SessionStatus.COMPLETED
    [s] = unprepared.sessions  # a prepare step that fails would fail again
    assert s.failure is not None and (s.failure.kind, s.failure.phase) == ("sandbox", "provision")
    assert not s.failure.retryable and s.reward is None
    assert exit_code([missing]) == 1 and exit_code([raising]) == 1
    assert exit_code([failing]) == 0


async def test_a_run_timeout_while_the_model_answers_is_the_policys(fleets):
    """The run budget runs out after an answered call, nothing waiting on the backend: the
    session is evaluated (timeout_reward "evaluate"), or takes the task's number, or is left
    unscored with timeout_reward null."""
    # the budget leaves the call time to be answered on 2 busy cores
    command, phases = f"{call('hi')} && sleep 600", {"run_s": 20}
    evaluated, forced, unscored = await run_all(
        fleets,
        task("tmo-eval", command, phases=phases),
        task("tmo-num", command, phases=phases, timeout_reward=0.25),
        task("tmo-null", command, phases=phases, timeout_reward=None),
    )
    for group in (evaluated, forced, unscored):
        [s] = group.sessions
        assert s.status == SessionStatus.TIMEOUT and s.failure is not None, s
        assert (s.failure.kind, s.failure.phase) == ("timeout", "run")
        assert s.failure.policy_accountable and not s.failure.retryable
    assert [g.sessions[0].reward for g in (evaluated, forced, unscored)] == [1.0, 0.25, None]
    assert exit_code([evaluated, forced, unscored]) == 0


async def test_a_5xx_counts_as_backend_unless_the_harness_recovered(fleets):
    """The backend answers 500 to two calls: unrecovered gives ``backend``, reward None and
    a failing submit; a harness that retried the same request after one 500 recovered: no
    failure, scored."""
    fleets.engine_tee.fail_next_posts = 2
    try:
        [broken] = await run_all(
            fleets, task("b5xx", f"{call('one')}; {call('two')}; true", max_replacements=0)
        )
    finally:
        fleets.engine_tee.fail_next_posts = 0
    [s] = broken.sessions
    assert s.failure is not None and s.failure.kind == "backend", s
    assert s.reward is None and s.num_unrecovered_call_errors == 2
    assert "request" in s.failure.message
    assert exit_code([broken]) == 1

    fleets.engine_tee.fail_next_posts = 1
    try:
        [recovered] = await run_all(fleets, task("r5xx", f"{call('one')} || {call('one')}"))
    finally:
        fleets.engine_tee.fail_next_posts = 0
    [s] = recovered.sessions
    assert s.num_call_errors == 1 and s.num_unrecovered_call_errors == 0, s
    assert s.failure is None and s.reward == 1.0
    assert exit_code([recovered]) == 0
