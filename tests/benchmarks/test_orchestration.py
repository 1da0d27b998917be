"""``benchmarks/orchestration.py`` on a tiny run: every row of its report is there, every
session of both systems completed, and the floor ran as many activities per session as
rolloutd's sessions did. Its figures are not checked: speed targets are never tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.temporal, pytest.mark.slow, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
SESSIONS = 4

#: first cells of the rows the report must hold, whatever the run
ROWS = [
    "sessions",
    "sessions completed",
    "tasks",
    "model calls",
    "wall s",
    "sessions/s",
    "Temporal server",
    "workflows fleet",
    "sandbox fleet",
    "gateway fleet",
    "eval fleet",
    "stack (`up`'s supervisor)",
    "codec server",
    "floor worker",
    "engine",
    "client (this process)",
    "orchestration (server + rolloutd's processes / floor worker)",
    "of which Temporal server",
    "of which rolloutd's processes / floor worker",
    "ratio rolloutd / this system: orchestration",
    "ratio rolloutd / this system: Temporal server",
    *(
        f"{what}: {kind}"
        for what in ("events", "history bytes", "payload bytes")
        for kind in (
            "session workflow",
            "task workflow (share)",
            "other workflows",
            "session + task",
        )
    ),
    "ActivityTaskScheduled",
    "ChildWorkflowExecutionCompleted",
    "WorkflowExecutionCompleted",
    "RespondWorkflowTaskCompleted",
    "RespondActivityTaskCompleted",
    "StartWorkflowExecution",
    "(persistence requests)",
]
#: activities every rolloutd session of this shape runs (docs/sessions.md, its lifecycle)
SESSION_ACTIVITIES = [
    "open_session",
    "provision_runtime",
    "run_harness",
    "collect_artifacts",
    "teardown_runtime",
    "close_session",
    "build_trajectory",
    "evaluate",
]


def tables(text: str) -> dict[str, list[str]]:
    """Every markdown table row of ``text``: first cell -> the other cells."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith("| ---"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


def test_orchestration_benchmark_reports_every_row(tmp_path: Path) -> None:
    """About 2 minutes: a LocalStack with the instant engine, 2 + 4 sessions of rolloutd,
    then 2 + 4 of the floor, on one Temporal dev server."""
    # the benchmark's stack is `up`'s: none of the test stack's settings (policy, codec off,
    # evaluators from tests/) reaches it
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUTD_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "orchestration.py"),
            f"--sessions={SESSIONS}",
            "--per-task=2",
            "--warmup=2",
            "--idle-s=1",
            "--settle-s=1",
            f"--home={tmp_path}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    rows = tables(done.stdout)
    missing = [row for row in ROWS if row not in rows]
    assert not missing, (missing, done.stdout)
    # rolloutd, the floor, the floor with its activities on a queue of their own
    assert rows[""] == ["rolloutd", "floor", "floor, own activity queue"]
    assert rows["sessions"] == [str(SESSIONS)] * 3
    assert rows["sessions completed"] == [str(SESSIONS)] * 3
    for name in SESSION_ACTIVITIES:
        assert f"session: activity `{name}`" in rows, (name, done.stdout)
    # the floor: as many activities per session as rolloutd's sessions ran
    rolloutd = sum(
        float(cells[0])
        for row, cells in rows.items()
        if row.startswith("session: activity `") and row != "session: activity `noop`"
    )
    _, noop, noop_own_queue = rows["session: activity `noop`"]
    assert float(noop) == float(noop_own_queue) == round(rolloutd)
    assert rows["session: activity `noop`"][0] == "0"
    # the server's counters were read whole: each of the floors' activities completed once
    assert rows["RespondActivityTaskCompleted"][1:] == [noop, noop]
    # on a queue of their own, every activity was polled for (none dispatched eagerly)
    assert float(rows["PollActivityTaskQueue"][2]) >= float(noop)
