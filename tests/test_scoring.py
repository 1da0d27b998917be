"""The scored sessions of a group: one rule for the task's stats, the buffer's DAPO filter and
GRPO; failure causes, including results written before causes existed."""

from __future__ import annotations

import math

import pytest

from rolloutd.scoring import (
    failure_counts,
    failure_of,
    is_fleet_down,
    is_replaceable,
    is_zero_variance,
    pass_at_k,
    pass_rates,
    scored_rewards,
)
from rolloutd.trainer_client.training.grpo import dapo_filter, group_rewards
from rolloutd.types import FailureCause, GroupRef, SessionResult, SessionStatus, TaskResult
from rolloutd.workflows.buffer.workflow import _zero_variance
from rolloutd.workflows.task import summarize

BACKEND = FailureCause(kind="backend", message="502 BackendError", phase="run")
RUN_TIMEOUT = FailureCause(
    kind="timeout",
    message="run phase exceeded 5 s",
    phase="run",
    retryable=False,
    policy_accountable=True,
)
FLEET_DOWN = FailureCause(
    kind="sandbox",
    message="no sandbox worker is polling task queue rolloutd-sandbox (checked for 60 s)",
    phase="provision",
)


def session(
    index: int,
    reward: float | None,
    *,
    status: SessionStatus = SessionStatus.COMPLETED,
    failure: FailureCause | None = None,
) -> SessionResult:
    return SessionResult(
        session_id=f"t/{index}",
        task_id="t",
        sample_index=index,
        status=status,
        reward=reward,
        failure=failure,
    )


def test_only_scored_sessions_count_everywhere() -> None:
    # a backend failure that an older evaluator still scored 1.0 must not count; a run
    # timeout the policy owns does; a legacy failed session (no cause) scored 0.0 does not
    sessions = [
        session(0, 0.0),
        session(1, 1.0, status=SessionStatus.FAILED, failure=BACKEND),
        session(2, 1.0, status=SessionStatus.TIMEOUT, failure=RUN_TIMEOUT),
        session(3, 0.0, status=SessionStatus.FAILED),
    ]
    group = summarize("t", sessions, num_samples=4)
    assert scored_rewards(group) == group_rewards(group) == [0.0, 1.0]
    assert (group.num_scored, group.incomplete, group.mean_reward) == (2, True, 0.5)
    assert group.num_failed_by_kind == {"backend": 1, "sandbox": 1, "timeout": 1}
    assert not buffer_drops(group) and dapo_filter([group]) == [group]
    assert not is_zero_variance(group)
    # zero-filling the failures would have made this group [1, 0, 0]: informative; it is not
    solved_but_failed = summarize(
        "t", [session(0, 1.0), session(1, None, failure=BACKEND), session(2, 1.0)]
    )
    assert buffer_drops(solved_but_failed) and dapo_filter([solved_but_failed]) == []
    assert solved_but_failed.mean_reward == 1.0 and solved_but_failed.reward_std == 0.0


def buffer_drops(group: TaskResult) -> bool:
    """Whether the buffer workflow drops the group as zero-variance, given the reference the
    task workflow signals it (rewards: the scored sessions')."""
    return _zero_variance(GroupRef.of(group, "", scored_rewards(group)))


def test_zero_variance_is_one_rule_for_rewards_and_groups() -> None:
    assert is_zero_variance([]) and is_zero_variance([1.0]) and is_zero_variance([0.0, 0.0])
    assert not is_zero_variance([0.0, 1.0, 1.0]) and not is_zero_variance([0.5, 0.5 + 1e-9])
    with pytest.raises(ValueError, match="reward 0 is nan"):
        is_zero_variance([math.nan, 1.0])


def test_failure_counts_by_kind_with_or_without_the_sessions_that_ran_to_their_end() -> None:
    sessions = [
        session(0, 1.0),
        session(1, None, status=SessionStatus.FAILED, failure=BACKEND),
        session(2, 0.0, status=SessionStatus.TIMEOUT, failure=RUN_TIMEOUT),
        session(3, None, status=SessionStatus.FAILED),  # a result from before causes existed
        session(4, 0.0),
    ]
    assert failure_counts(sessions) == {"backend": 1, "sandbox": 1, "timeout": 1}
    assert failure_counts(sessions, count_none=True) == {
        "backend": 1,
        "none": 2,
        "sandbox": 1,
        "timeout": 1,
    }
    assert list(failure_counts(sessions, count_none=True)) == sorted(
        ["backend", "none", "sandbox", "timeout"]
    )


def test_failure_of_reads_legacy_statuses() -> None:
    assert failure_of(session(0, 1.0)) is None
    assert failure_of(session(0, None, status=SessionStatus.CANCELLED)).kind == "cancelled"
    legacy_failed = failure_of(session(0, None, status=SessionStatus.FAILED))
    assert (legacy_failed.kind, legacy_failed.retryable) == ("sandbox", True)
    assert failure_of(session(0, 0.0, status=SessionStatus.TIMEOUT)).phase == "run"
    assert failure_of(session(0, None, status=SessionStatus.TIMEOUT)).phase is None


def test_what_is_replaced_and_what_waits_for_the_fleet() -> None:
    assert is_replaceable(session(0, None, status=SessionStatus.FAILED, failure=BACKEND))
    assert not is_replaceable(session(0, 0.0))
    assert not is_replaceable(session(0, 1.0, status=SessionStatus.TIMEOUT, failure=RUN_TIMEOUT))
    assert not is_replaceable(session(0, None, status=SessionStatus.CANCELLED))
    bad_image = FailureCause(kind="sandbox", message="prepare[0] exited 1", retryable=False)
    assert not is_replaceable(session(0, None, status=SessionStatus.FAILED, failure=bad_image))
    assert is_fleet_down(FLEET_DOWN) and not is_fleet_down(BACKEND)
    assert failure_counts([]) == {}


def test_a_group_records_its_policy_versions() -> None:
    a, b = session(0, 1.0), session(1, 0.0)
    a.stats.policy_versions, b.stats.policy_versions = [3], [3, 4]
    group = summarize("t", [b, a], num_samples=2)
    assert group.policy_versions == [3, 4] and not group.incomplete
    assert TaskResult.model_validate(group.model_dump()).policy_versions == [3, 4]


def test_pass_rates_count_scored_samples_only() -> None:
    """pass@1 and pass@k (Chen et al. 2021, eq. 1) over scored samples: an infrastructure
    failure is left out, never a fail; a row with no scored sample is a failed row."""
    rows = [
        [session(0, 1.0), session(1, 0.0), session(2, 1.0), session(3, 0.0)],
        [session(0, 0.0), session(1, None, failure=BACKEND), session(2, 0.0), session(3, 1.0)],
        [session(0, None, failure=BACKEND), session(1, None, failure=BACKEND)],
    ]
    rates = pass_rates(rows, k=2)
    assert rates.num_rows_failed == 1 and rates.num_passing == 3
    assert rates.pass_at_1 == pytest.approx((2 / 4 + 1 / 3) / 2)
    # 1 - C(n-c, k)/C(n, k): 1 - 1/6 for 2 of 4; 1 - 1/3 for 1 of 3
    assert rates.pass_at_k == pytest.approx(((1 - 1 / 6) + (1 - 1 / 3)) / 2)
    assert pass_at_k(4, 2, 2) == pytest.approx(5 / 6) and pass_at_k(3, 3, 2) == 1.0
    assert pass_rates(rows, k=2, pass_reward=2.0).pass_at_1 == 0.0
