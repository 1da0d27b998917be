"""What ``rolloutd tasks`` reads and prints: tasks on a stack, one task with its sessions'
evaluation records (tamper reports and ceilings included), cancelling.

Two ways in, one shape out (:class:`TaskAccess`): the operator's, over Temporal and the blob
store (:class:`~rolloutd.trainer_client.RolloutClient`: the credentials ``rolloutd up`` and
the fleets use), and a tenant's, over the REST facade with its tenant token
(:class:`~rolloutd.trainer_client.RestClient`: a tenant sees, reads and cancels its own tasks
only, and never holds Temporal or store credentials).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from rolloutd.cli import tables
from rolloutd.cli.report import failure_cell
from rolloutd.trainer_client.listing import TaskRow, rows_of
from rolloutd.types import SessionResult, TaskProgress, Trajectory

#: tamper findings shown per session (the rest are counted)
MAX_FINDINGS_SHOWN = 5


class TaskAccess:
    """Reads and cancels tasks over Temporal (``client``: a ``RolloutClient``) or over the
    REST facade (``rest``: a ``RestClient``); exactly one of them is given."""

    def __init__(self, client: Any = None, rest: Any = None) -> None:
        if (client is None) == (rest is None):
            raise ValueError("give a RolloutClient or a RestClient")
        self.client = client
        self.rest = rest

    @property
    def via(self) -> str:
        """``temporal`` or ``rest``."""
        return "rest" if self.rest is not None else "temporal"

    async def close(self) -> None:
        """Close the REST client (the Temporal client needs no closing)."""
        if self.rest is not None:
            await self.rest.aclose()

    async def list(
        self, *, status: str | None = None, prefix: str | None = None, limit: int = 100
    ) -> list[TaskRow]:
        """Tasks, newest first (a tenant's own only, over REST).

        Raises:
            ConfigError: a malformed filter (Temporal); RestError: the facade refused.
        """
        if self.rest is not None:
            return rows_of(await self.rest.list_tasks(status=status, prefix=prefix, limit=limit))
        return await self.client.list_tasks(status=status, prefix=prefix, limit=limit)

    async def progress(self, task_id: str) -> TaskProgress:
        """A task as it stands: its ended sessions with their evaluation records.

        Raises:
            NotFoundError: no such task (Temporal); RestError: 404 and other refusals.
        """
        if self.rest is None:
            return await self.client.status(task_id)
        body = await self.rest.status(task_id, traces=False)
        sessions = [
            SessionResult.model_validate(r["metadata"]["rolloutd"]) for r in body.get("results", [])
        ]
        return TaskProgress(
            task_id=task_id,
            status=body["status"],
            num_samples=body.get("total_sessions", 0),
            sessions=sessions,
            error=body.get("error"),
        )

    async def trajectory(self, session: SessionResult) -> Trajectory:
        """An ended session's trajectory (its re-scores included).

        Raises:
            ConfigError: no blob store or no trajectory (Temporal); RestError (REST).
        """
        if self.rest is not None:
            return Trajectory.model_validate(await self.rest.trajectory(session.session_id))
        return await asyncio.to_thread(self.client.trajectory, session)

    async def cancel(self, task_id: str) -> None:
        """Cancel a task: its sessions stop, tear their runtimes down, keep what they captured.

        Raises:
            RPCError (Temporal) or RestError (REST): no such task, or the call failed.
        """
        if self.rest is not None:
            await self.rest.cancel(task_id)
        else:
            await self.client.cancel(task_id)


def print_rows(rows: Sequence[TaskRow]) -> None:
    """``rolloutd tasks list``'s table."""
    tables.show(
        tables.table(
            "task",
            "status",
            "tenant",
            "harness",
            tables.num("mean reward"),
            "started",
            "closed",
            title=f"{len(rows)} task(s), newest first",
            rows=(
                (
                    row.task_id,
                    row.status,
                    row.tenant,
                    row.harness,
                    tables.cell(row.mean_reward, 3),
                    _when(row.started_at),
                    _when(row.closed_at),
                )
                for row in rows
            ),
        )
    )


def _when(moment: datetime | None) -> str | None:
    return moment.strftime("%Y-%m-%d %H:%M:%S") if moment else None


def tamper_cell(session: SessionResult) -> str:
    """The ``tamper`` column: ``-`` when not examined, ``none`` when clean, else how many
    verdict-affecting paths were found."""
    record = session.evaluation
    if record is None or record.tamper is None:
        return "-"
    return f"{len(record.tamper.findings)} found" if record.tamper.tampered else "none"


def session_notes(session: SessionResult) -> list[str]:
    """What a session's row cannot hold: its failure in words (a ceiling names its limit),
    the evaluator's reason, and the tamper report's findings."""
    notes = []
    if session.failure is not None:
        notes.append(f"failure {failure_cell(session)}: {session.failure.message}")
    record = session.evaluation
    if record is not None:
        if record.reason:
            notes.append(f"evaluator {record.evaluator} {record.version}: {record.reason}")
        if record.forced:
            notes.append("reward forced by the task (run timeout, invalid tool call, ceiling)")
        if record.error:
            notes.append(f"evaluator error: {record.error}")
        tamper = record.tamper
        if tamper is not None:
            for f in tamper.findings[:MAX_FINDINGS_SHOWN]:
                notes.append(f"tamper: {f.path} ({f.category}, {f.change}) {f.detail}".rstrip())
            more = len(tamper.findings) - MAX_FINDINGS_SHOWN
            if more > 0 or tamper.truncated:
                notes.append(f"tamper: {max(more, 0)} more finding(s) (truncated)")
            if tamper.ignored:
                notes.append(
                    f"tamper: {len(tamper.ignored)} suspicious path(s) the verifier did not "
                    "carry (listed, not scored)"
                )
    return notes


def print_task(progress: TaskProgress) -> None:
    """``rolloutd tasks show``: the task, a row per ended session (status, failure, reward,
    evaluator, tamper, completions, tokens, time), then each session's notes."""
    result = progress.result
    mean = result.mean_reward if result is not None else None
    print(
        f"task {progress.task_id}: {progress.status}; "
        f"{len(progress.sessions)}/{progress.num_samples or '?'} sessions ended; mean reward "
        + ("-" if mean is None else f"{mean:.3f}")
        + (f"; {progress.error}" if progress.error else "")
    )
    table = tables.table(
        tables.num("sample"),
        "session",
        "status",
        "failure",
        tables.num("reward"),
        "evaluator",
        "tamper",
        tables.num("completions"),
        tables.num("tokens"),
        tables.num("s"),
    )
    sessions = sorted(progress.sessions, key=lambda s: s.sample_index)
    for s in [*sessions, *progress.replaced]:
        record = s.evaluation
        table.add_row(
            str(s.sample_index) + (" (replaced)" if s in progress.replaced else ""),
            s.session_id,
            s.status.value,
            failure_cell(s),
            tables.cell(s.reward),
            "-" if record is None else f"{record.evaluator} {record.version}".strip(),
            tamper_cell(s),
            str(s.num_completions),
            str(s.num_trainable_tokens),
            tables.cell(sum(p.duration_s for p in s.phases), 1),
        )
    tables.show(table)
    for s in [*sessions, *progress.replaced]:
        for note in session_notes(s):
            print(f"  {s.session_id}: {note}")
    if progress.status == "running":
        print("running: sessions that end meanwhile show on the next look")


def print_session(session: SessionResult, trajectory: Trajectory | None) -> None:
    """``rolloutd tasks show ID --session N``: one session whole: its result, its notes, its
    evaluation record and the trajectory's re-scores."""
    print(
        f"session {session.session_id}: {session.status.value}; reward "
        + ("-" if session.reward is None else f"{session.reward:g}")
    )
    for note in session_notes(session):
        print(f"  {note}")
    print(
        "  phases: " + (", ".join(f"{p.phase} {p.duration_s:.2f} s" for p in session.phases) or "-")
    )
    if session.attempts:
        print(f"  earlier attempts: {len(session.attempts)} (lost hosts; replayed)")
    if session.evaluation is not None:
        print("  evaluation record: " + session.evaluation.model_dump_json(exclude_none=True))
    if trajectory is not None:
        print(
            f"  trajectory: {len(trajectory.traces)} trace(s), "
            f"{trajectory.stats.num_trainable_tokens} trainable tokens"
        )
        for record in trajectory.rescores:
            print(
                f"  re-scored ({record.source}) by {record.evaluator} {record.version}: reward "
                + ("-" if record.reward is None else f"{record.reward:g}")
                + (f" ({record.reason})" if record.reason else "")
                + (" tampered" if record.tamper is not None and record.tamper.tampered else "")
            )
    print(f"  viewer: rolloutd view {session.session_id}")
