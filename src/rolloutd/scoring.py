"""Which sessions of a group carry a reward the policy earned, and the pure rules read from that
answer: one definition each, for every reader.

A reward measures the policy, never the infrastructure (docs/decisions.md, "Failure causes
and rewards"). The task's group stats (:func:`rolloutd.workflows.task.summarize`), the
buffer's DAPO filter and :mod:`rolloutd.trainer_client.training.grpo` all ask "which rewards of
this group count?"; they ask it here, so the answer cannot drift apart (before, the buffer
zero-filled missing rewards while the other two skipped them).

The rule: a session is **scored** when it has a reward and either ran to its end
(``failure is None``) or timed out in the run phase while the policy was accountable (the only
failure the policy owns; the session workflow gives such a session a reward only then).

On it rest :func:`is_zero_variance` (DAPO's filter: the buffer workflow, the trainer's GRPO
helpers) and :func:`failure_counts` (sessions by failure kind: the task's summary, ``rolloutd
status``, ``rolloutd submit``, REST's task status).

Deterministic and I/O-free: workflow code imports it.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rolloutd.types import FailureCause, SessionResult, SessionStatus, TaskResult, Trajectory

__all__ = [
    "FLEET_DOWN_MARKERS",
    "JUDGE_FAILURE",
    "failure_counts",
    "failure_key",
    "failure_of",
    "is_fleet_down",
    "is_policy_timeout",
    "is_replaceable",
    "is_scored",
    "is_zero_variance",
    "judge_failure",
    "pass_at_k",
    "pass_rates",
    "scored_rewards",
    "scored_sessions",
]

#: text of :class:`rolloutd.errors.NoSandboxWorkerError` (raised by the session workflow when
#: no sandbox worker polls): a failure with it says the fleet was down, not this sample.
FLEET_DOWN_MARKERS = (
    "no sandbox worker is alive",
    "no sandbox worker is polling",  # results recorded before liveness came from heartbeats
    "NoSandboxWorkerError",
)


def failure_of(result: SessionResult | Trajectory) -> FailureCause | None:
    """The failure cause of a session, also for results recorded before causes existed.

    ``result.failure`` when it is set. Otherwise the status decides, as results were written
    before the session workflow set causes: ``cancelled`` is a cancellation; ``failed`` was
    only ever an activity error, a lost host or no sandbox worker, i.e. infrastructure
    (retryable; ``sandbox`` kind, the phase unknown); ``timeout`` without a reward is an
    infrastructure timeout; ``timeout`` with a reward was evaluated as the policy's run-phase
    timeout.

    Args:
        result: a session's result, or its trajectory.

    Returns:
        The cause, or None for a session that ran to its end.
    """
    if result.failure is not None:
        return result.failure
    message = getattr(result, "error", None) or result.status.value
    if result.status == SessionStatus.CANCELLED:
        return FailureCause(kind="cancelled", message=message, retryable=False)
    if result.status == SessionStatus.FAILED:
        return FailureCause(kind="sandbox", message=message, retryable=True)
    if result.status == SessionStatus.TIMEOUT:
        evaluated = result.reward is not None
        return FailureCause(
            kind="timeout",
            message=message,
            phase="run" if evaluated else None,
            retryable=not evaluated,
            policy_accountable=evaluated,
        )
    return None


def is_policy_timeout(failure: FailureCause) -> bool:
    """A failure the policy is accountable for (``FailureCause.policy_accountable``, set by the
    session workflow): a run-phase timeout while the model kept answering (no backend error
    stood unrecovered and no call waited on the engine at the deadline), or a ceiling its run
    reached after an answered call (reward 0.0). The only failures a reward may measure; the
    task's ``timeout_reward`` may still leave a timeout unscored."""
    return failure.policy_accountable


def is_scored(result: SessionResult | Trajectory) -> bool:
    """Whether a session's reward counts: it has one, and it ran to its end or its run-phase
    timeout is the policy's.

    Args:
        result: a session's result, or its trajectory.
    """
    if result.reward is None:
        return False
    failure = failure_of(result)
    return failure is None or is_policy_timeout(failure)


def scored_sessions(group: TaskResult | Iterable[SessionResult]) -> list[SessionResult]:
    """The scored sessions of a group (:func:`is_scored`), in their given order.

    Args:
        group: a task's group, or its sessions.

    Returns:
        list[SessionResult], length ≤ G; every one has a reward.
    """
    sessions = group.sessions if isinstance(group, TaskResult) else group
    return [s for s in sessions if is_scored(s)]


def scored_rewards(group: TaskResult | Iterable[SessionResult]) -> list[float]:
    """The rewards of :func:`scored_sessions`, as floats, in session order (length ≤ G)."""
    return [float(s.reward) for s in scored_sessions(group)]  # type: ignore[arg-type]


def is_fleet_down(failure: FailureCause) -> bool:
    """Whether a failure says the sandbox fleet was down (no worker polled its queue), not
    that this sample failed: its replacement waits for the fleet and is not counted against
    ``TaskRequest.max_replacements``. The message decides (``NoSandboxWorkerError``'s text),
    whichever kind the session gave it (``sandbox`` by the taxonomy)."""
    return failure.kind != "cancelled" and any(m in failure.message for m in FLEET_DOWN_MARKERS)


def is_replaceable(result: SessionResult) -> bool:
    """Whether a new attempt of the sample may make the group whole: the session ended with
    a retryable cause that is not the policy's and not a cancellation."""
    failure = failure_of(result)
    return (
        failure is not None
        and failure.retryable
        and failure.kind != "cancelled"
        and not is_policy_timeout(failure)
    )


#: the count key of a judge's failure: kind ``evaluator``, phase ``judge`` (a judge pool that
#: gave no answer; the session has no reward, and its judging can be re-run)
JUDGE_FAILURE = "evaluator/judge"


def judge_failure(message: str) -> FailureCause:
    """The failure cause of a session whose judging was given up after
    ``judge.max_attempts``: the infrastructure's (``evaluator``, phase ``judge``), no reward;
    never re-sampled nor replaced (``retryable`` false: the sample ran well), its judging re-run
    on the stored trajectory instead."""
    return FailureCause(kind="evaluator", phase="judge", message=message[:500], retryable=False)


def failure_key(failure: FailureCause | None) -> str:
    """What a failure is counted under in summaries and metrics: its kind, and for a judge's
    failure ``evaluator/judge`` (:data:`JUDGE_FAILURE`); ``none`` for no failure."""
    if failure is None:
        return "none"
    if failure.kind == "evaluator" and failure.phase == "judge":
        return JUDGE_FAILURE
    return failure.kind


def failure_counts(
    sessions: Iterable[SessionResult], *, count_none: bool = False
) -> dict[str, int]:
    """How many sessions ended with each failure kind (:func:`failure_of`, so results written
    before causes existed count too), in kind order; policy-accountable run timeouts count
    under ``timeout``, a judge's failures under ``evaluator/judge`` (:func:`failure_key`).

    Args:
        sessions: the sessions counted (one group's, or every group's of a run).
        count_none: also count the sessions that ran to their end, under ``none`` (what
            ``rolloutd submit`` prints and REST's task status shows); else kinds with no
            session are left out (the task's and buffer's ``num_failed_by_kind``).

    Returns:
        kind -> number of sessions, sorted by kind.
    """
    counts = Counter(failure_key(failure_of(s)) for s in sessions)
    if not count_none:
        counts.pop("none", None)
    return dict(sorted(counts.items()))


def is_zero_variance(rewards: TaskResult | Sequence[float]) -> bool:
    """Whether a group's rewards carry no relative signal: all equal, or fewer than two.

    Such a group gets all-zero GRPO advantages (DeepSeekMath, arXiv 2402.03300, section
    4.1.2), so it adds no policy gradient; DAPO's dynamic sampling (arXiv 2503.14476, section
    3.2: keep a group only when ``0 < |{correct}| < G``) drops it. The buffer's filter
    (:class:`rolloutd.workflows.buffer.workflow.RolloutBufferWorkflow`), the trainer's
    :func:`rolloutd.trainer_client.training.grpo.dapo_filter` and
    :func:`~rolloutd.trainer_client.training.grpo.group_advantages` all ask it here.

    Equality is exact (``max == min``): rewards are usually discrete (0/1 accuracy), and any
    difference, however small, is a real ranking that GRPO turns into a bounded advantage.

    A group of one is zero-variance here. verl's DAPO filter (``recipe/dapo``, ``std > 0 or
    len == 1``) keeps singletons and verl's GRPO gives them their raw score as advantage;
    rolloutd treats a singleton as having no baseline, hence no signal.

    Args:
        rewards: a task's group (its scored sessions' rewards, :func:`scored_rewards`: a
            session without a scored reward is left out, never counted as 0.0), or the
            rewards themselves, list[float] of length G.

    Returns:
        True when ``G < 2`` or every reward is equal.

    Raises:
        ValueError: a reward is NaN or infinite.
    """
    values = (
        scored_rewards(rewards) if isinstance(rewards, TaskResult) else [float(r) for r in rewards]
    )
    for position, value in enumerate(values):
        if not math.isfinite(value):
            raise ValueError(f"reward {position} is {value}; rewards must be finite")
    return len(values) < 2 or max(values) == min(values)


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate of one problem: 1 - C(n-c, k) / C(n, k).

    Chen et al. 2021 (arXiv 2107.03374), eq. 1, from ``n`` samples of which ``c`` pass.
    """
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass
class PassRates:
    """pass@1 and pass@k over a run's rows (:func:`pass_rates`).

    Attributes:
        pass_at_1: mean over rows with a scored sample of passing / scored (None: no such
            row).
        pass_at_k: mean of :func:`pass_at_k` over rows with at least ``k`` scored samples
            (None: no such row).
        num_rows_failed: rows without a scored sample.
        num_passing: scored samples whose reward is >= the pass reward.
    """

    pass_at_1: float | None = None
    pass_at_k: float | None = None
    num_rows_failed: int = 0
    num_passing: int = 0


def pass_rates(
    rows: Iterable[Sequence[SessionResult]], k: int, pass_reward: float = 1.0
) -> PassRates:
    """pass@1 and pass@k of a run, one definition for ``rolloutd generate`` and ``rolloutd
    eval``: a sample passes when its reward is ``>= pass_reward``; a sample that is not
    scored (:func:`is_scored`: an infrastructure failure) is left out, never counted as a
    fail.

    Args:
        rows: each row's final sessions (one per sample; replaced ones left out).
        k: the k of pass@k (the samples per row).
        pass_reward: the reward from which a sample passes.

    Returns:
        The rates (Chen et al. 2021, arXiv 2107.03374, eq. 1 for pass@k).
    """
    rates: list[float] = []
    estimates: list[float] = []
    out = PassRates()
    for sessions in rows:
        rewarded = scored_rewards(sessions)
        passing = sum(reward >= pass_reward for reward in rewarded)
        out.num_passing += passing
        if not rewarded:
            out.num_rows_failed += 1
            continue
        rates.append(passing / len(rewarded))
        if len(rewarded) >= k:
            estimates.append(pass_at_k(len(rewarded), passing, k))
    out.pass_at_1 = sum(rates) / len(rates) if rates else None
    out.pass_at_k = sum(estimates) / len(estimates) if estimates else None
    return out
