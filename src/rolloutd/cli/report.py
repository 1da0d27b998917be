"""What ``rolloutd submit`` and ``rolloutd demo`` print of finished tasks: a table per session,
failures by kind, and what went wrong (the lines a failed run exits 1 for)."""

from __future__ import annotations

from typing import Any

from rolloutd.cli import tables
from rolloutd.scoring import failure_counts, failure_of
from rolloutd.types import SessionStatus


def call_errors_cell(session: Any) -> str:
    """The ``call errors`` column of a :class:`~rolloutd.types.SessionResult`: failed model
    calls, and how many of them were 5xx answers the harness never recovered from."""
    if not session.num_unrecovered_call_errors:
        return str(session.num_call_errors)
    return f"{session.num_call_errors} ({session.num_unrecovered_call_errors} unrecovered)"


def failure_cell(session: Any) -> str:
    """The ``failure`` column of a :class:`~rolloutd.types.SessionResult`: ``-`` for a
    session that ran to its end, else its cause's kind and phase (``timeout/run``), marked
    ``(policy)`` when the policy is accountable (docs/failures.md)."""
    failure = session.failure
    if failure is None:
        return "-"
    cell = (
        failure.kind
        if not failure.phase or failure.kind in ("cancelled",)
        else f"{failure.kind}/{failure.phase}"
    )
    return f"{cell} (policy)" if failure.policy_accountable else cell


def infrastructure_failure(session: Any) -> bool:
    """Whether a session ended with a cause that is not the policy's: any failure cause but
    ``cancelled`` (someone asked), ``refused`` (the task asked for what the sandbox policy
    refuses: the task's) and a policy-accountable run timeout."""
    failure = session.failure
    return (
        failure is not None
        and failure.kind not in ("cancelled", "refused")
        and not failure.policy_accountable
    )


def made_good(session: Any, group: Any) -> bool:
    """Whether another session of the group with the same sample index (a replacement)
    ended without an infrastructure cause."""
    return any(
        other is not session
        and other.sample_index == session.sample_index
        and not infrastructure_failure(other)
        for other in group.sessions
    )


def what_went_wrong(results: list[Any]) -> tuple[list[str], list[str]]:
    """What ``submit`` and ``demo`` print under their table, in words.

    The run failed (the command exits non-zero) when a session ended with an infrastructure
    cause (its ``failure``: any kind but ``cancelled`` and a run timeout the policy is
    accountable for) that no replacement made good (a session of the same sample index
    without one); for results without a failure cause: a gateway or backend failure (a 5xx
    answer) that no later completion of the session recovered, or a failed session
    (``status`` ``failed``); or when every session of a task recorded 0 completions (the
    model was never reached) and none of them was scored without a failure cause (a scripted
    harness, ``oracle`` or ``shell``, that ran to its end: the session workflow scores it
    though it made no call, and fails an agent harness that made none:
    :mod:`rolloutd.workflows.session.failures`). Failed calls the harness recovered from,
    and 4xx answers, are reported but do not fail the run.

    Args:
        results: the :class:`~rolloutd.types.TaskResult` of every task.

    Returns:
        ``(failures, notes)``: lines that fail the run, lines that only inform.
    """
    failures: list[str] = []
    notes: list[str] = []
    for group in results:
        for s in group.sessions:
            last = f"; last: {s.last_call_error}" if s.last_call_error else ""
            if s.failure is not None:
                where = f" in {s.failure.phase}" if s.failure.phase else ""
                line = f"session {s.session_id}: {s.failure.kind}{where}: {s.failure.message}"
                if s.failure.kind == "backend":
                    line += last
                if not infrastructure_failure(s):
                    notes.append(line)
                elif made_good(s, group):
                    notes.append(f"{line} (replaced)")
                else:
                    failures.append(line)
                if s.num_call_errors and not s.num_unrecovered_call_errors:
                    notes.append(
                        f"session {s.session_id}: {s.num_call_errors} model call(s) "
                        f"failed, recovered or refused as bad requests{last}"
                    )
                continue
            if s.num_unrecovered_call_errors:
                failures.append(
                    f"session {s.session_id}: {s.num_call_errors} model call(s) failed, "
                    f"{s.num_unrecovered_call_errors} with a gateway/backend error (5xx) the "
                    f"harness never recovered from{last}"
                )
            elif s.num_call_errors:
                notes.append(
                    f"session {s.session_id}: {s.num_call_errors} model call(s) "
                    f"failed, recovered or refused as bad requests{last}"
                )
            if s.status == SessionStatus.FAILED:
                failures.append(f"session {s.session_id} failed: {s.error}")
        if (
            group.sessions
            and all(s.num_completions == 0 for s in group.sessions)
            and not any(_scored_clean(s) for s in group.sessions)
            # a task cancelled before its sessions called the model was stopped, not silent
            and not all(
                (f := failure_of(s)) is not None and f.kind == "cancelled" for s in group.sessions
            )
        ):
            failures.append(
                f"task {group.task_id}: no session recorded a completion "
                "(no model call was answered)"
            )
    return failures, notes


def _scored_clean(session: Any) -> bool:
    """A session that ran to its end and was scored: no failure cause, no unrecovered 5xx
    answer, a reward."""
    return (
        session.status == SessionStatus.COMPLETED
        and session.failure is None
        and not session.num_unrecovered_call_errors
        and session.reward is not None
    )


def print_report(results: list[Any], wall_s: float) -> None:
    """Print what :func:`submit_tasks` waited for: a table per session, failures by kind, each
    task's mean reward and its first session's phases, then what went wrong
    (:func:`what_went_wrong`).

    Args:
        results: the TaskResults.
        wall_s: how long the wait took, seconds.
    """
    table = tables.table(
        "session",
        "status",
        "failure",
        tables.num("reward"),
        tables.num("completions"),
        tables.num("call errors"),
        tables.num("traces"),
        tables.num("trainable tokens"),
        tables.num("wall s"),
        title=f"rolloutd: {len(results)} tasks in {wall_s:.1f} s",
    )
    for group in results:
        for s in group.sessions:
            table.add_row(
                s.session_id,
                s.status.value,
                failure_cell(s),
                tables.cell(s.reward),
                str(s.num_completions),
                call_errors_cell(s),
                str(s.num_traces),
                str(s.num_trainable_tokens),
                tables.cell(sum(p.duration_s for p in s.phases), 1),
            )
    tables.show(table)
    print(
        "failures by kind: "
        + ", ".join(
            f"{kind} {n}"
            for kind, n in failure_counts(
                (s for group in results for s in group.sessions), count_none=True
            ).items()
        )
    )
    for group in results:
        mean = "-" if group.mean_reward is None else f"{group.mean_reward:.2f}"
        print(
            f"task {group.task_id}: mean reward {mean}, "
            f"{group.num_completed}/{len(group.sessions)} completed"
        )
        if group.sessions:
            first = group.sessions[0]
            print(
                f"  phases of {first.session_id}: "
                + ", ".join(f"{p.phase} {p.duration_s:.2f} s" for p in first.phases)
            )
    failures, notes = what_went_wrong(results)
    for line in notes:
        print(f"note: {line}")
    for line in failures:
        print(f"FAILED: {line}")


def exit_code(results: list[Any]) -> int:
    """1 when :func:`what_went_wrong` finds a failure of the run, else 0."""
    return 1 if what_went_wrong(results)[0] else 0
