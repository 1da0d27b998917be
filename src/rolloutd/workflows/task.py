"""``RolloutTaskWorkflow``: a task's ``num_samples`` sessions as child workflows, and the group.

Workflow id ``task/{task_id}``; children ``task/{task_id}/{index}``; session ids
``{task_id}/{index}``. Cancelling the task cancels every session; each session tears its runtime
down and stores what it captured before it ends.

A sample whose session ended with a retryable infrastructure cause (not the policy's, not a
cancellation: :func:`rolloutd.scoring.is_replaceable`) is run again as a new session of the same
sample index, child ``task/{task_id}/{index}/r{n}``, session ``{task_id}/{index}/r{n}``, up to
``TaskRequest.max_replacements`` per group. A failure because the sandbox fleet was down is
not counted: its replacement first waits until a sandbox worker process beats again (the fleet
registry signals it); so is a
``backend`` failure while the gateway's pool has no healthy backend (the engine is down): its
replacement waits until the engine answers again. A group that still
misses a scored sample ends ``incomplete`` (docs/decisions.md, "Failure causes and rewards":
a reward measures the policy, never the infrastructure).

The query ``status`` answers the sessions that have ended, as they end, a page at a time
(:data:`STATUS_PAGE_SIZE`, so 1,024 ended sessions never make one answer near Temporal's 2 MB
payload limit). A session's callback
(``callback_url``) starts after its result is stored here, as a detached child
(:mod:`rolloutd.workflows.callback`): the task ends when its sessions end, never later. A
group-judged task's sessions call back after the group's judging, each with its reward (or its
judge failure): a session's callback always carries its final outcome.

One module on purpose: the sample loop, replacements, cancellation and the group's end share
the workflow's state and its order of commands, which replay must see unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ChildWorkflowError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from rolloutd import task_queues
    from rolloutd.activities.cancel import cancel_workflows
    from rolloutd.activities.models import (
        AssembleGroupInput,
        JudgeTarget,
        StoredTaskRequest,
        StoreGroupPartInput,
        StoreTaskRequestInput,
    )
    from rolloutd.activities.names import (
        ASSEMBLE_GROUP,
        STORE_GROUP,
        STORE_GROUP_PART,
        STORE_TASK_REQUEST,
    )
    from rolloutd.capabilities import FLEET_STATE_SIGNAL, FleetState
    from rolloutd.observability import names
    from rolloutd.rubrics import JUDGE_EVALUATOR
    from rolloutd.scoring import (
        failure_counts,
        failure_of,
        is_fleet_down,
        is_replaceable,
        judge_failure,
        scored_rewards,
        scored_sessions,
    )
    from rolloutd.types import (
        GroupRef,
        JudgeCost,
        SessionResult,
        SessionStatus,
        StatusPage,
        TaskProgress,
        TaskRequest,
        TaskResult,
        group_part_key,
        group_version_stats,
    )
    from rolloutd.workflows import metadata, pool_watch, search, signals
    from rolloutd.workflows.callback import CallbackInput, CallbackWorkflow, callback_workflow_id
    from rolloutd.workflows.fleet_watch import FleetStates, unwatch_fleet, watch_fleet
    from rolloutd.workflows.session import judging
    from rolloutd.workflows.session.models import SessionInput
    from rolloutd.workflows.session.workflow import RolloutSessionWorkflow
    from rolloutd.workflows.tenants import has_quota, task_priority


#: an activity's result type
R = TypeVar("R")


def task_workflow_id(task_id: str) -> str:
    """Workflow id of a task."""
    return f"task/{task_id}"


def session_id_of(task_id: str, sample_index: int, replacement: int = 0) -> str:
    """Session id of one sample of a task: ``{task_id}/{index}``, and ``{task_id}/{index}/r{n}``
    for its n-th replacement."""
    base = f"{task_id}/{sample_index}"
    return base if replacement == 0 else f"{base}/r{replacement}"


def session_workflow_id(parent: str, sample_index: int, replacement: int = 0) -> str:
    """Child workflow id of one sample: ``{parent}/{index}``, then ``{parent}/{index}/r{n}``."""
    base = f"{parent}/{sample_index}"
    return base if replacement == 0 else f"{base}/r{replacement}"


#: the signal a task sends to ``TaskRequest.report_to`` (RolloutBufferWorkflow) at its end.
GROUP_FINISHED_SIGNAL = "group_finished"
#: the query answering :class:`~rolloutd.types.TaskProgress`, a page at a time
STATUS_QUERY = "status"
#: ended sessions (and replaced ones) in one answer of the ``status`` query: a session's result
#: is about 2 KB, a page about 0.5 MB
STATUS_PAGE_SIZE = 256
#: how often a replacement waiting for the sandbox fleet tries again to watch it while no fleet
#: registry runs yet (at most)
FLEET_CHECK_EVERY_S = 10.0
#: a request whose JSON is larger than this (bytes) is stored once in the blob store and its
#: sessions take its key (``store_task_request`` / ``read_task_request``, eval fleet); a
#: smaller one is copied into each session's input (no activity, no store read)
INLINE_REQUEST_BYTES = 8 * 1024
STORE_REQUEST_TIMEOUT = timedelta(seconds=60)
STORE_REQUEST_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=10,
)
#: children started in one workflow task at most, and the timer between two batches, s
START_BATCH = 128
START_BATCH_PAUSE_S = 0.001
#: fleet-down replacements per sample of a group at most (they are not counted against
#: ``max_replacements``): a fleet that comes back only to die again cannot hold a task forever
FLEET_DOWN_REPLACEMENTS_PER_SAMPLE = 3
#: workflow metrics (``workflow.metric_meter()``: not emitted again on replay); no label
#: carries a session or task id
REPLACEMENTS_METRIC = names.SESSION_REPLACEMENTS
INCOMPLETE_GROUPS_METRIC = names.INCOMPLETE_GROUPS


@workflow.defn
class RolloutTaskWorkflow:
    """Run ``num_samples`` sessions of one task and return the group with its stats."""

    def __init__(self) -> None:
        self._results: dict[int, SessionResult] = {}
        self._progress: TaskProgress | None = None
        self._replaced: list[SessionResult] = []
        self._replacing: set[int] = set()
        self._num_replacements = 0
        self._num_counted_replacements = 0
        self._num_fleet_down_replacements = 0
        self._child_ids: dict[int, str] = {}
        self._cancelling = False
        self._fleet_states = FleetStates()

    @workflow.signal(name=FLEET_STATE_SIGNAL)
    def fleet_state(self, state: FleetState) -> None:
        """The fleet registry answers a watch: the sandbox fleet lives again while a
        replacement waits for it (:mod:`rolloutd.workflows.fleet_watch`)."""
        self._fleet_states.add(state)

    @workflow.query
    def progress(self) -> dict[str, int]:
        """How many sessions have finished out of how many."""
        return {"finished": len(self._results)}

    @workflow.query(name=STATUS_QUERY)
    def status(self, page: StatusPage | None = None) -> TaskProgress | None:
        """The sessions that have ended so far, with their outcomes, one page of them (None
        before the first workflow task ran): the ended sessions from sample index
        ``page.first_sample`` on and the replaced ones from position ``page.first_replaced``
        on, at most ``page.limit`` and :data:`STATUS_PAGE_SIZE` of each; ``num_ended`` and
        ``num_replaced`` say how many there are in all
        (:func:`rolloutd.trainer_client.task_status.query_status` reads every page). ``status``
        is ``running`` here until the task's workflow ends; readers decide from the sessions
        (:meth:`RolloutClient.status <rolloutd.trainer_client.client.RolloutClient.status>`)."""
        if self._progress is None:
            return None
        page = page or StatusPage()
        size = min(page.limit or STATUS_PAGE_SIZE, STATUS_PAGE_SIZE)
        ended = [i for i in sorted(self._results) if i >= page.first_sample]
        return self._progress.model_copy(
            update={
                "sessions": [self._results[i] for i in ended[:size]],
                "replaced": self._replaced[page.first_replaced : page.first_replaced + size],
                "replacing": sorted(self._replacing),
                "num_ended": len(self._results),
                "num_replaced": len(self._replaced),
            }
        )

    @workflow.run
    async def run(self, task: TaskRequest) -> TaskResult:
        self._progress = TaskProgress(task_id=task.task_id, num_samples=task.num_samples)
        search.upsert(
            task_id=task.task_id, harness=task.harness.type, status="running", tenant=task.tenant
        )
        self._show(task, "running")
        parent = workflow.info().workflow_id
        # a sample's running session, by index: cancelled directly by this id
        self._child_ids = {i: session_workflow_id(parent, i) for i in range(task.num_samples)}
        # a large request is stored once and its sessions take its key: copied into each
        # child's input, 1,024 samples of a 50 KB instruction pass the 50 MB history limit
        task_key = await _store_request(task)
        # asked once for the group: a session of a tenant without a quota asks nothing
        quota = await has_quota(task)

        async def session(
            index: int, replacement: int, replay_from: list[str] | None = None
        ) -> SessionResult:
            session_id = session_id_of(task.task_id, index, replacement)
            try:
                return await workflow.execute_child_workflow(
                    RolloutSessionWorkflow.run,
                    SessionInput(
                        task=None if task_key else task,
                        task_key=task_key,
                        sample_index=index,
                        session_id=session_id,
                        replay_from=replay_from or [],
                        # a replacement, started later, asks its tenant itself
                        tenant_quota=None if replacement else quota,
                    ),
                    id=session_workflow_id(parent, index, replacement),
                    task_queue=task_queues.WORKFLOWS,
                    execution_timeout=None,
                    priority=task_priority(task),
                    search_attributes=search.started(
                        task_id=task.task_id, harness=task.harness.type, tenant=task.tenant
                    ),
                    static_summary=metadata.session_summary(task, index)
                    + (f" · replacement {replacement}" if replacement else ""),
                    static_details=metadata.static_details(task),
                    cancellation_type=workflow.ChildWorkflowCancellationType.WAIT_CANCELLATION_COMPLETED,
                )
            except ChildWorkflowError as e:
                return SessionResult(
                    session_id=session_id,
                    task_id=task.task_id,
                    sample_index=index,
                    status=SessionStatus.FAILED,
                    error=f"session workflow failed: {e.cause or e}",
                )

        judge = task.evaluator.judge
        group_judged = (
            task.evaluator.type == JUDGE_EVALUATOR and judge is not None and judge.mode == "group"
        )
        # a large group's children start START_BATCH at a time, one workflow task each: 1,024
        # starts in one activation took over the SDK's 2 s deadlock limit on a loaded machine
        released = [min(task.num_samples, START_BATCH)]

        async def one(index: int) -> SessionResult:
            if index >= released[0]:
                await workflow.wait_condition(lambda: index < released[0] or self._cancelling)
                if self._cancelling:
                    raise asyncio.CancelledError()
            result = await session(index, 0)
            replacement = 0
            earlier: list[str] = []
            while not self._cancelling and await self._replace(task, result):
                replacement += 1
                self._child_ids[index] = session_workflow_id(parent, index, replacement)
                # the replaced session's attempts, newest first, are the replacement's replay
                # source; a gateway skips an id that never opened
                earlier = [
                    result.session_id,
                    *(a.session_id for a in reversed(result.attempts)),
                    *earlier,
                ]
                result = await session(
                    index, replacement, earlier if task.resume == "replay" else None
                )
                self._replacing.discard(index)
            self._results[index] = result
            self._show(task, "running")
            # a group-judged session calls back once the group's judging gave it its reward
            if task.callback_url and not self._cancelling and not group_judged:
                await _start_callback(task.callback_url, parent, index, task, result)
            return result

        sessions = [asyncio.ensure_future(one(i)) for i in range(task.num_samples)]

        async def release_batches() -> None:
            while released[0] < task.num_samples and not self._cancelling:
                await asyncio.sleep(START_BATCH_PAUSE_S)  # a timer: the next workflow task
                released[0] = min(task.num_samples, released[0] + START_BATCH)

        releasing = asyncio.ensure_future(release_batches())
        try:
            # shielded: a cancelled task cancels its sessions itself (_cancel_sessions), then
            # waits for every one to end (its teardown done), as WAIT_CANCELLATION_COMPLETED
            results = await asyncio.gather(*(asyncio.shield(s) for s in sessions))
        except asyncio.CancelledError:
            self._cancelling = True
            releasing.cancel()
            self._progress.status = "cancelled"
            self._show(task, "cancelled")
            search.upsert(status=SessionStatus.CANCELLED.value)
            await _cancel_sessions(self._child_ids, sessions)
            await asyncio.gather(*sessions, return_exceptions=True)
            raise
        results = list(results)
        if group_judged:
            self._show(task, "judging")
            results = await _judge_group(task, results)
            self._results = {r.sample_index: r for r in results}
            if task.callback_url:
                url = task.callback_url
                await asyncio.gather(
                    *(_start_callback(url, parent, r.sample_index, task, r) for r in results)
                )
        return await self._finish(task, results)

    async def _finish(self, task: TaskRequest, results: list[SessionResult]) -> TaskResult:
        """The group of every sample's final session: shown, counted, returned (by reference
        when over the task's inline limit) and reported to the buffer that started it."""
        group = summarize(
            task.task_id,
            results,
            num_samples=task.num_samples,
            replaced=self._replaced,
            num_replacements=self._num_replacements,
        )
        self._progress.status = "completed" if group.num_completed else "failed"
        if group.incomplete:
            workflow.metric_meter().create_counter(
                INCOMPLETE_GROUPS_METRIC,
                "groups that ended with fewer scored sessions than samples",
            ).add(1)
        search.upsert(status="completed", reward=group.mean_reward)
        self._show(task, "done", status=self._progress.status, reward=group.mean_reward)
        # a group over the task's inline limit is returned by reference: 1,024 sessions'
        # results (about 2.1 MB) are refused as a workflow result over Temporal's 2 MB limit
        result = group
        if len(group.model_dump_json().encode()) > task.inline_result_bytes:
            result = await _store_result(group, task)
        if task.report_to:
            await _report(task.report_to, group, task, result.stored_key)
        return result

    def _show(self, task: TaskRequest, phase: str, **final) -> None:
        """Current details for the Temporal UI (:mod:`rolloutd.workflows.metadata`): sessions
        ended, their completions, and at the end the group's mean reward."""
        ended = list(self._results.values())
        workflow.set_current_details(
            metadata.current_details(
                phase=phase,
                sessions=f"{len(ended)}/{task.num_samples} ended",
                num_completions=sum(r.num_completions for r in ended),
                **final,
            )
        )

    async def _replace(self, task: TaskRequest, result: SessionResult) -> bool:
        """Decide whether a sample's ended session gets a replacement, and wait for the
        sandbox fleet first when the session failed because it was down.

        Returns:
            True when a new session of the sample is to start now (the ended one is moved to
            ``replaced``); False when ``result`` stands.
        """
        if not is_replaceable(result):
            return False
        failure = failure_of(result)
        fleet_down = failure is not None and is_fleet_down(failure)
        # a backend failure while the engine is down is the fleet's, as a dead sandbox fleet
        engine_down = (
            not fleet_down
            and failure is not None
            and failure.kind == "backend"
            and await pool_watch.pool_down("policy")
        )
        fleet_down = fleet_down or engine_down
        if not fleet_down and self._num_counted_replacements >= task.max_replacements:
            return False
        if fleet_down and (
            self._num_fleet_down_replacements
            >= FLEET_DOWN_REPLACEMENTS_PER_SAMPLE * task.num_samples
        ):
            return False
        # shown as being replaced while it waits for the fleet, too
        self._replaced.append(result)
        self._replacing.add(result.sample_index)
        if engine_down:
            came_back = await pool_watch.wait_for_pool(
                "policy", task.phases.provision_wait_s, lambda: self._cancelling
            )
        elif fleet_down:
            tag = f"replace-{result.sample_index}-{self._num_replacements + 1}"
            came_back = await _wait_for_sandbox_fleet(
                task, lambda: self._cancelling, self._fleet_states, tag
            )
        else:
            came_back = True
        if not came_back:
            self._replaced.remove(result)
            self._replacing.discard(result.sample_index)
            return False
        if fleet_down:
            self._num_fleet_down_replacements += 1
        else:
            self._num_counted_replacements += 1
        self._num_replacements += 1
        workflow.metric_meter().create_counter(
            REPLACEMENTS_METRIC, "sessions replaced after a retryable infrastructure failure"
        ).add(
            1,
            {
                "kind": failure.kind if failure else "unknown",
                "fleet_down": "true" if fleet_down else "false",
            },
        )
        workflow.logger.info(
            "replacing session %s (%s): replacement %d of the group",
            result.session_id,
            failure.kind if failure else "?",
            self._num_replacements,
        )
        return True


async def _judge_group(task: TaskRequest, results: list[SessionResult]) -> list[SessionResult]:
    """Judge a group-judged task's sessions together, after every sample ended (its
    replacements included): the sessions that ran to their end form the cohort (one failed
    for the infrastructure is left out, not scored; a forced reward stands), judged in chunks
    (:func:`rolloutd.workflows.session.judging.judge`, ``group_judge``); each gets its reward
    here and in its stored trajectory before the group is stored or reaches a buffer.
    A judging given up leaves the cohort without rewards, each with the judge's failure.

    Returns:
        ``results`` with the cohort's rewards (or failures) set, in the same order.
    """
    cohort = [r for r in results if r.failure is None and r.reward is None and r.trajectory_ref]
    if not cohort:
        return results
    judged = await judging.judge(
        task_id=task.task_id,
        evaluator=task.evaluator,
        targets=[
            JudgeTarget(session_id=r.session_id, trajectory_ref=r.trajectory_ref or "")
            for r in cohort
        ],
        judge_session_id=f"{task.task_id}/group-judge",
        source="group_judge",
        priority=task_priority(task),
        pool_wait_s=task.phases.provision_wait_s,
    )
    updates: dict[str, dict[str, object]] = {}
    if judged.output is not None:
        for verdict in judged.output.judged:
            updates[verdict.session_id] = {
                "reward": verdict.reward,
                "evaluation": verdict.evaluation,
            }
    else:
        failure = judge_failure(judged.error or "group judging given up")
        for r in cohort:
            updates[r.session_id] = {
                "failure": failure,
                "status": SessionStatus.FAILED,
                "error": failure.message,
            }
    return [
        r.model_copy(update=updates[r.session_id]) if r.session_id in updates else r
        for r in results
    ]


async def _wait_for_sandbox_fleet(
    task: TaskRequest, cancelling: Callable[[], bool], states: FleetStates, tag: str
) -> bool:
    """Wait until the sandbox fleet lives again (a process of it beats in the fleet registry:
    :func:`rolloutd.capabilities.fleet_liveness`), told by the registry's ``fleet_state``
    signal: no event is recorded while the task waits.

    The fleet gets as long to come back as it had to show up (``provision_wait_s`` again, a
    durable timer): a fleet that stays dead must reach the trainer as an incomplete group
    within minutes, not hold the task for its whole deadline (docs/failures.md: a dead fleet
    reaches the trainer within about a minute). Gives up at once when the task is being
    cancelled.

    Returns:
        True when the fleet lives; False when the wait gave up.
    """
    wait_s = task.phases.provision_wait_s
    give_up_at = workflow.now() + timedelta(seconds=wait_s)
    watching = False
    try:
        while not watching and workflow.now() < give_up_at and not cancelling():
            watching = await watch_fleet("sandbox", "alive", tag=tag)
            if not watching:
                # no registry yet: no worker process has started here; the first one to
                # start creates it
                left = (give_up_at - workflow.now()).total_seconds()
                with contextlib.suppress(asyncio.TimeoutError):
                    await workflow.wait_condition(
                        cancelling, timeout=max(0.001, min(FLEET_CHECK_EVERY_S, left))
                    )
        if watching:
            left = (give_up_at - workflow.now()).total_seconds()
            with contextlib.suppress(asyncio.TimeoutError):
                await workflow.wait_condition(
                    lambda: states.told(tag) or cancelling(), timeout=max(0.001, left)
                )
    finally:
        if watching and not states.told(tag):
            await unwatch_fleet(tag)
    told = states.by_tag.get(tag)
    if told is not None and told.alive:
        return True
    if not cancelling():
        workflow.logger.warning("sandbox fleet still down after %g s: no replacement", wait_s)
    return False


async def _cancel_sessions(child_ids: dict[int, str], sessions: list[asyncio.Future]) -> None:
    """Cancel the sessions still running: each directly by its workflow id (the local activity
    ``cancel_workflows``, about a second for 100), not by the task's child cancellation, which
    the server delivers at about one a second (:mod:`rolloutd.activities.cancel`). A session
    that call could not reach (not started yet), or every one when the activity fails, is
    cancelled as a child."""
    running = [i for i, s in enumerate(sessions) if not s.done()]
    fallback = running
    try:
        failed = await workflow.execute_local_activity(
            cancel_workflows,
            [child_ids[i] for i in running],
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=2),
        )
        fallback = [i for i in running if child_ids[i] in set(failed)]
    except ActivityError as e:
        workflow.logger.warning(
            "cancelling sessions directly failed (%s): cancelling them as children", e.cause or e
        )
    for i in fallback:
        sessions[i].cancel()


async def _start_callback(
    url: str, parent: str, index: int, task: TaskRequest, result: SessionResult
) -> None:
    """Start a session's callback as a detached child: it outlives the task, which never
    waits for it (the receiver's answers are in the child's ``state`` query)."""
    await workflow.start_child_workflow(
        CallbackWorkflow.run,
        CallbackInput(
            url=url, session=result, timeout_s=task.callback_timeout_s, secret=task.callback_secret
        ),
        id=callback_workflow_id(parent, index),
        task_queue=task_queues.WORKFLOWS,
        parent_close_policy=ParentClosePolicy.ABANDON,
        priority=task_priority(task),
    )


def group_parts(group: TaskResult, max_bytes: int) -> list[StoreGroupPartInput]:
    """Split a group's ``sessions`` then ``replaced`` into parts of at most about ``max_bytes``
    of JSON each (a session larger than that is a part of its own), keys
    :func:`~rolloutd.types.group_part_key` in order."""
    parts: list[StoreGroupPartInput] = []
    size = max_bytes + 1

    def add(session: SessionResult, replaced: bool) -> None:
        nonlocal size
        n = len(session.model_dump_json().encode())
        if size + n > max_bytes:
            parts.append(StoreGroupPartInput(key=group_part_key(group.task_id, len(parts))))
            size = 0
        (parts[-1].replaced if replaced else parts[-1].sessions).append(session)
        size += n

    for s in group.sessions:
        add(s, False)
    for s in group.replaced:
        add(s, True)
    return parts


async def _store_result(group: TaskResult, task: TaskRequest) -> TaskResult:
    """Store a large group in the blob store and return its summary with the reference
    (``stored_key``; ``sessions`` and ``replaced`` empty). Its sessions go in parts of at most
    ``task.inline_result_bytes`` (``store_group_part``, eval fleet), since an activity's input is
    held to the same 2 MB limit, then ``assemble_group`` writes the whole group under
    ``groups/{task_id}.json``. A group the store did not take is returned whole (it may still
    be under the limit)."""
    summary = group.model_copy(update={"sessions": [], "replaced": []})
    parts = group_parts(group, task.inline_result_bytes)
    try:
        await asyncio.gather(*(_on_store(STORE_GROUP_PART, part, task, int) for part in parts))
        key = await _on_store(
            ASSEMBLE_GROUP,
            AssembleGroupInput(group=summary, part_keys=[p.key for p in parts]),
            task,
            str,
        )
    except ActivityError as e:
        workflow.logger.warning("group %s not stored: %s", group.task_id, e.cause or e)
        return group
    return summary.model_copy(update={"stored_key": key})


def _on_store(activity: str, arg: object, task: TaskRequest, result_type: type[R]) -> Awaitable[R]:
    """One blob-store activity of the task on the eval fleet (``store_task_request``,
    ``store_group``, ``store_group_part``, ``assemble_group``), with the store's timeout and
    retry policy and the task's priority."""
    return workflow.execute_activity(
        activity,
        arg,
        task_queue=task_queues.EVAL,
        start_to_close_timeout=STORE_REQUEST_TIMEOUT,
        retry_policy=STORE_REQUEST_RETRY,
        priority=task_priority(task),
        result_type=result_type,
    )


async def _report(workflow_id: str, group: TaskResult, task: TaskRequest, key: str = "") -> None:
    """Store the task's group (unless it is stored already, at ``key``) and signal its
    reference (:class:`~rolloutd.types.GroupRef`) to the workflow that asked for it (its
    buffer): the buffer keeps references only. A group the store did not take is signalled
    without a key (its reader falls back to this task's result). A buffer that has closed is
    not an error of the task."""
    if not key:
        try:
            key = await _on_store(STORE_GROUP, group, task, str)
        except ActivityError as e:
            workflow.logger.warning("group %s not stored: %s", group.task_id, e.cause or e)
    ref = GroupRef.of(group, key, scored_rewards(group))
    try:
        await signals.send(workflow_id, GROUP_FINISHED_SIGNAL, ref)
    except Exception as e:  # noqa: BLE001 - boundary: the buffer may be gone
        workflow.logger.warning(
            "could not report group %s to %s: %s", group.task_id, workflow_id, e
        )


def summarize(
    task_id: str,
    sessions: list[SessionResult],
    *,
    num_samples: int | None = None,
    replaced: list[SessionResult] | None = None,
    num_replacements: int = 0,
) -> TaskResult:
    """Group stats of a task's sessions, over the scored sessions only
    (:func:`rolloutd.scoring.scored_sessions`): mean and (population) std of their rewards.

    Args:
        task_id: the task.
        sessions: one result per sample (a replaced sample's last session).
        num_samples: the group size G; ``len(sessions)`` when None. The group is
            ``incomplete`` when fewer than G sessions are scored.
        replaced: sessions superseded by replacements.
        num_replacements: replacements started.

    Returns:
        The group; ``mean_reward`` and ``reward_std`` are None without a scored session.
    """
    rewards = [float(s.reward) for s in scored_sessions(sessions)]  # type: ignore[arg-type]
    mean = sum(rewards) / len(rewards) if rewards else None
    std = (
        math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
        if rewards and mean is not None
        else None
    )
    size = len(sessions) if num_samples is None else num_samples
    low, high, weighted, modes = group_version_stats(scored_sessions(sessions))
    return TaskResult(
        task_id=task_id,
        sessions=sorted(sessions, key=lambda s: s.sample_index),
        mean_reward=mean,
        reward_std=std,
        num_completed=sum(s.status == SessionStatus.COMPLETED for s in sessions),
        replaced=list(replaced or []),
        num_replacements=num_replacements,
        num_scored=len(rewards),
        incomplete=len(rewards) < size,
        num_failed_by_kind=failure_counts(sessions),
        policy_versions=sorted({v for s in sessions for v in s.stats.policy_versions}),
        num_sessions=len(sessions),
        max_reward=max(rewards) if rewards else None,
        min_policy_version=low,
        max_policy_version=high,
        token_weighted_policy_version=weighted,
        logprob_modes=modes,
        mixed_logprob_modes=len(modes) > 1,
        judge_cost=judge_cost(sessions),
    )


def judge_cost(sessions: list[SessionResult]) -> JudgeCost | None:
    """The judge's cost of a group: its sessions' records' ``judge_cost`` summed (a group
    judging's shares add up to about its whole); None when no record has one."""
    costs = [s.evaluation.judge_cost for s in sessions if s.evaluation and s.evaluation.judge_cost]
    if not costs:
        return None
    return JudgeCost(
        num_calls=sum(c.num_calls for c in costs),
        num_prompt_tokens=sum(c.num_prompt_tokens for c in costs),
        num_response_tokens=sum(c.num_response_tokens for c in costs),
        duration_s=round(sum(c.duration_s for c in costs), 3),
        quota_wait_s=round(sum(c.quota_wait_s for c in costs), 3),
    )


async def _store_request(task: TaskRequest) -> str | None:
    """The blob-store key of a request larger than ``INLINE_REQUEST_BYTES``, stored once by the
    eval fleet so its sessions take the key (copied into each child's input, 1,024 samples
    of a 50 KB instruction pass the 50 MB history limit); None: the request travels inline."""
    if len(task.model_dump_json()) <= INLINE_REQUEST_BYTES:
        return None
    stored = await _on_store(
        STORE_TASK_REQUEST, StoreTaskRequestInput(task=task), task, StoredTaskRequest
    )
    return stored.key
