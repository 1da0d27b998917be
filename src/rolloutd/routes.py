"""Routed experts (R3, rollout routing replay) out of line: NumPy ``.npy`` arrays in the blob
store, referenced from completions and traces by :class:`rolloutd.types.RoutedExperts`.

For a mixture-of-experts policy the trainer replays, per token and MoE layer, the experts the
inference engine routed it to (verl ``AgentLoopOutput.routed_experts``, SkyRL
``GeneratorOutput.rollout_expert_indices``); without it MoE GRPO can collapse. vLLM and SGLang
return them for ``prompt + response`` minus the last sampled token (that one was never fed to
the model): row ``p`` of a sequence is the routing of the token at position ``p``.

Layout below the store's root::

    sessions/{session_id}/routes/{index:08d}.npy    a completion's rows from ``start`` on
    sessions/{session_id}/routes/trace-{n}.npy      a trace's rows from 0

A completion that continues an earlier one (``extends``) stores only the rows past its base's
(the base's ``prompt + response - 1``): a harness resends its whole conversation every turn,
and the rows of the earlier turns are the ones the model used when it sampled them. A trace's
row ``p`` comes from the first completion of its chain whose sequence covers ``p`` (SkyRL's
``RoutedExpertTrace`` accumulates turns the same way). Rows are never in a Temporal payload.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import numpy as np

from rolloutd.errors import BuilderError
from rolloutd.store import BlobStore, session_prefix
from rolloutd.types import Completion, RoutedExperts, Trace


def completion_routes_key(session_id: str, index: int) -> str:
    """Blob store key of completion ``index``'s rows."""
    return f"{session_prefix(session_id)}/routes/{index:08d}.npy"


def trace_routes_key(session_id: str, trace_index: int) -> str:
    """Blob store key of trace ``trace_index``'s rows."""
    return f"{session_prefix(session_id)}/routes/trace-{trace_index}.npy"


def encode(rows: np.ndarray) -> bytes:
    """``rows`` as ``.npy`` bytes (``numpy.save``, no pickle)."""
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(rows), allow_pickle=False)
    return buffer.getvalue()


def decode(data: bytes) -> np.ndarray:
    """The array of ``.npy`` bytes (``numpy.load``, no pickle)."""
    return np.load(io.BytesIO(data), allow_pickle=False)


def check_rows(rows: np.ndarray, where: str) -> np.ndarray:
    """``rows`` as a ``(num_rows, num_layers, top_k)`` integer array.

    Raises:
        ValueError: another shape, or not integers.
    """
    if rows.ndim != 3 or not np.issubdtype(rows.dtype, np.integer):
        raise ValueError(
            f"{where}: routed experts must be an integer (rows, layers, top_k) array, "
            f"got shape {rows.shape} of {rows.dtype}"
        )
    return rows


def _put(store: BlobStore, key: str, rows: np.ndarray, start: int) -> RoutedExperts:
    store.put_bytes(key, encode(rows))
    return RoutedExperts(
        key=key,
        start=start,
        num_rows=int(rows.shape[0]),
        num_layers=int(rows.shape[1]),
        top_k=int(rows.shape[2]),
    )


def store_completion_routes(
    store: BlobStore,
    completion: Completion,
    rows: np.ndarray,
    base: Completion | None,
) -> RoutedExperts:
    """Store a completion's rows, only those past its base's when it continues one.

    Args:
        store: the blob store.
        completion: the completion (its ``session_id``, ``index`` and ``extends``).
        rows: ``(num_rows, num_layers, top_k)``, rows of its ``prompt + response`` from 0.
        base: the completion it ``extends`` (whose rows, resolved, are the first ones), or
            None.

    Returns:
        The reference to set on the completion.

    Raises:
        ValueError: ``rows`` is not a ``(rows, layers, top_k)`` integer array.
    """
    check_rows(rows, f"completion {completion.session_id}#{completion.index}")
    start = 0
    if base is not None and base.routed_experts is not None:
        covered = base.routed_experts.start + base.routed_experts.num_rows
        if (
            covered <= rows.shape[0]
            and base.routed_experts.num_layers == rows.shape[1]
            and base.routed_experts.top_k == rows.shape[2]
        ):
            start = covered
    return _put(
        store, completion_routes_key(completion.session_id, completion.index), rows[start:], start
    )


def completion_routes(
    store: BlobStore, completion: Completion, earlier: Callable[[int], Completion]
) -> np.ndarray | None:
    """A completion's rows from position 0: its base's (resolved the same way) up to its
    ``start``, then its own.

    Args:
        store: the blob store.
        completion: the completion.
        earlier: the completion of an earlier index of the same log (its ``extends``).

    Returns:
        ``(num_rows, num_layers, top_k)``, or None when it has no routes.

    Raises:
        ValueError: a completion stores rows from ``start`` but its base covers fewer.
    """
    ref = completion.routed_experts
    if ref is None:
        return None
    own = decode(store.get_bytes(ref.key))
    if ref.start == 0:
        return own
    if completion.extends is None:
        raise ValueError(f"completion {completion.index}: routes from {ref.start} but no base")
    before = completion_routes(store, earlier(completion.extends), earlier)
    if before is None or before.shape[0] < ref.start:
        raise ValueError(
            f"completion {completion.index}: routes from row {ref.start}, its base has "
            f"{0 if before is None else before.shape[0]}"
        )
    return np.concatenate([before[: ref.start], own])


def trace_routes(
    store: BlobStore, trace: Trace, by_index: dict[int, Completion]
) -> np.ndarray | None:
    """The rows of ``trace.prompt_ids + trace.response_ids`` from position 0.

    Link k's completion covers the trace's positions up to where its sampled tokens end,
    less one (the last sampled token was never fed); its rows are aligned at the start of
    its sampled tokens (``len(prompt_ids) + response_offsets[k]`` in the trace, its own
    prompt length in its sequence). Each position takes the row of the first link that
    covers it.

    Args:
        store: the blob store.
        trace: a built trace.
        by_index: the session's completions by index.

    Returns:
        ``(num_rows, num_layers, top_k)`` with ``num_rows`` at most the trace's length less
        one; None when no completion of the trace has routes.

    Raises:
        BuilderError: a completion of the chain has none while another has some, or their
            shapes differ: the trace's rows would not line up.
    """
    completions = [by_index[i] for i in trace.completion_indices]
    if all(c.routed_experts is None for c in completions):
        return None
    num_prompt = len(trace.prompt_ids)
    parts: list[np.ndarray] = []
    covered = 0
    for offset, completion in zip(trace.response_offsets, completions, strict=True):
        rows = completion_routes(store, completion, by_index.__getitem__)
        if rows is None:
            raise BuilderError(
                f"trace {trace.trace_index}: completion {completion.index} has no routed "
                "experts while others of its chain do"
            )
        if parts and rows.shape[1:] != parts[0].shape[1:]:
            raise BuilderError(
                f"trace {trace.trace_index}: completion {completion.index}'s routes are "
                f"{rows.shape[1:]} per token, the chain's {parts[0].shape[1:]}"
            )
        # trace position p is position p - shift of this completion's sequence
        shift = num_prompt + offset - len(completion.prompt_ids)
        end = shift + rows.shape[0]
        if end > covered:
            if shift > covered:  # a gap no completion covers: not alignable
                raise BuilderError(
                    f"trace {trace.trace_index}: no routed experts for positions "
                    f"{covered}..{shift - 1}"
                )
            parts.append(rows[covered - shift :])
            covered = end
    return np.concatenate(parts) if parts else None


def store_trace_routes(
    store: BlobStore, session_id: str, traces: list[Trace], completions: list[Completion]
) -> None:
    """Assemble and store every trace's rows (:func:`trace_routes`) and set
    ``trace.routed_experts``, in place; traces without routes are left alone."""
    by_index = {c.index: c for c in completions}
    for trace in traces:
        rows = trace_routes(store, trace, by_index)
        if rows is not None:
            trace.routed_experts = _put(
                store, trace_routes_key(session_id, trace.trace_index), rows, 0
            )


def load_routes(store: BlobStore, ref: RoutedExperts) -> np.ndarray:
    """The stored rows of ``ref`` (a trace's: from position 0)."""
    return decode(store.get_bytes(ref.key))
