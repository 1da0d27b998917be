"""What ``rolloutd submit`` shows while it waits: per task, its sessions by phase, the
completions recorded so far and the rewards of the sessions that ended.

On a terminal the view is a ``rich`` Live table, redrawn every second and cleared at the end
(the final table and report print as before). When stdout is not a terminal (a script, a log)
it falls back to plain lines on stderr, one per change, so a script's stdout and the exit code
stay exactly what they were.

Reads: each task's ``status`` through :meth:`RolloutClient.status` (queries and results), the
running sessions from Temporal's visibility (search attribute ``RolloutTaskId``) and their
``phase`` query, and completions of running sessions from their completion logs in the blob
store (first attempts; a session on a later attempt counts what that attempt recorded once it
ends). Sessions of a task are found by the ``RolloutTaskId`` search attribute, which Temporal's
visibility shows after a short delay: a session just started may be missing for a moment.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from temporalio.client import WorkflowExecutionStatus, WorkflowQueryFailedError
from temporalio.service import RPCError

from rolloutd.cli import tables
from rolloutd.errors import NotFoundError, RolloutdError
from rolloutd.store import CompletionLog
from rolloutd.trainer_client.client import RolloutClient

#: seconds between two looks
REFRESH_S = 1.0


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
