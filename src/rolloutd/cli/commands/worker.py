"""``rolloutd worker --fleet F``: one fleet's workers in this process."""

from __future__ import annotations

import argparse
from typing import Any

from rolloutd.cli.commands import add_command
from rolloutd.settings import CommonSettings


def register(sub: Any) -> None:
    """Add ``worker`` and its options."""
    worker = add_command(sub, "worker", "run one fleet's workers", run, extras=("server",))
    worker.add_argument(
        "--fleet",
        required=True,
        choices=["workflows", "sandbox", "gateway", "eval"],
        help="which fleet; its settings come from ROLLOUTD_* variables",
    )
    worker.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="serve Prometheus metrics (rolloutd's and the Temporal SDK's) on "
        "this port; default: ROLLOUTD_METRICS_PORT, 0 (off) when unset",
    )


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Run the fleet until SIGTERM (:func:`rolloutd.workers.run_process`).

    Raises:
        SystemExit: a setting refused at start, with its message (exit 1).
    """
    from rolloutd.errors import RolloutdError
    from rolloutd.workers import run_process

    try:  # the gateway fleet on uvloop when installed
        run_process(args.fleet, metrics_port=args.metrics_port)
    except RolloutdError as e:  # a setting refused at start: the message, exit 1
        raise SystemExit(f"rolloutd worker --fleet {args.fleet}: {e}") from None
    return 0
