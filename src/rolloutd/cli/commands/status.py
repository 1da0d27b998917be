"""``rolloutd status``: the running stack, read from its state file and Temporal
(:mod:`rolloutd.stack.status`), as lines and tables (:mod:`rolloutd.cli.tables`)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rolloutd.cli.commands import add_command
from rolloutd.settings import CommonSettings

if TYPE_CHECKING:
    from rich.console import Group

    from rolloutd.stack.status import StackStatus


def register(sub: Any) -> None:
    """Add ``status`` and its options."""
    status = add_command(
        sub,
        "status",
        "the running stack: children, pids, uptime, restarts, task "
        "queues, engine, sessions in flight by phase",
        run,
    )
    status.add_argument(
        "--home",
        type=Path,
        default=None,
        help="state folder of the stack; None: $ROLLOUTD_HOME or ~/.rolloutd",
    )
    status.add_argument("--json", action="store_true", help="print the status as JSON")


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Print the stack's status.

    When it asked Temporal, it ends the process itself once the output is flushed
    (:func:`rolloutd.processes.end_process`): a short-lived process holding a Temporal client
    can abort in interpreter finalization ("PyGILState_Release ... finalizing",
    github.com/temporalio/sdk-python/issues/300), which turned a correct report into exit
    status -6.

    Returns:
        0 when the stack runs, 1 when it is stopped or failed, 2 when none ran on ``home``.
    """
    from rolloutd.cli import tables
    from rolloutd.processes import end_process
    from rolloutd.settings import default_home
    from rolloutd.stack.status import collect

    home = args.home or default_home()
    status = collect(home)
    if status is None:
        print(f"no stack has run on {home} (no {home / 'stack.json'})")
        return 2
    if args.json:
        print(json.dumps(status.model_dump(mode="json"), indent=2))
    else:
        tables.show(render(status))
    code = 0 if status.state.phase in ("starting", "running") else 1
    if status.sessions_by_phase is not None or status.temporal_error is not None:
        end_process(code)
    return code


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def render(status: StackStatus) -> Group:
    """What ``rolloutd status`` prints: the stack's line and addresses, a table of its
    children (phase, pid, uptime, restarts, last exit code, task queues), the engine and
    whether each of its URLs answers (:func:`rolloutd.cli.engines.engine_view`), the
    sessions in flight by phase, and a table of the running and recent tasks with their
    failures by kind."""
    from rich.console import Group
    from rich.text import Text

    from rolloutd.cli import tables
    from rolloutd.cli.engines import engine_view

    st = status.state
    parts: list[Any] = [
        Text(
            f"stack on {st.home}: {st.phase} (rolloutd up pid {st.pid}, supervision "
            f"{'on' if st.supervise else 'off'}, up {_duration(time.time() - st.started_at)})"
        )
    ]
    if st.error:
        parts.append(Text(f"error: {st.error}"))
    parts.append(Text(f"temporal {st.temporal_address}  ui {st.ui_url}  gateway {st.gateway_url}"))
    parts.append(
        tables.table(
            "child",
            "phase",
            tables.num("pid"),
            tables.num("uptime"),
            tables.num("restarts"),
            tables.num("last exit"),
            "task queues",
            rows=(
                (
                    c.name,
                    c.phase,
                    c.pid,
                    _duration(status.uptime_s.get(c.name)),
                    c.restarts,
                    c.last_exit_code,
                    ", ".join(c.task_queues),
                )
                for c in st.children
            ),
        )
    )
    parts += engine_view(st, status.engines, status.busy_slots)
    if status.sessions_by_phase is not None:
        total = sum(status.sessions_by_phase.values())
        parts.append(
            Text(
                f"sessions in flight: {total}"
                + (
                    " (" + ", ".join(f"{p} {n}" for p, n in status.sessions_by_phase.items()) + ")"
                    if total
                    else ""
                )
            )
        )
    elif status.temporal_error:
        parts.append(Text(f"sessions in flight: unknown (Temporal: {status.temporal_error})"))
    if status.tasks:
        parts.append(
            tables.table(
                "task",
                "status",
                tables.num("sessions ended"),
                "failed",
                title="running and recent tasks",
                rows=(
                    (
                        task.task_id,
                        task.status,
                        task.num_sessions,
                        ", ".join(f"{kind} {n}" for kind, n in task.num_failed_by_kind.items())
                        or "none",
                    )
                    for task in status.tasks
                ),
            )
        )
    return Group(*parts)
