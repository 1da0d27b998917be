"""The results file of ``rolloutd eval`` and ``rolloutd submit --out``: ``results.jsonl``, one
line a session, on the caller's machine, and the run's summary.

A line is a :class:`ResultLine` (its JSON Schema: ``ResultLine.model_json_schema()``; the
fields are listed in docs/evaluation.md, and the tests validate every line they write against
it). A task's lines are written together, once its group has ended, in one ``write``; a file
cut short by a crash loses at most the last task's lines, which ``--resume`` writes again
(:meth:`ResultsFile.read`).

The summary (:class:`RunSummary`): mean ± std of the scored rewards, pass@1 and pass@k with
``rolloutd generate``'s function (:func:`rolloutd.scoring.pass_rates`), failures by kind
(:func:`rolloutd.scoring.failure_counts`), replacements, tokens sampled, wall time.
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rolloutd.records import EvaluationRecord, FailureCause
from rolloutd.scoring import failure_counts, pass_rates, scored_rewards
from rolloutd.types import SessionResult, SessionStatus, TaskResult

#: the file's name in the results folder
RESULTS_FILE = "results.jsonl"
#: the summary's file
SUMMARY_FILE = "summary.json"
#: the version of :class:`ResultLine`'s shape
SCHEMA_VERSION = 1


class ResultLine(BaseModel):
    """One session of a run, as a line of ``results.jsonl``."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = Field(default=SCHEMA_VERSION, description="this shape's version")
    run: str | None = Field(
        default=None, description="the eval run's name (None: a `submit` of a task file)"
    )
    task_id: str = Field(description="the task (workflow `task/{task_id}`)")
    row_key: str | None = Field(
        default=None, description="the source row's key the task came from (eval)"
    )
    sample: int = Field(ge=0, description="the sample index in the task's group")
    session_id: str = Field(description="the session (`{task_id}/{sample}[/r{n}]`)")
    group_size: int = Field(
        ge=0,
        description="the task's final sessions, all written together (fewer than its samples "
        "when it was cancelled): a task is whole in the file when it has as many final lines",
    )
    superseded: bool = Field(
        default=False,
        description="a replacement superseded this session (an infrastructure failure): it is "
        "listed, never counted in the scores",
    )
    status: SessionStatus = Field(description="how the session ended")
    reward: float | None = Field(
        description="the reward (None: not scored; an infrastructure failure is never 0.0)"
    )
    trace_rewards: list[float] | None = Field(default=None, description="per-trace rewards")
    failure: FailureCause | None = Field(
        description="why the session did not run to its end (None: it did); kind, phase, "
        "message, whether the policy is accountable (a ceiling it reached, a run timeout)"
    )
    evaluation: EvaluationRecord | None = Field(
        description="the scoring its reward came from: evaluator and version, reason, tamper "
        "report, judge cost (None: not evaluated)"
    )
    harness: str | None = Field(default=None, description="the task's harness type")
    model: str | None = Field(default=None, description="the model name the harness was shown")
    num_completions: int = Field(ge=0, description="model calls answered and recorded")
    num_call_errors: int = Field(ge=0, description="model calls answered with an error")
    num_unrecovered_call_errors: int = Field(
        default=0, ge=0, description="of those, 5xx answers no later completion made good"
    )
    error: str | None = Field(default=None, description="the session's error, in words")
    num_traces: int = Field(ge=0, description="traces built from the completion log")
    num_sampled_tokens: int = Field(
        ge=0, description="tokens the model sampled (positions with loss_mask 1)"
    )
    num_response_tokens: int = Field(ge=0, description="all response positions of the traces")
    num_attempts: int = Field(
        ge=1, description="runs of the harness (more than 1: a lost host, replayed)"
    )
    started_at: datetime | None = Field(description="the first phase's start, UTC")
    ended_at: datetime | None = Field(description="the last phase's end, UTC")
    duration_s: float = Field(ge=0, description="the phases' execution time in all, s")
    phases_s: dict[str, float] = Field(description="phase -> execution time, s")
    trajectory_ref: str | None = Field(
        description="the trajectory's blob-store key (`rolloutd tasks show`, the viewer)"
    )
    viewer_path: str = Field(description="the session's page on the REST facade's viewer")


def session_line(
    session: SessionResult,
    *,
    group_size: int,
    superseded: bool = False,
    run: str | None = None,
    row_key: str | None = None,
    harness: str | None = None,
    model: str | None = None,
) -> ResultLine:
    """The line of one session.

    Args:
        session: its result.
        group_size: the final sessions of its task's group.
        superseded: a replacement superseded it.
        run, row_key, harness, model: what the run knows of its task.
    """
    phases = session.phases
    return ResultLine(
        run=run,
        task_id=session.task_id,
        row_key=row_key,
        sample=session.sample_index,
        group_size=group_size,
        session_id=session.session_id,
        superseded=superseded,
        status=session.status,
        reward=session.reward,
        trace_rewards=session.trace_rewards,
        failure=session.failure,
        evaluation=session.evaluation,
        harness=harness,
        model=model,
        num_completions=session.num_completions,
        num_call_errors=session.num_call_errors,
        num_unrecovered_call_errors=session.num_unrecovered_call_errors,
        error=session.error,
        num_traces=session.num_traces,
        num_sampled_tokens=session.num_trainable_tokens,
        num_response_tokens=session.stats.num_response_tokens,
        num_attempts=len(session.attempts) + 1,
        started_at=phases[0].started_at if phases else None,
        ended_at=phases[-1].ended_at if phases else None,
        duration_s=sum(p.duration_s for p in phases),
        phases_s={p.phase: p.duration_s for p in phases},
        trajectory_ref=session.trajectory_ref,
        viewer_path="/view/session/" + session.session_id,
    )


def task_lines(
    group: TaskResult,
    *,
    run: str | None = None,
    row_key: str | None = None,
    harness: str | None = None,
    model: str | None = None,
) -> list[ResultLine]:
    """The lines of a task's group: its final sessions by sample, then the sessions a
    replacement superseded, in the order they ended."""
    known = {
        "run": run,
        "row_key": row_key,
        "harness": harness,
        "model": model,
        "group_size": len(group.sessions),
    }
    final = sorted(group.sessions, key=lambda s: s.sample_index)
    return [session_line(s, **known) for s in final] + [
        session_line(s, superseded=True, **known) for s in group.replaced
    ]


class ResultsFile:
    """``results.jsonl`` in a results folder: a task's lines appended at once; read back on
    ``--resume``.

    Args:
        folder: the results folder (made when missing).
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / RESULTS_FILE

    def read(self) -> dict[str, list[ResultLine]]:
        """The tasks whose lines are whole, by task id: each of its samples has its final
        line. A line that is not valid JSON or not a :class:`ResultLine` (the end of a file
        cut short) is left out, with the rest of its task's lines; the file is rewritten
        without them, so appends go on from whole tasks."""
        if not self.path.exists():
            return {}
        by_task: dict[str, list[ResultLine]] = {}
        broken: set[str] = set()
        for text in self.path.read_text(encoding="utf-8").splitlines():
            if not text.strip():
                continue
            try:
                line = ResultLine.model_validate_json(text)
            except ValidationError:
                try:
                    task_id = json.loads(text).get("task_id")
                except (ValueError, AttributeError):
                    task_id = None
                if isinstance(task_id, str):
                    broken.add(task_id)
                continue
            by_task.setdefault(line.task_id, []).append(line)
        whole = {
            task: lines for task, lines in by_task.items() if task not in broken and _whole(lines)
        }
        if len(whole) != len(by_task) or broken:
            self._rewrite([line for lines in whole.values() for line in lines])
        return whole

    def append(self, lines: Sequence[ResultLine]) -> None:
        """Append a task's lines in one write, flushed to disk."""
        self.folder.mkdir(parents=True, exist_ok=True)
        text = "".join(line.model_dump_json() + "\n" for line in lines)
        with self.path.open("a", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())

    def _rewrite(self, lines: Sequence[ResultLine]) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text("".join(line.model_dump_json() + "\n" for line in lines), "utf-8")
        tmp.replace(self.path)


def _whole(lines: Sequence[ResultLine]) -> bool:
    """Whether a task's lines hold all of its final sessions (``group_size`` of them, one a
    sample index)."""
    final = {line.sample for line in lines if not line.superseded}
    return len(final) == lines[0].group_size == sum(not line.superseded for line in lines)


class RunSummary(BaseModel):
    """What a run comes to, over the final sessions of every task (``summary.json``)."""

    model_config = ConfigDict(extra="forbid")

    run: str | None = Field(default=None, description="the eval run's name")
    num_tasks: int = Field(default=0, ge=0)
    num_sessions: int = Field(default=0, ge=0, description="final sessions (one a sample)")
    num_scored: int = Field(default=0, ge=0, description="sessions whose reward counts")
    mean_reward: float | None = Field(default=None, description="over the scored sessions")
    reward_std: float | None = Field(
        default=None, description="population standard deviation of the scored rewards"
    )
    k: int = Field(default=1, ge=1, description="the k of pass@k: samples per task")
    pass_reward: float = Field(default=1.0, description="a reward >= this is a pass")
    pass_at_1: float | None = None
    pass_at_k: float | None = None
    num_tasks_failed: int = Field(default=0, ge=0, description="tasks without a rewarded sample")
    failures_by_kind: dict[str, int] = Field(
        default_factory=dict, description="final sessions by failure kind (`none`: ran to end)"
    )
    num_tampered: int = Field(default=0, ge=0, description="sessions a tamper report scored 0")
    num_replacements: int = Field(default=0, ge=0, description="sessions superseded")
    num_sampled_tokens: int = Field(default=0, ge=0, description="tokens the model sampled")
    wall_time_s: float = Field(default=0.0, ge=0, description="this invocation's wall time, s")


def summarize(
    tasks: Iterable[Sequence[ResultLine]],
    *,
    k: int,
    pass_reward: float = 1.0,
    run: str | None = None,
    wall_time_s: float = 0.0,
) -> RunSummary:
    """The run's summary from its tasks' lines (so a resumed run counts what earlier
    invocations wrote).

    Args:
        tasks: each task's lines.
        k: the k of pass@k.
        pass_reward: a reward >= this is a pass.
        run: the run's name.
        wall_time_s: this invocation's wall time, s.
    """
    rows: list[list[SessionResult]] = []
    num_replacements = 0
    tampered = 0
    for lines in tasks:
        final = [line for line in lines if not line.superseded]
        num_replacements += len(lines) - len(final)
        rows.append([_as_session(line) for line in final])
        tampered += sum(
            1
            for line in final
            if line.evaluation is not None
            and line.evaluation.tamper is not None
            and line.evaluation.tamper.tampered
        )
    sessions = [s for row in rows for s in row]
    rewards = scored_rewards(sessions)
    rates = pass_rates(rows, k, pass_reward)
    return RunSummary(
        run=run,
        num_tasks=len(rows),
        num_sessions=len(sessions),
        num_scored=len(rewards),
        mean_reward=statistics.fmean(rewards) if rewards else None,
        reward_std=statistics.pstdev(rewards) if rewards else None,
        k=k,
        pass_reward=pass_reward,
        pass_at_1=rates.pass_at_1,
        pass_at_k=rates.pass_at_k,
        num_tasks_failed=rates.num_rows_failed,
        failures_by_kind=failure_counts(sessions, count_none=True),
        num_tampered=tampered,
        num_replacements=num_replacements,
        num_sampled_tokens=sum(s.num_trainable_tokens for s in sessions),
        wall_time_s=wall_time_s,
    )


def _as_session(line: ResultLine) -> SessionResult:
    """The fields of a session the scoring rules read, from its line."""
    return SessionResult(
        session_id=line.session_id,
        task_id=line.task_id,
        sample_index=line.sample,
        status=line.status,
        reward=line.reward,
        failure=line.failure,
        num_completions=line.num_completions,
        num_call_errors=line.num_call_errors,
        num_unrecovered_call_errors=line.num_unrecovered_call_errors,
        error=line.error,
        num_trainable_tokens=line.num_sampled_tokens,
        trajectory_ref=line.trajectory_ref,
        evaluation=line.evaluation,
    )


def group_of(lines: Sequence[ResultLine]) -> TaskResult:
    """A task's group as its lines hold it (what the report and the exit status read: its
    final sessions and the superseded ones)."""
    final = sorted((line for line in lines if not line.superseded), key=lambda x: x.sample)
    return TaskResult(
        task_id=lines[0].task_id,
        sessions=[_as_session(line) for line in final],
        replaced=[_as_session(line) for line in lines if line.superseded],
        num_sessions=len(final),
    )


def write_summary(folder: Path, summary: RunSummary) -> Path:
    """Write ``summary.json`` (replaced whole) and return its path."""
    path = folder / SUMMARY_FILE
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(summary.model_dump_json(indent=2) + "\n", "utf-8")
    tmp.replace(path)
    return path


def summary_rows(summary: RunSummary) -> list[tuple[str, str]]:
    """The summary as (name, value) pairs, in the order a table shows them."""

    def rate(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    mean = (
        "-"
        if summary.mean_reward is None
        else f"{summary.mean_reward:.3f} ± {summary.reward_std or 0.0:.3f}"
    )
    failures = ", ".join(f"{kind} {n}" for kind, n in summary.failures_by_kind.items()) or "-"
    # one sample a task: pass@k is pass@1, shown once
    at_k = [(f"pass@{summary.k}", rate(summary.pass_at_k))] if summary.k > 1 else []
    return [
        ("tasks", str(summary.num_tasks)),
        ("sessions (scored)", f"{summary.num_sessions} ({summary.num_scored})"),
        ("reward mean ± std", mean),
        ("pass@1", rate(summary.pass_at_1)),
        *at_k,
        ("failures by kind", failures),
        ("tampered", str(summary.num_tampered)),
        ("replacements", str(summary.num_replacements)),
        ("tokens sampled", str(summary.num_sampled_tokens)),
        ("wall time s", f"{summary.wall_time_s:.1f}"),
    ]


def config_json(config: dict[str, Any]) -> str:
    """The run's config as the results folder keeps it (``config.json``): sorted keys."""
    return json.dumps(config, indent=2, sort_keys=True, default=str) + "\n"
