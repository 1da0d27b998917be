"""Exports of trajectories to what trainers consume: verl tensors, slime samples, OpenAI
messages JSONL for SFT, and Parquet.

Every export writes **one row per trace**, in input order (trajectory by trajectory, trace by
trace), and keeps the builders' alignment invariant: in each row, ``responses``,
``response_mask`` (= ``loss_mask``) and ``rollout_log_probs`` are aligned token for token with
``response_ids``. A trace's group is its task (``task_id``): the GRPO group of DeepSeekMath
(arXiv 2402.03300), verl's ``uid``, slime's ``group_index``.

A trace's reward is ``trace.reward`` (set by ``rolloutd.trajectory.assign_rewards``), else its
trajectory's ``reward``. The exports never truncate or drop silently: a trace over a length
limit, or without a reward where one is needed, raises a ``ValueError`` that names it.

Failed sessions (a failure cause that is not a rewarded run-phase timeout of the policy:
:func:`failed_cause`) are left out of every export: a reward measures the policy, never the
infrastructure (docs/decisions.md, "Failure causes and rewards"). ``include_failed=True`` keeps
them, marked: the cause in the row's metadata (``failure``: ``{kind, message, phase, retryable}``),
an all-zero loss mask, no reward; verl rows get a group of their own (``uid``) so no GRPO baseline
includes them.

Heavy imports (numpy, torch, pyarrow) happen inside the functions that need them, so importing
this module costs nothing for a trainer that only writes JSONL.

One module of about 600 lines on purpose: every export applies the same row rules above (which
sessions are left out or marked, the trace's reward, the length limits) through the private
helpers at the top, and each exporter is a short function over them; split by format, the rules
would be imported back by each part.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from typing import IO, TYPE_CHECKING, Any, Literal

from rolloutd.routes import load_routes
from rolloutd.scoring import failure_of, is_policy_timeout
from rolloutd.store import BlobStore
from rolloutd.trajectory.export import turn_reward_positions
from rolloutd.trajectory.versions import trained_logprob_modes
from rolloutd.types import FailureCause, SessionStatus, Trace, Trajectory

if TYPE_CHECKING:
    import numpy as np
    import torch

__all__ = [
    "failed_cause",
    "parquet_schema",
    "to_openai_messages_jsonl",
    "to_parquet",
    "to_slime_samples",
    "to_verl_batch",
    "trace_reward",
]

#: slime ``Sample.Status`` value of a trace, by session status (slime/utils/types.py).
_SLIME_STATUS = {
    SessionStatus.FAILED: "failed",
    SessionStatus.TIMEOUT: "aborted",
    SessionStatus.CANCELLED: "aborted",
}


def failed_cause(trajectory: Trajectory) -> FailureCause | None:
    """The failure that keeps a session out of training data, or None.

    None for a session that ran to its end, and for a run-phase timeout the policy is
    accountable for and that was rewarded (the task's ``timeout_reward``); any other cause
    (infrastructure, cancellation, an unrewarded timeout) is returned
    (:func:`rolloutd.scoring.failure_of`, which also reads trajectories stored before causes
    existed from their status).

    Args:
        trajectory: one session's trajectory.
    """
    failure = failure_of(trajectory)
    if failure is None:
        return None
    rewarded = trajectory.reward is not None or any(t.reward is not None for t in trajectory.traces)
    return None if is_policy_timeout(failure) and rewarded else failure


def _rows(
    trajectories: Sequence[Trajectory], include_failed: bool = False
) -> Iterator[tuple[Trajectory, Trace]]:
    """Every trace of every trajectory in order; failed sessions only with ``include_failed``,
    then each trace as :func:`_marked`."""
    for trajectory in trajectories:
        failure = failed_cause(trajectory)
        if failure is not None and not include_failed:
            continue
        for trace in trajectory.traces:
            yield trajectory, (trace if failure is None else _marked(trace, failure))


def _marked(trace: Trace, failure: FailureCause) -> Trace:
    """A failed session's trace as exported: nothing trainable, no reward, the cause in its
    metadata."""
    return trace.model_copy(
        update={
            "loss_mask": [0] * len(trace.loss_mask),
            "reward": None,
            "metadata": {**trace.metadata, "failure": failure.model_dump()},
        }
    )


def _failure_of_row(trace: Trace) -> dict[str, Any] | None:
    return trace.metadata.get("failure") if isinstance(trace.metadata, dict) else None


def _reward_of_row(trajectory: Trajectory, trace: Trace) -> float | None:
    """:func:`trace_reward`, and None for a failed session's row (marked by :func:`_marked`):
    its trajectory's reward, where an older evaluator set one, is not the policy's."""
    return None if _failure_of_row(trace) is not None else trace_reward(trajectory, trace)


def _name(trajectory: Trajectory, trace: Trace) -> str:
    return (
        f"trace {trace.trace_index} of session {trajectory.session_id} (task {trajectory.task_id})"
    )


def trace_reward(trajectory: Trajectory, trace: Trace) -> float | None:
    """The reward of one trace: its own, else its session's outcome reward, else None.

    Args:
        trajectory: the session the trace belongs to.
        trace: one of ``trajectory.traces``.

    Returns:
        The reward as a float, or None when the session is unscored.
    """
    if trace.reward is not None:
        return float(trace.reward)
    if trajectory.reward is not None:
        return float(trajectory.reward)
    return None


def _required_reward(trajectory: Trajectory, trace: Trace, default: float | None) -> float:
    reward = trace_reward(trajectory, trace)
    if reward is None:
        if default is None:
            raise ValueError(
                f"{_name(trajectory, trace)} has no reward; score the session "
                f"or pass default_reward"
            )
        return float(default)
    return reward


# --------------------------------------------------------------------------- verl


def _fit(
    trajectory: Trajectory,
    trace: Trace,
    *,
    max_prompt_len: int | None,
    max_response_len: int | None,
    truncate: bool,
) -> tuple[list[int], list[int], list[int], list[float]]:
    """The trace's token arrays within the limits: refused, or cut when ``truncate``."""
    prompt_ids = list(trace.prompt_ids)
    response_ids = list(trace.response_ids)
    loss_mask = list(trace.loss_mask)
    response_logprobs = list(trace.response_logprobs)
    if max_prompt_len is not None and len(prompt_ids) > max_prompt_len:
        if not truncate:
            raise ValueError(
                f"{_name(trajectory, trace)}: prompt has {len(prompt_ids)} tokens, more than "
                f"max_prompt_len={max_prompt_len}; pass truncate=True to keep its last "
                f"{max_prompt_len}"
            )
        # The end of the prompt is what the response was conditioned on most directly.
        prompt_ids = prompt_ids[len(prompt_ids) - max_prompt_len :]
    if max_response_len is not None and len(response_ids) > max_response_len:
        if not truncate:
            raise ValueError(
                f"{_name(trajectory, trace)}: response has {len(response_ids)} tokens, more "
                f"than max_response_len={max_response_len}; pass truncate=True to keep its "
                f"first {max_response_len}"
            )
        response_ids = response_ids[:max_response_len]
        loss_mask = loss_mask[:max_response_len]
        response_logprobs = response_logprobs[:max_response_len]
    if not response_ids:
        raise ValueError(f"{_name(trajectory, trace)} has no response tokens to train on")
    return prompt_ids, response_ids, loss_mask, response_logprobs


def to_verl_batch(
    trajectories: Sequence[Trajectory],
    *,
    pad_token_id: int,
    max_prompt_len: int | None = None,
    max_response_len: int | None = None,
    truncate: bool = False,
    reward_position: Literal["last_token", "last_trainable"] = "last_token",
    default_reward: float | None = None,
    include_failed: bool = False,
    store: BlobStore | None = None,
    turn_rewards: bool = False,
) -> dict[str, torch.Tensor | np.ndarray]:
    """Pad a batch of traces into verl's ``DataProto`` layout, one row per trace.

    Layout (verl ``verl/experimental/agent_loop/agent_loop.py``, ``_run_agent_loop`` and
    ``_postprocess``): each prompt is LEFT-padded to P, the longest prompt of the batch, each
    response RIGHT-padded to R, the longest response; ``input_ids`` is their concatenation, so
    every row's first response token sits at column P. ``position_ids`` is verl's
    ``compute_position_id_with_mask``: ``clip(cumsum(attention_mask) - 1, min=0)``, so real
    tokens count 0, 1, ..., L-1 from the first real prompt token; left padding is 0 and right
    padding repeats L-1. The outcome reward goes on one response token, as verl's reward
    managers and ``rm_scores`` put it on the last valid response token.

    Build a ``DataProto`` with ``DataProto.from_dict(tensors={k: v for torch values},
    non_tensors={"uid": ..., "session_id": ...})``.

    Args:
        trajectories: list[Trajectory], any number of sessions of any number of tasks. B is
            the total number of traces.
        pad_token_id: token id written at padded positions of ``input_ids``, ``prompts`` and
            ``responses`` (they are masked out by ``attention_mask``).
        max_prompt_len: refuse (or, with ``truncate``, keep the last ``max_prompt_len`` tokens
            of) longer prompts; None for no limit. Padding is still to the batch's longest.
        max_response_len: refuse (or, with ``truncate``, keep the first ``max_response_len``
            tokens, mask and logprobs of) longer responses; None for no limit.
        truncate: cut over-long traces instead of raising. The reward then lands on the last
            kept token.
        reward_position: ``last_token`` (verl's choice: the last response token) or
            ``last_trainable`` (the last token with ``loss_mask == 1``; the last token when
            none is trainable). They differ only for a trace that ends with non-sampled tokens.
        default_reward: reward of traces whose session is unscored; None raises instead.
        include_failed: keep failed sessions' traces (:func:`failed_cause`): all-zero
            ``response_mask`` and ``token_level_scores``, ``uid`` ``failed/{session_id}`` (a
            group of their own, outside every GRPO baseline), ``failure`` set.
        store: the blob store the traces' routed experts are read from; None leaves them out.
        turn_rewards: also give ``turn_level_scores``: a per-turn judge's process rewards.

    Returns:
        A dict with, for B traces, P the longest (kept) prompt and R the longest response:

        - ``input_ids``, ``attention_mask``, ``position_ids``: torch.long [B, P+R];
        - ``prompts``: torch.long [B, P]; ``responses``: torch.long [B, R];
        - ``response_mask``: torch.long [B, R], the trace's ``loss_mask`` then zeros;
        - ``rollout_log_probs``: torch.float32 [B, R], ``response_logprobs`` then zeros;
        - ``token_level_scores``: torch.float32 [B, R], the reward at one position, else 0;
        - ``uid``: np.ndarray of object (str) [B], the ``task_id``, so GRPO groups by task;
        - ``session_id``: np.ndarray of object (str) [B], for per-session weighting;
        - ``failure``: np.ndarray of object [B], the failure kind of a failed session's row,
          else None;
        - ``logprob_modes``: np.ndarray of object [B], each a sorted list of the log-prob modes
          of the row's completions that have a trainable token (one item unless its
          completions disagree; docs/backends.md);
        - ``routed_experts`` (with ``store``, when every trace has them): torch.int16
          [B, P+R, num_layers, top_k], verl's R3 field as its agent loop's ``_postprocess``
          lays it out: a trace's rows from its first real prompt token on, zeros elsewhere
          (the last token has no row).
        - ``turn_level_scores`` (with ``turn_rewards``): torch.float32 [B, R], each scored
          turn's process reward at its last sampled token
          (:func:`rolloutd.trajectory.turn_reward_positions`), else 0; a turn cut off by
          ``truncate`` is left out, and a failed row is all 0.

    Raises:
        ValueError: no traces; a trace over a limit without ``truncate``; a trace without
            response tokens; a trace without reward and no ``default_reward``.
    """
    import numpy as np
    import torch

    rows, failures = _verl_rows(
        trajectories,
        max_prompt_len=max_prompt_len,
        max_response_len=max_response_len,
        truncate=truncate,
        default_reward=default_reward,
        include_failed=include_failed,
    )
    arrays = _verl_padded(rows, failures, pad_token_id, reward_position)
    traces = [trace for _, trace in _rows(trajectories, include_failed)]
    modes = arrays["logprob_modes"] = np.empty(len(traces), dtype=object)
    for row, trace in enumerate(traces):  # one list per row (a slice would broadcast them)
        modes[row] = trained_logprob_modes([trace])
    if turn_rewards:
        scores = arrays["turn_level_scores"] = np.zeros_like(arrays["token_level_scores"])
        for row, (trace, kind) in enumerate(zip(traces, failures, strict=True)):
            kept = len(rows[row][1][1])
            for position, reward in turn_reward_positions(trace) if kind is None else []:
                if position < kept:
                    scores[row, position] = reward
    if store is not None:
        routes = _verl_routes(store, traces, rows, arrays["prompts"].shape[1])
        if routes is not None:
            arrays["routed_experts"] = routes
    return {
        key: torch.from_numpy(value) if value.dtype != object else value
        for key, value in arrays.items()
    }


#: one row of a verl batch: its trajectory, (prompt_ids, response_ids, loss_mask, logprobs)
#: as kept, and its reward
_VerlRow = tuple[Trajectory, tuple[list[int], list[int], list[int], list[float]], float]


def _verl_rows(
    trajectories: Sequence[Trajectory],
    *,
    max_prompt_len: int | None,
    max_response_len: int | None,
    truncate: bool,
    default_reward: float | None,
    include_failed: bool,
) -> tuple[list[_VerlRow], list[str | None]]:
    """The rows of :func:`to_verl_batch` (limits applied, rewards required) and each row's
    failure kind (None for a scored row).

    Raises:
        ValueError: as :func:`to_verl_batch` says.
    """
    rows: list[_VerlRow] = []
    failures: list[str | None] = []
    for trajectory, trace in _rows(trajectories, include_failed):
        arrays = _fit(
            trajectory,
            trace,
            max_prompt_len=max_prompt_len,
            max_response_len=max_response_len,
            truncate=truncate,
        )
        failure = _failure_of_row(trace)
        reward = 0.0 if failure else _required_reward(trajectory, trace, default_reward)
        rows.append((trajectory, arrays, reward))
        failures.append(failure["kind"] if failure else None)
    if not rows:
        raise ValueError("to_verl_batch needs at least one trace")
    return rows, failures


def _verl_routes(
    store: BlobStore, traces: list[Trace], rows: list[_VerlRow], prompt_len: int
) -> np.ndarray | None:
    """The batch's ``routed_experts`` (int16 [B, P+R, layers, top_k]), or None unless every
    trace has them. A row's stored rows start at its first kept prompt token (column
    ``prompt_len - len(kept prompt)``); a prompt cut to its last tokens drops as many rows."""
    import numpy as np

    if not traces or any(t.routed_experts is None for t in traces):
        return None
    loaded = [load_routes(store, t.routed_experts) for t in traces]  # type: ignore[arg-type]
    shapes = {r.shape[1:] for r in loaded}
    if len(shapes) != 1:
        raise ValueError(f"traces' routed experts differ in shape: {sorted(shapes)}")
    response_len = max(len(arrays[1]) for _, arrays, _ in rows)
    out = np.zeros((len(rows), prompt_len + response_len, *shapes.pop()), dtype=np.int16)
    for row, (trace, routes, (_, (prompt_ids, response_ids, _m, _l), _r)) in enumerate(
        zip(traces, loaded, rows, strict=True)
    ):
        cut = len(trace.prompt_ids) - len(prompt_ids)
        kept = routes[cut : cut + len(prompt_ids) + len(response_ids)]
        start = prompt_len - len(prompt_ids)
        out[row, start : start + len(kept)] = kept
    return out


def _verl_padded(
    rows: list[_VerlRow],
    failures: list[str | None],
    pad_token_id: int,
    reward_position: Literal["last_token", "last_trainable"],
) -> dict[str, np.ndarray]:
    """:func:`to_verl_batch`'s arrays as numpy arrays (prompts left-padded, responses
    right-padded, the reward on one response token)."""
    import numpy as np

    num_rows = len(rows)
    prompt_len = max(len(arrays[0]) for _, arrays, _ in rows)
    response_len = max(len(arrays[1]) for _, arrays, _ in rows)
    prompts = np.full((num_rows, prompt_len), pad_token_id, dtype=np.int64)
    responses = np.full((num_rows, response_len), pad_token_id, dtype=np.int64)
    prompt_attention = np.zeros((num_rows, prompt_len), dtype=np.int64)
    response_attention = np.zeros((num_rows, response_len), dtype=np.int64)
    response_mask = np.zeros((num_rows, response_len), dtype=np.int64)
    rollout_log_probs = np.zeros((num_rows, response_len), dtype=np.float32)
    token_level_scores = np.zeros((num_rows, response_len), dtype=np.float32)

    for row, (_, (prompt_ids, response_ids, loss_mask, logprobs), reward) in enumerate(rows):
        num_prompt, num_response = len(prompt_ids), len(response_ids)
        if num_prompt:
            prompts[row, prompt_len - num_prompt :] = prompt_ids
            prompt_attention[row, prompt_len - num_prompt :] = 1
        responses[row, :num_response] = response_ids
        response_attention[row, :num_response] = 1
        response_mask[row, :num_response] = loss_mask
        rollout_log_probs[row, :num_response] = logprobs
        position = num_response - 1
        if reward_position == "last_trainable":
            trainable = [i for i, m in enumerate(loss_mask) if m]
            position = trainable[-1] if trainable else position
        token_level_scores[row, position] = reward

    attention_mask = np.concatenate([prompt_attention, response_attention], axis=1)
    uid = np.empty(num_rows, dtype=object)
    uid[:] = [
        trajectory.task_id if kind is None else f"failed/{trajectory.session_id}"
        for (trajectory, _, _), kind in zip(rows, failures, strict=True)
    ]
    session_id = np.empty(num_rows, dtype=object)
    session_id[:] = [trajectory.session_id for trajectory, _, _ in rows]
    failure_kind = np.empty(num_rows, dtype=object)
    failure_kind[:] = failures
    return {
        "input_ids": np.concatenate([prompts, responses], axis=1),
        "attention_mask": attention_mask,
        "position_ids": np.clip(np.cumsum(attention_mask, axis=1) - 1, 0, None),
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "rollout_log_probs": rollout_log_probs,
        "token_level_scores": token_level_scores,
        "uid": uid,
        "session_id": session_id,
        "failure": failure_kind,
    }


# --------------------------------------------------------------------------- slime


def _slime_status(trajectory: Trajectory, trace: Trace) -> str:
    if trajectory.status in _SLIME_STATUS:
        return _SLIME_STATUS[trajectory.status]
    return "truncated" if trace.finish_reason == "length" else "completed"


def to_slime_samples(
    trajectories: Sequence[Trajectory],
    *,
    default_reward: float | None = None,
    include_failed: bool = False,
) -> list[dict[str, Any]]:
    """Convert traces to slime ``Sample`` dicts, one per trace.

    The keys are the fields of slime's ``Sample`` dataclass (THUDM/slime,
    ``slime/utils/types.py``) in the shape of ``Sample.to_dict()``, so ``Sample.from_dict(d)``
    rebuilds a sample. Invariant: ``len(tokens) == len(prompt_ids) + response_length`` and
    ``len(loss_mask) == len(rollout_log_probs) == response_length``.

    ``status`` maps a session that failed to ``failed``, one that timed out or was cancelled
    to ``aborted`` (its traces are what was captured), and otherwise a trace whose last call
    stopped on the token limit to ``truncated``, else ``completed``.

    Args:
        trajectories: list[Trajectory]; N traces in all.
        default_reward: reward of traces whose session is unscored; None leaves ``reward``
            None (slime's ``Sample.reward`` is optional: its reward model can fill it).
        include_failed: keep failed sessions' traces (:func:`failed_cause`): all-zero
            ``loss_mask``, ``reward`` None, ``remove_sample`` True, ``metadata["failure"]``.

    Returns:
        list[dict], length N, each with:

        - ``group_index``: int, the task's ordinal by first appearance in ``trajectories``;
        - ``index``: int, the row's position, 0..N-1;
        - ``prompt``: the trace's ``prompt_messages`` (OpenAI chat shape);
        - ``tokens``: list[int], ``prompt_ids + response_ids``, length P + R;
        - ``response``: "" (text is not reconstructed; messages are in ``metadata``);
        - ``response_length``: int, R;
        - ``label``: None; ``reward``: float or None;
        - ``loss_mask``: list[int], length R; ``rollout_log_probs``: list[float], length R;
        - ``weight_versions``: list[str], the policy versions of the trace's completions;
        - ``status``: "completed" | "truncated" | "aborted" | "failed";
        - ``session_id``: the rolloutd session (slime routes a session to one engine by it);
        - ``remove_sample``: False (True for a failed session's row);
        - ``metadata``: the trace's metadata plus ``task_id``, ``sample_index``,
          ``trace_index``, ``num_traces_in_session``, ``finish_reason``,
          ``response_messages``, ``tools``, and per merged completion (aligned with
          ``weight_versions``) ``logprob_modes`` and ``sampling`` (the parameters in force).
    """
    group_indices: dict[str, int] = {}
    samples = []
    for index, (trajectory, trace) in enumerate(_rows(trajectories, include_failed)):
        group_index = group_indices.setdefault(trajectory.task_id, len(group_indices))
        failed = _failure_of_row(trace) is not None
        reward = _reward_of_row(trajectory, trace)
        if reward is None and default_reward is not None and not failed:
            reward = float(default_reward)
        samples.append(
            {
                "group_index": group_index,
                "index": index,
                "prompt": [dict(m) for m in trace.prompt_messages],
                "tokens": [*trace.prompt_ids, *trace.response_ids],
                "response": "",
                "response_length": len(trace.response_ids),
                "label": None,
                "reward": reward,
                "loss_mask": list(trace.loss_mask),
                "rollout_log_probs": list(trace.response_logprobs),
                "weight_versions": [str(v) for v in trace.policy_versions],
                "status": _slime_status(trajectory, trace),
                "session_id": trajectory.session_id,
                "remove_sample": failed,
                "metadata": {
                    **trace.metadata,
                    "task_id": trajectory.task_id,
                    "sample_index": trajectory.sample_index,
                    "trace_index": trace.trace_index,
                    "num_traces_in_session": trace.num_traces_in_session,
                    "finish_reason": trace.finish_reason,
                    "response_messages": [dict(m) for m in trace.response_messages],
                    "tools": [dict(t) for t in trace.tools],
                    "logprob_modes": list(trace.logprob_modes),
                    "sampling": [None if u is None else u.model_dump() for u in trace.sampling],
                },
            }
        )
    return samples


# --------------------------------------------------------------------------- SFT JSONL


def to_openai_messages_jsonl(
    trajectories: Sequence[Trajectory],
    path_or_file: str | os.PathLike[str] | IO[str],
    *,
    min_reward: float | None = None,
    include_failed: bool = False,
) -> int:
    """Write traces as OpenAI chat messages JSONL for SFT, one line per trace.

    Each line is ``{"messages": prompt_messages + response_messages, "tools": tools}``, the
    conversation as the harness sent it (after dialect translation) and the model's answers, in
    the chat fine-tuning format of OpenAI's API reference (``messages`` and ``tools`` keys).

    Args:
        trajectories: list[Trajectory].
        path_or_file: a path (created or overwritten, UTF-8) or an open text file (written to,
            not closed).
        min_reward: keep only traces whose reward (:func:`trace_reward`) is not None and
            ``>= min_reward`` (rejection sampling for SFT); None keeps every trace.
        include_failed: keep failed sessions' traces (:func:`failed_cause`), each line with
            a ``failure`` key (``{kind, message, phase, retryable}``); they have no reward,
            so ``min_reward`` leaves them out.

    Returns:
        The number of lines written.
    """
    if isinstance(path_or_file, str | os.PathLike):
        target = open(path_or_file, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    else:
        target = nullcontext(path_or_file)
    num_lines = 0
    with target as out:
        for trajectory, trace in _rows(trajectories, include_failed):
            if min_reward is not None:
                reward = _reward_of_row(trajectory, trace)
                if reward is None or reward < min_reward:
                    continue
            line: dict[str, Any] = {
                "messages": [*trace.prompt_messages, *trace.response_messages],
                "tools": list(trace.tools),
            }
            if (failure := _failure_of_row(trace)) is not None:
                line["failure"] = failure
            out.write(json.dumps(line, ensure_ascii=False) + "\n")
            num_lines += 1
    return num_lines


# --------------------------------------------------------------------------- Parquet


def parquet_schema() -> Any:
    """The Arrow schema of :func:`to_parquet`'s rows (a ``pyarrow.Schema``).

    Token arrays are list columns; messages, tools and metadata are JSON text (their dicts
    have no fixed shape).

    Raises:
        ImportError: pyarrow is not installed.
    """
    import pyarrow as pa

    ints = pa.list_(pa.int64())
    return pa.schema(
        [
            ("task_id", pa.string()),
            ("session_id", pa.string()),
            ("sample_index", pa.int64()),
            ("status", pa.string()),
            ("trace_index", pa.int64()),
            ("prompt_ids", ints),
            ("response_ids", ints),
            ("loss_mask", pa.list_(pa.int8())),
            ("response_logprobs", pa.list_(pa.float64())),
            ("reward", pa.float64()),
            ("finish_reason", pa.string()),
            ("num_traces_in_session", pa.int64()),
            ("completion_indices", ints),
            ("response_offsets", ints),
            ("policy_versions", ints),
            ("logprob_modes", pa.list_(pa.string())),
            ("prompt_messages", pa.string()),
            ("response_messages", pa.string()),
            ("tools", pa.string()),
            ("metadata", pa.string()),
            ("failure", pa.string()),
        ]
    )


def to_parquet(
    trajectories: Sequence[Trajectory],
    path: str | os.PathLike[str] | IO[bytes],
    *,
    include_failed: bool = False,
) -> int:
    """Write traces to a Parquet file, one row per trace, columns of :func:`parquet_schema`.

    ``reward`` is :func:`trace_reward` (null for an unscored or failed session);
    ``failure`` is the cause as JSON (null but for a failed session's row); ``response_logprobs``
    are float64, so values round-trip exactly. Read back with ``pyarrow.parquet.read_table``
    (or pandas / datasets); ``json.loads`` the message columns.

    Args:
        trajectories: list[Trajectory]; N traces in all.
        path: file path or binary file object.
        include_failed: keep failed sessions' traces (:func:`failed_cause`): all-zero
            ``loss_mask``, null ``reward``, ``failure`` set (also in ``metadata``).

    Returns:
        N, the number of rows written (an empty file with the schema when N is 0).

    Raises:
        ImportError: pyarrow is not installed (``pip install 'rolloutd[parquet]'``).
    """
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as e:
        raise ImportError("to_parquet needs pyarrow: pip install 'rolloutd[parquet]'") from e

    schema = parquet_schema()
    columns: dict[str, list[Any]] = {name: [] for name in schema.names}
    for trajectory, trace in _rows(trajectories, include_failed):
        failure = _failure_of_row(trace)
        values = {
            "task_id": trajectory.task_id,
            "session_id": trajectory.session_id,
            "sample_index": trajectory.sample_index,
            "status": trajectory.status.value,
            "trace_index": trace.trace_index,
            "prompt_ids": trace.prompt_ids,
            "response_ids": trace.response_ids,
            "loss_mask": trace.loss_mask,
            "response_logprobs": trace.response_logprobs,
            "reward": _reward_of_row(trajectory, trace),
            "finish_reason": trace.finish_reason,
            "num_traces_in_session": trace.num_traces_in_session,
            "completion_indices": trace.completion_indices,
            "response_offsets": trace.response_offsets,
            "policy_versions": trace.policy_versions,
            "logprob_modes": list(trace.logprob_modes),
            "prompt_messages": json.dumps(trace.prompt_messages, ensure_ascii=False),
            "response_messages": json.dumps(trace.response_messages, ensure_ascii=False),
            "tools": json.dumps(trace.tools, ensure_ascii=False),
            "metadata": json.dumps(trace.metadata, ensure_ascii=False),
            "failure": None if failure is None else json.dumps(failure, ensure_ascii=False),
        }
        for name, value in values.items():
            columns[name].append(value)
    table = pa.Table.from_pydict(columns, schema=schema)
    pq.write_table(table, path)
    return table.num_rows
