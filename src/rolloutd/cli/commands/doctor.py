"""``rolloutd doctor``: the reliability figures of the last ``tests/reliability`` run
(:mod:`rolloutd.cli.reliability`), as a table."""

from __future__ import annotations

import argparse
from typing import Any

from rolloutd.cli.commands import add_command
from rolloutd.settings import CommonSettings


def register(sub: Any) -> None:
    """Add ``doctor`` and its options."""
    doctor = add_command(
        sub,
        "doctor",
        "reliability figures (kills, cancellations, fuzzing) of the "
        "last tests/reliability run, as a table",
        run,
    )
    doctor.add_argument("--run", action="store_true", help="run tests/reliability first")


def run(args: argparse.Namespace, settings: CommonSettings) -> int:
    """Print the figures (:func:`rolloutd.cli.reliability.main`)."""
    from rolloutd.cli import reliability

    return reliability.main(run=args.run)
