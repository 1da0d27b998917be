"""``rolloutd submit``: submit tasks from a JSONL file (or an external task set) and wait,
showing them live; the exit status says whether the infrastructure failed a session
(:func:`rolloutd.cli.report.exit_code`; docs/operations.md, "Exit codes").

Task ids are business keys: a task whose id already names a workflow is followed, not started
again, so running the same file twice re-attaches to the first run's tasks and prints the
same results; ``--fresh`` starts every task afresh under new ids. Ctrl-C stops waiting and
leaves the tasks running (exit status 130, with how to follow or cancel them).
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from rolloutd.cli.commands import ADDRESS_HELP, STORE_URL_HELP, add_command
from rolloutd.settings import CommonSettings


def register(sub: Any) -> None:
    """Add ``submit`` and its options."""
    submit = add_command(
        sub,
        "submit",
        "submit tasks from a JSONL file and wait (a task already started under its id is "
        "followed, not started again)",
        run,
    )
    submit.add_argument(
        "file",
        type=Path,
        help="JSONL file, one TaskRequest per line; with --task-set: a Harbor task folder "
        "(or a folder of them), or a SWE-bench / SWE-Gym / SWE-smith JSONL or Parquet file",
    )
    submit.add_argument(
        "--task-set",
        choices=["harbor", "swebench"],
        default=None,
        help="read FILE as an external task set (rolloutd.tasksets; docs/task_sets.md)",
    )
    submit.add_argument(
        "--harness",
        default="oracle",
        help="--task-set: the harness of every task: a type (oracle, qwen_code, codex, ...) "
        "or a HarnessSpec as JSON",
    )
    submit.add_argument(
        "--options",
        default="{}",
        help="--task-set: more TaskOptions (num_samples, task_id_prefix, run_s, ...): JSON, "
        "or a .json or .toml file",
    )
    submit.add_argument(
        "--fresh",
        action="store_true",
        help="start every task afresh under new ids (the ids get a suffix -UNIXTIME, printed); "
        "without it, a task whose id already ran is followed",
    )
    submit.add_argument(
        "--suffix",
        default="",
        help="append this to every task id (give the suffix --fresh printed to follow that "
        "run again)",
    )
    submit.add_argument(
        "--out",
        type=Path,
        default=None,
        help="write DIR/results.jsonl (one line a session; schema: docs/evaluation.md) and "
        "DIR/summary.json; a task already in the file is not written again",
    )
    submit.add_argument(
        "--details",
        action="store_true",
        help="show every task live (asks each task in turn) instead of one overall bar",
    )
    submit.add_argument("--address", default=None, help=ADDRESS_HELP)
    submit.add_argument("--store-url", default=None, help=STORE_URL_HELP)
    submit.add_argument(
        "--gateway-url",
        default=None,
        help="gateway base URL whose /health tells a dead engine; None: the "
        "running `rolloutd up` stack's, else no engine check",
    )


#: seconds ``submit`` waits for a ``rolloutd up`` stack that is still starting
STACK_START_WAIT_S = 600.0


def _wait_for_starting_stack() -> None:
    """When the ``rolloutd up`` stack on the default home is still starting (``rolloutd up &``
    just before, as docs/task_sets.md runs it), wait until it runs, failed or stopped, at most
    :data:`STACK_START_WAIT_S`; one line on stderr says so."""
    from rolloutd.settings import default_home
    from rolloutd.stack.state import read_state

    home = default_home()

    def starting() -> bool:
        state = read_state(home)
        return state is not None and state.phase == "starting" and state.alive()

    if not starting():
        return
    print(f"waiting for the `rolloutd up` stack on {home} to start", file=sys.stderr)
    deadline = time.monotonic() + STACK_START_WAIT_S
    while starting() and time.monotonic() < deadline:
        time.sleep(0.5)


def _stack_gateway_url() -> str | None:
    """The gateway URL of the `rolloutd up` stack running on the default home, if any."""
    from rolloutd.settings import default_home
    from rolloutd.stack.state import read_state

    state = read_state(default_home())
    return state.gateway_url if state is not None and state.phase == "running" else None


def _resume_line(args: argparse.Namespace, suffix: str) -> str:
    """The command line that follows this run's tasks again."""
    words = ["rolloutd", "submit", str(args.file)]
    if args.task_set:
        words += ["--task-set", args.task_set, "--harness", args.harness]
        if args.options != "{}":
            words += ["--options", args.options]
    if suffix:
        words += ["--suffix", suffix]
    if args.out:
        words += ["--out", str(args.out)]
    if args.address:
        words += ["--address", args.address]
    return shlex.join(words)


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Submit (or follow), wait, print the report; write the results file with ``--out``.

    Returns:
        :func:`rolloutd.cli.report.exit_code` of the results; 130 when Ctrl-C stopped the
        wait (the tasks keep running).
    """
    from rolloutd.cli.report import exit_code
    from rolloutd.cli.results import ResultsFile, summarize, task_lines, write_summary
    from rolloutd.cli.submission import (
        INTERRUPTED_EXIT,
        TaskRun,
        interrupted_message,
        load_tasks,
        read_task_set,
        submit_tasks,
    )

    _wait_for_starting_stack()
    tasks = (
        read_task_set(args.file, args.task_set, args.harness, args.options)
        if args.task_set
        else load_tasks(args.file)
    )
    suffix = args.suffix + (f"-{int(time.time())}" if args.fresh else "")
    if args.fresh:
        print(f"new task ids end in {suffix} (follow them again: --suffix {suffix})")
    results_file = ResultsFile(args.out) if args.out else None
    written = set(results_file.read()) if results_file else set()

    def on_group(request: Any, group: Any) -> None:
        if results_file is not None and group.task_id not in written:
            results_file.append(
                task_lines(group, harness=request.harness.type, model=request.model)
            )
            written.add(group.task_id)

    state = TaskRun([])
    t0 = time.monotonic()
    try:
        results = asyncio.run(
            submit_tasks(
                tasks,
                args.address or settings.temporal_address,
                args.store_url or settings.store_url,
                suffix=suffix,
                namespace=settings.temporal_namespace,
                gateway_url=args.gateway_url or _stack_gateway_url(),
                run=state,
                on_group=on_group,
                details=args.details,
            )
        )
    except KeyboardInterrupt:
        print(interrupted_message(state, _resume_line(args, suffix)), file=sys.stderr)
        return INTERRUPTED_EXIT
    if results_file is not None:
        lines = results_file.read()
        summary = summarize(
            [lines[r.task_id] for r in state.requests if r.task_id in lines],
            k=max((r.num_samples for r in state.requests), default=1),
            wall_time_s=time.monotonic() - t0,
        )
        print(f"results: {results_file.path} ({write_summary(args.out, summary)})")
    return exit_code(results)
