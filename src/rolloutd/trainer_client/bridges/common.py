"""What every trainer bridge shares: one session as one training sequence, the rule that keeps
failed sessions out, the counts a bridge reports, and running the async client from a
trainer's synchronous code.

A trainer that reshapes by group size (TRL's GRPO, SkyRL's generator) needs exactly one
sequence per sample. A rolloutd session gives one when its trajectory holds one trace (the
``prefix_merging`` builder in ``tokens`` capture mode merges a multi-turn session into one).
A session is **usable** when it is scored (:func:`rolloutd.scoring.is_scored`: it ran to its
end, or its run-phase timeout is the policy's, and it has a reward) and has exactly one trace
with response tokens. Everything else is left out and counted: a reward measures the policy,
never the infrastructure, so a session with a failure cause never reaches a trainer with a
reward.

Imports no trainer package: each bridge module (``trl``, ``verl``, ``skyrl``,
``verifiers``) imports its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rolloutd.scoring import failure_of, is_scored
from rolloutd.trainer_client.tracking import PREFIX
from rolloutd.trajectory.versions import token_policy_versions
from rolloutd.types import RoutedExperts, SessionResult, TaskResult, Trace, Trajectory

T = TypeVar("T")

__all__ = [
    "TASK_FIELDS",
    "BridgeStats",
    "GroupSamples",
    "LoopRunner",
    "RoutesLoader",
    "SessionSample",
    "group_samples",
    "instruction_of",
    "session_sample",
]

#: task fields (:class:`rolloutd.types.TaskRequest`) a trainer's dataset row may set
TASK_FIELDS = (
    "instruction",
    "harness",
    "runtime",
    "evaluator",
    "builder",
    "sampling",
    "phases",
    "timeout_s",
    "max_replacements",
    "max_session_attempts",
    "model",
    "tenant",
    "priority",
    "metadata",
    "timeout_reward",
)


def instruction_of(prompt: Any, what: str = "a prompt") -> str:
    """The task's instruction from a trainer's prompt: the prompt itself when it is text, else
    the text of the last user message of a conversation (a list of ``{"role", "content"}``
    messages, the chat format of TRL, verl and SkyRL datasets).

    Args:
        prompt: a string, or a list of message dicts.
        what: how the error names the prompt.

    Raises:
        ValueError: a conversation without a last user message with text content.
    """
    if isinstance(prompt, str):
        return prompt
    users = [m for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
    if not users or not isinstance(users[-1].get("content"), str):
        raise ValueError(f"{what} needs a last user message with text content")
    return users[-1]["content"]


@dataclass
class SessionSample:
    """One usable session as one training sequence.

    Invariant: ``len(response_ids) == len(loss_mask) == len(response_logprobs)``; positions
    with ``loss_mask == 1`` are tokens the engine sampled, with the logprob it reported; the
    others (tool output, user turns between calls) are 0 in both.

    Attributes:
        session_id / task_id / sample_index: where it comes from.
        prompt_ids: list[int], length P: the first prompt of the session's chain.
        response_ids: list[int], length R: everything after it.
        loss_mask: list[int] of 0/1, length R.
        response_logprobs: list[float], length R, nats.
        reward: the session's outcome reward (never None here).
        finish_reason: the last completion's (``stop``, ``length``, ``tool_calls``).
        policy_versions: the policy versions that sampled its completions, in order.
        num_turns: model calls merged into the sequence.
        trace: the trace itself.
        token_policy_versions: list[int], length R: the version that sampled each response
            position (:func:`rolloutd.trajectory.versions.token_policy_versions`).
        logprob_modes: each merged completion's log-prob mode, in order.
        routed_experts: ``numpy.ndarray`` ``(rows, num_layers, top_k)`` of ``prompt_ids +
            response_ids`` from position 0 (R3), or None: loaded only when a loader is given.
    """

    session_id: str
    task_id: str
    sample_index: int
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    response_logprobs: list[float]
    reward: float
    finish_reason: str
    policy_versions: list[int]
    num_turns: int
    trace: Trace
    token_policy_versions: list[int] = field(default_factory=list)
    logprob_modes: list[str] = field(default_factory=list)
    routed_experts: Any = None


@dataclass
class GroupSamples:
    """A task's group as a trainer sees it.

    Attributes:
        task_id: the task (the GRPO group).
        samples: the usable sessions, in sample order.
        num_samples: sessions the task asked for (G).
        left_out: session id -> why it was left out (failure kind, ``unscored``,
            ``no_trajectory``, ``num_traces=k``, ``empty_response``).
        num_replacements: sessions rolloutd replaced (infrastructure failures made good).
    """

    task_id: str
    samples: list[SessionSample]
    num_samples: int
    left_out: dict[str, str] = field(default_factory=dict)
    num_replacements: int = 0

    @property
    def whole(self) -> bool:
        """Every one of the G samples is usable."""
        return len(self.samples) == self.num_samples


@dataclass
class BridgeStats:
    """What a bridge handed a trainer and what it left out, cumulative.

    Attributes:
        num_groups: groups seen.
        num_groups_masked: groups a whole-group trainer got masked (not whole).
        num_sessions: sessions seen (the last attempt of each sample).
        num_sessions_left_out: sessions left out (failed, unscored, not one trace).
        left_out_by_reason: reason -> count.
        num_replacements: sessions rolloutd replaced inside the groups.
    """

    num_groups: int = 0
    num_groups_masked: int = 0
    num_sessions: int = 0
    num_sessions_left_out: int = 0
    left_out_by_reason: dict[str, int] = field(default_factory=dict)
    num_replacements: int = 0

    def add(self, group: GroupSamples, *, masked: bool = False) -> None:
        """Count one group (``masked``: the trainer got it masked whole)."""
        self.num_groups += 1
        self.num_groups_masked += int(masked)
        self.num_sessions += len(group.samples) + len(group.left_out)
        self.num_sessions_left_out += len(group.left_out)
        self.num_replacements += group.num_replacements
        for reason in group.left_out.values():
            self.left_out_by_reason[reason] = self.left_out_by_reason.get(reason, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        """The counts as a plain dict (for logs and metrics)."""
        return {
            "num_groups": self.num_groups,
            "num_groups_masked": self.num_groups_masked,
            "num_sessions": self.num_sessions,
            "num_sessions_left_out": self.num_sessions_left_out,
            "left_out_by_reason": dict(self.left_out_by_reason),
            "num_replacements": self.num_replacements,
        }

    def metrics(self) -> dict[str, float]:
        """The counts as tracker scalars: ``rolloutd/bridge/{count}`` and
        ``rolloutd/bridge/left_out/{reason}`` (:mod:`rolloutd.trainer_client.tracking`)."""
        counts = {k: v for k, v in self.as_dict().items() if isinstance(v, int)}
        counts.update({f"left_out/{k}": n for k, n in self.left_out_by_reason.items()})
        return {f"{PREFIX}bridge/{k}": float(v) for k, v in counts.items()}


#: reads a trace's routed experts: ``functools.partial(rolloutd.routes.load_routes, store)``.
#: A bridge that hands routes to its trainer (verl, SkyRL) passes one; this module does not
#: import :mod:`rolloutd.routes` (NumPy), so the client install imports TRL's rollout function.
RoutesLoader = Callable[[RoutedExperts], Any]


def session_sample(
    session: SessionResult, trajectory: Trajectory | None, routes: RoutesLoader | None = None
) -> SessionSample | str:
    """One session as a training sequence, or why it is left out.

    Args:
        session: the session's result.
        trajectory: its stored trajectory (None when it has none).
        routes: reads its routed experts (:data:`RoutesLoader`; None: not read).

    Returns:
        The :class:`SessionSample`, or the reason it is left out: the failure cause's kind
        (``backend``, ``sandbox``, ...), ``unscored``, ``no_trajectory``, ``num_traces=k``
        (k != 1) or ``empty_response``.
    """
    if not is_scored(session):
        failure = failure_of(session)
        return failure.kind if failure is not None else "unscored"
    if trajectory is None:
        return "no_trajectory"
    if len(trajectory.traces) != 1:
        return f"num_traces={len(trajectory.traces)}"
    trace = trajectory.traces[0]
    if not trace.response_ids:
        return "empty_response"
    return SessionSample(
        session_id=session.session_id,
        task_id=session.task_id,
        sample_index=session.sample_index,
        prompt_ids=list(trace.prompt_ids),
        response_ids=list(trace.response_ids),
        loss_mask=list(trace.loss_mask),
        response_logprobs=list(trace.response_logprobs),
        reward=float(session.reward),  # type: ignore[arg-type]
        finish_reason=trace.finish_reason,
        policy_versions=list(trace.policy_versions),
        num_turns=len(trace.completion_indices),
        trace=trace,
        token_policy_versions=token_policy_versions(trace),
        logprob_modes=list(trace.logprob_modes),
        routed_experts=(
            routes(trace.routed_experts)
            if routes is not None and trace.routed_experts is not None
            else None
        ),
    )


def group_samples(
    group: TaskResult,
    load: Any,
    num_samples: int | None = None,
    routes: RoutesLoader | None = None,
) -> GroupSamples:
    """A task's group as training sequences, its left-out sessions named.

    Args:
        group: the task's result.
        load: ``RolloutClient.trajectory`` (a callable ``SessionResult -> Trajectory``).
        num_samples: G, the sessions the task asked for (default: ``len(group.sessions)``).
        routes: reads routed experts (:data:`RoutesLoader`; None: not read).

    Returns:
        The group's usable samples in sample order and the others with their reason.
    """
    out = GroupSamples(
        task_id=group.task_id,
        samples=[],
        num_samples=num_samples if num_samples is not None else len(group.sessions),
        num_replacements=group.num_replacements,
    )
    for session in sorted(group.sessions, key=lambda s: s.sample_index):
        trajectory = load(session) if session.trajectory_ref else None
        sample = session_sample(session, trajectory, routes)
        if isinstance(sample, str):
            out.left_out[session.session_id] = sample
        else:
            out.samples.append(sample)
    return out


class LoopRunner:
    """Runs the async trainer client's coroutines from a trainer's synchronous code.

    A trainer's step (TRL's ``rollout_func``, a callback) is plain blocking code, often in
    another thread than the event loop that owns the Temporal client. Given that loop, each
    call submits the coroutine to it and waits (``asyncio.run_coroutine_threadsafe``); it must
    not be called from the loop's own thread.

    Args:
        loop: the running event loop that owns the client.
        timeout_s: bound on one call, s (None: unbounded).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, *, timeout_s: float | None = None):
        self.loop = loop
        self.timeout_s = timeout_s

    def __call__(self, coro: Coroutine[Any, Any, T] | Awaitable[T]) -> T:
        """Run ``coro`` on the loop and return its result.

        Raises:
            RuntimeError: called from the loop's own thread (it would deadlock).
            TimeoutError: ``timeout_s`` passed.
        """
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self.loop:
            raise RuntimeError("LoopRunner called from its own event loop's thread")
        future = asyncio.run_coroutine_threadsafe(_as_coroutine(coro), self.loop)
        return future.result(self.timeout_s)


async def _as_coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable
