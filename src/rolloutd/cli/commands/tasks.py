"""``rolloutd tasks list | show ID | cancel ID...``: the tasks on a stack.

The operator's way is Temporal and the blob store (the credentials ``rolloutd up`` and the
trainer client use); with a tenant token (``ROLLOUTD_TENANT_TOKEN``) every call goes through
the REST facade (``--rest-url`` or ``ROLLOUTD_REST_URL``), which shows and cancels the
tenant's own tasks only (:mod:`rolloutd.cli.task_views`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from rolloutd.cli.commands import ADDRESS_HELP, STORE_URL_HELP, add_command
from rolloutd.settings import CommonSettings


def register(sub: Any) -> None:
    """Add ``tasks`` and its actions."""
    tasks = add_command(sub, "tasks", "list, show and cancel tasks on a stack", run)
    actions = tasks.add_subparsers(
        dest="tasks_command", required=True, metavar="ACTION", help="what to do"
    )
    listing = add_command(
        actions, "list", "tasks, newest first, from Temporal's visibility (no task is asked)"
    )
    listing.add_argument(
        "--status",
        choices=["running", "completed", "failed", "cancelled", "terminated", "timed_out"],
        default=None,
        help="only tasks in this state; None: all",
    )
    listing.add_argument(
        "--prefix", default=None, help="only task ids starting with it (an eval run: RUN-)"
    )
    listing.add_argument("--limit", type=int, default=50, help="at most this many tasks")
    listing.add_argument("--json", action="store_true", help="print JSON lines")
    show = add_command(
        actions,
        "show",
        "a task: its sessions, failures, rewards and evaluation records (tamper reports, ceilings)",
    )
    show.add_argument("task_id", help="the task")
    show.add_argument(
        "--session",
        default=None,
        help="one session whole (sample index or session id): evaluation record, re-scores",
    )
    show.add_argument("--json", action="store_true", help="print the task's status as JSON")
    cancel = add_command(
        actions,
        "cancel",
        "cancel tasks: their sessions stop, tear down and keep what they captured",
    )
    cancel.add_argument("task_ids", nargs="*", help="the tasks")
    cancel.add_argument(
        "--prefix", default=None, help="also every running task whose id starts with it"
    )
    for parser in (listing, show, cancel):
        parser.add_argument("--address", default=None, help=ADDRESS_HELP)
        parser.add_argument("--store-url", default=None, help=STORE_URL_HELP)
        parser.add_argument(
            "--rest-url",
            default=None,
            help="go through this REST facade (with $ROLLOUTD_TENANT_TOKEN, if set); None: "
            "$ROLLOUTD_REST_URL when a tenant token is set, else Temporal",
        )


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Run the action.

    Returns:
        0; 1 when a task was not found or a call was refused (its message on stderr).
    """
    from rolloutd.errors import RolloutdError

    try:
        return asyncio.run(_tasks(args, settings))
    except RolloutdError as e:
        print(f"rolloutd tasks {args.tasks_command}: {e}", file=sys.stderr)
        return 1


async def _access(args: argparse.Namespace, settings: CommonSettings) -> Any:
    from rolloutd.cli.task_views import TaskAccess
    from rolloutd.errors import ConfigError
    from rolloutd.settings import HostSettings

    host = HostSettings()
    rest_url = args.rest_url or (host.rest_url if host.tenant_token else None)
    if host.tenant_token and not rest_url:
        raise ConfigError(
            "a tenant token is set (ROLLOUTD_TENANT_TOKEN): a tenant goes through the REST "
            "facade; give --rest-url or ROLLOUTD_REST_URL"
        )
    if rest_url:
        from rolloutd.trainer_client import RestClient

        return TaskAccess(rest=RestClient(rest_url))
    from rolloutd.trainer_client import RolloutClient

    client = await RolloutClient.connect(
        args.address or settings.temporal_address,
        namespace=settings.temporal_namespace,
        store_url=args.store_url or settings.store_url,
    )
    return TaskAccess(client=client)


async def _tasks(args: argparse.Namespace, settings: CommonSettings) -> int:
    from rolloutd.cli import task_views

    access = await _access(args, settings)
    try:
        action = args.tasks_command
        if action == "list":
            rows = await access.list(status=args.status, prefix=args.prefix, limit=args.limit)
            if args.json:
                for row in rows:
                    print(row.model_dump_json())
            else:
                task_views.print_rows(rows)
            return 0
        if action == "show":
            progress = await access.progress(args.task_id)
            if args.session is None:
                if args.json:
                    print(progress.model_dump_json(indent=2))
                else:
                    task_views.print_task(progress)
                return 0
            return await _show_session(access, progress, args.session)
        return await _cancel(access, args)
    finally:
        await access.close()


async def _show_session(access: Any, progress: Any, which: str) -> int:
    from rolloutd.cli import task_views

    for session in [*progress.sessions, *progress.replaced]:
        if which in (session.session_id, str(session.sample_index)):
            trajectory = None
            if session.trajectory_ref:
                trajectory = await access.trajectory(session)
            task_views.print_session(session, trajectory)
            return 0
    ended = ", ".join(s.session_id for s in progress.sessions) or "none"
    print(
        f"session {which} of task {progress.task_id} has not ended or does not exist "
        f"(ended: {ended})",
        file=sys.stderr,
    )
    return 1


async def _cancel(access: Any, args: argparse.Namespace) -> int:
    task_ids = list(args.task_ids)
    if args.prefix:
        rows = await access.list(status="running", prefix=args.prefix, limit=1000)
        task_ids += [r.task_id for r in rows if r.task_id not in task_ids]
    if not task_ids:
        print("rolloutd tasks cancel: no task named and none running with that prefix")
        return 0 if args.prefix else 1
    code = 0
    for task_id in task_ids:
        try:
            await access.cancel(task_id)
        except Exception as e:  # noqa: BLE001 - boundary: one refused task, the rest go on
            print(f"task {task_id}: not cancelled: {e}", file=sys.stderr)
            code = 1
            continue
        print(f"task {task_id}: cancelled (its sessions stop and tear down)")
    return code
