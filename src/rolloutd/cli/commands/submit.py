"""``rolloutd submit``: submit tasks from a JSONL file (or an external task set) and wait,
showing them live; the exit status says whether the infrastructure failed a session
(:func:`rolloutd.cli.report.exit_code`)."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from rolloutd.cli.commands import ADDRESS_HELP, STORE_URL_HELP, add_command
from rolloutd.settings import CommonSettings


def register(sub: Any) -> None:
    """Add ``submit`` and its options."""
    submit = add_command(sub, "submit", "submit tasks from a JSONL file and wait", run)
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


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Submit, wait, print the report.

    Returns:
        :func:`rolloutd.cli.report.exit_code` of the results.
    """
    from rolloutd.cli.report import exit_code
    from rolloutd.cli.submission import load_tasks, read_task_set, submit_tasks

    _wait_for_starting_stack()
    return exit_code(
        asyncio.run(
            submit_tasks(
                read_task_set(args.file, args.task_set, args.harness, args.options)
                if args.task_set
                else load_tasks(args.file),
                args.address or settings.temporal_address,
                args.store_url or settings.store_url,
                namespace=settings.temporal_namespace,
                gateway_url=args.gateway_url or _stack_gateway_url(),
            )
        )
    )
