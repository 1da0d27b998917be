"""What the gateway records and the builders produce: completions (one recorded model call
each, kept in a session's completion log) and trajectories (the traces of one session), with a
session's status and failure cause. Stored in the blob store; Temporal payloads carry
references to them, never their token arrays.

Re-exported by :mod:`rolloutd.types` (import them from there).
"""

from __future__ import annotations

import enum
from typing import Any, Literal

from pydantic import Field, model_validator

from rolloutd.payload import Payload

# --------------------------------------------------------------------------- completions


class CaptureMode(str, enum.Enum):
    """How the gateway captures tokens.

    ``tokens``: the gateway renders the chat template and sends prompt token ids, so the trace
    is the model's own tokens; ``passthrough``: the backend renders, the gateway records the
    token ids it returns, when it does.
    """

    TOKENS = "tokens"
    PASSTHROUGH = "passthrough"


#: what a completion's logprobs are (the glossary's "log-prob mode"): ``raw``, the log-softmax
#: of the model's logits before any sampler (vLLM ``raw_logprobs``, its default; llama-server's
#: ``completion_probabilities`` without ``post_sampling_probs``; SGLang with
#: ``SGLANG_RETURN_ORIGINAL_LOGPROB``); ``temperature``, after temperature scaling but before
#: top-k/top-p (SGLang's default); ``processed``, after temperature and top-k/top-p (vLLM
#: ``processed_logprobs``); ``unknown``, a backend that does not say (docs/backends.md)
LogprobMode = Literal["raw", "temperature", "processed", "unknown"]


class SamplingUsed(Payload):
    """The sampling parameters in force for one completion: the task's or the harness's
    (``SamplingParams.policy``), ``max_tokens`` after the context bound."""

    temperature: float = Field(ge=0.0, description="softmax temperature; 0 samples greedily")
    top_p: float = Field(default=1.0, description="nucleus mass; 1 disables it")
    top_k: int = Field(default=0, description="top-k cut-off; 0 disables it")
    max_tokens: int = Field(default=0, ge=0, description="sampled tokens at most")
    seed: int | None = Field(default=None, description="sampling seed; None: random")


class RoutedExperts(Payload):
    """Where the routed experts (R3) of a completion or a trace are stored: a NumPy ``.npy``
    array of shape ``(num_rows, num_layers, top_k)`` in the blob store, never in a Temporal
    payload.

    Row ``p`` holds the experts each MoE layer routed the token at position ``p`` of the
    sequence (prompt, then response) to, when that token was fed to the model (so the row of
    the last sampled token is absent: it was never fed; vLLM's and SGLang's convention). A
    completion stores only rows ``start ..``: the rows before come from the completion it
    ``extends`` (:func:`rolloutd.routes.completion_routes`); a trace's start is 0.
    """

    key: str = Field(description="blob store key of the ``.npy`` array")
    start: int = Field(default=0, ge=0, description="sequence position of the first row stored")
    num_rows: int = Field(ge=0, description="rows stored")
    num_layers: int = Field(ge=1, description="MoE layers per row")
    top_k: int = Field(ge=1, description="experts per token and layer")


class Timings(Payload):
    """Wall-clock timings of one completion, seconds since the epoch and durations in s."""

    started_at: float = 0.0
    first_token_s: float | None = None
    duration_s: float = 0.0


class Completion(Payload):
    """One recorded model call.

    Invariant: ``len(response_ids) == len(response_logprobs)``; ``response_ids`` are the tokens
    the backend sampled, in order, end-of-turn token included when it was sampled.
    """

    session_id: str
    index: int = Field(
        ge=0,
        description="position in the session's completion log, 0-based, gap-free",
    )
    request_hash: str = Field(
        default="",
        description="sha256 of the canonical request body; equal hashes mean a retried request",
    )
    dialect: str = "openai_chat"
    capture_mode: CaptureMode = CaptureMode.TOKENS
    model: str = ""
    messages: list[dict[str, Any]] = Field(
        default_factory=list,
        description="the request's conversation in OpenAI chat shape (after translation)",
    )
    tools: list[dict[str, Any]] = Field(
        default_factory=list,
        description="the request's conversation in OpenAI chat shape (after translation)",
    )
    request: dict[str, Any] = Field(default_factory=dict, description="raw request body")
    prompt_ids: list[int] = Field(
        default_factory=list,
        description="list[int], length P: the exact prompt the backend received (tokens mode) or "
        "reported (passthrough); empty when unknown",
    )
    response_ids: list[int] = Field(
        default_factory=list,
        description="list[int], length R: sampled token ids",
    )
    response_logprobs: list[float] = Field(
        default_factory=list,
        description="list[float], length R: logprob of each sampled token as reported",
    )
    recomputed_logprob_positions: list[int] = Field(
        default_factory=list,
        description="positions in ``response_ids`` whose logprob the backend did not report with "
        "the sample (llama.cpp: a token ending inside a UTF-8 character) and the "
        "gateway computed again from the same context; such a value may differ from "
        "the sampling one in the last bits. Sorted; empty for most calls",
    )
    response_text: str = ""
    response_message: dict[str, Any] = Field(
        default_factory=dict,
        description="the answer in OpenAI chat shape (content, tool_calls, reasoning)",
    )
    finish_reason: Literal["stop", "length", "tool_calls", "error"] = "stop"
    end_of_turn_sampled: bool = True
    extends: int | None = Field(
        default=None,
        description="index of the completion whose prompt + response this prompt continues "
        "(tokens mode), or None for a fresh render",
    )
    backend: str = ""
    policy_version: int = 0
    trainable: bool = Field(
        default=True,
        description="False when token ids or logprobs are unknown (plain OpenAI passthrough)",
    )
    error: str | None = None
    timings: Timings = Field(default_factory=Timings)
    tool_call_parse_failed: bool = Field(
        default=False,
        description="the answer holds a tool call the parser could not read (tokens mode): the "
        "model's doing; its tokens stay, and the task may force the session's reward "
        "(``TaskRequest.invalid_tool_call_reward``)",
    )
    response_id: str = Field(
        default="",
        description="the answer's id as the harness got it (``chatcmpl-<hex>``; each dialect "
        "prefixes its hex part its own way); chosen when the call starts, since a "
        "stream names its answer before the completion has an index. Empty in logs "
        "written before it was kept: then derived from ``session_id`` and ``index``",
    )
    replayed_from: str | None = Field(
        default=None,
        description="``{session_id}#{index}`` of the earlier attempt's completion this one "
        "replays (its tokens, logprobs, policy version and answer ids, copied; no "
        "engine call); None when sampled here",
    )
    backend_type: str = Field(
        default="",
        description="the kind of the backend that sampled it (``llama_cpp``, ``vllm``, "
        "``sglang``, ``openai``, ``verl``); empty in logs written before it was kept",
    )
    logprob_mode: LogprobMode = Field(
        default="unknown",
        description="what ``response_logprobs`` are: the engine's raw distribution, after "
        "temperature, or after temperature and top-k/top-p (:data:`LogprobMode`)",
    )
    sampling: SamplingUsed | None = Field(
        default=None,
        description="the sampling parameters in force; None in logs written before they were kept",
    )
    routed_experts: RoutedExperts | None = Field(
        default=None,
        description="the experts each token was routed to (R3), when the backend returned "
        "them: stored out of line (:mod:`rolloutd.routes`)",
    )
    num_prompt_tokens: int | None = Field(
        default=None,
        ge=0,
        description="prompt tokens the backend received: ``len(prompt_ids)`` in tokens mode, "
        "the backend's ``usage.prompt_tokens`` in passthrough; None in logs written before "
        "it was kept and for a replayed completion",
    )
    num_cached_tokens: int | None = Field(
        default=None,
        ge=0,
        description="prompt tokens the backend served from its prefix cache, as it reported "
        "them (llama.cpp ``timings.cache_n``, SGLang ``meta_info.cached_tokens``, "
        "OpenAI-shaped ``usage.prompt_tokens_details.cached_tokens``); None when it did not",
    )

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


class Trace(Payload):
    """One training sequence (POLAR appendix A.4 shape).

    Invariant: ``len(response_ids) == len(loss_mask) == len(response_logprobs)``; every position
    with ``loss_mask == 1`` holds a sampled token with the logprob its backend reported.
    """

    trace_index: int = Field(default=0, ge=0)
    prompt_ids: list[int] = Field(
        default_factory=list,
        description="list[int], length P: the first prompt of the chain",
    )
    response_ids: list[int] = Field(
        default_factory=list,
        description="list[int], length R: everything after the prompt (sampled tokens and the "
        "tokens of tool results / user turns in between)",
    )
    loss_mask: list[int] = Field(default_factory=list, description="list[int] of 0/1, length R")
    response_logprobs: list[float] = Field(
        default_factory=list,
        description="list[float], length R; 0.0 where ``loss_mask`` is 0",
    )
    prompt_messages: list[dict[str, Any]] = Field(default_factory=list)
    response_messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    finish_reason: str = "stop"
    reward: float | None = None
    completion_indices: list[int] = Field(
        default_factory=list,
        description="the completions merged into this trace, in order",
    )
    num_traces_in_session: int = Field(
        default=1,
        ge=1,
        description="how many traces the session produced (for per-session normalisation of a "
        "broadcast reward)",
    )
    policy_versions: list[int] = Field(default_factory=list)
    drift_positions: list[int] = Field(
        default_factory=list,
        description="positions in ``response_ids`` of sampled tokens that a later prompt of this "
        "trace re-rendered differently (an insertion is located where it was "
        "inserted)",
    )
    recomputed_logprob_positions: list[int] = Field(
        default_factory=list,
        description="positions in ``response_ids`` (``loss_mask`` 1) whose logprob the backend "
        "computed again after sampling (a completion's "
        "``recomputed_logprob_positions`` moved to its offset); a trainer may leave "
        "them out of an importance ratio",
    )
    metadata: dict[str, Any] = Field(default_factory=dict)
    response_offsets: list[int] = Field(
        default_factory=list,
        description="list[int], aligned with ``completion_indices``: where each merged "
        "completion's sampled tokens start in ``response_ids`` (their context ends "
        "there)",
    )
    retry_indices: list[int] = Field(
        default_factory=list,
        description="retried completions (identical prompt and answer) collapsed into this trace; "
        "each is kept once, in the trace of the completion it repeats",
    )
    num_drift_tokens: int = Field(
        default=0,
        ge=0,
        description="number of differing tokens over the merges of this trace (per merge, the "
        "larger of the sampled and the re-rendered side of each difference)",
    )
    logprob_modes: list[LogprobMode] = Field(
        default_factory=list,
        description="aligned with ``completion_indices``: each merged completion's log-prob "
        "mode (empty in traces built before it was kept)",
    )
    sampling: list[SamplingUsed | None] = Field(
        default_factory=list,
        description="aligned with ``completion_indices``: each merged completion's sampling "
        "parameters",
    )
    turn_rewards: list[float | None] = Field(
        default_factory=list,
        description="aligned with ``completion_indices``: each merged completion's per-turn "
        "(process) reward from a per-turn judge; None for a turn not scored; empty when no "
        "per-turn scoring ran. ``response_offsets`` locates each turn's tokens",
    )
    routed_experts: RoutedExperts | None = Field(
        default=None,
        description="the routed experts of ``prompt_ids + response_ids`` (R3), rows from "
        "position 0, each from the completion that first fed that token to the model; None "
        "when its completions carried none",
    )

    @model_validator(mode="after")
    def _aligned(self) -> Trace:
        n = len(self.response_ids)
        if len(self.loss_mask) != n or len(self.response_logprobs) != n:
            raise ValueError(
                f"trace {self.trace_index}: response_ids {n}, loss_mask {len(self.loss_mask)}, "
                f"response_logprobs {len(self.response_logprobs)} must be equal"
            )
        return self


class BuilderStats(Payload):
    """Reconstruction stats a builder reports on every trajectory.

    ``num_completions == num_chains + num_completions_merged + num_retries_collapsed``.
    """

    num_completions: int = 0
    num_chains: int = Field(default=0, description="traces built (per_request: one per completion)")
    num_completions_merged: int = Field(
        default=0,
        description="completions that continued an existing chain",
    )
    num_chain_breaks: int = Field(
        default=0,
        description="chains started by a completion that shares an existing chain's first prompt "
        "but cannot continue it (retry with another answer, branch, drift split)",
    )
    num_retries_collapsed: int = Field(default=0, description="identical retries kept once")
    num_drift_tokens: int = Field(
        default=0,
        description="drift detected at merges (also when split off)",
    )
    num_length_turns: int = Field(
        default=0,
        description="completions that ended by length without sampling end-of-turn",
    )
    num_untrainable_completions: int = 0
    num_trainable_tokens: int = Field(
        default=0,
        description="positions with loss_mask 1; num_response_tokens: all positions",
    )
    num_response_tokens: int = 0
    num_drift_turns: int = Field(
        default=0,
        description="drift detected at merges (also when split off)",
    )
    policy_versions: list[int] = Field(
        default_factory=list,
        description="the distinct policy versions of the completions, "
        "ascending (empty without completions)",
    )
    min_policy_version: int | None = Field(
        default=None, description="the oldest version that sampled a trainable token"
    )
    max_policy_version: int | None = Field(
        default=None, description="the newest version that sampled a trainable token"
    )
    token_weighted_policy_version: float | None = Field(
        default=None,
        description="the mean policy version of the trainable tokens (``loss_mask`` 1), each "
        "token at the version that sampled it (a replayed one at its source's): a buffer's "
        "staleness is its version minus this (token-weighted staleness); None without "
        "trainable tokens",
    )
    logprob_modes: list[LogprobMode] = Field(
        default_factory=list,
        description="the distinct log-prob modes of the trainable completions, sorted",
    )


class SessionStatus(str, enum.Enum):
    """How a session ended."""

    COMPLETED = "completed"
    FAILED = "failed"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"


FailureKind = Literal[
    "backend", "sandbox", "harness", "evaluator", "timeout", "cancelled", "refused"
]


class FailureCause(Payload):
    """Why a session did not run to its end (the glossary's "failure cause",
    docs/failures.md); a session that did has ``failure = None``.

    A reward measures the policy, never the infrastructure: a session whose failure is not the
    policy's is not evaluated and its ``reward`` is None (never 0.0, never averaged into a
    group). docs/failures.md gives the rule for each kind.
    """

    kind: FailureKind = Field(
        description="``backend`` (a model call got no usable answer and was not recovered), "
        "``sandbox`` (the runtime could not start, or its host was lost after the "
        "last attempt), ``harness`` (the CLI could not start or was killed), "
        "``evaluator`` (the evaluator raised or its runtime could not start), "
        "``timeout`` (a phase budget was spent: ``phase`` says which), ``cancelled``, "
        "``refused`` (the sandbox host refused what the task asked, outside its sandbox "
        "policy: the task's fault, never retried or replaced)",
    )
    message: str = Field(description="what happened, in words")
    phase: str | None = Field(
        default=None,
        description="the session phase it happened in (``provision``, ``run``, ``evaluate``, ...)",
    )
    retryable: bool = Field(
        default=True,
        description="whether a new attempt of the sample could succeed (false for what it would "
        "hit again: a prepare step that fails, an image that does not exist; false "
        "for what the policy is accountable for)",
    )
    policy_accountable: bool = Field(
        default=False,
        description="the policy, not the infrastructure, is accountable for "
        "the outcome (a run-phase timeout while the model kept answering): the session is "
        "scored as the task's timeout_reward says, and it does not fail a run",
    )


# --------------------------------------------------------------------------- evaluation

#: what a changed path is to a verifier (the tamper report's categories): a program or library
#: the verifier may run or load, a path the interpreter searches, a file that configures the
#: test runner, a shell profile, git's configuration or hooks, or the verifier's own folders
TamperCategory = Literal[
    "executable",
    "library",
    "interpreter_path",
    "runner_config",
    "shell_profile",
    "git_config",
    "verifier_path",
]


class TamperFinding(Payload):
    """One path a session changed that a verifier must not trust."""

    path: str = Field(description="the path inside the runtime (absolute, or workdir-relative)")
    category: TamperCategory = Field(description="what the path is to a verifier")
    change: Literal["added", "modified", "deleted"] = Field(
        default="modified", description="how the session changed it"
    )
    detail: str = Field(default="", description="why it counts, in words")


class TamperReport(Payload):
    """The paths a session changed that a verifier must not trust (the glossary's tamper
    report). A finding with ``verdict_affecting`` set scores the session 0.0 (the policy's
    doing: ``failure`` stays None); the others are listed for the reader (e.g. changes outside
    the workdir that the verifier did not carry, so they could not change its verdict).
    """

    findings: list[TamperFinding] = Field(
        default_factory=list, description="the verdict-affecting paths found, at most 50"
    )
    ignored: list[TamperFinding] = Field(
        default_factory=list,
        description="suspicious paths the verifier did not carry or trust (listed, not scored), "
        "at most 50",
    )
    num_changed_paths: int = Field(
        default=0, ge=0, description="paths the session changed in all (added, modified, deleted)"
    )
    truncated: bool = Field(default=False, description="more findings than the lists hold")
    carried_system_changes: bool = Field(
        default=False,
        description="the verifier saw the session's changes outside its workdir "
        "(the task set's ``carry_system_changes``)",
    )

    @property
    def tampered(self) -> bool:
        """Whether a finding affects the verdict (the session scores 0.0)."""
        return bool(self.findings)


class JudgeCost(Payload):
    """What a judge's scoring of one session (or its share of a group's) cost."""

    num_calls: int = Field(default=0, ge=0, description="judge model calls")
    num_prompt_tokens: int = Field(default=0, ge=0)
    num_response_tokens: int = Field(default=0, ge=0)
    duration_s: float = Field(default=0.0, ge=0, description="wall time of the judging, s")
    quota_wait_s: float = Field(
        default=0.0,
        ge=0,
        description="of which waiting for the judge pool's token quota (429 Retry-After), s",
    )


class EvaluationRecord(Payload):
    """One scoring of a session (the glossary's evaluation record). A session's first record is
    the one its ``reward`` came from; a re-score (``rolloutd reverify``, a re-judging) appends
    another (``Trajectory.rescores``) and never rewrites a reward already handed out.
    """

    evaluator: str = Field(description="the evaluator's registry name")
    version: str = Field(
        default="",
        description="the evaluator's version: a built-in's is rolloutd's version and its own "
        "revision (``0.1.0+r2``); a registered one's its ``version`` attribute, when it has one",
    )
    reward: float | None = Field(default=None, description="the reward it gave (None: none)")
    trace_rewards: list[float] | None = Field(default=None, description="per-trace rewards")
    reason: str | None = Field(default=None, description="why that reward, in words")
    tamper: TamperReport | None = Field(
        default=None, description="what the verifier found changed (None: not examined)"
    )
    judge_cost: JudgeCost | None = Field(default=None, description="a judge's cost")
    forced: bool = Field(
        default=False,
        description="the reward was the task's (a run timeout, an invalid tool call, a limit "
        "hit), not the evaluator's",
    )
    error: str | None = Field(default=None, description="the evaluator failed: no reward")
    source: Literal["session", "reverify", "judge", "group_judge"] = Field(
        default="session", description="what produced the record"
    )
    run_id: str | None = Field(
        default=None,
        description="the reverify run that made it (``source='reverify'``): a run retried "
        "replaces its own record instead of appending it twice",
    )
    evaluated_at: float | None = Field(default=None, description="Unix time, s")


class Trajectory(Payload):
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
    evaluation: EvaluationRecord | None = Field(
        default=None, description="the scoring ``reward`` came from (None: not evaluated)"
    )
    rescores: list[EvaluationRecord] = Field(
        default_factory=list,
        description="later scorings of the stored session (reverify, re-judging), in order; "
        "they never change ``reward``",
    )
