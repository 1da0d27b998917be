"""Rewards on traces, and the POLAR trace export.

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
