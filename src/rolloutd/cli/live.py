"""What ``rolloutd submit`` and ``rolloutd eval`` show while they wait.

By default one overall view (:class:`RunView`, :func:`watch_run`): a progress bar of the
sessions ended, with its ETA, and a summary line (sessions running, mean reward so far,
failures by kind). Its cost does not grow with the number of tasks: each look is one
``count_workflows`` query per 200 unfinished tasks (search attribute ``RolloutTaskId``, which
every session workflow sets, grouped by ``ExecutionStatus``); the groups of finished tasks
come from the results the caller already awaits. Temporal's visibility shows a session after
a short delay, and a replaced session counts as ended until its task's group arrives, so the
bar is an estimate until then (never past the total).

On request (``--details``) the per-task view (:func:`watch`): per task, its sessions by phase,
the completions recorded so far and the rewards of the sessions that ended; it asks every task
in turn, so it is for a few tasks. Reads: each task's ``status`` through
:meth:`RolloutClient.status` (queries and results), the running sessions from Temporal's
visibility and their ``phase`` query, and completions of running sessions from their
completion logs in the blob store (first attempts; a session on a later attempt counts what
that attempt recorded once it ends).

On a terminal either view is drawn with ``rich`` and cleared at the end (the final table and
report print after it). When stdout is not a terminal (a script, a log) they fall back to
plain lines on stderr, one per change, so a script's stdout and the exit code stay exactly
what they were.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from temporalio.client import WorkflowExecutionStatus, WorkflowQueryFailedError
from temporalio.service import RPCError

from rolloutd.cli import tables
from rolloutd.errors import NotFoundError, RolloutdError
from rolloutd.scoring import failure_counts, scored_rewards
from rolloutd.store import CompletionLog
from rolloutd.trainer_client.client import RolloutClient
from rolloutd.types import TaskResult

#: seconds between two looks
REFRESH_S = 1.0
#: task ids in one visibility query of the overall view
IDS_PER_QUERY = 200


@dataclass
class TaskView:
    """One task as the live view shows it.

    Attributes:
        task_id: the task.
        num_samples: its group size.
        phases: running sessions by phase (``run``: 2), ``done`` for those whose workflow
            closed but whose task has not recorded them yet, ``ended`` for those it has.
        num_completions: completions recorded so far (ended sessions, and running ones read
            from their completion logs).
        rewards: the ended sessions' rewards in sample order (None: not scored).
        statuses: ended sessions by status (``completed``: 3).
    """

    task_id: str
    num_samples: int = 0
    phases: dict[str, int] = field(default_factory=dict)
    num_completions: int = 0
    rewards: list[float | None] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        """The task in one plain line."""
        phases = ", ".join(f"{p} {n}" for p, n in sorted(self.phases.items())) or "-"
        rewards = " ".join("-" if r is None else f"{r:g}" for r in self.rewards) or "-"
        return (
            f"task {self.task_id}: {self.phases.get('ended', 0)}/{self.num_samples} "
            f"ended; phases {phases}; completions {self.num_completions}; "
            f"rewards {rewards}"
        )


async def look(client: RolloutClient, task_id: str) -> TaskView:
    """The task as it stands now (see the module docstring for where each number comes from).

    Raises:
        NotFoundError: no task has this id.
    """
    progress = await client.status(task_id)
    view = TaskView(task_id=task_id, num_samples=progress.num_samples)
    ended = sorted(progress.sessions, key=lambda s: s.sample_index)
    view.rewards = [s.reward for s in ended]
    view.statuses = dict(Counter(s.status.value for s in ended))
    view.num_completions = sum(s.num_completions for s in ended)
    phases: Counter[str] = Counter({"ended": len(ended)} if ended else {})
    query = f"WorkflowType = 'RolloutSessionWorkflow' AND RolloutTaskId = '{task_id}'"
    # a later attempt's session id is ``{id}.attempt-{n}``; its workflow is still ``task/{id}``
    known = {s.session_id.split(".attempt-")[0] for s in [*ended, *progress.replaced]}
    async for wf in client.client.list_workflows(query, limit=1024):
        session_id = wf.id.removeprefix("task/")
        if session_id in known:
            continue
        if wf.status != WorkflowExecutionStatus.RUNNING:
            # closed, not yet in the task's status: counted, not left out for a moment
            phases["done"] += 1
        else:
            try:
                phases[
                    await client.client.get_workflow_handle(wf.id, run_id=wf.run_id).query("phase")
                ] += 1
            except (RPCError, WorkflowQueryFailedError):
                phases["unknown"] += 1
        if client.store is not None:
            view.num_completions += await asyncio.to_thread(
                len, CompletionLog(client.store, session_id)
            )
    view.phases = dict(phases)
    return view


def _table(views: Sequence[TaskView]) -> Any:
    table = tables.table(
        "task",
        tables.num("ended"),
        "sessions by phase",
        tables.num("completions"),
        "rewards",
        "status",
        title="rolloutd submit: waiting (Ctrl-C stops waiting; tasks keep running)",
    )
    for v in views:
        phases = ", ".join(f"{p} {n}" for p, n in sorted(v.phases.items()) if p != "ended")
        table.add_row(
            v.task_id,
            f"{v.phases.get('ended', 0)}/{v.num_samples}",
            phases or "-",
            str(v.num_completions),
            " ".join("-" if r is None else f"{r:g}" for r in v.rewards) or "-",
            ", ".join(f"{s} {n}" for s, n in sorted(v.statuses.items())) or "-",
        )
    return table


async def _look_all(
    client: RolloutClient, task_ids: Sequence[str], last: dict[str, TaskView]
) -> list[TaskView]:
    views = []
    for task_id in task_ids:
        try:
            last[task_id] = await look(client, task_id)
        except (RPCError, NotFoundError, RolloutdError):
            pass  # a look that failed leaves the last one shown; the wait decides the end
        views.append(last.get(task_id, TaskView(task_id=task_id)))
    return views


async def watch(
    client: RolloutClient,
    task_ids: Sequence[str],
    waiting: Awaitable[Any],
    *,
    tty: bool | None = None,
    err: TextIO | None = None,
    refresh_s: float = REFRESH_S,
    console: Any = None,
) -> Any:
    """Show the tasks live until ``waiting`` ends, and return its result.

    Args:
        client: the submitting client.
        task_ids: the tasks submitted.
        waiting: what the caller waits for (the tasks' results).
        tty: draw the rich Live table (True) or plain lines on ``err`` (False); None: rich
            when stdout is a terminal.
        err: where plain lines go (default stderr).
        refresh_s: seconds between two looks.
        console: the rich Console the Live table draws on (default: stdout's).

    Returns:
        ``waiting``'s result.

    Raises:
        Whatever ``waiting`` raises; the view never hides it, and a look that fails (Temporal
        busy) only keeps the last view.
    """
    future = asyncio.ensure_future(waiting)
    tty = sys.stdout.isatty() if tty is None else tty
    err = err or sys.stderr
    last: dict[str, TaskView] = {}
    try:
        if tty:
            from rich.live import Live

            with Live(
                _table(await _look_all(client, task_ids, last)),
                console=console or tables.console(),
                transient=True,
                auto_refresh=False,
            ) as live:
                while not future.done():
                    await asyncio.wait({future}, timeout=refresh_s)
                    if not future.done():
                        live.update(_table(await _look_all(client, task_ids, last)), refresh=True)
            return await future
        shown: dict[str, str] = {}
        while not future.done():
            for view in await _look_all(client, task_ids, last):
                line = view.line()
                if shown.get(view.task_id) != line:
                    shown[view.task_id] = line
                    print(line, file=err, flush=True)
            await asyncio.wait({future}, timeout=refresh_s)
        return await future
    finally:
        if not future.done():  # an interrupt (Ctrl-C) stops the waiting, not the tasks
            future.cancel()


def _quoted(task_ids: Iterable[str]) -> str:
    # task ids are letters, digits, '.', '_' and '-' (TASK_ID_PATTERN): safe in the query
    return ", ".join(f"'{t}'" for t in task_ids)


@dataclass
class RunView:
    """A run as the overall view shows it: every task's sessions, how many ended.

    Attributes:
        total: sessions the run waits for (every task's ``num_samples``).
        finished: the groups that arrived, by task id.
        in_flight: tasks started or followed whose group has not arrived.
        num_ended: sessions of ``in_flight`` tasks whose workflow closed (the last look).
        num_running: sessions of ``in_flight`` tasks whose workflow runs (the last look).
        title: what the bar says it counts.
    """

    total: int
    finished: dict[str, TaskResult] = field(default_factory=dict)
    in_flight: set[str] = field(default_factory=set)
    num_ended: int = 0
    num_running: int = 0
    title: str = "sessions ended"

    def started(self, task_id: str) -> None:
        """A task was started or followed."""
        self.in_flight.add(task_id)

    def arrived(self, group: TaskResult) -> None:
        """A task's group arrived."""
        self.in_flight.discard(group.task_id)
        self.finished[group.task_id] = group

    @property
    def completed(self) -> int:
        """Sessions ended: every final session of the groups that arrived, and the closed
        session workflows of the tasks in flight; at most :attr:`total`."""
        done = sum(len(g.sessions) for g in self.finished.values())
        return min(self.total, done + self.num_ended)

    def summary(self) -> str:
        """The line under the bar: running sessions, mean reward so far, failures by kind."""
        sessions = [s for g in self.finished.values() for s in g.sessions]
        rewards = scored_rewards(sessions)
        mean = (
            f"mean reward {statistics.fmean(rewards):.3f} over {len(rewards)} scored"
            if rewards
            else "no reward yet"
        )
        failures = failure_counts(sessions)
        text = f"running {self.num_running} · tasks done {len(self.finished)} · {mean}"
        if failures:
            text += " · failures " + ", ".join(f"{k} {n}" for k, n in failures.items())
        return text

    def line(self) -> str:
        """The view in one plain line."""
        return f"{self.title} {self.completed}/{self.total}; {self.summary()}"

    async def look(self, client: Any) -> None:
        """Count the in-flight tasks' session workflows by execution status: one
        ``count_workflows`` query per :data:`IDS_PER_QUERY` tasks.

        Args:
            client: a Temporal client (``RolloutClient.client``).

        Raises:
            RPCError: Temporal did not answer (the caller keeps the last look).
        """
        ids = sorted(self.in_flight)
        ended = running = 0
        for start in range(0, len(ids), IDS_PER_QUERY):
            query = (
                "WorkflowType = 'RolloutSessionWorkflow' AND RolloutTaskId IN "
                f"({_quoted(ids[start : start + IDS_PER_QUERY])}) GROUP BY ExecutionStatus"
            )
            counted = await client.count_workflows(query)
            for group in counted.groups:
                if str(group.group_values[0]) == "Running":
                    running += group.count
                else:
                    ended += group.count
        self.num_ended, self.num_running = ended, running


async def watch_run(
    client: RolloutClient,
    view: RunView,
    waiting: Awaitable[Any],
    *,
    tty: bool | None = None,
    err: TextIO | None = None,
    refresh_s: float = REFRESH_S,
    console: Any = None,
) -> Any:
    """Show the overall view until ``waiting`` ends, and return its result. The caller
    updates ``view`` (:meth:`RunView.started`, :meth:`RunView.arrived`) as tasks start and
    their groups arrive.

    Args:
        client: the submitting client.
        view: the run.
        waiting: what the caller waits for.
        tty: draw a rich progress bar with ETA (True) or plain lines on ``err`` (False);
            None: rich when stdout is a terminal.
        err: where plain lines go (default stderr).
        refresh_s: seconds between two looks (longer with more than 200 tasks in flight:
            one second a query).
        console: the rich Console the bar draws on (default: stdout's).

    Returns:
        ``waiting``'s result.

    Raises:
        Whatever ``waiting`` raises; a look that fails (Temporal busy) keeps the last one.
    """
    future = asyncio.ensure_future(waiting)
    tty = sys.stdout.isatty() if tty is None else tty
    err = err or sys.stderr

    async def look() -> None:
        try:
            await view.look(client.client)
        except RPCError:
            pass

    def pause() -> float:
        return max(refresh_s, float(len(view.in_flight) // IDS_PER_QUERY))

    try:
        if tty:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            with Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("ETA"),
                TimeRemainingColumn(),
                TextColumn("{task.fields[summary]}"),
                console=console or tables.console(),
                transient=True,
                auto_refresh=False,
            ) as progress:
                bar = progress.add_task(view.title, total=view.total, summary="")
                while not future.done():
                    await look()
                    progress.update(
                        bar, completed=view.completed, summary=view.summary(), refresh=True
                    )
                    await asyncio.wait({future}, timeout=pause())
            return await future
        shown = ""
        last_print = 0.0
        while not future.done():
            await look()
            line = view.line()
            # one line per change, at most one every 5 s: a log of a long run stays readable
            if line != shown and time.monotonic() - last_print >= 5.0:
                shown, last_print = line, time.monotonic()
                print(line, file=err, flush=True)
            await asyncio.wait({future}, timeout=pause())
        return await future
    finally:
        if not future.done():  # an interrupt (Ctrl-C) stops the waiting, not the tasks
            future.cancel()
