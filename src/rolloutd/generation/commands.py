"""``rolloutd generate`` and ``rolloutd schedule ...``: start or attach to a generation and show
its progress; manage its Temporal Schedule.

``generate`` starts ``generation/{name}`` or, while one runs, attaches to it (a CLI killed
halfway and run again follows the same run: nothing is started twice). A finished generation
run again starts a new run over the rows not yet journaled.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
    WorkflowHandle,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError

from rolloutd import task_queues
from rolloutd.errors import ConfigError
from rolloutd.payload import read_document, validate_strict
from rolloutd.workflows.generation.models import (
    PROGRESS_QUERY,
    GenerationInput,
    GenerationProgress,
    GenerationSpec,
    GenerationSummary,
    generation_workflow_id,
)
from rolloutd.workflows.generation.workflow import GenerationWorkflow

#: how often the progress query is asked, seconds
POLL_EVERY_S = 1.0


def load_spec(path: Path, overrides: dict[str, Any] | None = None) -> GenerationSpec:
    """A generation spec from a JSON file, or a TOML one (``.toml``), with dotted-path
    overrides (``source.limit``).

    Raises:
        ConfigError: the file cannot be read, is not JSON (TOML), or holds no object.
        pydantic.ValidationError: the spec is malformed or names an unknown field.
    """
    try:
        data = read_document(path)
    except (ValueError, OSError) as e:
        raise ConfigError(str(e)) from None
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        *parents, last = dotted.split(".")
        target = data
        for part in parents:
            target = target.setdefault(part, {})
        target[last] = value
    return validate_strict(GenerationSpec, data)


def schedule_id(name: str) -> str:
    """Schedule id of a generation: ``generation-{name}``."""
    return f"generation-{name}"


async def _query(handle: WorkflowHandle[Any, Any]) -> GenerationProgress | None:
    try:
        return await handle.query(PROGRESS_QUERY, result_type=GenerationProgress)
    except RPCError:  # no workflow worker right now (it restarts): ask again later
        return None


async def follow(
    handle: WorkflowHandle[Any, GenerationSummary], console: Console
) -> GenerationSummary:
    """Show a generation's progress until it ends; its summary.

    On a terminal: a live bar (rows done of rows, failed, passing, running, ETA); elsewhere one
    line per change.
    """
    result = asyncio.ensure_future(handle.result())
    last: tuple[int, ...] | None = None
    if console.is_terminal:
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn(
                "failed {task.fields[failed]} passing {task.fields[passing]} "
                "running {task.fields[running]}"
            ),
            TimeRemainingColumn(),
        )
        with Progress(*columns, console=console) as bar:
            task = bar.add_task("rows", total=None, failed=0, passing=0, running=0)
            while not result.done():
                if (p := await _query(handle)) is not None:
                    bar.update(
                        task,
                        total=p.num_rows or None,
                        completed=p.num_done,
                        failed=p.num_failed,
                        passing=p.num_passing,
                        running=p.num_running,
                        description=f"rows ({p.status})",
                    )
                await asyncio.wait({result}, timeout=POLL_EVERY_S)
        return await result
    t0 = time.monotonic()
    first_done: int | None = None
    while not result.done():
        p = await _query(handle)
        if p is not None:
            state = (p.num_rows, p.num_done, p.num_failed, p.num_passing, p.num_running)
            if state != last:
                last = state
                if first_done is None:
                    first_done = p.num_done
                eta = "-"
                elapsed = time.monotonic() - t0
                if p.num_done > first_done and p.num_rows:
                    rate = (p.num_done - first_done) / elapsed
                    eta = f"{(p.num_rows - p.num_done) / rate:.0f} s"
                console.print(
                    f"progress {p.status}: rows {p.num_done}/{p.num_rows} "
                    f"failed {p.num_failed} passing {p.num_passing} running "
                    f"{p.num_running} eta {eta}",
                    highlight=False,
                )
        await asyncio.wait({result}, timeout=POLL_EVERY_S)
    return await result


async def generate(
    client: Client,
    spec: GenerationSpec,
    *,
    task_queue: str = task_queues.WORKFLOWS,
    console: Console | None = None,
) -> GenerationSummary:
    """``rolloutd generate``: start or attach to ``generation/{name}`` and follow it (the
    command prints the summary's table, :mod:`rolloutd.cli.commands.generation`).

    Args:
        client: a Temporal client with rolloutd's data converter.
        spec: the generation.
        task_queue: the queue of the generation workflow itself (its tasks always run on
            ``rolloutd-workflows``).
        console: where the progress goes (default: stdout's).

    Returns:
        The summary over every journaled row.
    """
    console = console or Console(highlight=False)
    handle = await client.start_workflow(
        GenerationWorkflow.run,
        GenerationInput(spec=spec),
        id=generation_workflow_id(spec.name),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
    )
    console.print(
        f"generation {spec.name}: workflow {handle.id} run {handle.result_run_id}", highlight=False
    )
    return await follow(handle, console)


# ----------------------------------------------------------------------------- schedules


def parse_every(text: str) -> timedelta:
    """An interval such as ``90s``, ``15m``, ``6h``, ``1d``.

    Raises:
        ConfigError: any other text.
    """
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        seconds = float(text[:-1]) * units[text[-1]]
    except (KeyError, ValueError, IndexError):
        raise ConfigError(f"interval {text!r}: a number and s, m, h or d (15m)") from None
    if seconds <= 0:
        raise ConfigError(f"interval {text!r} must be positive")
    return timedelta(seconds=seconds)


async def create_schedule(
    client: Client,
    spec: GenerationSpec,
    *,
    cron: str | None,
    every: str | None,
    task_queue: str = task_queues.WORKFLOWS,
    paused: bool = False,
) -> str:
    """A Temporal Schedule that runs the generation over rows not yet journaled.

    Overlap policy SKIP: a firing while the last run is still running is skipped (the rows are
    being done). Each firing's workflow id is ``generation/{name}-{time}`` (Temporal appends
    the time).

    Returns:
        The schedule id.

    Raises:
        ConfigError: neither or both of ``cron`` and ``every``.
    """
    if (cron is None) == (every is None):
        raise ConfigError("give exactly one of --cron and --every")
    sid = schedule_id(spec.name)
    await client.create_schedule(
        sid,
        Schedule(
            action=ScheduleActionStartWorkflow(
                GenerationWorkflow.run,
                GenerationInput(spec=spec),
                id=generation_workflow_id(spec.name),
                task_queue=task_queue,
            ),
            spec=ScheduleSpec(
                cron_expressions=[cron] if cron else [],
                intervals=[ScheduleIntervalSpec(every=parse_every(every))] if every else [],
            ),
            policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
            state=ScheduleState(paused=paused, note=f"rolloutd generation {spec.name}"),
        ),
    )
    return sid


async def list_schedules(client: Client) -> list[dict[str, Any]]:
    """Every schedule: id, paused, next run, recent runs."""
    rows = []
    async for entry in await client.list_schedules():
        info = entry.info
        rows.append(
            {
                "id": entry.id,
                "paused": bool(info and info.paused),
                "next": [t.isoformat() for t in (info.next_action_times if info else [])][:1],
                "recent": len(info.recent_actions) if info else 0,
            }
        )
    return rows


async def describe_schedule(client: Client, sid: str) -> dict[str, Any]:
    """A schedule's state, spec and recent firings."""
    d = await client.get_schedule_handle(sid).describe()
    action = d.schedule.action
    return {
        "id": d.id,
        "paused": d.schedule.state.paused,
        "note": d.schedule.state.note,
        "cron": list(d.schedule.spec.cron_expressions),
        "every_s": [i.every.total_seconds() for i in d.schedule.spec.intervals],
        "overlap": d.schedule.policy.overlap.name,
        "workflow": getattr(action, "workflow", None),
        "num_actions": d.info.num_actions,
        "num_skipped": d.info.num_actions_skipped_overlap,
        "recent": [
            {
                "scheduled": a.scheduled_at.isoformat(),
                "workflow_id": getattr(a.action, "workflow_id", None),
            }
            for a in d.info.recent_actions
        ],
        "running": [getattr(a, "workflow_id", None) for a in d.info.running_actions],
        "next": [t.isoformat() for t in d.info.next_action_times[:3]],
    }


async def schedule_command(client: Client, action: str, sid: str, note: str | None = None) -> None:
    """``pause``, ``unpause``, ``trigger`` or ``delete`` a schedule."""
    handle = client.get_schedule_handle(sid)
    if action == "pause":
        await handle.pause(note=note or "paused by rolloutd schedule pause")
    elif action == "unpause":
        await handle.unpause(note=note or "unpaused by rolloutd schedule unpause")
    elif action == "trigger":
        await handle.trigger()
    elif action == "delete":
        await handle.delete()
    else:
        raise ConfigError(f"unknown schedule action {action!r}")
