"""Turning chains into traces: token layout, loss-mask strategies and reconstruction stats.

Layout of a merged trace (every completion lands in exactly one trace):
``prompt_ids`` is the chain's first prompt; ``response_ids`` is ``response_0``
[+ end-of-turn token, inserted after a turn that ended by length] + the tokens that are new in
``prompt_1`` (tool results, user turns) + ``response_1`` + ... ``loss_mask`` is 1 only on sampled
tokens of trainable completions (never on an inserted or prompt token); ``response_logprobs``
holds the reported logprob where ``loss_mask`` is 1 and 0.0 elsewhere.
"""

from __future__ import annotations

from typing import Any, Literal

from rolloutd.errors import BuilderError
from rolloutd.trajectory.chains import Chain, ChainPlan, drift_count
from rolloutd.trajectory.tokenizer import ReasoningSpanFn
from rolloutd.trajectory.versions import trained_logprob_modes, version_stats
from rolloutd.types import BuilderStats, Completion, Trace

LossMaskStrategy = Literal["full_assistant", "action_only"]


def sampled_loss_mask(
    c: Completion, strategy: LossMaskStrategy, reasoning_spans: ReasoningSpanFn | None
) -> tuple[list[int], list[float]]:
    """Loss mask and logprobs of one completion's sampled tokens.

    ``full_assistant`` trains every sampled token; ``action_only`` masks reasoning
    (``<think>…</think>``) so only the action is trained, as in agentic-RL practice where the
    reasoning is not part of the next context. Untrainable completions are all zeros.

    Args:
        c: the completion; its ``response_ids`` have length R.
        strategy: ``BuilderSpec.loss_mask``.
        reasoning_spans: locates reasoning; required for ``action_only``.

    Returns:
        ``(loss_mask, response_logprobs)``, each of length R.

    Raises:
        BuilderError: ``action_only`` without ``reasoning_spans``, or a span out of range.
    """
    n = len(c.response_ids)
    if not c.trainable:
        return [0] * n, [0.0] * n
    loss_mask = [1] * n
    logprobs = list(c.response_logprobs)
    if strategy == "action_only":
        if reasoning_spans is None:
            raise BuilderError(
                "loss_mask 'action_only' needs reasoning_spans "
                "(for example ReasoningSpans(tokenizer))"
            )
        for start, end in reasoning_spans(c.response_ids):
            if not 0 <= start <= end <= n:
                raise BuilderError(
                    f"completion {c.index}: reasoning span ({start}, {end}) "
                    f"is outside its {n} sampled tokens"
                )
            loss_mask[start:end] = [0] * (end - start)
            logprobs[start:end] = [0.0] * (end - start)
    return loss_mask, logprobs


def _recomputed(c: Completion, loss_mask: list[int]) -> list[int]:
    """The completion's recomputed logprob positions that are trained (``loss_mask`` 1)."""
    return [k for k in c.recomputed_logprob_positions if loss_mask[k]]


def _base_metadata(c: Completion, builder: str, start: str) -> dict[str, Any]:
    return {"session_id": c.session_id, "builder": builder, "chain_start": start}


def chain_trace(
    chain: Chain,
    by_index: dict[int, Completion],
    *,
    end_of_turn_id: int,
    strategy: LossMaskStrategy,
    reasoning_spans: ReasoningSpanFn | None,
    trace_index: int,
) -> Trace:
    """Merge one chain into a trace (layout in the module docstring).

    Args:
        chain: links in order, from :func:`rolloutd.trajectory.chains.plan_chains`.
        by_index: completions by ``index``.
        end_of_turn_id: inserted, with loss_mask 0, after a turn that ended by length.
        strategy: the loss-mask strategy.
        reasoning_spans: for ``action_only``.
        trace_index: position of the trace in its trajectory.

    Returns:
        The trace; ``response_offsets[k]`` is where link k's sampled tokens start.
    """
    head = by_index[chain.links[0].index]
    response_ids: list[int] = []
    loss_mask: list[int] = []
    logprobs: list[float] = []
    offsets: list[int] = []
    drift_positions: list[int] = []
    recomputed: list[int] = []
    num_drift = 0
    response_messages: list[dict[str, Any]] = []
    prev: Completion | None = None
    for link in chain.links:
        c = by_index[link.index]
        if prev is not None:
            prev_offset = offsets[-1]
            for i1, i2, _j1, _j2 in link.drift:
                drift_positions.extend(range(prev_offset + i1, prev_offset + max(i2, i1 + 1)))
            num_drift += drift_count(link.drift)
            if link.eot_inserted:
                response_ids.append(end_of_turn_id)
            response_ids.extend(c.prompt_ids[link.delta_start :])
            gap = len(response_ids) - len(loss_mask)
            loss_mask.extend([0] * gap)
            logprobs.extend([0.0] * gap)
            response_messages.extend(c.messages[len(prev.messages) + 1 :])
        offsets.append(len(response_ids))
        mask, lps = sampled_loss_mask(c, strategy, reasoning_spans)
        recomputed.extend(offsets[-1] + k for k in _recomputed(c, mask))
        response_ids.extend(c.response_ids)
        loss_mask.extend(mask)
        logprobs.extend(lps)
        if c.response_message:
            response_messages.append(c.response_message)
        prev = c
    assert prev is not None
    metadata = _base_metadata(head, "prefix_merging", chain.start)
    return Trace(
        trace_index=trace_index,
        prompt_ids=list(head.prompt_ids),
        response_ids=response_ids,
        loss_mask=loss_mask,
        response_logprobs=logprobs,
        prompt_messages=list(head.messages),
        response_messages=response_messages,
        tools=list(head.tools),
        finish_reason=prev.finish_reason,
        completion_indices=[link.index for link in chain.links],
        response_offsets=offsets,
        retry_indices=list(chain.retry_indices),
        policy_versions=[by_index[link.index].policy_version for link in chain.links],
        logprob_modes=[by_index[link.index].logprob_mode for link in chain.links],
        sampling=[by_index[link.index].sampling for link in chain.links],
        drift_positions=drift_positions,
        num_drift_tokens=num_drift,
        recomputed_logprob_positions=recomputed,
        metadata=metadata,
    )


def request_trace(
    c: Completion,
    *,
    strategy: LossMaskStrategy,
    reasoning_spans: ReasoningSpanFn | None,
    trace_index: int,
) -> Trace:
    """One completion as one trace (the ``per_request`` builder): its prompt, its answer."""
    mask, lps = sampled_loss_mask(c, strategy, reasoning_spans)
    return Trace(
        trace_index=trace_index,
        prompt_ids=list(c.prompt_ids),
        response_ids=list(c.response_ids),
        loss_mask=mask,
        response_logprobs=lps,
        prompt_messages=list(c.messages),
        response_messages=[c.response_message] if c.response_message else [],
        tools=list(c.tools),
        finish_reason=c.finish_reason,
        completion_indices=[c.index],
        response_offsets=[0],
        policy_versions=[c.policy_version],
        logprob_modes=[c.logprob_mode],
        sampling=[c.sampling],
        recomputed_logprob_positions=_recomputed(c, mask),
        metadata=_base_metadata(c, "per_request", "request"),
    )


def builder_stats(
    traces: list[Trace], completions: list[Completion], plan: ChainPlan | None = None
) -> BuilderStats:
    """Reconstruction stats of a trajectory (every builder reports them).

    ``num_completions == num_chains + num_completions_merged + num_retries_collapsed``.
    Drift counts are what was detected, also when ``on_drift="split"`` kept it out of traces.
    """
    chains = plan.chains if plan is not None else []
    low, high, weighted = version_stats(traces)
    return BuilderStats(
        num_completions=len(completions),
        num_chains=len(traces),
        num_completions_merged=sum(len(t.completion_indices) - 1 for t in traces),
        num_chain_breaks=sum(chain.start in ("fork", "drift") for chain in chains),
        num_retries_collapsed=plan.num_retries_collapsed if plan else 0,
        num_drift_tokens=plan.num_drift_tokens if plan else 0,
        num_drift_turns=plan.num_drift_turns if plan else 0,
        num_length_turns=sum(not c.end_of_turn_sampled for c in completions),
        num_untrainable_completions=sum(not c.trainable for c in completions),
        num_trainable_tokens=sum(sum(t.loss_mask) for t in traces),
        num_response_tokens=sum(len(t.response_ids) for t in traces),
        policy_versions=sorted({c.policy_version for c in completions}),
        min_policy_version=low,
        max_policy_version=high,
        token_weighted_policy_version=weighted,
        logprob_modes=trained_logprob_modes(traces),
    )
