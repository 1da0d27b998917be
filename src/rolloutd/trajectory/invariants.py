"""The invariants every builder keeps, listed in :func:`check_invariants`.

:func:`check_invariants` verifies a builder's output against the completion log it came from,
token by token; it is what the property tests assert and what a trajectory activity may run
before it stores a trajectory. It costs one pass over the traces and the log.
"""

from __future__ import annotations

from rolloutd.errors import BuilderError
from rolloutd.types import CaptureMode, Completion, Trace


def _fail(trace: Trace, message: str) -> BuilderError:
    return BuilderError(f"trace {trace.trace_index}: {message}")


def _check_alignment(trace: Trace) -> None:
    n = len(trace.response_ids)
    if len(trace.loss_mask) != n or len(trace.response_logprobs) != n:
        raise _fail(
            trace,
            f"response_ids {n}, loss_mask {len(trace.loss_mask)}, "
            f"response_logprobs {len(trace.response_logprobs)} must be equal",
        )
    if len(trace.response_offsets) != len(trace.completion_indices):
        raise _fail(
            trace,
            f"{len(trace.response_offsets)} response_offsets for "
            f"{len(trace.completion_indices)} completions",
        )
    for position, value in enumerate(trace.loss_mask):
        if value not in (0, 1):
            raise _fail(trace, f"loss_mask[{position}] is {value}, not 0 or 1")
        if value == 0 and trace.response_logprobs[position] != 0.0:
            raise _fail(
                trace,
                f"response_logprobs[{position}] is "
                f"{trace.response_logprobs[position]} where loss_mask is 0",
            )


def _check_sampled(trace: Trace, by_index: dict[int, Completion]) -> None:
    """Every loss_mask-1 position lies in a completion's span and holds its sampled token."""
    covered = [False] * len(trace.response_ids)
    end = 0
    for index, offset in zip(trace.completion_indices, trace.response_offsets, strict=True):
        c = by_index[index]
        span = len(c.response_ids)
        if offset < end or offset + span > len(trace.response_ids):
            raise _fail(
                trace,
                f"completion {index}: sampled tokens at [{offset}, "
                f"{offset + span}) overlap the previous ones or run past the end",
            )
        if trace.response_ids[offset : offset + span] != c.response_ids:
            raise _fail(
                trace,
                f"completion {index}: response_ids[{offset}:{offset + span}] "
                "are not its sampled tokens",
            )
        for k in range(span):
            if trace.loss_mask[offset + k] == 1:
                if not c.trainable:
                    raise _fail(
                        trace, f"loss_mask[{offset + k}] is 1 in untrainable completion {index}"
                    )
                if trace.response_logprobs[offset + k] != c.response_logprobs[k]:
                    raise _fail(
                        trace,
                        f"response_logprobs[{offset + k}] is "
                        f"{trace.response_logprobs[offset + k]}, completion "
                        f"{index} reported {c.response_logprobs[k]}",
                    )
                covered[offset + k] = True
        end = offset + span
    for position, value in enumerate(trace.loss_mask):
        if value == 1 and not covered[position]:
            raise _fail(
                trace,
                f"loss_mask[{position}] is 1 on a token that was not sampled "
                f"(token {trace.response_ids[position]})",
            )


def _check_context(trace: Trace, by_index: dict[int, Completion]) -> None:
    """Before the first recorded drift, each completion's context is exactly its prompt."""
    first_drift = min(trace.drift_positions, default=len(trace.response_ids) + 1)
    head = by_index[trace.completion_indices[0]]
    if trace.prompt_ids != head.prompt_ids:
        raise _fail(trace, f"prompt_ids differ from completion {head.index}'s prompt")
    for index, offset in zip(trace.completion_indices[1:], trace.response_offsets[1:], strict=True):
        if offset > first_drift:
            break
        c = by_index[index]
        p = len(trace.prompt_ids)
        if len(c.prompt_ids) != p + offset or c.prompt_ids[p:] != trace.response_ids[:offset]:
            raise _fail(
                trace,
                f"completion {index}: the trace's context before its sampled "
                "tokens differs from its prompt, and no drift is recorded",
            )


def check_invariants(traces: list[Trace], completions: list[Completion]) -> None:
    """Verify a builder's traces against their completion log.

    Checks, in order: ``len(response_ids) == len(loss_mask) == len(response_logprobs)``;
    loss_mask is 0/1 and logprobs are 0.0 where it is 0; every completion lands in exactly one
    trace (``completion_indices`` or ``retry_indices``), and a collapsed retry equals a
    completion of its trace; every loss_mask-1 position holds a sampled token of a trainable
    completion with its reported logprob, in sampling order; the context before each merged
    completion equals its prompt unless drift was recorded earlier in the trace; traces made
    only of tokens-mode completions have no drift; ``num_traces_in_session`` is the trace count.

    Args:
        traces: a builder's output.
        completions: the log it was built from.

    Raises:
        BuilderError: the first violation, naming the trace, position or completion.
    """
    by_index = {c.index: c for c in completions}
    seen: dict[int, int] = {}
    for trace in traces:
        _check_alignment(trace)
        if trace.num_traces_in_session != len(traces):
            raise _fail(
                trace,
                f"num_traces_in_session is {trace.num_traces_in_session}, the "
                f"session produced {len(traces)} traces",
            )
        if not trace.completion_indices:
            raise _fail(trace, "no completion")
        for index in trace.completion_indices + trace.retry_indices:
            if index not in by_index:
                raise _fail(trace, f"completion {index} is not in the log")
            if index in seen:
                raise _fail(trace, f"completion {index} is also in trace {seen[index]}")
            seen[index] = trace.trace_index
        members = [by_index[i] for i in trace.completion_indices]
        for index in trace.retry_indices:
            retry = by_index[index]
            if not any(
                m.prompt_ids == retry.prompt_ids and m.response_ids == retry.response_ids
                for m in members
            ):
                raise _fail(trace, f"retry {index} repeats no completion of this trace")
        _check_sampled(trace, by_index)
        _check_context(trace, by_index)
        if trace.num_drift_tokens and all(m.capture_mode == CaptureMode.TOKENS for m in members):
            raise _fail(trace, f"{trace.num_drift_tokens} drift tokens in tokens mode")
    missing = sorted(set(by_index) - set(seen))
    if missing:
        raise BuilderError(f"completions {missing} are in no trace")
