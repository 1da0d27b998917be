"""``rolloutd reliability [--run]``: the reliability figures of the last ``tests/reliability``
run (:mod:`rolloutd.cli.reliability`), as a table; ``--run`` runs the tests first and shows what
that run recorded."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rolloutd.cli.commands import add_command
from rolloutd.settings import CommonSettings


def register(sub: Any) -> None:
    """Add ``reliability`` and its options."""
    reliability = add_command(
        sub,
        "reliability",
        "reliability figures (kills, cancellations, fuzzing) of the last tests/reliability "
        "run, as a table",
        run,
    )
    reliability.add_argument(
        "--run",
        action="store_true",
        help="run tests/reliability first (every test there, acceptance tier included: tens "
        "of minutes) and show the figures that run recorded",
    )
    reliability.add_argument(
        "--tests",
        type=Path,
        default=Path("tests/reliability"),
        help="with --run: the reliability tests' folder (a source checkout's)",
    )


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Print the figures (:func:`rolloutd.cli.reliability.main`)."""
    from rolloutd.cli import reliability

    return reliability.main(run=args.run, tests=args.tests)
