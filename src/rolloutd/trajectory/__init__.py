"""Builders: turn a session's completion log into trainer-ready traces.

Public API:

- :func:`build_traces` runs ``per_request`` (one trace per completion) or ``prefix_merging``
  (one trace per chain of completions whose prompts extend each other) and returns the traces
  with their :class:`~rolloutd.types.BuilderStats`;
- :func:`end_of_turn_id` and :class:`ReasoningSpans` derive what a builder needs from the
  model's tokenizer and chat template;
- :func:`check_invariants` verifies any builder's output against its log;
- :func:`assign_rewards` and :func:`to_polar_trace` score and export traces.

Invariants (:func:`check_invariants` lists them all):
``len(response_ids) == len(loss_mask) == len(response_logprobs)``; ``loss_mask`` is 1 only on
sampled tokens, with their reported logprobs; every completion lands in exactly one trace.
"""

from __future__ import annotations

import itertools
import time
from typing import Literal

import structlog

from rolloutd.errors import BuilderError
from rolloutd.trajectory.assemble import builder_stats, chain_trace, request_trace
from rolloutd.trajectory.chains import plan_chains
from rolloutd.trajectory.export import (
    assign_rewards,
    per_token_turn_rewards,
    to_polar_trace,
    turn_reward_positions,
)
from rolloutd.trajectory.invariants import check_invariants
from rolloutd.trajectory.tokenizer import ReasoningSpanFn, ReasoningSpans, end_of_turn_id
from rolloutd.types import BuilderSpec, BuilderStats, Completion, Trace

__all__ = [
    "ReasoningSpanFn",
    "ReasoningSpans",
    "assign_rewards",
    "build_traces",
    "check_invariants",
    "end_of_turn_id",
    "per_token_turn_rewards",
    "to_polar_trace",
    "turn_reward_positions",
]

log = structlog.get_logger(__name__)


def _ordered(completions: list[Completion]) -> list[Completion]:
    ordered = sorted(completions, key=lambda c: c.index)
    for before, after in itertools.pairwise(ordered):
        if before.index == after.index:
            raise BuilderError(f"completion index {after.index} appears twice in the log")
    return ordered


def build_traces(
    completions: list[Completion],
    spec: BuilderSpec,
    *,
    end_of_turn_id: int | None,
    reasoning_spans: ReasoningSpanFn | None = None,
    verify: Literal["sampled", "full"] = "sampled",
) -> tuple[list[Trace], BuilderStats]:
    """Build the traces of one session's completion log.

    ``per_request`` makes one trace per completion (prompt, answer). ``prefix_merging`` merges
    each chain of completions into one trace (see :mod:`rolloutd.trajectory.chains` for the
    chaining rules and :mod:`rolloutd.trajectory.assemble` for the layout); identical retries
    are collapsed into the trace of the completion they repeat; drift is counted and located
    and ``spec.on_drift`` decides whether a drifting turn continues its chain.

    Args:
        completions: the session's completion log (any order; indices unique).
        spec: builder type, ``on_drift`` and ``loss_mask`` strategy.
        end_of_turn_id: the tokenizer's end-of-turn token, from :func:`end_of_turn_id`;
            required by ``prefix_merging`` (it is inserted after turns that ended by length).
        reasoning_spans: locates reasoning in sampled tokens, for ``loss_mask="action_only"``
            (e.g. ``ReasoningSpans(tokenizer)``).
        verify: ``sampled`` (default) trusts a tokens-mode ``extends`` hint after a bounded
            comparison; ``full`` compares every prefix token of every link.

    Returns:
        ``(traces, stats)``; each trace has ``num_traces_in_session == len(traces)``.

    Raises:
        BuilderError: ``prefix_merging`` without an end-of-turn token, ``action_only`` without
            ``reasoning_spans``, a duplicated completion index, a bad ``extends`` hint, or drift
            in tokens mode.
    """
    started = time.perf_counter()
    ordered = _ordered(completions)
    plan = None
    if spec.type == "per_request":
        traces = [
            request_trace(
                c, strategy=spec.loss_mask, reasoning_spans=reasoning_spans, trace_index=position
            )
            for position, c in enumerate(ordered)
        ]
    else:
        if end_of_turn_id is None:
            raise BuilderError(
                "prefix_merging needs the tokenizer's end-of-turn token; derive "
                "it with rolloutd.trajectory.end_of_turn_id(tokenizer)"
            )
        plan = plan_chains(
            ordered, end_of_turn_id=end_of_turn_id, on_drift=spec.on_drift, verify=verify
        )
        by_index = {c.index: c for c in ordered}
        traces = [
            chain_trace(
                chain,
                by_index,
                end_of_turn_id=end_of_turn_id,
                strategy=spec.loss_mask,
                reasoning_spans=reasoning_spans,
                trace_index=position,
            )
            for position, chain in enumerate(plan.chains)
        ]
    for trace in traces:
        trace.num_traces_in_session = max(1, len(traces))
    stats = builder_stats(traces, ordered, plan)
    log.info(
        "trajectory_built",
        builder=spec.type,
        num_traces=len(traces),
        duration_s=round(time.perf_counter() - started, 6),
        **stats.model_dump(),
    )
    return traces, stats
