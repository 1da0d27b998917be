"""``rolloutd status``: the running stack, read from its state file and Temporal."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rolloutd.cli.commands import add_command
from rolloutd.settings import CommonSettings


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
    """Print the stack's status (:func:`rolloutd.stack.status.main`)."""
    from rolloutd.settings import default_home
    from rolloutd.stack.status import main as status_main

    return status_main(args.home or default_home(), as_json=args.json)
