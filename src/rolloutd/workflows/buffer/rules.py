"""The buffer's rules for a finished group: its token-weighted staleness, and whether it is
dropped as stale, for mixed log-prob modes or as incomplete.

Pure functions of a :class:`~rolloutd.types.GroupRef`, the version its task started under,
the buffer's version and its :class:`~rolloutd.workflows.buffer.models.BufferConfig`, so the
workflow and the tests run the same rule. Deterministic, no I/O.

Staleness is token-weighted (verl's fully async trainer weighs a sample's staleness by its
tokens): the buffer's version minus the mean policy version of the group's trainable tokens,
each token at the version that sampled it (:mod:`rolloutd.trajectory.versions`). A session that
spans weight updates counts mostly at the version of its longer turns, not at its start.
"""

from __future__ import annotations

from rolloutd.types import GroupRef
from rolloutd.workflows.buffer.models import BufferConfig, DropReason


def group_staleness(ref: GroupRef, start_version: int, buffer_version: int) -> float:
    """The group's staleness at ``buffer_version``, in policy versions.

    Args:
        ref: the finished group.
        start_version: the buffer's version when its task started (used when the group has no
            trainable token, so no token-weighted version).
        buffer_version: the buffer's policy version now.

    Returns:
        ``buffer_version - ref.token_weighted_policy_version`` (or ``- start_version``); may be
        negative when the group's tokens are newer than the buffer's version.
    """
    weighted = ref.token_weighted_policy_version
    return buffer_version - (start_version if weighted is None else weighted)


def is_too_stale(staleness: float, config: BufferConfig) -> bool:
    """Whether ``staleness`` exceeds ``config.max_staleness`` (never, when it is None)."""
    limit = config.max_staleness
    return limit is not None and staleness > limit


def arrival_drop_reason(
    ref: GroupRef, start_version: int, buffer_version: int, config: BufferConfig
) -> DropReason | None:
    """Why the buffer drops a group that just finished, by the rules checked before rewards
    (``stale``, then ``mixed_logprob_modes``, then ``incomplete``), or None.

    Args:
        ref: the finished group.
        start_version: the buffer's version when its task started.
        buffer_version: the buffer's policy version now.
        config: the buffer's settings (``max_staleness``, ``mixed_logprob_modes``,
            ``incomplete_groups``).
    """
    if is_too_stale(group_staleness(ref, start_version, buffer_version), config):
        return "stale"
    if ref.mixed_logprob_modes and config.mixed_logprob_modes == "drop":
        return "mixed_logprob_modes"
    if ref.incomplete and config.incomplete_groups == "drop":
        return "incomplete"
    return None
