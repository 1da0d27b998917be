"""``rolloutd reverify`` (:mod:`rolloutd.cli.commands.reverify`): score stored sessions again
without sampling, with the evaluator as the fleets have it now (a fixed or stricter verifier),
and report what changed.

Which sessions: by task id (every stored session of the task), from a results file (JSON or
JSONL of task results, session results or trajectories: each ``session_id``), or by a prefix
of the blob store's session keys (``sessions/run-1-`` or ``run-1-``). The run is a
``ReverifyWorkflow`` (:mod:`rolloutd.workflows.reverify`): the sandbox fleet restores each
session's stored final state into a fresh runtime and runs the evaluator's check, the eval
fleet scores it and appends an evaluation record (``source="reverify"``) to the stored
trajectory's ``rescores``; a session's ``reward`` is never rewritten. The command waits,
prints what changed (per pair of evaluator versions, old to new; each session whose reward
changed; each session that could not be scored again and why) and writes the whole summary as
JSON.

Exit status: 0 when every session was scored again or cannot be by its nature (no final
state stored, never evaluated, a reward the task forced); 1 when a re-score failed (its
runtime, its evaluator) or a session named is not in the store.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy

from rolloutd import task_queues
from rolloutd.activities.models import ReverifySummary, SessionRescore
from rolloutd.cli import tables
from rolloutd.errors import ConfigError
from rolloutd.store import BlobStore, session_prefix, trajectory_key, whole_group
from rolloutd.types import TaskResult
from rolloutd.workflows.reverify import (
    PROGRESS_QUERY,
    ReverifyInput,
    ReverifyWorkflow,
    reverify_workflow_id,
)

if TYPE_CHECKING:
    from rich.console import Group

#: statuses that fail the command (a re-score that went wrong, a session not in the store)
FAILING = ("failed", "evaluator_error", "missing")
#: how often the progress is shown, s
POLL_EVERY_S = 5.0


def sessions_of_task(store: BlobStore, task_id: str) -> list[str]:
    """The stored sessions of a task (those with a trajectory), in index order, each sample's
    replacements (``{task_id}/{index}/r{n}``) after it."""
    found = []
    for key in store.list(session_prefix(task_id)):
        name = key.rsplit("/", 1)[-1]
        if store.exists(trajectory_key(f"{task_id}/{name}")):
            found.append(name)
        for inner in store.list(key):
            replacement = inner.rsplit("/", 1)[-1]
            if re.fullmatch(r"r[0-9]+", replacement) and store.exists(
                trajectory_key(f"{task_id}/{name}/{replacement}")
            ):
                found.append(f"{name}/{replacement}")

    def order(name: str) -> tuple[int, int, str]:
        head, _, replacement = name.partition("/r")
        index = head.split(".", 1)[0]
        return (
            int(index) if index.isdigit() else 1 << 30,
            int(replacement) if replacement.isdigit() else 0,
            name,
        )

    return [f"{task_id}/{name}" for name in sorted(found, key=order)]


def sessions_with_prefix(store: BlobStore, prefix: str) -> list[str]:
    """The stored sessions whose id (``{task_id}/{index}``) starts with ``prefix`` (a leading
    ``sessions/`` is the store's folder and is dropped)."""
    prefix = prefix.removeprefix("sessions/")
    head = prefix.split("/", 1)[0]
    tasks = [k.rsplit("/", 1)[-1] for k in store.list("sessions")]
    found = []
    for task_id in sorted(t for t in tasks if t.startswith(head)):
        found += [s for s in sessions_of_task(store, task_id) if s.startswith(prefix)]
    return found


def sessions_in_results(store: BlobStore, path: Path) -> list[str]:
    """The session ids of a results file: JSON (an object or a list) or JSONL, each object a
    task result (its ``sessions``; a stored group read from the store), a session result or a
    trajectory (its ``session_id``).

    Raises:
        ConfigError: the file is not JSON or JSONL of such objects.
    """
    text = path.read_text(encoding="utf-8")
    try:
        data: Any = json.loads(text)
        rows = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ConfigError(f"{path}:{n}: not JSON: {e}") from None
    found: list[str] = []
    for n, row in enumerate(rows, 1):
        if isinstance(row, dict) and "sessions" in row and "task_id" in row:
            group = whole_group(store, TaskResult.model_validate(row))
            found += [s.session_id for s in group.sessions]
        elif isinstance(row, dict) and isinstance(row.get("session_id"), str):
            found.append(row["session_id"])
        else:
            raise ConfigError(
                f"{path}: record {n} is neither a task result, a session result nor a "
                "trajectory (no session_id)"
            )
    return found


def find_sessions(
    store: BlobStore,
    *,
    task_ids: list[str] | None = None,
    results: Path | None = None,
    prefix: str | None = None,
) -> list[str]:
    """The sessions named by task ids, a results file and a store prefix, in that order, each
    once.

    Raises:
        ConfigError: nothing named, or an unreadable results file.
    """
    if not (task_ids or results or prefix):
        raise ConfigError("name the sessions: --task, --results or --prefix")
    found: list[str] = []
    for task_id in task_ids or []:
        found += sessions_of_task(store, task_id) or [f"{task_id}/0"]  # reported missing
    if results is not None:
        found += sessions_in_results(store, results)
    if prefix:
        found += sessions_with_prefix(store, prefix)
    return list(dict.fromkeys(found))


def render(summary: ReverifySummary) -> Group:
    """The summary as the command prints it: a line of counts, a table of the evaluator
    versions re-scored (before -> after: sessions, changed, lower, higher, mean reward), and a
    table of the sessions whose reward changed or that were not re-scored, with why."""
    from rich.console import Group
    from rich.text import Text

    counts = ", ".join(f"{n} {status}" for status, n in summary.counts.items())
    versions = tables.table(
        "evaluator before",
        "after",
        tables.num("re-scored"),
        tables.num("changed"),
        tables.num("lower"),
        tables.num("higher"),
        tables.num("mean before"),
        tables.num("mean after"),
        rows=(
            (
                f"{v.old_evaluator} {v.old_version or '?'}",
                f"{v.new_evaluator} {v.new_version or '?'}",
                v.num_sessions,
                v.num_changed,
                v.num_lower,
                v.num_higher,
                v.mean_old,
                v.mean_new,
            )
            for v in summary.by_version
        ),
    )
    sessions = tables.table(
        "session", "status", tables.num("reward before"), tables.num("reward after"), "detail"
    )
    for o in summary.changed:
        sessions.add_row(
            *map(tables.cell, (o.session_id, "changed", o.old_reward, o.new_reward)),
            tables.cell((o.reason or "")[:200]),
        )
    for o in summary.sessions:
        if o.status not in ("rescored",) or o.image_changed:
            what = o.detail or ("the image differs from the session's" if o.image_changed else "")
            sessions.add_row(o.session_id, o.status, "-", "-", tables.cell(what[:300]))
    parts: list[Any] = [
        Text(
            f"reverify {summary.run_id}: {summary.num_sessions} sessions ({counts}); "
            f"{summary.num_changed} rewards changed"
        )
    ]
    if summary.by_version:
        parts.append(versions)
    if sessions.row_count:
        parts.append(sessions)
    return Group(*parts)


async def run(
    client: Client,
    store: BlobStore,
    session_ids: list[str],
    *,
    run_id: str,
    evaluators: dict[str, str] | None = None,
    max_concurrent: int = 8,
    out: Path | None = None,
    progress: bool = True,
) -> ReverifySummary:
    """Start (or attach to) the reverify run, wait for it, write its whole summary as JSON to
    ``out`` and return it (read from the store: every session's outcome included)."""
    handle = await client.start_workflow(
        ReverifyWorkflow.run,
        ReverifyInput(
            run_id=run_id,
            session_ids=session_ids,
            evaluators=evaluators or {},
            max_concurrent=max_concurrent,
        ),
        id=reverify_workflow_id(run_id),
        task_queue=task_queues.WORKFLOWS,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )
    result = asyncio.ensure_future(handle.result())
    while progress and not result.done():
        await asyncio.wait([result], timeout=POLL_EVERY_S)
        if not result.done():
            state = await handle.query(PROGRESS_QUERY)
            print(f"reverify {run_id}: {state['num_done']}/{state['num_sessions']}", flush=True)
    summary: ReverifySummary = await result
    if summary.stored_key:
        summary = await asyncio.to_thread(store.get_model, summary.stored_key, ReverifySummary)
    if out is not None:
        out.write_text(summary.model_dump_json(indent=2), encoding="utf-8")
    return summary


def evaluator_map(values: list[str] | None) -> dict[str, str]:
    """``--evaluator`` values as ``ReverifyInput.evaluators``: ``NEW`` scores every session
    with NEW, ``OLD=NEW`` the sessions OLD scored.

    Raises:
        ConfigError: an empty name, or two choices for one.
    """
    chosen: dict[str, str] = {}
    for value in values or []:
        old, _, new = value.rpartition("=")
        old = old or "*"
        if not new or old in chosen:
            raise ConfigError(f"--evaluator {value!r}: give NEW or OLD=NEW, once per OLD")
        chosen[old] = new
    return chosen


def exit_status(sessions: list[SessionRescore]) -> int:
    """1 when a session's re-score failed or it is not in the store, else 0."""
    return 1 if any(o.status in FAILING for o in sessions) else 0
