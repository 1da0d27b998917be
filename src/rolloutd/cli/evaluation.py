"""What ``rolloutd eval`` runs: an eval is ``submit`` with a results file.

Its tasks (:mod:`rolloutd.cli.eval_sources`) have deterministic ids, ``{run}-{row key}``, so
``--resume`` follows the tasks an interrupted run started and starts only the others: no
session runs twice (a task id is a workflow id, which Temporal never starts twice). The
results folder on the caller's machine holds ``config.json`` (what the run ran with, its name
included), ``results.jsonl`` (one line a session: :class:`~rolloutd.cli.results.ResultLine`)
and ``summary.json``; a task's lines are written once its group has ended, and a resumed run
skips the tasks the file holds whole. pass@k comes from ``rolloutd generate``'s function
(:func:`rolloutd.scoring.pass_rates`); no generation workflow is involved.

With ``--tracker``, the run also goes to the team's tracker
(:class:`rolloutd.trainer_client.tracking.RolloutTracker`: TensorBoard, W&B, MLflow) through
:class:`EvalTracking`: each task's group as it arrives is one batch (step = tasks done), and
the summary and a table of sample trajectories at the end.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rolloutd.cli import tables
from rolloutd.cli.eval_sources import (
    EvalPlan,
    Overrides,
    check_run_name,
    default_run_name,
    plan,
)
from rolloutd.cli.report import what_went_wrong
from rolloutd.cli.results import (
    ResultsFile,
    RunSummary,
    config_json,
    group_of,
    summarize,
    summary_rows,
    task_lines,
    write_summary,
)
from rolloutd.cli.submission import TaskRun, wait_run
from rolloutd.errors import ConfigError
from rolloutd.trainer_client.tracking import PREFIX, RolloutTracker
from rolloutd.types import TaskResult

#: the run's config in its results folder
CONFIG_FILE = "config.json"
#: where results go when ``--out`` is not given: ``runs/{run}``
DEFAULT_OUT = Path("runs")
#: sessions in flight at most when neither ``-c`` nor the config says
DEFAULT_CONCURRENCY = 32
#: lines of failures (and of notes) printed at the end; the rest are in results.jsonl
MAX_LINES_SHOWN = 20


#: where an eval's summary goes in the tracker: ``rolloutd/eval/{field}``
EVAL_PREFIX = f"{PREFIX}eval/"
#: sample trajectories in the tracker's table at the end of a run
NUM_SAMPLE_ROWS = 16


def summary_metrics(summary: RunSummary) -> dict[str, float]:
    """The summary as tracker scalars, ``rolloutd/eval/{name}``: ``mean_reward``,
    ``reward_std``, ``pass_at_1``, ``pass_at_k`` (a figure that is None is left out, never
    logged as 0), ``num_tasks``, ``num_sessions``, ``num_scored``, ``num_tasks_failed``,
    ``num_tampered``, ``num_replacements``, ``num_sampled_tokens``, ``wall_time_s`` and
    ``failures/{kind}`` (``none``: ran to its end)."""
    fields = summary.model_dump(exclude={"run", "failures_by_kind"})
    values = {k: v for k, v in fields.items() if isinstance(v, int | float)}
    values.update({f"failures/{k}": n for k, n in summary.failures_by_kind.items()})
    return {f"{EVAL_PREFIX}{k}": float(v) for k, v in values.items() if v is not None}


class EvalTracking:
    """An eval run's series in a :class:`~rolloutd.trainer_client.tracking.RolloutTracker`.

    A task's group is one batch (:meth:`RolloutTracker.log_batch`: reward mean/std, pass
    rate, failures by kind, replacements, turns, tokens, session wall time) at step = the
    tasks the results file holds with it, so a resumed run goes on along the same axis; the
    end logs the summary (:func:`summary_metrics`) and a table of sample trajectories at the
    last step.

    Args:
        tracker: the open tracker (the caller closes it).
        tasks_done: tasks the results file held before this invocation.
    """

    def __init__(self, tracker: RolloutTracker, tasks_done: int = 0) -> None:
        self.tracker = tracker
        self.step = tasks_done

    def group(self, group: TaskResult) -> None:
        """Log one task's group as it arrives."""
        self.step += 1
        self.tracker.log_batch([group], step=self.step)

    def end(self, summary: RunSummary, groups: list[TaskResult]) -> None:
        """Log the run's summary and sample trajectories (``rolloutd/samples``)."""
        step = max(self.step, summary.num_tasks)
        self.tracker.log(summary_metrics(summary), step)
        self.tracker.log_samples(groups, step=step, max_rows=NUM_SAMPLE_ROWS)


@dataclass
class EvalSetup:
    """An eval run, ready to go.

    Attributes:
        run: its name.
        out: its results folder.
        plan: its tasks.
        resumed: an earlier invocation started it (``--resume``).
    """

    run: str
    out: Path
    plan: EvalPlan
    resumed: bool = False

    @property
    def task_ids(self) -> list[str]:
        """The run's task ids, in order."""
        return [t.task_id for t in self.plan.tasks]


def set_up(
    source: str,
    overrides: Overrides,
    *,
    run_name: str | None = None,
    out: Path | None = None,
    resume: bool = False,
    command: list[str] | None = None,
) -> EvalSetup:
    """Name the run, find its folder and plan its tasks; a new run writes ``config.json``.

    Args:
        source: SOURCE.
        overrides: ``-a``, ``-m``, ``-r``, ``-n``.
        run_name: ``--run-name`` (None: the source's stem and the time, or the config's).
        out: ``--out`` (None: ``runs/{run}``).
        resume: ``--resume``: continue the run ``out`` (or ``runs/{run_name}``) holds.
        command: the command line, kept in ``config.json``.

    Raises:
        ConfigError: ``--resume`` without a run to resume, a new run into a folder that
            holds one, a source or options that no longer give the run's tasks, or what
            :func:`rolloutd.cli.eval_sources.plan` refuses.
    """
    if resume:
        if out is None and run_name is None:
            raise ConfigError("--resume needs --out DIR or --run-name NAME (the run to resume)")
        out = out or DEFAULT_OUT / check_run_name(run_name or "")
        try:
            saved = json.loads((out / CONFIG_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ConfigError(f"--resume: no run in {out} ({e})") from None
        run = saved["run"]
        if run_name is not None and run_name != run:
            raise ConfigError(f"--resume: {out} holds run {run!r}, not {run_name!r}")
        said = saved.get("overrides")
        if said is not None and said != vars(overrides):
            changed = sorted(k for k in said if said.get(k) != vars(overrides).get(k))
            raise ConfigError(
                f"--resume: run {run!r} ran with other options ({', '.join(changed)}): resume "
                f"with the command line it started with (in {out / CONFIG_FILE})"
            )
        setup = EvalSetup(run=run, out=out, plan=plan(source, run, overrides), resumed=True)
        if setup.task_ids != saved.get("task_ids"):
            before, now = set(saved.get("task_ids") or []), set(setup.task_ids)
            raise ConfigError(
                f"--resume: SOURCE and the options give other tasks than run {run!r} had "
                f"({len(now - before)} new, {len(before - now)} gone): resume with the "
                f"command line it started with (in {out / CONFIG_FILE})"
            )
        return setup
    run = check_run_name(run_name or default_run_name(source))
    out = out or DEFAULT_OUT / run
    if (out / CONFIG_FILE).exists():
        held = json.loads((out / CONFIG_FILE).read_text(encoding="utf-8")).get("run")
        raise ConfigError(
            f"{out} holds run {held!r}: --resume to continue it, or another --out / --run-name"
        )
    setup = EvalSetup(run=run, out=out, plan=plan(source, run, overrides))
    out.mkdir(parents=True, exist_ok=True)
    config = {**setup.plan.config, "command": command or [], "started_at": time.time()}
    (out / CONFIG_FILE).write_text(config_json(config), encoding="utf-8")
    return setup


async def evaluate(
    client: Any,
    setup: EvalSetup,
    state: TaskRun,
    *,
    concurrency: int | None = None,
    details: bool = False,
    tracker: RolloutTracker | None = None,
) -> tuple[RunSummary, list[TaskResult]]:
    """Run the eval: start (or follow) every task the results file does not hold whole, at
    most ``concurrency`` sessions in flight, write each task's lines as its group arrives,
    then the summary.

    Args:
        client: a connected :class:`~rolloutd.trainer_client.RolloutClient`.
        setup: the run.
        state: where the run's progress goes (the caller's, for an interrupt's message).
        concurrency: sessions in flight at most (None: the config's, else
            :data:`DEFAULT_CONCURRENCY`).
        details: the per-task live view.
        tracker: where each group and the summary are logged too (:class:`EvalTracking`).

    Returns:
        The summary over every task the results file holds (earlier invocations' too) and
        those tasks' groups as the file holds them.

    Raises:
        FleetUnavailableError: a fleet died while waiting (the tasks keep running).
        KeyboardInterrupt: Ctrl-C; the tasks keep running, ``state`` says which.
    """
    t0 = time.monotonic()
    results = ResultsFile(setup.out)
    done = results.read()
    requests = {t.task_id: t for t in setup.plan.tasks}
    state.requests = list(setup.plan.tasks)
    state.done = {t for t in done if t in requests}
    tracking = EvalTracking(tracker, len(state.done)) if tracker is not None else None

    def on_group(request: Any, group: TaskResult) -> None:
        results.append(
            task_lines(
                group,
                run=setup.run,
                row_key=setup.plan.row_keys.get(request.task_id),
                harness=request.harness.type,
                model=request.model,
            )
        )
        if tracking is not None:
            tracking.group(group)

    bound = concurrency or setup.plan.concurrency or DEFAULT_CONCURRENCY
    await wait_run(client, state, concurrency=bound, on_group=on_group, details=details)
    lines = results.read()
    whole = [lines[t] for t in setup.task_ids if t in lines]
    summary = summarize(
        whole,
        k=setup.plan.num_samples,
        pass_reward=setup.plan.pass_reward,
        run=setup.run,
        wall_time_s=time.monotonic() - t0,
    )
    write_summary(setup.out, summary)
    groups = [group_of(task) for task in whole]
    if tracking is not None:
        tracking.end(summary, groups)
    return summary, groups


def print_summary(summary: RunSummary, groups: list[TaskResult], setup: EvalSetup) -> int:
    """Print the summary table and what went wrong (at most :data:`MAX_LINES_SHOWN` lines
    of each kind).

    Returns:
        The exit status: 1 when a session ended with an infrastructure cause no replacement
        made good (:func:`rolloutd.cli.report.what_went_wrong`), else 0; a tamper or a
        ceiling is a score, not a failure.
    """
    tables.show(
        tables.table(
            "what",
            "value",
            title=f"rolloutd eval {setup.run}",
            rows=summary_rows(summary),
        )
    )
    failures, notes = what_went_wrong(groups)
    for label, lines in (("note", notes), ("FAILED", failures)):
        for line in lines[:MAX_LINES_SHOWN]:
            print(f"{label}: {line}")
        if len(lines) > MAX_LINES_SHOWN:
            print(f"{label}: {len(lines) - MAX_LINES_SHOWN} more in {setup.out}/results.jsonl")
    print(f"results: {setup.out}/results.jsonl, {setup.out}/summary.json")
    return 1 if failures else 0
