"""``rolloutd status`` shows each running or recent task with its failure counts by kind."""

from __future__ import annotations

from pathlib import Path

from rolloutd.stack import StackState
from rolloutd.stack.inflight import TaskFailures
from rolloutd.stack.status import StackStatus, render


def test_status_shows_failure_counts_by_kind_per_task(tmp_path: Path) -> None:
    status = StackStatus(
        state=StackState(home=str(tmp_path), phase="running"),
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
    lines = render(status).splitlines()
    assert "task a: running, 3 sessions ended, failed: backend 2, harness 1" in lines
    assert "task b: completed, 4 sessions ended, failed: none" in lines
