"""Shared domain models: the project's vocabulary (one meaning per term) as pydantic models.

Every model here crosses a process boundary (Temporal payloads, the blob store, the trainer
client), so new fields always get defaults: old and new workers must interoperate.

Token arrays (``*_ids``, ``response_logprobs``) live in :class:`Completion` and :class:`Trace`
(:mod:`rolloutd.records`), which are stored in the blob store; Temporal payloads carry
references to them, never the arrays. The task's specs are :mod:`rolloutd.task_spec`'s. Both
are re-exported here.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from pydantic import Field, field_validator

from rolloutd.payload import Payload
from rolloutd.records import (
    BuilderStats,
    CaptureMode,
    Completion,
    EvaluationRecord,
    FailureCause,
    FailureKind,
    JudgeCost,
    LogprobMode,
    RoutedExperts,
    SamplingUsed,
    SessionStatus,
    TamperFinding,
    TamperReport,
    Timings,
    Trace,
    Trajectory,
)
from rolloutd.task_spec import (
    CONTAINER_RUNTIMES,
    ISOLATING_RUNTIMES,
    BuilderSpec,
    EvaluatorSpec,
    ExecStep,
    HarnessSpec,
    ImageBuild,
    PhaseTimeouts,
    PrepareStep,
    RuntimeSpec,
    UploadStep,
)

#: the task's specs live in :mod:`rolloutd.task_spec`, completions and trajectories in
#: :mod:`rolloutd.records`; callers import them from here
__all__ = [
    "CONTAINER_RUNTIMES",
    "ISOLATING_RUNTIMES",
    "BuilderStats",
    "CaptureMode",
    "Completion",
    "EvaluationRecord",
    "ExecStep",
    "ImageBuild",
    "FailureCause",
    "FailureKind",
    "JudgeCost",
    "LogprobMode",
    "PrepareStep",
    "RoutedExperts",
    "SamplingUsed",
    "SessionStatus",
    "TamperFinding",
    "TamperReport",
    "Timings",
    "Trace",
    "Trajectory",
    "UploadStep",
]

#: task ids become workflow ids and blob-store folders, so they are kept path- and URL-safe.
TASK_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: the tenant of a task that names none
DEFAULT_TENANT = "default"
#: Temporal's default priority key (1 first ... 5 last)
DEFAULT_PRIORITY = 3
#: ``TaskRequest.fairness_weight`` unless a task gives one
DEFAULT_FAIRNESS_WEIGHT = 1.0


# --------------------------------------------------------------------------- task request


class SamplingParams(Payload):
    """Sampling parameters of a task.

    ``policy`` decides who wins when the harness sends its own values: ``respect`` keeps the
    harness's temperature/top_p/max_tokens where it set them, ``override`` always uses these.
    """

    temperature: float = Field(default=1.0, ge=0.0, le=5.0, description="softmax temperature")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="nucleus sampling mass")
    top_k: int = Field(default=0, ge=0, description="top-k cut-off; 0 disables it")
    max_tokens: int = Field(default=1024, ge=1, le=1_000_000, description="tokens per call")
    seed: int | None = Field(default=None, description="sampling seed; None for random")
    policy: Literal["respect", "override"] = Field(
        default="override", description="who wins when the harness sends its own values"
    )


class TaskRequest(Payload):
    """One problem instance, run as ``num_samples`` sessions (the GRPO group size).

    Raises:
        pydantic.ValidationError: on any malformed field; the error names the field's path.
    """

    task_id: str = Field(description="business key; becomes the workflow id `task/{task_id}`")
    instruction: str = Field(min_length=1, description="what the agent is asked to do")
    num_samples: int = Field(default=1, ge=1, le=1024, description="sessions of this task")
    timeout_s: float = Field(default=900.0, gt=0, le=7 * 86_400, description="session deadline")
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec)
    harness: HarnessSpec
    builder: BuilderSpec = Field(default_factory=BuilderSpec)
    evaluator: EvaluatorSpec = Field(default_factory=EvaluatorSpec)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    phases: PhaseTimeouts = Field(default_factory=PhaseTimeouts)
    max_session_attempts: int = Field(
        default=3,
        ge=1,
        le=10,
        description="attempts of a session whose sandbox host is lost "
        "(each on a fresh runtime and a fresh gateway session; docs/faults.md)",
    )
    max_replacements: int = Field(
        default=2,
        ge=0,
        le=64,
        description="new sessions of a sample that ended with a "
        "retryable infrastructure cause, per group (the replacement keeps its sample_index); "
        "a failure because the sandbox fleet was down waits for the fleet (up to "
        "phases.provision_wait_s) and is not counted",
    )
    model: str | None = Field(default=None, description="model name shown to the harness")
    tenant: str = Field(
        default=DEFAULT_TENANT,
        description="the trainer job, evaluation or generation the "
        "task belongs to: the fairness key of every activity and child workflow of the task "
        "(Temporal task fairness), and the key of its quota of sessions in flight "
        "(docs/tenancy.md)",
    )
    priority: int = Field(
        default=DEFAULT_PRIORITY,
        ge=1,
        le=5,
        description="Temporal task priority key of "
        "every activity and child workflow of the task: 1 is served first, 5 last, 3 is "
        "Temporal's default (docs.temporal.io/develop/task-queue-priority-fairness)",
    )
    fairness_weight: float = Field(
        default=DEFAULT_FAIRNESS_WEIGHT,
        gt=0.0,
        le=1000.0,
        description="the tenant's share among tasks of equal "
        "priority: a tenant of weight 2 gets about twice the dispatches of one of weight 1",
    )
    resume: Literal["replay", "restart"] = Field(
        default="replay",
        description="what a new attempt of a sample does (after a lost "
        "sandbox host, or as the replacement of a session that failed for infrastructure): "
        "'replay' answers each request identical to one the earlier attempt recorded from "
        "that record, without an engine call, so every conversation replays until its first "
        "difference, then samples; 'restart' samples everything again (docs/sessions.md, "
        '"Replay across attempts")',
    )
    replay_max_staleness: int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        description="policy versions a replayed completion may "
        "lag behind the current version of the session's backend; 0: replay only what the "
        "current version sampled",
    )
    timeout_reward: Literal["evaluate"] | float | None = Field(
        default="evaluate",
        description="the reward of a session whose run phase timed out "
        "while the policy was accountable (no backend error stood unrecovered, no call was "
        "waiting on the backend at the deadline, the budget was not shortened by a lost "
        "attempt): 'evaluate' scores it as any other session, a number is its reward, null "
        "leaves it unscored (reward None; docs/failures.md)",
    )
    invalid_tool_call_reward: float | None = Field(
        default=None,
        description="the reward forced on a session one of whose completions "
        "holds a tool call the parser could not read (the model's doing, tokens mode); "
        "None (default): no forcing, the evaluator scores it (POLAR forces 0.0)",
    )
    store_final_state: bool = Field(
        default=False,
        description="store each session's final state (what its evaluator needs to score it "
        "again without sampling: the workdir, with a container's system changes, an answer "
        "file or the patch) in the blob store, bounded by the sandbox fleet's "
        "max_final_state_bytes, with the image digest, for `rolloutd reverify` "
        "(docs/task_sets.md)",
    )
    metadata: dict[str, Any] = Field(default_factory=dict, description="free-form, kept")
    callback_url: str | None = Field(
        default=None,
        description="each session's SessionResult is POSTed here when it ends, "
        "after the task stored it (retried with backoff, never holding the task open)",
    )
    callback_secret: str | None = Field(
        default=None,
        repr=False,
        min_length=16,
        max_length=256,
        description="the key each callback POST is signed with (HMAC-SHA256 in the "
        "`X-Rolloutd-Signature` header, rolloutd.security.callbacks); None with a "
        "callback_url: the client generates one at submit (RolloutHandle.task, and the REST "
        "facade's submit answer, carry it)",
    )
    callback_timeout_s: float = Field(
        default=300.0,
        gt=0,
        le=86_400,
        description="total time of one session's callback over "
        "all its attempts, queue time included; then it is marked failed in the task's status",
    )
    report_to: str | None = Field(
        default=None,
        description="workflow id signalled `group_finished` with the group "
        "(set by RolloutBufferWorkflow on the tasks it starts)",
    )
    inline_result_bytes: int = Field(
        default=256 * 1024,
        ge=1024,
        le=1024 * 1024,
        description="a finished group whose JSON is larger (bytes) is stored in the blob store "
        "(``groups/{task_id}.json``) and the task's workflow returns it by reference "
        "(``TaskResult.stored_key``, ``sessions`` empty): Temporal refuses a payload over "
        "2 MB, and 1,024 sessions' results come to about 2.1 MB",
    )

    @field_validator("task_id")
    @classmethod
    def _safe_task_id(cls, task_id: str) -> str:
        if not TASK_ID_PATTERN.match(task_id):
            raise ValueError(
                "task_id must be 1-128 characters of letters, digits, '.', '_' or '-', "
                "starting with a letter or digit"
            )
        return task_id

    @field_validator("tenant")
    @classmethod
    def _safe_tenant(cls, tenant: str) -> str:
        return check_tenant(tenant)

    @field_validator("callback_url")
    @classmethod
    def _http_callback(cls, url: str | None) -> str | None:
        if url is not None and not re.match(r"^https?://[^/\s]+(/\S*)?$", url):
            raise ValueError(f"callback_url {url!r} is not an http(s) URL")
        return url


def check_tenant(tenant: str) -> str:
    """``tenant``, when it is a valid tenant name: it names a workflow id (``tenant/{tenant}``).

    Raises:
        ValueError: not 1-128 letters, digits, '.', '_' or '-' starting with a letter or digit.
    """
    if not TASK_ID_PATTERN.match(tenant):
        raise ValueError(
            "tenant must be 1-128 characters of letters, digits, '.', '_' or '-', "
            f"starting with a letter or digit, not {tenant!r}"
        )
    return tenant


# --------------------------------------------------------------------------- results


class PhaseTiming(Payload):
    """Execution time of one session phase, seconds."""

    phase: str
    duration_s: float = Field(ge=0)
    started_at: datetime | None = Field(default=None, description="workflow time, UTC")
    ended_at: datetime | None = Field(default=None, description="workflow time, UTC")


class SessionAttempt(Payload):
    """An attempt of a session that was given up because its sandbox host was lost."""

    attempt: int = Field(ge=1, description="1-based attempt number")
    session_id: str = Field(
        description="the attempt's gateway session (its completion log stays in the store, "
        "sealed, and is not part of the trajectory)",
    )
    error: str = Field(description="why the attempt was given up")
    num_completions: int = Field(default=0, description="completions recorded in that attempt")


class ReplayEnd(Payload):
    """Where one conversation of a resumed session stopped replaying, and why."""

    last_index: int = Field(
        ge=0,
        description="index in the new log of the conversation's last replayed completion",
    )
    source: str = Field(description="``{session_id}#{index}`` of the completion it replayed")
    reason: Literal["body_differed", "source_ended"] = Field(
        description="``body_differed``: the source's conversation went on, but the next request "
        "differed from its recorded one (a tool output changed, the harness chose "
        "another path), or its recorded next completion was too stale to replay; "
        "``source_ended``: the source recorded nothing after it (the attempt died "
        "there)",
    )


class ReplayStats(Payload):
    """What replay across attempts did for a session (docs/sessions.md, "Replay across
    attempts"); all zero when the session had no earlier attempt or ``resume`` is
    ``restart``.
    """

    sources: list[str] = Field(
        default_factory=list,
        description="gateway session ids of the earlier attempts replayed from, newest first",
    )
    num_source_completions: int = Field(
        default=0,
        ge=0,
        description="completions of those attempts offered for replay (each earlier completion "
        "once: one a later attempt replayed already is offered as that attempt's "
        "copy)",
    )
    num_replayed: int = Field(
        default=0,
        ge=0,
        description="calls answered from the source, without an engine call",
    )
    num_not_replayed: int = Field(
        default=0,
        ge=0,
        description="source completions never replayed (they stay in their sealed logs, out of "
        "training)",
    )
    num_stale: int = Field(
        default=0,
        ge=0,
        description="source completions whose request came again but whose policy version lagged "
        "more than ``replay_max_staleness``: sampled again",
    )
    num_prompt_tokens_saved: int = Field(
        default=0,
        ge=0,
        description="the engine tokens replay saved (prompt tokens not prefilled, response tokens "
        "not sampled)",
    )
    num_response_tokens_saved: int = Field(
        default=0,
        ge=0,
        description="the engine tokens replay saved (prompt tokens not prefilled, response tokens "
        "not sampled)",
    )
    ends: list[ReplayEnd] = Field(
        default_factory=list,
        description="per replayed conversation, where and why its replay ended",
    )


class SessionResult(Payload):
    """What a session returns to its parent: a summary and references, never token arrays."""

    session_id: str
    task_id: str
    sample_index: int = 0
    status: SessionStatus
    reward: float | None = None
    trace_rewards: list[float] | None = None
    error: str | None = None
    num_completions: int = 0
    num_call_errors: int = Field(
        default=0,
        description="model calls answered with an error (backend failure, bad "
        "request), not in the completion log; the last ones are in the session state",
    )
    num_unrecovered_call_errors: int = Field(
        default=0,
        description="of those, calls answered with a 5xx (gateway or backend "
        "failure) that no later completion of the session made good: none answered the same "
        "request (equal request hash) or the same conversation (equal messages; a longer "
        "conversation that went on without the answer does not count)",
    )
    last_call_error: str | None = Field(
        default=None,
        description="the last failed call in words, e.g. '502 BackendError: backend b0: ...'",
    )
    num_traces: int = 0
    num_trainable_tokens: int = 0
    trajectory_ref: str | None = Field(default=None, description="blob-store key")
    harness_exit_code: int | None = None
    phases: list[PhaseTiming] = Field(default_factory=list)
    stats: BuilderStats = Field(default_factory=BuilderStats)
    attempts: list[SessionAttempt] = Field(
        default_factory=list, description="earlier attempts given up (sandbox host lost)"
    )
    failure: FailureCause | None = Field(
        default=None, description="why the session did not run to its end; None when it did"
    )
    evaluation: EvaluationRecord | None = Field(
        default=None,
        description="the scoring its reward came from: evaluator and version, reward, reason, "
        "tamper report, judge cost (None: not evaluated)",
    )
    replay: ReplayStats = Field(
        default_factory=ReplayStats,
        description="calls this attempt replayed from earlier "
        "attempts instead of sampling them, where each conversation's replay ended and why, "
        "and the engine tokens saved",
    )


class TaskResult(Payload):
    """A task's group of sessions with group stats.

    Group stats (``mean_reward``, ``reward_std``) are over the scored sessions only
    (:func:`rolloutd.scoring.scored_sessions`): a session that failed for infrastructure has
    no reward and is never averaged in.
    """

    task_id: str
    sessions: list[SessionResult] = Field(
        default_factory=list,
        description="one result per sample index (the last attempt of a replaced sample)",
    )
    mean_reward: float | None = None
    reward_std: float | None = None
    num_completed: int = 0
    metadata: dict[str, Any] = Field(default_factory=dict)
    replaced: list[SessionResult] = Field(
        default_factory=list,
        description="the sessions that a replacement superseded, in the order they ended",
    )
    num_replacements: int = Field(
        default=0,
        ge=0,
        description="replacements started (fleet-down ones included)",
    )
    num_scored: int = Field(
        default=0,
        ge=0,
        description="sessions whose reward counts; ``incomplete`` when fewer than ``num_samples``",
    )
    incomplete: bool = False
    num_failed_by_kind: dict[str, int] = Field(
        default_factory=dict,
        description="failure kind -> sessions of ``sessions`` that ended with it",
    )
    policy_versions: list[int] = Field(
        default_factory=list,
        description="the policy versions the group's sessions ran on, ascending",
    )
    num_sessions: int = Field(default=0, ge=0, description="sessions of the group (``sessions``)")
    judge_cost: JudgeCost | None = Field(
        default=None,
        description="what the LLM judge's scoring of the group cost, summed over its sessions' "
        "evaluation records (calls, tokens, wall time); None when no judge scored it",
    )
    max_reward: float | None = Field(
        default=None, description="the highest scored reward; None without a scored session"
    )
    min_policy_version: int | None = Field(
        default=None,
        description="the oldest policy version that sampled a trainable token of a scored "
        "session; None without one",
    )
    max_policy_version: int | None = Field(
        default=None, description="the newest such version; None without one"
    )
    token_weighted_policy_version: float | None = Field(
        default=None,
        description="the mean policy version of the scored sessions' trainable tokens, each at "
        "the version that sampled it (a buffer's staleness is its version at take minus "
        "this); None without a trainable token",
    )
    logprob_modes: list[LogprobMode] = Field(
        default_factory=list,
        description="the distinct log-prob modes of the scored sessions' trainable "
        "completions, sorted",
    )
    mixed_logprob_modes: bool = Field(
        default=False,
        description="the scored sessions' log-probs are not all of one mode (raw, after "
        "temperature, after top-k/top-p): an importance ratio over the group mixes "
        "distributions; a buffer hands it out flagged or drops it "
        "(``BufferConfig.mixed_logprob_modes``)",
    )
    stored_key: str = Field(
        default="",
        description="blob store key of the whole group (``groups/{task_id}.json``) when it was "
        "too large to return inline (``TaskRequest.inline_result_bytes``): ``sessions`` and "
        "``replaced`` are then empty here, the other fields are the group's. rolloutd's readers "
        "(RolloutClient, the REST facade, ``rolloutd submit``) load it "
        "(:func:`rolloutd.store.whole_group`); empty when the group is inline",
    )


class GroupRef(Payload):
    """A finished group by reference: where its :class:`TaskResult` is stored, and the few
    facts a buffer filters on. A task started by a buffer signals this (``group_finished``),
    never the whole group: a buffer's state holds references only, however many groups
    wait in it, and stays far under Temporal's 2 MB payload limit."""

    task_id: str
    key: str = Field(
        default="",
        description="blob store key of the group's TaskResult JSON (``groups/{task_id}.json``); "
        "empty when it could not be stored (the group is then read from its task's workflow)",
    )
    num_sessions: int = Field(default=0, ge=0)
    rewards: list[float] = Field(
        default_factory=list,
        description="the scored sessions' rewards (rolloutd.scoring.scored_rewards)",
    )
    mean_reward: float | None = None
    incomplete: bool = False
    num_failed_by_kind: dict[str, int] = Field(default_factory=dict)
    min_policy_version: int | None = Field(
        default=None, description="``TaskResult.min_policy_version``"
    )
    max_policy_version: int | None = Field(
        default=None, description="``TaskResult.max_policy_version``"
    )
    token_weighted_policy_version: float | None = Field(
        default=None,
        description="``TaskResult.token_weighted_policy_version``: what a buffer's staleness "
        "rule reads",
    )
    mixed_logprob_modes: bool = Field(
        default=False, description="``TaskResult.mixed_logprob_modes``"
    )

    @classmethod
    def of(cls, group: TaskResult, key: str, rewards: list[float]) -> GroupRef:
        """The reference of ``group`` stored at ``key``."""
        return cls(
            task_id=group.task_id,
            key=key,
            num_sessions=len(group.sessions),
            rewards=rewards,
            mean_reward=group.mean_reward,
            incomplete=group.incomplete,
            num_failed_by_kind=dict(group.num_failed_by_kind),
            min_policy_version=group.min_policy_version,
            max_policy_version=group.max_policy_version,
            token_weighted_policy_version=group.token_weighted_policy_version,
            mixed_logprob_modes=group.mixed_logprob_modes,
        )


def group_version_stats(
    sessions: list[SessionResult],
) -> tuple[int | None, int | None, float | None, list[LogprobMode]]:
    """``(min, max, token-weighted mean)`` policy version and the distinct log-prob modes of
    the trainable tokens of ``sessions`` (each session's mean weighed by its trainable
    tokens); versions None without a trainable token."""
    low = [s.stats.min_policy_version for s in sessions if s.stats.min_policy_version is not None]
    high = [s.stats.max_policy_version for s in sessions if s.stats.max_policy_version is not None]
    weighted = [
        (s.stats.token_weighted_policy_version, s.stats.num_trainable_tokens)
        for s in sessions
        if s.stats.token_weighted_policy_version is not None and s.stats.num_trainable_tokens
    ]
    total = sum(n for _, n in weighted)
    modes = sorted({m for s in sessions for m in s.stats.logprob_modes})
    return (
        min(low, default=None),
        max(high, default=None),
        sum(v * n for v, n in weighted) / total if total else None,
        modes,  # type: ignore[return-value]
    )


def group_key(task_id: str) -> str:
    """Blob store key of a finished group's TaskResult: ``groups/{task_id}.json``."""
    return f"groups/{task_id}.json"


def group_part_key(task_id: str, part: int) -> str:
    """Blob store key of one part of a large group's sessions, written before the group is
    assembled under :func:`group_key`: ``groups/{task_id}/part-{n}.json``."""
    return f"groups/{task_id}/part-{part}.json"


class CallbackStatus(Payload):
    """Where a session's callback to ``TaskRequest.callback_url`` stands."""

    session_id: str
    status: Literal["pending", "delivered", "failed"] = Field(
        default="pending",
        description="``pending`` (trying), ``delivered`` (a 2xx answer) or ``failed`` (a final "
        "4xx, or ``callback_timeout_s`` spent)",
    )
    attempts: int = Field(
        default=0,
        ge=0,
        description="POSTs tried, known once the callback ended (Temporal retries the POST; 0 "
        "while ``pending``)",
    )
    error: str | None = Field(default=None, description="the last attempt's error")
    status_code: int | None = Field(
        default=None,
        description="the receiver's answer when delivered",
    )


class StatusPage(Payload):
    """Which page of a running task's ended sessions its ``status`` query answers."""

    first_sample: int = Field(default=0, ge=0, description="ended sessions from this sample index")
    first_replaced: int = Field(
        default=0, ge=0, description="replaced sessions from this position of their list"
    )
    limit: int | None = Field(
        default=None, ge=1, description="at most this many of each (None: the workflow's page size)"
    )


class TaskProgress(Payload):
    """A task as it stands: every session that has ended so far, with its outcome."""

    task_id: str
    status: Literal["running", "completed", "failed", "cancelled"] = Field(
        default="running",
        description="``running`` while a session runs; ``completed`` once every session ended and "
        "at least one completed; ``failed`` once every session ended without "
        "completing, or when the task's workflow failed or was terminated; "
        "``cancelled``",
    )
    num_samples: int = Field(default=0, ge=0, description="sessions of the task (0 when unknown)")
    sessions: list[SessionResult] = Field(
        default_factory=list,
        description="the ended sessions' results, by sample index (a replaced sample's is the "
        "latest attempt's, once it ended)",
    )
    replaced: list[SessionResult] = Field(
        default_factory=list,
        description="sessions superseded by a replacement (their sample's new session runs or "
        "ended); ``replacing`` the sample indexes whose replacement is running",
    )
    replacing: list[int] = Field(default_factory=list)
    num_ended: int | None = Field(
        default=None,
        ge=0,
        description="a running task's ended sessions in all, when ``sessions`` is one page of "
        "them (the ``status`` query); None when ``sessions`` holds them all",
    )
    num_replaced: int | None = Field(
        default=None, ge=0, description="as ``num_ended``, for ``replaced``"
    )
    callbacks: list[CallbackStatus] = Field(
        default_factory=list,
        description="each ended session's callback (empty without ``callback_url``)",
    )
    error: str | None = Field(default=None, description="why the task failed, in words")
    result: TaskResult | None = Field(
        default=None,
        description="the group with its stats, once the task's workflow completed",
    )
