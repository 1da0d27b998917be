"""Run one harness task through the trainer client and check what every harness test checks.

Used by tests/sandbox/harnesses/acceptance/: a task submitted through :class:`RolloutClient` to the
session's real fleets (tests/conftest.py ``fleets``: real Temporal, real llama-server), then per
session: the completions, the trajectory (the builders' invariants, ``check_invariants``) and
whether the harness executed a tool call of its own (:func:`executed_tool_calls`).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rolloutd.errors import HarnessError, NotFoundError
from rolloutd.store import BlobStore, CompletionLog, artifact_key
from rolloutd.trainer_client import RolloutClient
from rolloutd.trajectory import check_invariants
from rolloutd.types import Completion, SessionResult, TaskResult, Trajectory

#: sessions per harness task: 2 in CI; the closing figures use 4 (ROLLOUTD_HARNESS_SAMPLES=4)
NUM_SAMPLES = int(os.environ.get("ROLLOUTD_HARNESS_SAMPLES", "2"))
#: what a harness task through the real fleets needs: Temporal, the engine, a sandbox, the CLI
HARNESS_TASK_MARKS = [
    pytest.mark.temporal,
    pytest.mark.engine,
    pytest.mark.sandbox,
    pytest.mark.harness,
    pytest.mark.slow,
]
#: the harness tasks users submit (`rolloutd submit examples/harnesses.jsonl`)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "harnesses.jsonl"


@dataclass
class SessionRun:
    """One session of a harness task, read back."""

    result: SessionResult
    completions: list[Completion]
    trajectory: Trajectory | None
    harness: dict[str, Any] = field(default_factory=dict)  # the `harness` artifact


@dataclass
class TaskRun:
    """A harness task's result, its sessions read back, and its wall time."""

    group: TaskResult
    sessions: list[SessionRun]
    wall_s: float


def executed_tool_calls(completions: list[Completion]) -> int:
    """How many tool results the harness sent back to the model.

    A tool call the harness executed shows up in a later request as a tool-result message
    (OpenAI chat shape after translation: ``role == "tool"``), whatever the dialect.
    """
    seen: set[str] = set()
    for c in completions:
        for m in c.messages:
            if m.get("role") == "tool":
                seen.add(str(m.get("tool_call_id")) + str(m.get("content"))[:200])
    return len(seen)


async def run_task(fleets: Any, task: dict[str, Any]) -> TaskRun:
    """Submit ``task`` (``task_id`` added when missing) and read every session back.

    Checks on the way (an AssertionError names the session): each session's completions are
    all in its log, and its trajectory keeps the builder invariants.
    """
    client = RolloutClient(fleets.client, BlobStore(fleets.store_url))
    task = {"task_id": f"h-{uuid.uuid4().hex[:8]}"} | task
    t0 = time.monotonic()
    handle = await client.submit(task)
    group = await handle.result()
    wall_s = time.monotonic() - t0
    runs = []
    for session in group.sessions:
        completions = CompletionLog(client.store, session.session_id).read_all()
        assert len(completions) == session.num_completions, session.session_id
        trajectory = client.trajectory(session) if completions else None
        if trajectory is not None:
            check_invariants(trajectory.traces, completions)
        try:
            harness = client.store.get_json(artifact_key(session.session_id, "harness"))
        except NotFoundError:  # the harness never ran (provisioning failed)
            harness = {}
        runs.append(SessionRun(session, completions, trajectory, harness))
    return TaskRun(group, runs, wall_s)


def example_task(task_id: str, **fields: Any) -> dict[str, Any]:
    """The task ``task_id`` of :data:`EXAMPLES` with ``fields`` set, under a task id of its own
    per call (the example's id names a workflow of an earlier run).

    Raises:
        StopIteration: no such task.
    """
    task = next(
        task
        for line in EXAMPLES.read_text().splitlines()
        if line.strip() and (task := json.loads(line))["task_id"] == task_id
    )
    return task | fields | {"task_id": f"{task_id}-{uuid.uuid4().hex[:6]}"}


def cli_installed(harness: Any) -> bool:
    """Whether the CLI of ``harness`` (an adapter class with ``cli_version``) is installed."""
    try:
        harness.cli_version()
    except HarnessError:
        return False
    return True


def skip_unless_runnable_in_bwrap(harness: Any) -> None:
    """Skip the calling test unless bubblewrap and the CLI of ``harness`` (an adapter class
    with ``cli_version``) are installed; the skip says which is missing."""
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    try:
        harness.cli_version()
    except HarnessError as e:
        pytest.skip(str(e))


def hello_world_task(
    instruction: str, harness: dict[str, Any], *, max_tokens: int = 256
) -> dict[str, Any]:
    """The harness tests' task: ``harness`` makes ``hello.py`` in a bwrap runtime with
    gateway-only network, scored by running it (``hello world`` expected); :data:`NUM_SAMPLES`
    sessions, seeded sampling at temperature 0.2, 600 s to run."""
    return {
        "instruction": instruction,
        "num_samples": NUM_SAMPLES,
        "harness": harness,
        "runtime": {"type": "bwrap", "network": "gateway"},
        "evaluator": {
            "type": "test_on_output",
            "command": "python3 hello.py",
            "expected_output": "hello world",
        },
        "sampling": {"temperature": 0.2, "max_tokens": max_tokens, "seed": 7},
        "phases": {"run_s": 600},
    }


def print_figures(run: TaskRun, name: str) -> None:
    """Print the task's figures, one list per kind over its sessions (for the closing note)."""
    print(
        name,
        [s.result.reward for s in run.sessions],
        [s.result.num_completions for s in run.sessions],
        [s.result.num_traces for s in run.sessions],
        [s.result.num_trainable_tokens for s in run.sessions],
        round(run.wall_s, 1),
        [s.harness.get("summary") for s in run.sessions],
    )


def check_each_ran_a_tool_and_scored(run: TaskRun, name: str) -> None:
    """Check that in every session the harness's tool ran (its output came back as a tool
    result in a later request) and the session was scored; then print the figures.

    Raises:
        AssertionError: a session without an executed tool call or without a reward.
    """
    for s in run.sessions:
        assert executed_tool_calls(s.completions) >= 1, s.harness
        assert s.result.reward is not None, (s.result.status, s.result.error, s.harness)
    print_figures(run, name)


def check_scored_with_tools(run: TaskRun, name: str, *, tool_must_run: bool = False) -> None:
    """Print each session's figures (for the closing note), then check the acceptance: every
    session scored and recorded completions, and the harness's own tool ran in at least one
    session (its result went back to the model, or, unless ``tool_must_run``, the check ran
    the file it made).

    Raises:
        AssertionError: a session without a reward or completions, or no tool ran.
    """
    for s in run.sessions:
        print(
            f"{name} {s.result.session_id}: reward {s.result.reward}, "
            f"{len(s.completions)} completions, {s.result.num_traces} traces, "
            f"{s.result.num_trainable_tokens} trainable tokens, "
            f"{executed_tool_calls(s.completions)} tool results, "
            f"exit {s.harness.get('exit_code')}, summary {s.harness.get('summary')}"
        )
    print(f"{name} wall {run.wall_s:.0f} s")
    assert all(s.result.reward is not None for s in run.sessions), [
        (s.result.status, s.result.failure) for s in run.sessions
    ]
    assert all(s.completions for s in run.sessions)
    assert any(
        executed_tool_calls(s.completions) >= 1 or (s.result.reward == 1.0 and not tool_must_run)
        for s in run.sessions
    )
