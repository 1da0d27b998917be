"""Shared domain models: the project's vocabulary (one meaning per term) as pydantic models.

Every model here crosses a process boundary (Temporal payloads, the blob store, the trainer
client), so new fields always get defaults: old and new workers must interoperate.

Token arrays (``*_ids``, ``response_logprobs``) live in :class:`Completion` and :class:`Trace`,
which are stored in the blob store; Temporal payloads carry references to them, never the arrays.
"""

from __future__ import annotations

import enum
import re
from datetime import datetime
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rolloutd.task_spec import (
    CONTAINER_RUNTIMES,
    ISOLATING_RUNTIMES,
    BuilderSpec,
    EvaluatorSpec,
    ExecStep,
    HarnessSpec,
    ImageBuild,
    Model,
    PhaseTimeouts,
    PrepareStep,
    RuntimeSpec,
    UploadStep,
)

#: the task's specs live in :mod:`rolloutd.task_spec`; callers still import them from here
__all__ = [
    "CONTAINER_RUNTIMES",
    "ISOLATING_RUNTIMES",
    "ExecStep",
    "ImageBuild",
    "PrepareStep",
    "UploadStep",
]

#: task ids become workflow ids and blob-store folders, so they are kept path- and URL-safe.
TASK_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: the tenant of a task that names none
DEFAULT_TENANT = "default"
#: Temporal's default priority key (1 first ... 5 last)
DEFAULT_PRIORITY = 3


# --------------------------------------------------------------------------- task request


class SamplingParams(Model):
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


class TaskRequest(Model):
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
        default=1.0,
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
    metadata: dict[str, Any] = Field(default_factory=dict, description="free-form, kept")
    callback_url: str | None = Field(
        default=None,
        description="each session's SessionResult is POSTed here when it ends, "
        "after the task stored it (retried with backoff, never holding the task open)",
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


# --------------------------------------------------------------------------- completions


class CaptureMode(str, enum.Enum):
    """How the gateway captures tokens.

    ``tokens``: the gateway renders the chat template and sends prompt token ids, so the trace
    is the model's own tokens; ``passthrough``: the backend renders, the gateway records the
    token ids it returns, when it does.
    """

    TOKENS = "tokens"
    PASSTHROUGH = "passthrough"


class Timings(Model):
    """Wall-clock timings of one completion, seconds since the epoch and durations in s."""

    started_at: float = 0.0
    first_token_s: float | None = None
    duration_s: float = 0.0


class Completion(Model):
    """One recorded model call.

    Invariant: ``len(response_ids) == len(response_logprobs)``; ``response_ids`` are the tokens
    the backend sampled, in order, end-of-turn token included when it was sampled.

    Attributes:
        index: position in the session's completion log, 0-based, gap-free.
        request_hash: sha256 of the canonical request body; equal hashes mean a retried request.
        prompt_ids: list[int], length P: the exact prompt the backend received (tokens mode) or
            reported (passthrough); empty when unknown.
        response_ids: list[int], length R: sampled token ids.
        response_logprobs: list[float], length R: logprob of each sampled token as reported.
        recomputed_logprob_positions: positions in ``response_ids`` whose logprob the backend
            did not report with the sample (llama.cpp: a token ending inside a UTF-8
            character) and the gateway computed again from the same context; such a value may
            differ from the sampling one in the last bits. Sorted; empty for most calls.
        messages / tools: the request's conversation in OpenAI chat shape (after translation).
        response_message: the answer in OpenAI chat shape (content, tool_calls, reasoning).
        trainable: False when token ids or logprobs are unknown (plain OpenAI passthrough).
        extends: index of the completion whose prompt + response this prompt continues
            (tokens mode), or None for a fresh render.
        tool_call_parse_failed: the answer holds a tool call the parser could not read
            (tokens mode): the model's doing; its tokens stay, and the task may force the
            session's reward (``TaskRequest.invalid_tool_call_reward``).
        response_id: the answer's id as the harness got it (``chatcmpl-<hex>``; each dialect
            prefixes its hex part its own way); chosen when the call starts, since a stream
            names its answer before the completion has an index. Empty in logs written before
            it was kept: then derived from ``session_id`` and ``index``.
        replayed_from: ``{session_id}#{index}`` of the earlier attempt's completion this one
            replays (its tokens, logprobs, policy version and answer ids, copied; no engine
            call); None when sampled here.
    """

    session_id: str
    index: int = Field(ge=0)
    request_hash: str = ""
    dialect: str = "openai_chat"
    capture_mode: CaptureMode = CaptureMode.TOKENS
    model: str = ""
    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    request: dict[str, Any] = Field(default_factory=dict, description="raw request body")
    prompt_ids: list[int] = Field(default_factory=list)
    response_ids: list[int] = Field(default_factory=list)
    response_logprobs: list[float] = Field(default_factory=list)
    recomputed_logprob_positions: list[int] = Field(default_factory=list)
    response_text: str = ""
    response_message: dict[str, Any] = Field(default_factory=dict)
    finish_reason: Literal["stop", "length", "tool_calls", "error"] = "stop"
    end_of_turn_sampled: bool = True
    extends: int | None = None
    backend: str = ""
    policy_version: int = 0
    trainable: bool = True
    error: str | None = None
    timings: Timings = Field(default_factory=Timings)
    tool_call_parse_failed: bool = False
    response_id: str = ""
    replayed_from: str | None = None

    @model_validator(mode="after")
    def _aligned(self) -> Completion:
        if len(self.response_ids) != len(self.response_logprobs):
            raise ValueError(
                f"completion {self.session_id}#{self.index}: response_ids has "
                f"{len(self.response_ids)} tokens, response_logprobs {len(self.response_logprobs)}"
            )
        if any(not 0 <= p < len(self.response_ids) for p in self.recomputed_logprob_positions):
            raise ValueError(
                f"completion {self.session_id}#{self.index}: a recomputed logprob "
                f"position is outside its {len(self.response_ids)} tokens"
            )
        return self


# --------------------------------------------------------------------------- trajectories


class Trace(Model):
    """One training sequence (POLAR appendix A.4 shape).

    Invariant: ``len(response_ids) == len(loss_mask) == len(response_logprobs)``; every position
    with ``loss_mask == 1`` holds a sampled token with the logprob its backend reported.

    Attributes:
        prompt_ids: list[int], length P: the first prompt of the chain.
        response_ids: list[int], length R: everything after the prompt (sampled tokens and the
            tokens of tool results / user turns in between).
        loss_mask: list[int] of 0/1, length R.
        response_logprobs: list[float], length R; 0.0 where ``loss_mask`` is 0.
        completion_indices: the completions merged into this trace, in order.
        num_traces_in_session: how many traces the session produced (for per-session
            normalisation of a broadcast reward).
        response_offsets: list[int], aligned with ``completion_indices``: where each merged
            completion's sampled tokens start in ``response_ids`` (their context ends there).
        retry_indices: retried completions (identical prompt and answer) collapsed into this
            trace; each is kept once, in the trace of the completion it repeats.
        drift_positions: positions in ``response_ids`` of sampled tokens that a later prompt of
            this trace re-rendered differently (an insertion is located where it was inserted).
        num_drift_tokens: number of differing tokens over the merges of this trace (per merge,
            the larger of the sampled and the re-rendered side of each difference).
        recomputed_logprob_positions: positions in ``response_ids`` (``loss_mask`` 1) whose
            logprob the backend computed again after sampling (a completion's
            ``recomputed_logprob_positions`` moved to its offset); a trainer may leave them out
            of an importance ratio.
    """

    trace_index: int = Field(default=0, ge=0)
    prompt_ids: list[int] = Field(default_factory=list)
    response_ids: list[int] = Field(default_factory=list)
    loss_mask: list[int] = Field(default_factory=list)
    response_logprobs: list[float] = Field(default_factory=list)
    prompt_messages: list[dict[str, Any]] = Field(default_factory=list)
    response_messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    finish_reason: str = "stop"
    reward: float | None = None
    completion_indices: list[int] = Field(default_factory=list)
    num_traces_in_session: int = Field(default=1, ge=1)
    policy_versions: list[int] = Field(default_factory=list)
    drift_positions: list[int] = Field(default_factory=list)
    recomputed_logprob_positions: list[int] = Field(default_factory=list)
    metadata: dict[str, Any] = Field(default_factory=dict)
    response_offsets: list[int] = Field(default_factory=list)
    retry_indices: list[int] = Field(default_factory=list)
    num_drift_tokens: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _aligned(self) -> Trace:
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.response_logprobs) != n:
            raise ValueError(
                f"trace {self.trace_index}: response_ids {n}, loss_mask {len(self.loss_mask)}, "
                f"response_logprobs {len(self.response_logprobs)} must be equal"
            )
        return self


class BuilderStats(Model):
    """Reconstruction stats a builder reports on every trajectory.

    ``num_completions == num_chains + num_completions_merged + num_retries_collapsed``.

    Attributes:
        num_chains: traces built (per_request: one per completion).
        num_completions_merged: completions that continued an existing chain.
        num_chain_breaks: chains started by a completion that shares an existing chain's first
            prompt but cannot continue it (retry with another answer, branch, drift split).
        num_retries_collapsed: identical retries kept once.
        num_drift_tokens / num_drift_turns: drift detected at merges (also when split off).
        num_length_turns: completions that ended by length without sampling end-of-turn.
        num_trainable_tokens: positions with loss_mask 1; num_response_tokens: all positions.
    """

    num_completions: int = 0
    num_chains: int = 0
    num_completions_merged: int = 0
    num_chain_breaks: int = 0
    num_retries_collapsed: int = 0
    num_drift_tokens: int = 0
    num_length_turns: int = 0
    num_untrainable_completions: int = 0
    num_trainable_tokens: int = 0
    num_response_tokens: int = 0
    num_drift_turns: int = 0
    policy_versions: list[int] = Field(
        default_factory=list,
        description="the distinct policy versions of the completions, "
        "ascending (empty without completions)",
    )


class SessionStatus(str, enum.Enum):
    """How a session ended."""

    COMPLETED = "completed"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"


FailureKind = Literal["backend", "sandbox", "harness", "evaluator", "timeout", "cancelled"]


class FailureCause(Model):
    """Why a session did not run to its end (the glossary's "failure cause",
    docs/failures.md); a session that did has ``failure = None``.

    A reward measures the policy, never the infrastructure: a session whose failure is not the
    policy's is not evaluated and its ``reward`` is None (never 0.0, never averaged into a
    group). docs/failures.md gives the rule for each kind.

    Attributes:
        kind: ``backend`` (a model call got no usable answer and was not recovered),
            ``sandbox`` (the runtime could not start, or its host was lost after the last
            attempt), ``harness`` (the CLI could not start or was killed), ``evaluator`` (the
            evaluator raised or its runtime could not start), ``timeout`` (a phase budget was
            spent: ``phase`` says which), ``cancelled``.
        message: what happened, in words.
        phase: the session phase it happened in (``provision``, ``run``, ``evaluate``, ...).
        retryable: whether a new attempt of the sample could succeed (false for what it would
            hit again: a prepare step that fails, an image that does not exist; false for
            what the policy is accountable for).
        policy_accountable: the outcome is the policy's (see the field).
    """

    kind: FailureKind
    message: str
    phase: str | None = None
    retryable: bool = True
    policy_accountable: bool = Field(
        default=False,
        description="the policy, not the infrastructure, is accountable for "
        "the outcome (a run-phase timeout while the model kept answering): the session is "
        "scored as the task's timeout_reward says, and it does not fail a run",
    )


class Trajectory(Model):
    """The traces of one session, with status, rewards and reconstruction stats."""

    session_id: str
    task_id: str
    sample_index: int = 0
    status: SessionStatus = SessionStatus.COMPLETED
    builder: str = "prefix_merging"
    traces: list[Trace] = Field(default_factory=list)
    reward: float | None = None
    stats: BuilderStats = Field(default_factory=BuilderStats)
    metadata: dict[str, Any] = Field(default_factory=dict)
    failure: FailureCause | None = Field(
        default=None, description="the session's failure cause (SessionResult.failure)"
    )


# --------------------------------------------------------------------------- results


class PhaseTiming(Model):
    """Execution time of one session phase, seconds."""

    phase: str
    duration_s: float = Field(ge=0)
    started_at: datetime | None = Field(default=None, description="workflow time, UTC")
    ended_at: datetime | None = Field(default=None, description="workflow time, UTC")


class SessionAttempt(Model):
    """An attempt of a session that was given up because its sandbox host was lost.

    Attributes:
        attempt: 1-based attempt number.
        session_id: the attempt's gateway session (its completion log stays in the store,
            sealed, and is not part of the trajectory).
        error: why the attempt was given up.
        num_completions: completions recorded in that attempt.
    """

    attempt: int = Field(ge=1)
    session_id: str
    error: str
    num_completions: int = 0


class ReplayEnd(Model):
    """Where one conversation of a resumed session stopped replaying, and why.

    Attributes:
        last_index: index in the new log of the conversation's last replayed completion.
        source: ``{session_id}#{index}`` of the completion it replayed.
        reason: ``body_differed``: the source's conversation went on, but the next request
            differed from its recorded one (a tool output changed, the harness chose another
            path), or its recorded next completion was too stale to replay;
            ``source_ended``: the source recorded nothing after it (the attempt died there).
    """

    last_index: int = Field(ge=0)
    source: str
    reason: Literal["body_differed", "source_ended"]


class ReplayStats(Model):
    """What replay across attempts did for a session (docs/sessions.md, "Replay across
    attempts"); all zero when the session had no earlier attempt or ``resume`` is
    ``restart``.

    Attributes:
        sources: gateway session ids of the earlier attempts replayed from, newest first.
        num_source_completions: completions of those attempts offered for replay (each
            earlier completion once: one a later attempt replayed already is offered as that
            attempt's copy).
        num_replayed: calls answered from the source, without an engine call.
        num_not_replayed: source completions never replayed (they stay in their sealed
            logs, out of training).
        num_stale: source completions whose request came again but whose policy version
            lagged more than ``replay_max_staleness``: sampled again.
        num_prompt_tokens_saved / num_response_tokens_saved: the engine tokens replay saved
            (prompt tokens not prefilled, response tokens not sampled).
        ends: per replayed conversation, where and why its replay ended.
    """

    sources: list[str] = Field(default_factory=list)
    num_source_completions: int = Field(default=0, ge=0)
    num_replayed: int = Field(default=0, ge=0)
    num_not_replayed: int = Field(default=0, ge=0)
    num_stale: int = Field(default=0, ge=0)
    num_prompt_tokens_saved: int = Field(default=0, ge=0)
    num_response_tokens_saved: int = Field(default=0, ge=0)
    ends: list[ReplayEnd] = Field(default_factory=list)


class SessionResult(Model):
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
        "request or continued its conversation",
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
    replay: ReplayStats = Field(
        default_factory=ReplayStats,
        description="calls this attempt replayed from earlier "
        "attempts instead of sampling them, where each conversation's replay ended and why, "
        "and the engine tokens saved",
    )


class TaskResult(Model):
    """A task's group of sessions with group stats.

    Group stats (``mean_reward``, ``reward_std``) are over the scored sessions only
    (:func:`rolloutd.scoring.scored_sessions`): a session that failed for infrastructure has
    no reward and is never averaged in.

    Attributes:
        sessions: one result per sample index (the last attempt of a replaced sample).
        replaced: the sessions that a replacement superseded, in the order they ended.
        num_replacements: replacements started (fleet-down ones included).
        num_scored: sessions whose reward counts; ``incomplete`` when fewer than
            ``num_samples``.
        num_failed_by_kind: failure kind -> sessions of ``sessions`` that ended with it.
        policy_versions: the policy versions the group's sessions ran on, ascending.
    """

    task_id: str
    sessions: list[SessionResult] = Field(default_factory=list)
    mean_reward: float | None = None
    reward_std: float | None = None
    num_completed: int = 0
    metadata: dict[str, Any] = Field(default_factory=dict)
    replaced: list[SessionResult] = Field(default_factory=list)
    num_replacements: int = Field(default=0, ge=0)
    num_scored: int = Field(default=0, ge=0)
    incomplete: bool = False
    num_failed_by_kind: dict[str, int] = Field(default_factory=dict)
    policy_versions: list[int] = Field(default_factory=list)


class CallbackStatus(Model):
    """Where a session's callback to ``TaskRequest.callback_url`` stands.

    Attributes:
        status: ``pending`` (trying), ``delivered`` (a 2xx answer) or ``failed`` (a final 4xx,
            or ``callback_timeout_s`` spent).
        attempts: POSTs tried so far.
        error: the last attempt's error.
        status_code: the receiver's answer when delivered.
    """

    session_id: str
    status: Literal["pending", "delivered", "failed"] = "pending"
    attempts: int = Field(default=0, ge=0)
    error: str | None = None
    status_code: int | None = None


class TaskProgress(Model):
    """A task as it stands: every session that has ended so far, with its outcome.

    Attributes:
        status: ``running`` while a session runs; ``completed`` once every session ended and
            at least one completed; ``failed`` once every session ended without completing,
            or when the task's workflow failed or was terminated; ``cancelled``.
        num_samples: sessions of the task (0 when unknown).
        sessions: the ended sessions' results, by sample index (a replaced sample's is the
            latest attempt's, once it ended).
        replaced: sessions superseded by a replacement (their sample's new session runs or
            ended); ``replacing`` the sample indexes whose replacement is running.
        callbacks: each ended session's callback (empty without ``callback_url``).
        error: why the task failed, in words.
        result: the group with its stats, once the task's workflow completed.
    """

    task_id: str
    status: Literal["running", "completed", "failed", "cancelled"] = "running"
    num_samples: int = Field(default=0, ge=0)
    sessions: list[SessionResult] = Field(default_factory=list)
    replaced: list[SessionResult] = Field(default_factory=list)
    replacing: list[int] = Field(default_factory=list)
    callbacks: list[CallbackStatus] = Field(default_factory=list)
    error: str | None = None
    result: TaskResult | None = None
