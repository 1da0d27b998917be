"""``RolloutBufferWorkflow``: a training run's durable data buffer.

ProRL Agent's efficient DAPO keeps the job queue full, stops once enough informative groups
are collected and carries unfinished jobs to the next step; slime's DataBuffer groups, filters
and batches. Both do it in trainer memory. Here it is a workflow, so a trainer crash loses
nothing:

- it keeps ``num_in_flight`` tasks running (``RolloutTaskWorkflow`` children, ``ABANDON``ed on
  continue-as-new) from a task source: tasks pushed by the trainer, then rows of a JSONL /
  Parquet file read in chunks by the ``read_task_chunk`` activity (eval fleet), with a cursor;
  with ``max_staleness`` set it starts no task whose group would go stale before a take could
  reach it (``staleness_admission``, AReaL's staleness control);
- each task stores its group in the blob store and signals ``group_finished`` with a
  reference (:class:`~rolloutd.types.GroupRef`): the buffer's state (ready, leased, re-offered,
  and its continue-as-new input) holds references only, and ``take`` on the client reads the
  whole groups from the store; the group is stamped with the buffer's policy version at the
  task's start (admission counts it); zero-variance groups (DAPO, over the scored sessions
  only: :func:`rolloutd.scoring.is_zero_variance`), groups whose token-weighted staleness
  (the buffer's version minus the mean version of their trainable tokens) exceeds
  ``max_staleness``, incomplete groups when ``incomplete_groups="drop"`` and groups of mixed
  log-prob modes when ``mixed_logprob_modes="drop"`` are dropped; failures are counted by
  kind;
- ``take_batch`` (an Update) returns ``num_groups`` groups as soon as they are ready, under a
  lease; ``ack`` commits the batch; a batch whose lease runs out unacked is offered again, whole,
  to the next ``take_batch``: a trainer that acks after it trains gets each group exactly once;
- tasks still running when a batch is handed out keep running into the next step, unless
  ``cancel_surplus``;
- what waits is bounded: no task starts while ``max_ready`` groups wait to be taken, and a
  push beyond ``max_pushed`` waiting tasks or ``max_pushed_bytes`` of them is refused;
- a task that ended without reporting (terminated, cancelled from the UI or REST, its report
  failed) would hold its running slot forever: every ``reap_every_s`` the buffer asks Temporal
  whether its oldest running tasks still run (the activity ``closed_workflows``, eval fleet)
  and frees the slots of those that ended;
- it continues-as-new after ``workflow.all_handlers_finished()`` when the history grows long
  (events or bytes) or ``max_starts_per_run`` tasks were started in the run (its running
  children count against Temporal's 2,000 pending children until it continues as new).

Deterministic code only: ``workflow.now()`` for time, no I/O.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from rolloutd import task_queues
    from rolloutd.activities.models import ReadTaskChunkInput, ReadTaskChunkOutput
    from rolloutd.activities.names import CLOSED_WORKFLOWS, READ_TASK_CHUNK
    from rolloutd.observability import names
    from rolloutd.scoring import is_zero_variance
    from rolloutd.types import GroupRef, TaskRequest
    from rolloutd.workflows import metadata, search
    from rolloutd.workflows.buffer import capacity as buffer_capacity
    from rolloutd.workflows.buffer import rules
    from rolloutd.workflows.buffer.models import (
        AckInput,
        AckOutput,
        Batch,
        BufferConfig,
        BufferedGroup,
        BufferInput,
        BufferState,
        BufferStats,
        BufferSummary,
        CloseInput,
        DroppedGroup,
        DropReason,
        PolicyVersionInput,
        PushTasksInput,
        PushTasksOutput,
        RunningTask,
        TakeBatchInput,
        TakeBatchOutput,
    )
    from rolloutd.workflows.task import GROUP_FINISHED_SIGNAL, RolloutTaskWorkflow
    from rolloutd.workflows.tenants import task_priority

#: reading a task file is retried like other infrastructure work.
SOURCE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
)
#: how many acked batch ids and dropped groups the state remembers (bounded history).
MAX_REMEMBERED = 1000
#: running tasks asked about per reaping check (oldest first), and reaped ones remembered
REAP_BATCH = 200
REAP_TIMEOUT = timedelta(seconds=60)


def _read_outcome(child: asyncio.Future[Any]) -> None:
    """Read an abandoned child's outcome (its exception too), so that it is not reported as
    an exception never retrieved."""
    if not child.cancelled():
        child.exception()


def _json_bytes(task: TaskRequest) -> int:
    """A pushed task's size as it travels in the buffer's state (JSON bytes)."""
    return len(task.model_dump_json())


def _zero_variance(group: GroupRef) -> bool:
    """:func:`rolloutd.scoring.is_zero_variance` of the group's scored rewards; a non-finite
    reward keeps the group (handed out: the trainer's GRPO refuses it, naming the reward),
    where the rule's ``ValueError`` would fail this workflow's task again and again."""
    try:
        return is_zero_variance(group.rewards)
    except ValueError:
        workflow.logger.warning("group %s has a non-finite reward: kept", group.task_id)
        return False


@workflow.defn
class RolloutBufferWorkflow:
    """A trainer's durable buffer of finished groups; see the module docstring."""

    @workflow.init
    def __init__(self, input: BufferInput) -> None:
        self._config: BufferConfig = input.config
        self._s: BufferState = input.state or BufferState(
            policy_version=input.config.policy_version
        )
        self._dirty = False
        self._draining = False
        self._cancel_running = False
        self._close_cancel = True
        #: workflow time (s) the fleets' capacity is asked again (adapt_in_flight)
        self._capacity_due = 0.0
        #: workflow time (s) the running tasks are next checked for an unreported end
        self._reap_due = workflow.now().timestamp() + input.config.reap_every_s
        self._s.num_started_this_run = 0

    # ------------------------------------------------------------------ main loop

    @workflow.run
    async def run(self, input: BufferInput) -> BufferSummary:
        search.upsert(status="running", policy_version=self._s.policy_version)
        while not self._s.closed:
            if self._cancel_running:
                await self._cancel_all_running()
            await self._reap()
            await self._refill()
            self._expire_leases()
            if self._s.closed or self._continue_as_new_due():
                break
            await self._wait_for_change()
        if not self._s.closed:
            self._draining = True
            await workflow.wait_condition(workflow.all_handlers_finished)
            self._s.num_runs += 1
            workflow.continue_as_new(BufferInput(config=self._config, state=self._s))
        if self._close_cancel:
            await self._cancel_all_running()
        await workflow.wait_condition(workflow.all_handlers_finished)
        search.upsert(status="closed")
        return BufferSummary(buffer_id=self._config.buffer_id, state=self._s)

    def _continue_as_new_due(self) -> bool:
        info = workflow.info()
        return (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= self._config.max_history_events
            or info.get_current_history_size() >= self._config.max_history_bytes
            or self._s.num_started_this_run >= self._config.max_starts_per_run
        )

    async def _reap(self) -> None:
        """Free the running slots of tasks that ended without reporting their group (asked
        of Temporal, oldest first, :data:`REAP_BATCH` a check)."""
        now = workflow.now().timestamp()
        if now < self._reap_due or not self._s.running:
            return
        self._reap_due = now + self._config.reap_every_s
        asked = self._s.running[:REAP_BATCH]
        try:
            # an activity, not a local one: what follows a local activity's result may run in
            # another workflow task on replay than it did first (a nondeterminism error)
            closed: list[str] = await workflow.execute_activity(
                CLOSED_WORKFLOWS,
                [r.workflow_id for r in asked],
                task_queue=task_queues.EVAL,
                schedule_to_close_timeout=REAP_TIMEOUT,
                retry_policy=RetryPolicy(maximum_attempts=2),
                result_type=list[str],
            )
        except ActivityError as e:
            workflow.logger.warning("running tasks not checked: %s", e.cause or e)
            return
        ended = set(closed)
        for running in [r for r in asked if r.workflow_id in ended]:
            # a group signalled meanwhile was taken in this activation already
            if self._remove_running(running.task_id) is None:
                continue
            workflow.logger.warning("task %s ended without its group: slot freed", running.task_id)
            self._s.reaped.append(running)
            del self._s.reaped[:-REAP_BATCH]
            self._s.num_reaped += 1
            self._drop(running.task_id, "ended", running.policy_version)
            self._dirty = True

    async def _wait_for_change(self) -> None:
        """Sleep until a handler changed something, a lease runs out, or history is long."""
        self._dirty = False
        now = workflow.now().timestamp()
        expiries = [b.lease_expires_at for b in self._s.leased]
        if self._config.adapt_in_flight:
            expiries.append(self._capacity_due)
        if self._s.running:
            expiries.append(self._reap_due)
        timeout = max(0.001, min(expiries) - now) if expiries else None
        try:
            await workflow.wait_condition(
                lambda: self._dirty or self._s.closed or self._continue_as_new_due(),
                timeout=timeout,
            )
        except TimeoutError:
            pass

    async def _refill(self) -> None:
        """Start tasks until ``num_in_flight`` run, reading the source file when needed."""
        cfg = self._config
        num_in_flight = cfg.num_in_flight
        if cfg.adapt_in_flight:
            now = workflow.now().timestamp()
            if now >= self._capacity_due:
                self._capacity_due = now + buffer_capacity.CAPACITY_CHECK_S
                self._s.observed_sessions = await buffer_capacity.observed_sessions()
            num_in_flight = self._s.in_flight_target = buffer_capacity.target(
                cfg.num_in_flight, cfg.num_samples or 1, self._s.observed_sessions
            )
        while (
            not self._s.closed
            and not self._draining
            and len(self._s.running) < num_in_flight
            and len(self._s.ready) < cfg.max_ready
            and self._s.num_started_this_run < cfg.max_starts_per_run
            and not self._admission_full()
        ):
            if self._s.pushed:
                task = self._s.pushed.pop(0)
                self._s.pushed_bytes = max(0, self._s.pushed_bytes - _json_bytes(task))
                await self._start(task)
                continue
            if not self._s.pending:
                if cfg.source.type == "push" or self._s.source_exhausted:
                    return
                chunk: ReadTaskChunkOutput = await workflow.execute_activity(
                    READ_TASK_CHUNK,
                    ReadTaskChunkInput(
                        path=cfg.source.path or "",
                        format=cfg.source.type,
                        offset=self._s.cursor,
                        limit=cfg.source.chunk_size,
                        options=cfg.source.options or {},
                    ),
                    task_queue=task_queues.EVAL,
                    start_to_close_timeout=timedelta(seconds=120),
                    retry_policy=SOURCE_RETRY,
                    result_type=ReadTaskChunkOutput,
                )
                self._s.cursor = chunk.next_offset
                self._s.source_exhausted = chunk.exhausted
                self._s.pending.extend(chunk.tasks)
                self._s.num_source_errors += len(chunk.errors)
                self._s.source_errors = (self._s.source_errors + chunk.errors)[-100:]
                for error in chunk.errors:
                    workflow.logger.warning("task source row skipped: %s", error)
                continue
            await self._start(self._s.pending.pop(0))

    def _admission_full(self) -> bool:
        """Whether a new task's group could go stale before a take reaches it (see
        ``BufferConfig.staleness_admission``).

        Takes hand out the oldest ready groups first, B per policy version at most, so the
        ``(max_staleness + 1) x B`` groups ready or running now are all taken within the next
        ``max_staleness + 1`` versions.
        """
        cfg = self._config
        if cfg.max_staleness is None or not cfg.staleness_admission or not self._s.batch_groups:
            return False
        queued = len(self._s.ready) + len(self._s.running)
        return queued >= (cfg.max_staleness + 1) * self._s.batch_groups

    async def _start(self, task: TaskRequest) -> None:
        cfg = self._config
        update: dict[str, object] = {
            "task_id": task.task_id + cfg.task_id_suffix,
            "report_to": workflow.info().workflow_id,
        }
        if cfg.num_samples is not None:
            update["num_samples"] = cfg.num_samples
        try:
            request = TaskRequest.model_validate({**task.model_dump(), **update})
        except ValueError as e:
            self._drop(task.task_id, "invalid", self._s.policy_version)
            workflow.logger.warning("task %s refused: %s", task.task_id, e)
            return
        running = RunningTask(task_id=request.task_id, policy_version=self._s.policy_version)
        # registered before the start resolves: the group may be signalled in that activation
        self._s.running.append(running)
        try:
            child = await workflow.start_child_workflow(
                RolloutTaskWorkflow.run,
                request,
                id=running.workflow_id,
                task_queue=task_queues.WORKFLOWS,
                priority=task_priority(request),
                static_summary=metadata.task_summary(request),
                static_details=metadata.static_details(request),
                memo=metadata.task_memo(request),
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
            )
        except Exception as e:  # noqa: BLE001 - boundary: a reused task id, a bad request
            self._remove_running(running.task_id)
            self._drop(running.task_id, "start_failed", running.policy_version)
            workflow.logger.warning("task %s not started: %s", running.task_id, e)
            return
        # the task reports its group by signal; its own result (or a cancellation from
        # outside) is not awaited here, and is read so asyncio does not log it as lost
        child.add_done_callback(_read_outcome)
        self._s.num_started += 1
        self._s.num_started_this_run += 1

    async def _cancel_all_running(self) -> None:
        """Cancel every running task (cancel_surplus, or close); their groups are dropped."""
        self._cancel_running = False
        for running in list(self._s.running):
            self._remove_running(running.task_id)
            self._drop(running.task_id, "cancelled", running.policy_version)
            self._s.num_cancelled += 1
            try:
                await workflow.get_external_workflow_handle(running.workflow_id).cancel()
            except Exception as e:  # noqa: BLE001 - boundary: the task may have just ended
                workflow.logger.info("cancel of %s: %s", running.workflow_id, e)

    def _expire_leases(self) -> None:
        now = workflow.now().timestamp()
        for batch in [b for b in self._s.leased if b.lease_expires_at <= now]:
            self._s.leased.remove(batch)
            self._s.reoffer.append(batch)
            workflow.logger.info("lease of %s ran out; offered again", batch.batch_id)

    # ------------------------------------------------------------------ bookkeeping

    def _remove_running(self, task_id: str) -> RunningTask | None:
        for i, running in enumerate(self._s.running):
            if running.task_id == task_id:
                return self._s.running.pop(i)
        return None

    def _drop(
        self,
        task_id: str,
        reason: DropReason,
        policy_version: int,
        staleness: float | None = None,
    ) -> None:
        self._s.dropped.append(
            DroppedGroup(
                task_id=task_id,
                reason=reason,
                policy_version=policy_version,
                staleness=staleness,
            )
        )
        del self._s.dropped[:-MAX_REMEMBERED]

    def _is_stale(self, policy_version: int) -> bool:
        """Whether a task started under ``policy_version`` is already too stale (admission and
        ``cancel_surplus`` count start versions)."""
        return self._too_stale(self._s.policy_version - policy_version)

    def _too_stale(self, staleness: float) -> bool:
        return rules.is_too_stale(staleness, self._config)

    def _staleness(self, ref: GroupRef, start_version: int) -> float:
        """The group's token-weighted staleness now (:func:`rules.group_staleness`)."""
        return rules.group_staleness(ref, start_version, self._s.policy_version)

    def _drop_stale_ready(self) -> None:
        keep = []
        for buffered in self._s.ready:
            staleness = self._staleness(buffered.ref, buffered.policy_version)
            if self._too_stale(staleness):
                self._drop(buffered.task_id, "stale", buffered.policy_version, staleness)
                self._s.num_dropped_stale += 1
            else:
                keep.append(buffered)
        self._s.ready = keep

    def _exhausted(self) -> bool:
        """No more groups can ever arrive (a file source read to its end, nothing running)."""
        return (
            self._config.source.type != "push"
            and self._s.source_exhausted
            and not self._s.pending
            and not self._s.pushed
            and not self._s.running
        )

    def _lease(self, groups: list[BufferedGroup], lease_s: float | None) -> Batch:
        staleness = workflow.metric_meter().create_histogram_float(
            names.GROUP_STALENESS,
            "token-weighted staleness of each group handed out (policy versions)",
        )
        for buffered in groups:
            staleness.record(max(0.0, self._staleness(buffered.ref, buffered.policy_version)))
        self._s.next_batch += 1
        batch = Batch(
            batch_id=f"{self._config.buffer_id}/batch/{self._s.next_batch}",
            groups=groups,
            policy_version=self._s.policy_version,
            lease_expires_at=workflow.now().timestamp() + (lease_s or self._config.lease_s),
        )
        self._s.leased.append(batch)
        if self._config.cancel_surplus and self._s.running:
            self._cancel_running = True
        self._dirty = True
        return batch

    # ------------------------------------------------------------------ signals

    @workflow.signal(name=GROUP_FINISHED_SIGNAL)
    def group_finished(self, group: GroupRef) -> None:
        """A task started by this buffer finished: buffer or drop its group (by reference)."""
        running = self._remove_running(group.task_id)
        if running is None:
            running = next((r for r in self._s.reaped if r.task_id == group.task_id), None)
            if running is None:
                workflow.logger.info("group of %s ignored: not running here", group.task_id)
                return
            # reaped while its report was on its way: taken after all
            self._s.reaped.remove(running)
            self._s.dropped = [d for d in self._s.dropped if d.task_id != group.task_id]
        self._s.num_groups_finished += 1
        for kind, count in group.num_failed_by_kind.items():
            self._s.num_failed_by_kind[kind] = self._s.num_failed_by_kind.get(kind, 0) + count
        reason = rules.arrival_drop_reason(
            group, running.policy_version, self._s.policy_version, self._config
        )
        if reason == "stale":
            staleness = self._staleness(group, running.policy_version)
            self._drop(group.task_id, "stale", running.policy_version, staleness)
            self._s.num_dropped_stale += 1
        elif reason == "mixed_logprob_modes":
            self._drop(group.task_id, reason, running.policy_version)
            self._s.num_dropped_mixed_logprob_modes += 1
        elif reason == "incomplete":
            self._drop(group.task_id, reason, running.policy_version)
            self._s.num_dropped_incomplete += 1
        elif self._config.drop_zero_variance and _zero_variance(group):
            self._drop(group.task_id, "zero_variance", running.policy_version)
            self._s.num_dropped_zero_variance += 1
        else:
            self._s.num_incomplete_handed_out += group.incomplete
            self._s.num_mixed_logprob_modes_handed_out += group.mixed_logprob_modes
            self._s.ready.append(BufferedGroup(ref=group, policy_version=running.policy_version))
        self._dirty = True

    # ------------------------------------------------------------------ updates

    @workflow.update
    async def take_batch(self, input: TakeBatchInput) -> TakeBatchOutput:
        """Wait for ``num_groups`` ready groups (or a re-offered batch) and lease them.

        A re-offered batch (its lease ran out unacked) is served first, whole, whatever
        ``num_groups`` asks: the trainer that lost it gets the very same groups again.
        """
        deadline = workflow.now().timestamp() + input.timeout_s
        if input.num_groups > self._s.batch_groups:
            self._s.batch_groups = input.num_groups
            self._dirty = True  # the admission bound moved: refill

        def servable() -> bool:
            return (
                self._draining
                or self._s.closed
                or bool(self._s.reoffer)
                or len(self._s.ready) >= input.num_groups
                or self._exhausted()
            )

        while True:
            left = deadline - workflow.now().timestamp()
            try:
                await workflow.wait_condition(servable, timeout=max(left, 0.001))
            except TimeoutError:
                return TakeBatchOutput(status="timeout")
            if self._s.reoffer:
                batch = self._s.reoffer.pop(0)
                batch.num_offers += 1
                batch.lease_expires_at = workflow.now().timestamp() + (
                    input.lease_s or self._config.lease_s
                )
                self._s.leased.append(batch)
                self._dirty = True
                return TakeBatchOutput(status="ok", batch=batch)
            if self._draining or self._s.closed:
                return TakeBatchOutput(status="retry" if not self._s.closed else "exhausted")
            if len(self._s.ready) >= input.num_groups:
                groups = self._s.ready[: input.num_groups]
                del self._s.ready[: input.num_groups]
                return TakeBatchOutput(status="ok", batch=self._lease(groups, input.lease_s))
            if self._exhausted():
                if not self._s.ready:
                    return TakeBatchOutput(status="exhausted")
                groups, self._s.ready = self._s.ready, []
                return TakeBatchOutput(status="partial", batch=self._lease(groups, input.lease_s))
            # another taker got there first in the same activation: wait again

    @workflow.update
    def ack(self, input: AckInput) -> AckOutput:
        """Commit a batch: its groups are never offered again. Repeating an ack is a no-op."""
        if input.batch_id in self._s.acked_batch_ids:
            return AckOutput(batch_id=input.batch_id, already_acked=True)
        for queue in (self._s.leased, self._s.reoffer):
            for batch in queue:
                if batch.batch_id == input.batch_id:
                    queue.remove(batch)
                    self._s.acked_batch_ids.append(batch.batch_id)
                    del self._s.acked_batch_ids[:-MAX_REMEMBERED]
                    self._s.num_batches_acked += 1
                    self._s.num_groups_acked += len(batch.groups)
                    self._dirty = True
                    return AckOutput(batch_id=batch.batch_id, num_groups=len(batch.groups))
        raise ApplicationError(
            f"unknown batch {input.batch_id!r}", type="UnknownBatch", non_retryable=True
        )

    @ack.validator
    def _validate_ack(self, input: AckInput) -> None:
        known = (
            {b.batch_id for b in self._s.leased}
            | {b.batch_id for b in self._s.reoffer}
            | set(self._s.acked_batch_ids)
        )
        if input.batch_id not in known:
            raise ValueError(f"unknown batch {input.batch_id!r}")

    @workflow.update
    def push_tasks(self, input: PushTasksInput) -> PushTasksOutput:
        """Queue tasks pushed by the trainer (started before rows of the source file)."""
        self._s.pushed.extend(input.tasks)
        self._s.pushed_bytes += sum(_json_bytes(t) for t in input.tasks)
        self._dirty = True
        return PushTasksOutput(num_pending=len(self._s.pushed) + len(self._s.pending))

    @push_tasks.validator
    def _validate_push(self, input: PushTasksInput) -> None:
        if self._s.closed:
            raise ValueError("the buffer is closed")
        waiting = len(self._s.pushed) + len(input.tasks)
        if waiting > self._config.max_pushed:
            raise ValueError(
                f"the buffer holds {len(self._s.pushed)} pushed tasks waiting to start; "
                f"{len(input.tasks)} more pass max_pushed ({self._config.max_pushed}): "
                "push again once some have started"
            )
        size = sum(_json_bytes(t) for t in input.tasks)
        if self._s.pushed_bytes + size > self._config.max_pushed_bytes:
            raise ValueError(
                f"the buffer holds {self._s.pushed_bytes} bytes of pushed tasks waiting to "
                f"start; {len(input.tasks)} more ({size} bytes) pass max_pushed_bytes "
                f"({self._config.max_pushed_bytes}): push again once some have started, or "
                "submit large tasks directly (their request is stored once)"
            )

    @workflow.update
    def set_policy_version(self, input: PolicyVersionInput) -> BufferStats:
        """Move the policy version (after a weight update); drops groups now too stale."""
        self._s.policy_version = input.policy_version
        self._drop_stale_ready()
        if self._config.cancel_surplus and any(
            self._is_stale(r.policy_version) for r in self._s.running
        ):
            self._cancel_running = True
        search.upsert(policy_version=input.policy_version)
        self._dirty = True
        return self.stats()

    @set_policy_version.validator
    def _validate_policy_version(self, input: PolicyVersionInput) -> None:
        if input.policy_version < self._s.policy_version:
            raise ValueError(
                f"policy_version {input.policy_version} is older than {self._s.policy_version}"
            )

    @workflow.update
    def close(self, input: CloseInput) -> BufferStats:
        """End the buffer; running tasks are cancelled (or abandoned), unacked batches lost."""
        self._s.closed = True
        self._close_cancel = input.cancel_running
        self._dirty = True
        return self.stats()

    # ------------------------------------------------------------------ queries

    @workflow.query
    def stats(self) -> BufferStats:
        """Counters, what runs, what is ready and leased, recent drops."""
        s = self._s
        counters = {
            k: v
            for k, v in s.model_dump().items()
            if isinstance(v, int)
            and (k.startswith("num_") or k in ("cursor", "next_batch", "batch_groups"))
        }
        return BufferStats(
            buffer_id=self._config.buffer_id,
            run_id=workflow.info().run_id,
            policy_version=s.policy_version,
            num_pending=len(s.pending) + len(s.pushed),
            running=list(s.running),
            num_ready=len(s.ready),
            ready_task_ids=[g.task_id for g in s.ready],
            held_task_ids=[g.task_id for g in s.ready]
            + [g.task_id for b in (*s.leased, *s.reoffer) for g in b.groups],
            leased_batch_ids=[b.batch_id for b in s.leased],
            reoffer_batch_ids=[b.batch_id for b in s.reoffer],
            state_counters=counters,
            dropped=list(s.dropped[-100:]),
            source_exhausted=s.source_exhausted,
            closed=s.closed,
            num_failed_by_kind=dict(s.num_failed_by_kind),
            in_flight_target=s.in_flight_target,
            observed_sessions=s.observed_sessions,
            source_errors=list(s.source_errors),
        )
