"""Inputs, outputs and carried state of the buffer workflow
(:class:`~rolloutd.workflows.buffer.workflow.RolloutBufferWorkflow`).

One pydantic model in and one out for the workflow, each update and each signal; every new
field gets a default so old and new workers interoperate. The workflow's state holds groups by
reference (:class:`~rolloutd.types.GroupRef`: a blob store key and the facts it filters on),
never whole ``TaskResult``s: the trainer client reads each group from the store when it takes
a batch.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, model_validator

from rolloutd.payload import Payload
from rolloutd.scoring import scored_rewards
from rolloutd.tasksets import task_options
from rolloutd.types import TASK_ID_PATTERN, GroupRef, TaskRequest, TaskResult
from rolloutd.workflows.task import task_workflow_id


def buffer_workflow_id(buffer_id: str) -> str:
    """Workflow id of a buffer: ``buffer/{buffer_id}``."""
    return f"buffer/{buffer_id}"


class TaskSource(Payload):
    """Where a buffer's tasks come from.

    ``push``: only tasks the trainer pushes (``push_tasks``). ``jsonl`` / ``parquet``: a file
    read in chunks of ``chunk_size`` rows by the ``read_task_chunk`` activity (eval fleet), so
    the file must be readable there; pushed tasks are started before file rows. ``harbor``: a
    folder of Harbor task folders (or one); ``swebench``: a JSONL or Parquet file of SWE-bench,
    SWE-Gym or SWE-smith instances; both become tasks under ``options``
    (:mod:`rolloutd.tasksets`), and their folders must be readable by the eval and sandbox
    hosts.
    """

    type: Literal["push", "jsonl", "parquet", "harbor", "swebench"] = Field(default="push")
    path: str | None = Field(default=None, description="file or folder path")
    chunk_size: int = Field(default=64, ge=1, le=10_000, description="rows per read")
    options: dict[str, Any] | None = Field(
        default=None,
        description="harbor, swebench: the trainer's choices for every task of the set "
        "(rolloutd.tasksets.HarborOptions / SwebenchOptions fields: harness, num_samples, ...)",
    )

    @model_validator(mode="after")
    def _file_needs_path(self) -> TaskSource:
        if self.type != "push" and not self.path:
            raise ValueError(f"source.path is required when source.type is {self.type!r}")
        if self.type in ("harbor", "swebench"):
            if self.options is None:
                raise ValueError(f"source.options (at least a harness) is required for {self.type}")
            task_options(self.type, self.options)
        return self


class BufferConfig(Payload):
    """A training run's buffer (POLAR/ProRL's efficient DAPO queue, kept in Temporal)."""

    buffer_id: str = Field(description="business key; workflow id ``buffer/{buffer_id}``")
    source: TaskSource = Field(default_factory=TaskSource, description="the task source")
    num_in_flight: int = Field(
        default=8,
        ge=1,
        le=10_000,
        description="tasks kept running at once (the job queue depth)",
    )
    num_samples: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="overrides every task's group size when set",
    )
    task_id_suffix: str = Field(
        default="",
        max_length=40,
        description="appended to every source task id (a second run over the same file needs new "
        "ids: task ids are business keys)",
    )
    drop_zero_variance: bool = Field(
        default=True,
        description="drop groups whose rewards are all equal (DAPO, arXiv 2503.14476, section "
        "3.2) over their scored sessions; see "
        ":func:`rolloutd.scoring.is_zero_variance`",
    )
    incomplete_groups: Literal["hand_out", "drop"] = Field(
        default="hand_out",
        description="a group that misses scored samples after its replacements "
        "(``TaskResult.incomplete``): ``hand_out`` (the trainer gets the scored "
        "sessions; GRPO stats use those only) or ``drop`` (reason ``incomplete``)",
    )
    max_staleness: int | None = Field(
        default=None,
        ge=0,
        description="drop a group when its staleness exceeds it: the buffer's policy version "
        "minus the token-weighted mean version of the group's trainable tokens, each token "
        "at the version that sampled it, a replayed one at its source's "
        "(``GroupRef.token_weighted_policy_version``); a group without a trainable token "
        "counts at the version its task started under. Checked when the group arrives and "
        "whenever the version moves, so a group handed out is within it at take. None keeps "
        "all",
    )
    mixed_logprob_modes: Literal["hand_out", "drop"] = Field(
        default="hand_out",
        description="a group whose scored sessions' log-probs are not all of one mode (raw, "
        "after temperature, after top-k/top-p; ``TaskResult.mixed_logprob_modes``): "
        "``hand_out`` (flagged in its GroupRef and TaskResult: the trainer decides) or "
        "``drop`` (reason ``mixed_logprob_modes``)",
    )
    staleness_admission: bool = Field(
        default=True,
        description="with ``max_staleness`` set, start no task whose group could not be taken "
        "before it goes stale: ready + running groups stay below ``(max_staleness + "
        "1) x B``, where B is the largest ``num_groups`` a ``take_batch`` asked for "
        "(no bound before the first take). AReaL's staleness control (Fu et al., "
        "arXiv 2505.24298: generation is refused once it would run more than ``eta`` "
        "versions ahead of training). Off: tasks start whenever fewer than "
        "``num_in_flight`` run, and a trainer slower than its rollouts gets most "
        "groups dropped as stale. ``max_staleness = 0`` is then synchronous RL",
    )
    cancel_surplus: bool = Field(
        default=False,
        description="when a batch is handed out, cancel the tasks still running (ProRL's early "
        "termination) instead of carrying them into the next step",
    )
    lease_s: float = Field(
        default=600.0,
        gt=0,
        le=7 * 86_400,
        description="default lease of a batch; an unacked batch is offered again after it",
    )
    max_history_events: int = Field(
        default=10_000,
        ge=50,
        description="continue-as-new once the history is this long (or when Temporal suggests it)",
    )
    max_history_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=10_000,
        description="continue-as-new once the history is this large, bytes (Temporal's limit is "
        "50 MB; its suggestion comes at 10 MB)",
    )
    max_starts_per_run: int = Field(
        default=1000,
        ge=1,
        le=1900,
        description="tasks started in one run at most, then continue-as-new: a run's children "
        "still running count against Temporal's 2,000 pending children",
    )
    max_ready: int = Field(
        default=4096,
        ge=1,
        description="groups waiting to be taken at most: no task starts while this many wait "
        "(a trainer slower than the rollouts holds the fill back)",
    )
    max_pushed: int = Field(
        default=2048,
        ge=1,
        description="pushed tasks waiting to start at most: a push beyond it is refused",
    )
    max_pushed_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        le=1536 * 1024,
        description="bytes (JSON) of the pushed tasks waiting to start at most: they travel in "
        "the buffer's continue-as-new input, which Temporal's 2 MB payload limit bounds (2,048 "
        "SWE-bench tasks of 10 KB would pass it); a push beyond it is refused",
    )
    reap_every_s: float = Field(
        default=60.0,
        gt=0,
        description="seconds between two checks that running tasks still run (a task "
        "terminated, or cancelled from outside, never reports its group): at most "
        "``REAP_BATCH`` tasks are asked per check, oldest first",
    )
    policy_version: int = Field(default=0, ge=0, description="initial policy version")
    adapt_in_flight: bool = Field(
        default=False,
        description="keep fewer than ``num_in_flight`` tasks running when the fleets' observed "
        "capacity (sandbox hosts, backend slots) takes fewer "
        "(:mod:`rolloutd.workflows.buffer.capacity`); needs ``num_samples``",
    )

    @model_validator(mode="after")
    def _safe_id(self) -> BufferConfig:
        if not TASK_ID_PATTERN.match(self.buffer_id):
            raise ValueError("buffer_id must be 1-128 letters, digits, '.', '_' or '-'")
        if self.adapt_in_flight and self.num_samples is None:
            raise ValueError("adapt_in_flight needs num_samples (sessions per task)")
        return self


class BufferedGroup(Payload):
    """A finished task's group by reference (its versions, token-weighted too, in ``ref``),
    stamped with the policy version its task started under (what admission counts).
    ``group`` is None in the workflow; the trainer client fills it from the store when it
    takes the batch (:meth:`rolloutd.trainer_client.buffer.RolloutBuffer.take`).
    """

    ref: GroupRef
    policy_version: int = Field(ge=0)
    group: TaskResult | None = Field(
        default=None, description="the whole group, read by the client (never in the workflow)"
    )

    @model_validator(mode="before")
    @classmethod
    def _ref_of_a_whole_group(cls, data: Any) -> Any:
        # a whole group alone (a trainer's own batches, a test double) gets its reference
        if isinstance(data, dict) and data.get("ref") is None and data.get("group") is not None:
            group = data["group"]
            if not isinstance(group, TaskResult):
                group = TaskResult.model_validate(group)
            data = {**data, "ref": GroupRef.of(group, "", scored_rewards(group))}
        return data

    @property
    def task_id(self) -> str:
        """The group's task id."""
        return self.ref.task_id


class Batch(Payload):
    """Groups handed to a trainer under a lease.

    ``lease_expires_at`` is seconds since the epoch (workflow time); ``num_offers`` counts how
    many times the batch was handed out (2+ after a lease ran out).
    """

    batch_id: str
    groups: list[BufferedGroup] = Field(default_factory=list)
    policy_version: int = Field(default=0, description="buffer's policy version at hand-out")
    lease_expires_at: float = 0.0
    num_offers: int = 1


class RunningTask(Payload):
    """A task the buffer started and the policy version at its start.

    Its workflow id is derived, not carried: 10,000 running tasks travel in every
    continue-as-new input, which Temporal's 2 MB payload limit bounds (about 0.67 MB for
    10,000 ids of 30 characters; the workflow id carried beside it took as much again)."""

    task_id: str
    policy_version: int

    @property
    def workflow_id(self) -> str:
        """The task's workflow id (:func:`rolloutd.workflows.task.task_workflow_id`)."""
        return task_workflow_id(self.task_id)


#: the reasons a buffer drops a group, as its code writes them (:attr:`DroppedGroup.reason`)
DropReason = Literal[
    "zero_variance",
    "stale",
    "cancelled",
    "start_failed",
    "invalid",
    "incomplete",
    "ended",
    "mixed_logprob_modes",
]
#: the values of :data:`DropReason`
DROP_REASONS: tuple[str, ...] = get_args(DropReason)


class DroppedGroup(Payload):
    """A group the buffer did not hand out, and why."""

    task_id: str
    # a plain str, not a Literal: this travels in the buffer's continue-as-new state and in
    # its stats, and a reader that predates a reason must not refuse the whole payload
    reason: str = Field(
        description="why: one of :data:`DROP_REASONS` (``zero_variance``, ``stale``, "
        "``cancelled``, ``start_failed``, ``invalid``, ``incomplete``, ``ended``, "
        "``mixed_logprob_modes``); a newer buffer may add reasons, so a reader keeps an "
        "unknown one as it is"
    )
    policy_version: int = Field(default=0, description="the version its task started under")
    staleness: float | None = Field(
        default=None,
        description="its token-weighted staleness when dropped (the buffer's version minus the "
        "token-weighted version of its trainable tokens); None when not known",
    )


class BufferState(Payload):
    """Everything a buffer carries across continue-as-new."""

    policy_version: int = 0
    cursor: int = Field(default=0, description="rows read from the source file")
    source_exhausted: bool = False
    pending: list[TaskRequest] = Field(default_factory=list, description="file rows read")
    pushed: list[TaskRequest] = Field(default_factory=list, description="pushed, started first")
    pushed_bytes: int = Field(default=0, ge=0, description="JSON bytes of ``pushed``")
    running: list[RunningTask] = Field(default_factory=list)
    reaped: list[RunningTask] = Field(
        default_factory=list,
        description="recent tasks found ended without a report (capped): a group of one that "
        "arrives late is still taken",
    )
    num_reaped: int = 0
    num_started_this_run: int = 0
    ready: list[BufferedGroup] = Field(default_factory=list)
    leased: list[Batch] = Field(default_factory=list)
    reoffer: list[Batch] = Field(default_factory=list, description="expired, offered next")
    acked_batch_ids: list[str] = Field(default_factory=list, description="recent acks, capped")
    dropped: list[DroppedGroup] = Field(default_factory=list, description="recent, capped")
    next_batch: int = 0
    num_started: int = 0
    num_groups_finished: int = 0
    num_dropped_zero_variance: int = 0
    num_dropped_stale: int = 0
    num_dropped_incomplete: int = 0
    num_incomplete_handed_out: int = 0
    num_dropped_mixed_logprob_modes: int = 0
    num_mixed_logprob_modes_handed_out: int = 0
    num_failed_by_kind: dict[str, int] = Field(
        default_factory=dict, description="failure kind -> sessions of finished groups"
    )
    num_cancelled: int = 0
    num_groups_acked: int = 0
    num_batches_acked: int = 0
    num_source_errors: int = Field(
        default=0, description="task-source rows skipped as invalid (each in source_errors)"
    )
    source_errors: list[str] = Field(
        default_factory=list,
        description="the last 100 skipped rows: `line N: why` (JSONL) or `row N: why` (Parquet)",
    )
    num_runs: int = Field(default=1, description="runs of this buffer (continue-as-new + 1)")
    in_flight_target: int | None = Field(
        default=None,
        description="tasks kept running from the observed capacity "
        "(adapt_in_flight); None: num_in_flight",
    )
    observed_sessions: int | None = Field(
        default=None, description="sessions the fleets run at once, as last observed"
    )
    batch_groups: int = Field(
        default=0, description="largest num_groups a take_batch asked for (0: none yet)"
    )
    closed: bool = False


class BufferInput(Payload):
    """Input of the workflow: the config, and the state when continued-as-new."""

    config: BufferConfig
    state: BufferState | None = None


class BufferSummary(Payload):
    """Result of the workflow (after ``close``): the final counters."""

    buffer_id: str
    state: BufferState


class PushTasksInput(Payload):
    """Tasks pushed by the trainer; started before file rows, in order."""

    tasks: list[TaskRequest]


class PushTasksOutput(Payload):
    num_pending: int


class TakeBatchInput(Payload):
    """Ask for a batch of ``num_groups`` groups.

    ``timeout_s`` bounds the wait inside the workflow; ``lease_s`` overrides the buffer's.
    """

    num_groups: int = Field(ge=1, le=10_000)
    lease_s: float | None = Field(default=None, gt=0, le=7 * 86_400)
    timeout_s: float = Field(default=300.0, gt=0, le=86_400)


class TakeBatchOutput(Payload):
    """A batch, or why there is none.

    ``status``: ``ok`` (a batch, possibly re-offered: see ``batch.num_offers``), ``partial``
    (the source is exhausted and fewer groups remain), ``exhausted`` (nothing left, ever),
    ``timeout`` (nothing within ``timeout_s``), ``retry`` (the buffer is continuing-as-new or
    closing: ask again).
    """

    status: Literal["ok", "partial", "exhausted", "timeout", "retry"]
    batch: Batch | None = None


class AckInput(Payload):
    batch_id: str


class AckOutput(Payload):
    """``num_groups`` committed by this ack; ``already_acked`` for a repeated ack (no-op)."""

    batch_id: str
    num_groups: int = 0
    already_acked: bool = False


class PolicyVersionInput(Payload):
    policy_version: int = Field(ge=0)


class CloseInput(Payload):
    """End the buffer. ``cancel_running``: cancel the tasks still running (else abandoned)."""

    cancel_running: bool = True


class BufferStats(Payload):
    """A view of the buffer for trainers and tests (query ``stats``)."""

    buffer_id: str
    run_id: str = ""
    policy_version: int = 0
    num_pending: int = 0
    running: list[RunningTask] = Field(default_factory=list)
    reaped: list[RunningTask] = Field(
        default_factory=list,
        description="recent tasks found ended without a report (capped): a group of one that "
        "arrives late is still taken",
    )
    num_reaped: int = 0
    num_started_this_run: int = 0
    num_ready: int = 0
    ready_task_ids: list[str] = Field(default_factory=list)
    held_task_ids: list[str] = Field(
        default_factory=list,
        description="task ids of every group not acknowledged yet (ready, leased, offered "
        "again): the store keeps them (``rolloutd store gc``)",
    )
    leased_batch_ids: list[str] = Field(default_factory=list)
    reoffer_batch_ids: list[str] = Field(default_factory=list)
    state_counters: dict[str, int] = Field(default_factory=dict)
    dropped: list[DroppedGroup] = Field(default_factory=list)
    source_exhausted: bool = False
    closed: bool = False
    num_failed_by_kind: dict[str, int] = Field(
        default_factory=dict,
        description="failure kind -> sessions of finished groups (replaced sessions not included)",
    )
    in_flight_target: int | None = Field(
        default=None, description="tasks kept running (adapt_in_flight); None: num_in_flight"
    )
    observed_sessions: int | None = Field(
        default=None, description="sessions the fleets run at once, as last observed"
    )
    source_errors: list[str] = Field(
        default_factory=list,
        description="the last 100 task-source rows skipped as invalid, each with its line "
        "(JSONL) or row (Parquet) and why; `state_counters['num_source_errors']` counts all",
    )
