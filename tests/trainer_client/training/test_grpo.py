"""GRPO advantages, DAPO zero-variance filtering and per-session trace weights."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from rolloutd.trainer_client.training.grpo import (
    dapo_filter,
    group_advantages,
    group_rewards,
    is_zero_variance,
    trace_weights,
)
from rolloutd.types import SessionResult, SessionStatus, TaskResult, Trace

finite_rewards = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)
groups = st.lists(finite_rewards, min_size=0, max_size=64)


@given(st.lists(finite_rewards, min_size=2, max_size=64))
def test_advantages_have_mean_zero_and_unit_sample_std(rewards: list[float]) -> None:
    assume(statistics.stdev(rewards) > 1e-2)  # eps=1e-6 then shrinks the std by < 1e-4
    advantages = group_advantages(rewards)
    assert len(advantages) == len(rewards)
    assert abs(statistics.fmean(advantages)) < 1e-9
    assert statistics.stdev(advantages) == pytest.approx(1.0, abs=1e-3)


@given(groups)
def test_advantages_are_always_finite(rewards: list[float]) -> None:
    for normalize_std in (True, False):
        assert all(math.isfinite(a) for a in group_advantages(rewards, normalize_std=normalize_std))


@given(st.lists(finite_rewards, min_size=2, max_size=32))
def test_advantages_preserve_the_reward_order(rewards: list[float]) -> None:
    # weakly: rewards 1e-16 apart may round to one advantage after centring
    advantages = group_advantages(rewards)
    for i in range(len(rewards)):
        for j in range(len(rewards)):
            if rewards[i] > rewards[j]:
                assert advantages[i] >= advantages[j]
            if rewards[i] == rewards[j]:
                assert advantages[i] == advantages[j]
    best, worst = rewards.index(max(rewards)), rewards.index(min(rewards))
    if rewards[best] - rewards[worst] > 1e-6:
        assert advantages[best] > 0 > advantages[worst]


@given(finite_rewards, st.integers(min_value=0, max_value=64))
def test_equal_rewards_give_all_zero_advantages(reward: float, size: int) -> None:
    assert group_advantages([reward] * size) == [0.0] * size
    assert group_advantages([reward] * size, normalize_std=False) == [0.0] * size


def test_equal_rewards_that_do_not_average_exactly_still_give_zeros() -> None:
    # mean([0.1] * 3) is 0.10000000000000002: an eps-only guard would give about 1e-11
    assert group_advantages([0.1, 0.1, 0.1]) == [0.0, 0.0, 0.0]


def test_advantages_match_verl_with_the_unbiased_std() -> None:
    torch = pytest.importorskip("torch")
    rewards = [1.0, 0.0, 0.0, 1.0, 1.0, 0.5]
    scores = torch.tensor(rewards, dtype=torch.float64)
    # verl core_algos.compute_grpo_outcome_advantage: torch.std is the n-1 estimator
    expected = (scores - scores.mean()) / (torch.std(scores) + 1e-6)
    assert group_advantages(rewards) == pytest.approx(expected.tolist(), abs=1e-12)
    # two samples {0, 1}: unbiased std is 1/sqrt(2), population std would be 1/2
    assert group_advantages([0.0, 1.0], eps=1e-12) == pytest.approx(
        [-1 / math.sqrt(2), 1 / math.sqrt(2)]
    )


def test_unnormalised_advantages_are_centred_rewards() -> None:
    assert group_advantages([1.0, 0.0, 0.0, 3.0], normalize_std=False) == [0.0, -1.0, -1.0, 2.0]


def test_a_singleton_group_gets_zero_advantage() -> None:
    assert group_advantages([0.7]) == [0.0]
    assert group_advantages([]) == []


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_rewards_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="reward 1"):
        group_advantages([0.0, bad])
    with pytest.raises(ValueError, match="finite"):
        is_zero_variance([bad, 1.0])


def test_eps_must_be_positive() -> None:
    with pytest.raises(ValueError, match="eps"):
        group_advantages([0.0, 1.0], eps=0.0)


def test_zero_variance() -> None:
    assert is_zero_variance([])
    assert is_zero_variance([1.0])
    assert is_zero_variance([0.0, 0.0, 0.0])
    assert is_zero_variance([1.0, 1.0])
    assert not is_zero_variance([0.0, 1.0, 1.0])
    assert not is_zero_variance([0.5, 0.5 + 1e-9])


def _task(task_id: str, rewards: list[float | None]) -> TaskResult:
    return TaskResult(
        task_id=task_id,
        sessions=[
            SessionResult(
                session_id=f"{task_id}/{i}",
                task_id=task_id,
                sample_index=i,
                status=SessionStatus.COMPLETED if r is not None else SessionStatus.FAILED,
                reward=r,
            )
            for i, r in enumerate(rewards)
        ],
    )


def test_dapo_filter_drops_all_equal_reward_lists_and_keeps_order() -> None:
    mixed_a, all_one, mixed_b, all_zero, single = (
        [1.0, 0.0],
        [1.0, 1.0],
        [0.0, 0.2, 0.0],
        [0.0, 0.0, 0.0],
        [1.0],
    )
    kept = dapo_filter([mixed_a, all_one, mixed_b, all_zero, single])
    assert kept == [mixed_a, mixed_b]
    assert kept[0] is mixed_a


def test_dapo_filter_on_task_results_ignores_unscored_sessions() -> None:
    solved = _task("solved", [1.0, 1.0, 1.0])
    mixed = _task("mixed", [1.0, 0.0, None])
    solved_but_one_failed = _task("unscored-failure", [1.0, None, 1.0])
    kept = dapo_filter([solved, mixed, solved_but_one_failed])
    assert [t.task_id for t in kept] == ["mixed"]
    assert group_rewards(mixed) == [1.0, 0.0]


@given(st.lists(st.lists(finite_rewards, max_size=8), max_size=8))
def test_dapo_filter_keeps_exactly_the_groups_with_nonzero_advantages(
    reward_groups: list[list[float]],
) -> None:
    kept = dapo_filter(reward_groups)
    assert kept == [g for g in reward_groups if any(a != 0 for a in group_advantages(g))]


def test_trace_weights_make_each_session_count_once() -> None:
    session_a = [Trace(trace_index=i, num_traces_in_session=3) for i in range(3)]
    session_b = [Trace(trace_index=0, num_traces_in_session=1)]
    weights = trace_weights([*session_a, *session_b])
    assert weights == pytest.approx([1 / 3, 1 / 3, 1 / 3, 1.0])
    assert sum(weights[:3]) == pytest.approx(1.0)
    assert trace_weights([]) == []
