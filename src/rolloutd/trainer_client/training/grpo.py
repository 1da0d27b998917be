"""GRPO and DAPO helpers for the trainer side: group advantages, zero-variance filtering and
per-session trace weights. The zero-variance rule itself is
:func:`rolloutd.scoring.is_zero_variance` (the buffer workflow drops by it too), re-exported
here.

All functions are pure and work on plain Python floats, so a trainer can use them before it
builds tensors (for example to drop a group before :func:`~rolloutd.trainer_client.training.exports.
to_verl_batch`).

Sources:

- GRPO, group-relative advantages: Shao et al., *DeepSeekMath*, arXiv 2402.03300, section 4.1.2
  (outcome supervision: ``A_i = (r_i - mean(r)) / std(r)``, broadcast to every token of output i).
- The std estimator and ``eps``: verl ``verl/trainer/ppo/core_algos.py``,
  ``compute_grpo_outcome_advantage`` (``torch.std``, which is the unbiased, n-1 estimator, and
  ``(score - mean) / (std + epsilon)`` with ``epsilon=1e-6``); ``norm_adv_by_std_in_grpo=False``
  gives ``score - mean`` (Dr. GRPO, Liu et al., arXiv 2503.20783).
- Dynamic sampling: Yu et al., *DAPO*, arXiv 2503.14476, section 3.2 (drop the prompts whose
  group is all correct or all wrong: their advantages are all zero, so they carry no gradient).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeVar, overload

from rolloutd.scoring import is_zero_variance, scored_rewards
from rolloutd.types import TaskResult, Trace

__all__ = [
    "dapo_filter",
    "group_advantages",
    "group_rewards",
    "is_zero_variance",  # the rule itself is rolloutd.scoring's
    "trace_weights",
]

_Group = TypeVar("_Group", TaskResult, list[float])


def group_advantages(
    rewards: Sequence[float], *, normalize_std: bool = True, eps: float = 1e-6
) -> list[float]:
    """GRPO outcome advantages of one group: ``(r_i - mean(r)) / (std(r) + eps)``.

    DeepSeekMath (arXiv 2402.03300, section 4.1.2) normalises each session's reward by its
    group's mean and standard deviation; the trainer broadcasts ``A_i`` to every trainable token
    of session i. The std is the **unbiased** sample std (divisor ``G - 1``), as verl's
    ``compute_grpo_outcome_advantage`` computes it with ``torch.std``; note that
    :attr:`TaskResult.reward_std` is the population std (divisor ``G``), a group statistic for
    display, not this normaliser.

    Guards: a zero-variance group (all rewards equal, or ``G < 2``, see
    :func:`is_zero_variance`) gives exactly ``0.0`` for every session, never NaN or inf; with
    any spread, ``eps`` keeps the quotient finite. The result is always finite.

    Args:
        rewards: list[float], length G: one outcome reward per session of the group.
        normalize_std: divide by ``std + eps`` (GRPO); False gives ``r_i - mean(r)`` only
            (Dr. GRPO, arXiv 2503.20783; verl's ``norm_adv_by_std_in_grpo=False``).
        eps: added to the std, unitless (reward units); verl's default ``1e-6``. Must be > 0.

    Returns:
        list[float], length G, aligned with ``rewards``. On a non-degenerate group the
        advantages have mean 0 and unbiased std ``std / (std + eps)``, i.e. about 1.

    Raises:
        ValueError: a reward is NaN or infinite, or ``eps <= 0``.
    """
    if not eps > 0:
        raise ValueError(f"eps must be > 0, got {eps}")
    values = [float(r) for r in rewards]
    if is_zero_variance(values):
        return [0.0] * len(values)
    num = len(values)
    mean = math.fsum(values) / num
    centred = [value - mean for value in values]
    if not normalize_std:
        return centred
    std = math.sqrt(math.fsum(c * c for c in centred) / (num - 1))
    return [c / (std + eps) for c in centred]


def group_rewards(group: TaskResult | Sequence[float]) -> list[float]:
    """The outcome rewards of a group, one per scored session, in session order.

    Args:
        group: a :class:`TaskResult` (its sessions' ``reward``), or the rewards themselves.

    Returns:
        list[float], length ≤ G: the scored sessions only (:func:`rolloutd.scoring.
        scored_rewards`, the rule the task's group stats and the buffer's DAPO filter use).
        A session that failed for infrastructure is left out even when an older evaluator
        gave it a reward: a reward measures the policy, never the infrastructure.
    """
    if isinstance(group, TaskResult):
        return scored_rewards(group)
    return [float(r) for r in group]


@overload
def dapo_filter(groups: Sequence[TaskResult]) -> list[TaskResult]: ...
@overload
def dapo_filter(groups: Sequence[list[float]]) -> list[list[float]]: ...


def dapo_filter(groups: Sequence[_Group]) -> list[_Group]:
    """DAPO dynamic sampling: keep only the groups whose rewards differ.

    DAPO (arXiv 2503.14476, section 3.2: the constraint ``0 < |{correct}| < G``) over-samples
    and drops the prompts whose outputs are all correct or all wrong; for any reward this is a
    group whose rewards are all equal (:func:`is_zero_variance`), whose GRPO advantages are all
    zero. The trainer keeps sampling until its batch is full of kept groups.

    Args:
        groups: list of :class:`TaskResult` (rewards from :func:`group_rewards`, unscored
            sessions left out) or list of reward lists, one per group.

    Returns:
        The kept groups, the same objects, in input order.

    Raises:
        ValueError: a reward is NaN or infinite.
    """
    return [group for group in groups if not is_zero_variance(group_rewards(group))]


def trace_weights(traces: Sequence[Trace]) -> list[float]:
    """Per-session normalisation weights: ``1 / num_traces_in_session`` for each trace.

    A session that produced k traces (for example a prefix-merging chain break, or the
    ``per_request`` builder) broadcasts its outcome reward to all k; weighting each trace's
    loss by ``1/k`` makes every session count once in the group, whatever its number of traces.

    Args:
        traces: list[Trace], length N, from any number of sessions; each carries
            ``num_traces_in_session`` (set by ``rolloutd.trajectory.assign_rewards``).

    Returns:
        list[float], length N, aligned with ``traces``; each in (0, 1]. The weights of one
        session's k traces sum to 1.
    """
    return [1.0 / trace.num_traces_in_session for trace in traces]
