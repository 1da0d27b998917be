"""``rolloutd status`` shows each running or recent task with its failure counts by kind, in a
table of the house style beside the children's."""

from __future__ import annotations

import re
from pathlib import Path

from rolloutd.cli.commands.status import render
from rolloutd.cli.tables import text
from rolloutd.stack import StackState
from rolloutd.stack.inflight import TaskFailures
from rolloutd.stack.state import ChildState
from rolloutd.stack.status import StackStatus


def _cells(shown: str, first: str) -> list[str]:
    """The cells of the row whose first cell is ``first`` (cells stand 2+ spaces apart)."""
    row = next(line for line in shown.splitlines() if line.startswith(first + " "))
    return re.split(r"\s{2,}", row.strip())


def test_status_shows_failure_counts_by_kind_per_task(tmp_path: Path) -> None:
    status = StackStatus(
        state=StackState(
            home=str(tmp_path),
            phase="running",
            children=[ChildState(name="sandbox", kind="fleet", phase="running", restarts=1)],
        ),
        tasks=[
            TaskFailures(
                task_id="a",
                status="running",
                num_sessions=3,
                num_failed_by_kind={"backend": 2, "harness": 1},
            ),
            TaskFailures(task_id="b", status="completed", num_sessions=4),
        ],
    )
    shown = text(render(status))
    assert _cells(shown, "a") == ["a", "running", "3", "backend 2, harness 1"]
    assert _cells(shown, "b") == ["b", "completed", "4", "none"]
    # a child that is not alive has no pid: "-", as an unknown uptime and exit code
    assert _cells(shown, "sandbox")[:6] == ["sandbox", "running", "-", "-", "1", "-"]
