"""Inputs and outputs of every activity: one pydantic model in, one out (``<Name>Input`` /
``<Name>Output``). New fields get defaults so old and new workers interoperate.

These models carry references and summaries only, never token arrays (Temporal payload limit
~2 MB, history ~50 MB): completions and trajectories stay in the blob store.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rolloutd.payload import Payload
from rolloutd.types import (
    BuilderSpec,
    BuilderStats,
    EvaluationRecord,
    EvaluatorSpec,
    FailureCause,
    HarnessSpec,
    JudgeCost,
    ReplayStats,
    RuntimeSpec,
    SamplingParams,
    SessionResult,
    SessionStatus,
    TaskRequest,
    TaskResult,
)

# --------------------------------------------------------------------------- gateway fleet


class OpenSessionInput(Payload):
    session_id: str
    task_id: str
    owner: str = Field(default="", description="workflow run id owning the session")
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    model: str | None = None
    replay_from: list[str] = Field(
        default_factory=list,
        description="gateway session ids of the sample's earlier attempts, newest first, whose "
        "sealed logs answer this session's requests identical to theirs (replay; "
        "empty: none)",
    )
    replay_max_staleness: int = Field(
        default=0,
        ge=0,
        description="policy versions a replayed completion may lag behind the backend's current "
        "one",
    )
    wait_for_backends: bool = Field(
        default=False,
        description="refuse (BackendSaturatedError) while the backends hold "
        "their bound of open sessions: the session waits before provisioning",
    )
    pool: Literal["policy", "judge"] = Field(
        default="policy",
        description="the backend pool: ``judge`` opens a judge session (its calls recorded "
        "apart, never trainable; passthrough capture on a chat server)",
    )


class OpenSessionOutput(Payload):
    session_id: str
    session_key: str
    openai_base_url: str
    anthropic_base_url: str
    gemini_base_url: str
    model: str
    backend: str
    host_queue: str = Field(description="the gateway host's own task queue")
    queue_wait_s: float = Field(
        default=0.0,
        ge=0,
        description="seconds this open waited in its queue for a gateway with room (the "
        "admission queue's backlog: backend capacity)",
    )


class CapacityInput(Payload):
    """``sandbox_capacity``, ``backend_capacity``: nothing to say; the whole fleet answers."""


class SandboxCapacityOutput(Payload):
    """The sandbox fleet's capacity: the registered hosts' ``max_concurrent_sessions``
    summed (None: no host publishes one, or the registry did not answer)."""

    max_sessions: int | None = None
    num_hosts: int = 0


class BackendCapacityOutput(Payload):
    """The gateway pool's load (:class:`rolloutd.proxy.backends.saturation.Saturation`):
    sessions open, engine slots, calls in flight, and the open sessions it takes (None:
    unbounded)."""

    num_sessions_open: int = 0
    num_slots: int = 0
    num_in_flight: int = 0
    max_sessions: int | None = None
    saturated: bool = False


class BackendHealthInput(Payload):
    """``backend_health``: which of the gateway's pools to answer about."""

    pool: Literal["policy", "judge"] = Field(
        default="policy", description="``policy`` (the engines) or ``judge`` (the judge pool)"
    )


class BackendHealthOutput(Payload):
    status: str = Field(
        default="ok",
        description="``ok``, ``unavailable`` (a policy version has no healthy backend) or "
        "``empty``",
    )
    unavailable: list[dict[str, Any]] = Field(
        default_factory=list,
        description="per unavailable policy version: ``{policy_version, unhealthy_s, message}``",
    )


class CloseSessionInput(Payload):
    session_id: str
    run_deadline_at: float | None = Field(
        default=None,
        description="Unix time (s) the run phase's budget ran out and the harness was stopped: "
        "the output says whether a call was waiting on the backend then (None: the "
        "run did not time out)",
    )


class CloseSessionOutput(Payload):
    num_completions: int
    num_errors: int = Field(
        default=0,
        description="calls that failed (answered with an error, kept in the session's state, "
        "never in the completion log)",
    )
    num_unrecovered_errors: int = Field(
        default=0,
        description="failed calls answered with a 5xx (a gateway or backend failure, not a bad "
        "request) that no later completion made good "
        "(rolloutd.proxy.sessions.call_errors.RecoveryIndex)",
    )
    last_refusal: str | None = Field(
        default=None,
        description="the last call the gateway refused for the task's or the policy's "
        "reasons (413, a conversation over the context, a concurrency bound: "
        "rolloutd.fault.call_fault is task), in words; None: none",
    )
    last_error: str | None = Field(
        default=None,
        description='the last failed call, in words (``"502 BackendError: ..."``)',
    )
    first_unrecovered_error: str | None = Field(
        default=None,
        description="the first failed call of the backend kind (BackendError, "
        "BackendUnavailableError, a 5xx) that no completion made good, in words, with "
        "its request hash; None: none",
    )
    call_waiting_at_deadline: bool = Field(
        default=False,
        description="a call was waiting on the backend at ``CloseSessionInput.run_deadline_at``",
    )
    num_invalid_tool_calls: int = Field(
        default=0,
        description="completions whose tool call the parser could not read (tokens mode)",
    )
    replay: ReplayStats = Field(
        default_factory=ReplayStats,
        description="what replay across attempts did "
        "(rolloutd.proxy.sessions.replay_source.replay_stats)",
    )


class BuildTrajectoryInput(Payload):
    session_id: str
    task_id: str
    sample_index: int = 0
    status: SessionStatus = SessionStatus.COMPLETED
    failure: FailureCause | None = None
    builder: BuilderSpec = Field(default_factory=BuilderSpec)
    metadata: dict[str, Any] = Field(default_factory=dict)


class BuildTrajectoryOutput(Payload):
    trajectory_ref: str
    num_traces: int
    stats: BuilderStats


# --------------------------------------------------------------------------- sandbox fleet


class ProvisionRuntimeInput(Payload):
    session_id: str
    runtime: RuntimeSpec
    purpose: Literal["session", "evaluation"] = Field(
        default="session", description="an evaluation runtime's id carries `-evaluati`"
    )


class ProvisionRuntimeOutput(Payload):
    runtime_id: str
    host_id: str
    host_queue: str
    workdir: str
    duration_s: float = 0.0
    queue_wait_s: float = Field(
        default=0.0,
        ge=0.0,
        description="seconds the (last attempt of the) provisioning waited in the sandbox queue "
        "for a host with capacity: not charged to the session deadline",
    )


class RunHarnessInput(Payload):
    runtime_id: str
    session_id: str
    harness: HarnessSpec
    instruction: str
    session: OpenSessionOutput
    timeout_s: float = Field(gt=0, description="run-phase budget; the harness is killed after")


class RunHarnessOutput(Payload):
    exit_code: int | None = Field(description="negative: killed by that signal (-9: SIGKILL)")
    timed_out: bool = False
    timed_out_at: float | None = Field(
        default=None,
        description="Unix time (s) the run budget ran out and the harness was stopped "
        "(``timed_out``)",
    )
    signal_sent: int | None = Field(
        default=None,
        description="the signal the sandbox sent the harness itself (SIGTERM, then SIGKILL, at "
        "the budget): a death by another signal was not the session's doing",
    )
    num_oom_kills: int = Field(
        default=0,
        description="processes the runtime's memory limit killed during the run",
    )
    backend_verdict: str | None = Field(
        default=None,
        description="the gateway's verdict that stopped the harness: its model calls stood "
        "unanswered for ``backend_dead_after_s`` (None: not stopped for that)",
    )
    limit_reached: str | None = Field(
        default=None,
        description="the runtime's ceiling (a resource limit of the sandbox policy or the task) "
        "the run reached, naming the limit: ``max_processes``, ``memory_mb``, ``disk_mb`` or "
        "``tmpfs_mb`` (the harness was stopped then); None: none",
    )
    duration_s: float = 0.0
    stdout_tail: str = ""
    stderr_tail: str = ""


class CollectArtifactsInput(Payload):
    runtime_id: str
    session_id: str
    evaluator: EvaluatorSpec
    collect_outputs: bool = Field(default=True, description="store the patch and files")
    run_check: bool = Field(default=True, description="run the evaluator's check here")
    store_final_state: bool = Field(
        default=False,
        description="with ``collect_outputs``: store the session's final state before the "
        "check runs (rolloutd.sandbox.final_state)",
    )
    apply_patch_ref: str | None = Field(
        default=None, description="blob key of a `patch` artifact applied before the check"
    )


class CollectArtifactsOutput(Payload):
    artifacts: dict[str, str] = Field(default_factory=dict, description="name -> blob key")


class RestoreFinalStateInput(Payload):
    """Restore a stored final state into a runtime provisioned for a re-score."""

    runtime_id: str
    session_id: str = Field(description="the stored session (for logs)")
    final_state_key: str = Field(description="blob key of the session's final state manifest")


class RestoreFinalStateOutput(Payload):
    image_digest: str | None = Field(
        default=None, description="the id of the image the runtime runs (container runtimes)"
    )


class TeardownRuntimeInput(Payload):
    runtime_id: str


class TeardownRuntimeOutput(Payload):
    found: bool
    duration_s: float = 0.0


# --------------------------------------------------------------------------- eval fleet


class EvaluateInput(Payload):
    session_id: str
    task_id: str
    evaluator: EvaluatorSpec
    status: SessionStatus
    harness_exit_code: int | None = None
    num_completions: int = 0
    trajectory_ref: str | None = None
    artifacts: dict[str, str] = Field(default_factory=dict, description="name -> blob key")
    forced_reward: float | None = Field(
        default=None,
        description="the session's reward decided by the task, not the evaluator (a run-phase "
        "timeout's ``timeout_reward``, an invalid tool call's "
        "``invalid_tool_call_reward``, a ceiling the run reached after an answered call): "
        "the evaluator is not run and the trajectory gets this reward",
    )
    forced_reason: str | None = Field(
        default=None,
        description="why the reward was forced, in words (the ceiling reached, naming the "
        "limit), for the evaluation record's reason",
    )


class EvaluateOutput(Payload):
    reward: float | None = None
    trace_rewards: list[float] | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    evaluation: EvaluationRecord | None = Field(
        default=None, description="the evaluation record (also in the stored trajectory)"
    )
    error: str | None = Field(
        default=None,
        description='the evaluator raised (``"ErrorType: message"``): no reward; the trajectory '
        "is kept and carries the failure (a raising evaluator is not retried: it "
        "would raise again)",
    )


# ------------------------------------------------------------------ judge queue: LLM judges


class JudgeTarget(Payload):
    """One stored session to judge."""

    session_id: str
    trajectory_ref: str = Field(description="the stored trajectory's blob-store key")


class JudgeInput(Payload):
    """A judging: one session (``source='judge'``) or a group's sessions
    (``source='group_judge'``), through an open judge session at the gateway."""

    task_id: str
    evaluator: EvaluatorSpec = Field(description="``llm_judge`` with its ``judge`` spec")
    targets: list[JudgeTarget] = Field(min_length=1)
    base_url: str = Field(description="the judge session's OpenAI base URL (``.../v1``)")
    session_key: str = Field(description="the judge session's key", repr=False)
    judge_session_id: str = Field(description="the judge session's id (its completion log)")
    source: Literal["judge", "group_judge"] = "judge"
    rescore: bool = Field(
        default=False,
        description="a re-judging of stored sessions: its records are appended to "
        "``rescores``; a session without a reward (its judging had failed) gets this one",
    )


class JudgedSession(Payload):
    """One session's verdict."""

    session_id: str
    reward: float = Field(description="the reward written into its trajectory")
    evaluation: EvaluationRecord


class JudgeOutput(Payload):
    """A judging's verdicts, in the order of its targets, and what it cost in all."""

    judged: list[JudgedSession] = Field(default_factory=list)
    cost: JudgeCost = Field(default_factory=JudgeCost)


class JudgeFailedInput(Payload):
    """A judging given up after its attempts: written into the stored trajectories."""

    task_id: str
    evaluator: EvaluatorSpec
    targets: list[JudgeTarget]
    message: str = Field(description="the judge's failure, in words")
    rescore: bool = False


# ------------------------------------------------------------------ eval fleet: trainer I/O


class ReadTaskChunkInput(Payload):
    """One chunk of a buffer's task source (JSONL or Parquet file), from row ``offset``."""

    path: str = Field(
        description="file path (JSONL: one TaskRequest per line; Parquet: one per row)"
    )
    format: str = Field(default="jsonl", description="jsonl, parquet, harbor or swebench")
    offset: int = Field(default=0, ge=0, description="rows already read (the cursor)")
    limit: int = Field(default=64, ge=1, le=10_000, description="rows to read at most")
    options: dict[str, Any] = Field(
        default_factory=dict, description="harbor, swebench: the task set's TaskOptions"
    )


class ReadTaskChunkOutput(Payload):
    tasks: list[TaskRequest] = Field(default_factory=list, description="valid rows, in order")
    errors: list[str] = Field(
        default_factory=list,
        description="`line N: message` per bad row (JSONL, 1-based line; Parquet: `row N`)",
    )
    next_offset: int = Field(ge=0, description="the cursor after this chunk")
    exhausted: bool = Field(default=False, description="no rows after next_offset")


class PostCallbackInput(Payload):
    """A session's result for a task's ``callback_url``."""

    url: str
    session: SessionResult
    secret: str | None = Field(
        default=None, repr=False, description="the task's callback secret: the POST is signed"
    )


class PostCallbackOutput(Payload):
    """The receiver's answer, and the attempt that got it (1-based; Temporal retries)."""

    status_code: int
    attempt: int = 1


class StoreGroupPartInput(Payload):
    """One part of a large group's sessions (``store_group_part``): each part's input stays
    under Temporal's 2 MB payload limit, however large the group."""

    key: str = Field(description="where the part goes (rolloutd.types.group_part_key)")
    sessions: list[SessionResult] = Field(default_factory=list)
    replaced: list[SessionResult] = Field(default_factory=list)


class AssembleGroupInput(Payload):
    """A large group's summary (``sessions`` and ``replaced`` empty) and its parts' keys, in
    order (``assemble_group``)."""

    group: TaskResult
    part_keys: list[str]


class StoreTaskRequestInput(Payload):
    """A task's request, stored once for its sessions (``store_task_request``)."""

    task: TaskRequest


class StoredTaskRequest(Payload):
    """Where a task's request is stored, and its size."""

    key: str = Field(description="blob store key of the request's JSON")
    num_bytes: int = Field(ge=0, description="size of the stored JSON, bytes")


# --------------------------------------------------------------------------- reverify

#: what became of one session in a re-score (``SessionRescore.status``)
RescoreStatus = Literal[
    "rescored",
    "evaluator_error",
    "failed",
    "no_final_state",
    "final_state_refused",
    "not_scored",
    "forced",
    "missing",
]


class ReverifyPlanInput(Payload):
    """One stored session to score again (``reverify_plan``)."""

    run_id: str = Field(description="the reverify run")
    index: int = Field(ge=0, description="the session's place in the run")
    session_id: str = Field(description="the stored session (its trajectory's session_id)")
    evaluators: dict[str, str] = Field(
        default_factory=dict,
        description="old evaluator name -> the name to score with (``*``: any); a session "
        "whose evaluator is not named is scored by its own",
    )


class ReverifyPlan(Payload):
    """How a stored session is scored again, or why it is not (``skip``: its outcome is
    stored already)."""

    skip: RescoreStatus | None = Field(default=None, description="not re-scored: why")
    evaluator: EvaluatorSpec | None = Field(default=None, description="the spec scored with")
    runtime: RuntimeSpec | None = Field(
        default=None, description="the fresh runtime's spec; None: the evaluator needs none"
    )
    final_state_key: str | None = Field(default=None, description="the manifest's blob key")
    patch_key: str | None = Field(
        default=None, description="a ``patch`` artifact applied in the fresh runtime"
    )
    image_digest: str | None = Field(default=None, description="the image the session ran")


class RescoreInput(Payload):
    """Score a stored session again and append the record (``rescore_session``)."""

    run_id: str
    index: int = Field(ge=0)
    session_id: str
    evaluator: EvaluatorSpec
    artifacts: dict[str, str] = Field(
        default_factory=dict,
        description="name -> blob key of what the fresh runtime's check produced",
    )
    image_digest: str | None = Field(
        default=None, description="the image the fresh runtime ran (compared with the session's)"
    )
    stored_image_digest: str | None = Field(default=None, description="the session's image")
    error: str | None = Field(
        default=None, description="the fresh runtime failed (no score: the outcome says why)"
    )


class SessionRescore(Payload):
    """What became of one session in a reverify run (stored per session, then summarised)."""

    index: int = Field(ge=0, description="the session's place in the run")
    session_id: str
    task_id: str = ""
    status: RescoreStatus = Field(
        description="``rescored`` (a record appended), ``evaluator_error`` (a record with the "
        "evaluator's error appended), ``failed`` (the fresh runtime or the store failed: "
        "nothing appended), ``no_final_state`` (the task did not ask to store it), "
        "``final_state_refused`` (it passed the bound, or storing it failed), ``not_scored`` "
        "(the session was never evaluated: an infrastructure failure), ``forced`` (its reward "
        "was the task's, not an evaluator's), ``missing`` (no trajectory in the store)"
    )
    old_evaluator: str | None = None
    old_version: str | None = None
    old_reward: float | None = None
    new_evaluator: str | None = None
    new_version: str | None = None
    new_reward: float | None = None
    changed: bool = Field(default=False, description="the new reward differs from the old")
    reason: str | None = Field(default=None, description="the new record's reason")
    detail: str | None = Field(default=None, description="why not re-scored, or what failed")
    image_changed: bool = Field(
        default=False, description="the fresh runtime ran another image than the session"
    )


class VersionChange(Payload):
    """The sessions of one pair of evaluator versions, old to new."""

    old_evaluator: str | None = None
    old_version: str | None = None
    new_evaluator: str | None = None
    new_version: str | None = None
    num_sessions: int = Field(default=0, ge=0, description="sessions re-scored")
    num_changed: int = Field(default=0, ge=0, description="whose reward changed")
    num_lower: int = Field(default=0, ge=0, description="whose reward went down")
    num_higher: int = Field(default=0, ge=0, description="whose reward went up")
    mean_old: float | None = Field(default=None, description="mean old reward")
    mean_new: float | None = Field(default=None, description="mean new reward")


class SummarizeReverifyInput(Payload):
    """A finished reverify run to summarise (``summarize_reverify``)."""

    run_id: str
    num_sessions: int = Field(ge=0)


class ReverifySummary(Payload):
    """What a reverify run changed (stored whole at ``reverify/{run_id}/summary.json``)."""

    run_id: str
    num_sessions: int = Field(default=0, ge=0)
    counts: dict[str, int] = Field(
        default_factory=dict, description="sessions per ``SessionRescore.status``"
    )
    num_changed: int = Field(default=0, ge=0, description="sessions whose reward changed")
    by_version: list[VersionChange] = Field(default_factory=list)
    changed: list[SessionRescore] = Field(
        default_factory=list, description="the sessions whose reward changed"
    )
    sessions: list[SessionRescore] = Field(
        default_factory=list,
        description="every session's outcome (only in the stored summary: the workflow "
        "returns the rest)",
    )
    stored_key: str = Field(default="", description="where the whole summary is stored")
