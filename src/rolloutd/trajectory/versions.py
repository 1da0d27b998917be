"""Policy versions per token, and the token-weighted version of a trajectory.

A completion is sampled whole by one policy version: a call holds its backend's lease from
request to answer, and a weight sync through the gateway pauses the backend, waits until no
lease is held (the drain), and only then loads weights and sets the version
(:mod:`rolloutd.proxy.backends.pool`, :mod:`rolloutd.trainer_client.training.weight_sync`).
So a trace stores one version per merged completion (``Trace.policy_versions``, aligned with
``completion_indices``), and the version of each token follows from ``response_offsets``.

Token-weighted staleness (verl's fully async trainer weighs a sample's staleness by its
tokens): a trajectory's ``token_weighted_policy_version`` is the mean version over its
trainable tokens (``loss_mask`` 1), so a session whose first turns ran on version 3 and whose
last, longer turn ran on version 5 counts mostly as version 5.
"""

from __future__ import annotations

from rolloutd.types import LogprobMode, Trace


def token_policy_versions(trace: Trace) -> list[int]:
    """The policy version of every position of ``trace.response_ids``.

    Link k of the trace owns ``[response_offsets[k], response_offsets[k+1])``: its sampled
    tokens, which get the version of the completion that sampled them, then the tokens the
    next completion's prompt added (tool results, user turns: ``loss_mask`` 0), which get the
    same version.

    Args:
        trace: a built trace; ``policy_versions`` and ``response_offsets`` aligned with
            ``completion_indices``.

    Returns:
        list[int], length R (``len(trace.response_ids)``); empty when the trace has no
        versions (built before they were kept).
    """
    n = len(trace.response_ids)
    if not trace.policy_versions or len(trace.policy_versions) != len(trace.response_offsets):
        return []
    versions: list[int] = []
    bounds = [*trace.response_offsets[1:], n]
    for version, offset, end in zip(
        trace.policy_versions, trace.response_offsets, bounds, strict=True
    ):
        versions.extend([version] * (end - offset))
    return versions


def version_stats(traces: list[Trace]) -> tuple[int | None, int | None, float | None]:
    """``(min, max, token-weighted mean)`` policy version over the trainable tokens of
    ``traces``; all None without a trainable token (or without versions)."""
    total = weighted = 0
    low: int | None = None
    high: int | None = None
    for trace in traces:
        for version, trained in zip(token_policy_versions(trace), trace.loss_mask, strict=False):
            if not trained:
                continue
            total += 1
            weighted += version
            low = version if low is None else min(low, version)
            high = version if high is None else max(high, version)
    return low, high, (weighted / total if total else None)


def trained_logprob_modes(traces: list[Trace]) -> list[LogprobMode]:
    """The distinct log-prob modes of the completions that have a trainable token in
    ``traces``, sorted."""
    modes: set[LogprobMode] = set()
    for trace in traces:
        if not trace.logprob_modes or len(trace.logprob_modes) != len(trace.response_offsets):
            continue  # built before modes were kept
        bounds = [*trace.response_offsets[1:], len(trace.response_ids)]
        for mode, offset, end in zip(
            trace.logprob_modes, trace.response_offsets, bounds, strict=True
        ):
            if any(trace.loss_mask[offset:end]):
                modes.add(mode)
    return sorted(modes)
