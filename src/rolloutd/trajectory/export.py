"""Rewards on traces, process rewards per turn located in a trace's tokens, and the POLAR trace
export.

A session's outcome reward is broadcast to each of its traces, or the evaluator gives one
reward per trace; either way every trace carries ``num_traces_in_session`` so that a trainer can
normalise per session. POLAR (arXiv 2605.24220) saw reward hacking when per-request traces each
took the whole session reward: a session that made more calls weighed more.
"""

from __future__ import annotations

from typing import Any

from rolloutd.errors import BuilderError
from rolloutd.types import Trace


def assign_rewards(
    traces: list[Trace], reward: float | None, trace_rewards: list[float] | None
) -> None:
    """Set ``reward`` and ``num_traces_in_session`` on every trace of one session, in place.

    Args:
        traces: the session's traces.
        reward: the session's outcome reward, broadcast to every trace; or None.
        trace_rewards: one reward per trace, in trace order (length ``len(traces)``); or None.
            With neither, rewards stay None (an unscored session) and only the count is set.

    Raises:
        BuilderError: both are given, or ``trace_rewards`` has the wrong length.
    """
    if reward is not None and trace_rewards is not None:
        raise BuilderError("give an outcome reward or one reward per trace, not both")
    if trace_rewards is not None and len(trace_rewards) != len(traces):
        raise BuilderError(f"{len(trace_rewards)} trace rewards for {len(traces)} traces")
    for position, trace in enumerate(traces):
        trace.num_traces_in_session = max(1, len(traces))
        if trace_rewards is not None:
            trace.reward = float(trace_rewards[position])
        elif reward is not None:
            trace.reward = float(reward)


def turn_reward_positions(trace: Trace) -> list[tuple[int, float]]:
    """Where each scored turn's process reward sits in ``response_ids``: the last sampled token
    (``loss_mask`` 1) of the turn's completion, located by ``response_offsets`` (a turn ends
    where the next one's context starts), as PRIME and verl's process-reward managers place a
    step's reward on the step's last token.

    Args:
        trace: a built trace; ``turn_rewards`` aligned with ``completion_indices`` (empty, or
            None for a turn not scored: left out).

    Returns:
        ``(position, reward)`` per scored turn, positions ascending, each < ``len(response_ids)``.
    """
    out: list[tuple[int, float]] = []
    offsets = trace.response_offsets
    for k, reward in enumerate(trace.turn_rewards):
        if reward is None or k >= len(offsets):
            continue
        end = offsets[k + 1] if k + 1 < len(offsets) else len(trace.response_ids)
        position = end - 1
        while position > offsets[k] and not trace.loss_mask[position]:
            position -= 1
        if 0 <= position < len(trace.response_ids):
            out.append((position, float(reward)))
    return out


def per_token_turn_rewards(trace: Trace) -> list[float]:
    """The trace's process rewards expanded to its tokens: list[float], length
    ``len(response_ids)``, each scored turn's reward at its last sampled token
    (:func:`turn_reward_positions`), 0.0 elsewhere."""
    values = [0.0] * len(trace.response_ids)
    for position, reward in turn_reward_positions(trace):
        values[position] = reward
    return values


def to_polar_trace(trace: Trace) -> dict[str, Any]:
    """Export a trace in the shape of POLAR's paper (arXiv 2605.24220, appendix A.4).

    Args:
        trace: a built trace.

    Returns:
        A JSON-ready dict with exactly the keys ``prompt_ids``, ``response_ids``, ``loss_mask``,
        ``response_logprobs`` (lists, the last three of equal length), ``prompt_messages``,
        ``response_messages``, ``tools``, ``finish_reason``, ``reward`` and ``metadata``;
        rolloutd's provenance (completion indices, offsets, retries, drift, policy versions,
        ``num_traces_in_session``) travels in ``metadata``.
    """
    metadata = dict(trace.metadata)
    metadata.update(
        trace_index=trace.trace_index,
        completion_indices=list(trace.completion_indices),
        response_offsets=list(trace.response_offsets),
        retry_indices=list(trace.retry_indices),
        policy_versions=list(trace.policy_versions),
        num_traces_in_session=trace.num_traces_in_session,
        num_drift_tokens=trace.num_drift_tokens,
        drift_positions=list(trace.drift_positions),
    )
    if trace.turn_rewards:
        # a per-turn judge's process rewards, aligned with completion_indices
        metadata["turn_rewards"] = list(trace.turn_rewards)
    return {
        "prompt_ids": list(trace.prompt_ids),
        "response_ids": list(trace.response_ids),
        "loss_mask": list(trace.loss_mask),
        "response_logprobs": list(trace.response_logprobs),
        "prompt_messages": list(trace.prompt_messages),
        "response_messages": list(trace.response_messages),
        "tools": list(trace.tools),
        "finish_reason": trace.finish_reason,
        "reward": trace.reward,
        "metadata": metadata,
    }
