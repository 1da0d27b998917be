"""A stand-in for tests/reliability that ``tests/cli/test_reliability.py`` runs through
``rolloutd reliability --run``: one scenario's figures, recorded as the reliability tests
record theirs (its name does not start with ``test_``, so only that run collects it)."""

from __future__ import annotations

import os

from rolloutd.cli import reliability


def test_records_one_scenario() -> None:
    reliability.record(
        "probe scenario",
        sessions=3,
        completed=3,
        lost=0,
        ok=True,
        home=os.environ["ROLLOUTD_HOME"],
    )
