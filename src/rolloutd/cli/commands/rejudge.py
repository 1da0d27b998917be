"""``rolloutd rejudge``: judge stored sessions again with an LLM judge, from their stored
trajectories, never by sampling them again (:meth:`RolloutClient.rejudge
<rolloutd.trainer_client.client.RolloutClient.rejudge>`, a ``RejudgeWorkflow``).

The judge: the task's own ``llm_judge`` evaluator, read from the task file the task came from
(``--task-file``), or a judge spec of its own (``--judge``: a JSON ``evaluator.judge``
object, or a whole ``evaluator``), e.g. a fixed rubric. The sessions: every stored session of
the task, or those named with ``--session``. Each verdict is appended to its trajectory's
``rescores``; a session whose judging had failed (no reward) gets this reward and loses its
judge failure; a reward handed out already is never rewritten.

A session that failed before its judging (its harness, its runtime: the infrastructure's) is
left out, as group judging leaves it out of its cohort. Exit status: 0 when every session was
judged; 1 when a judging was given up (the judge pool failed: the sessions keep no reward) or no
stored session is left to judge.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rolloutd.cli.commands import ADDRESS_HELP, STORE_URL_HELP, add_command
from rolloutd.errors import ConfigError, RolloutdError
from rolloutd.settings import CommonSettings

if TYPE_CHECKING:
    from rolloutd.cli.tables import Table
    from rolloutd.store import BlobStore
    from rolloutd.types import EvaluatorSpec
    from rolloutd.workflows.session.judging import RejudgeOutput


def register(sub: Any) -> None:
    """Add ``rejudge``."""
    rejudge = add_command(
        sub,
        "rejudge",
        "judge a task's stored sessions again with an LLM judge (the task's own, or another "
        "rubric), from their stored trajectories, never sampled again; appends an evaluation "
        "record to each trajectory and gives a reward only to a session whose judging had "
        "failed; prints each session's verdict",
        run,
    )
    rejudge.add_argument("--task", required=True, metavar="TASK_ID", help="the task judged")
    rejudge.add_argument(
        "--task-file",
        type=Path,
        default=None,
        help="the task file (JSON or JSONL) holding the task: its llm_judge evaluator judges",
    )
    rejudge.add_argument(
        "--judge",
        type=Path,
        default=None,
        help="a JSON file of the judge to use instead: an evaluator.judge object (rubric, "
        "mode, limits) or a whole llm_judge evaluator",
    )
    rejudge.add_argument(
        "--session",
        action="append",
        default=None,
        metavar="SESSION_ID",
        help="judge only this stored session (repeat for more); None: every stored session "
        "of the task",
    )
    rejudge.add_argument(
        "--run-name",
        default=None,
        help="names the run (workflow rejudge/NAME, its judge sessions); a name that ran "
        "already answers with its result again; None: the time and a random suffix",
    )
    rejudge.add_argument(
        "--max-concurrent", type=int, default=4, help="sample judgings at once (1-256)"
    )
    rejudge.add_argument(
        "--json", action="store_true", help="print the verdicts as JSON instead of a table"
    )
    rejudge.add_argument("--address", default=None, help=ADDRESS_HELP)
    rejudge.add_argument("--store-url", default=None, help=STORE_URL_HELP)


def judge_spec(task_id: str, task_file: Path | None, judge: Path | None) -> EvaluatorSpec:
    """The ``llm_judge`` evaluator to judge with: ``judge``'s, else the task's in
    ``task_file``.

    Raises:
        ConfigError: neither given, the task is not in the file, the file is not JSON, or the
            spec is not an ``llm_judge`` one.
    """
    from pydantic import ValidationError

    from rolloutd.types import EvaluatorSpec, TaskRequest

    try:
        if judge is not None:
            data = json.loads(judge.read_text(encoding="utf-8"))
            if isinstance(data, dict) and "type" not in data:
                data = {"type": "llm_judge", "judge": data}
            spec = EvaluatorSpec.model_validate(data)
        elif task_file is not None:
            rows = _json_rows(task_file)
            found = [r for r in rows if isinstance(r, dict) and r.get("task_id") == task_id]
            if not found:
                raise ConfigError(f"{task_file}: no task {task_id!r}")
            spec = TaskRequest.model_validate(found[0]).evaluator
        else:
            raise ConfigError("give the judge: --task-file (the task's own) or --judge")
    except ValidationError as e:
        raise ConfigError(f"not a judge: {e}") from None
    except (OSError, ValueError) as e:
        raise ConfigError(str(e)) from None
    if spec.judge is None:
        raise ConfigError(f"task {task_id} is not scored by llm_judge: give --judge")
    return spec


def _json_rows(path: Path) -> list[Any]:
    """A JSON file's object or list, or a JSONL file's lines."""
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
        return data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def stored_sessions(
    store: BlobStore, task_id: str, only: list[str] | None
) -> tuple[list[Any], dict[str, str]]:
    """The sessions to judge, as session results pointing at their stored trajectories:
    ``only`` (each must be stored), else every stored session of the task. A session that
    failed for another cause than its judging is left out (never rewarded, and never in a
    group's cohort).

    Returns:
        The sessions to judge, and the ones left out with why.

    Raises:
        ConfigError: a session named is not in the store.
    """
    from rolloutd.cli.rescoring import sessions_of_task
    from rolloutd.store import trajectory_key
    from rolloutd.types import SessionResult, Trajectory

    ids = only or sessions_of_task(store, task_id)
    missing = [s for s in ids if not store.exists(trajectory_key(s))]
    if missing:
        raise ConfigError(f"not in the store: {', '.join(missing)}")
    sessions, left_out = [], {}
    for session_id in ids:
        trajectory = store.get_model(trajectory_key(session_id), Trajectory)
        failure = trajectory.failure
        if failure is not None and not (failure.kind == "evaluator" and failure.phase == "judge"):
            left_out[session_id] = f"failed before its judging ({failure.kind}): never judged"
            continue
        sessions.append(
            SessionResult(
                session_id=session_id,
                task_id=task_id,
                status=trajectory.status,
                trajectory_ref=trajectory_key(session_id),
            )
        )
    return sessions, left_out


def render(
    output: RejudgeOutput, store: BlobStore, left_out: dict[str, str] | None = None
) -> Table:
    """The verdicts as a table: each session's status (``judged``, ``failed``, ``left out``),
    the judge's reward, the reward its trajectory holds now (a reward handed out is never
    rewritten), and the judge's reason or why the judging was given up."""
    from rolloutd.cli import tables
    from rolloutd.store import trajectory_key
    from rolloutd.types import Trajectory

    table = tables.table(
        "session",
        "status",
        tables.num("judged"),
        tables.num("reward"),
        "detail",
        title=f"{len(output.judged)} judged, {len(output.errors)} failed",
    )
    for verdict in sorted(output.judged, key=lambda v: v.session_id):
        stored = store.get_model(trajectory_key(verdict.session_id), Trajectory)
        table.add_row(
            *map(tables.cell, (verdict.session_id, "judged", verdict.reward, stored.reward)),
            tables.cell((verdict.evaluation.reason or "")[:300]),
        )
    for session_id, error in sorted(output.errors.items()):
        table.add_row(session_id, "failed", "-", "-", tables.cell(error[:300]))
    for session_id, why in sorted((left_out or {}).items()):
        table.add_row(session_id, "left out", "-", "-", why)
    return table


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Judge the sessions again and print each verdict.

    Returns:
        1 when a judging was given up, else 0.
    """
    from rolloutd.cli import tables
    from rolloutd.store import BlobStore
    from rolloutd.trainer_client import RolloutClient

    store = BlobStore(args.store_url or settings.store_url)
    try:
        spec = judge_spec(args.task, args.task_file, args.judge)
        sessions, left_out = stored_sessions(store, args.task, args.session)
    except RolloutdError as e:
        raise SystemExit(f"rolloutd rejudge: {e}") from None
    if not sessions:
        raise SystemExit(f"rolloutd rejudge: no stored session of task {args.task} to judge")
    run_id = args.run_name or f"{time.strftime('%Y%m%d-%H%M%S')}-{os.urandom(3).hex()}"

    async def main() -> int:
        client = await RolloutClient.connect(
            args.address or settings.temporal_address,
            namespace=settings.temporal_namespace,
            store_url=args.store_url or settings.store_url,
        )
        output = await client.rejudge(
            args.task,
            sessions,
            run_id=run_id,
            max_concurrent=args.max_concurrent,
            evaluator=spec,
        )
        if args.json:
            print(output.model_dump_json(indent=2))
        else:
            tables.show(render(output, store, left_out))
        return 1 if output.errors else 0

    return asyncio.run(main())
