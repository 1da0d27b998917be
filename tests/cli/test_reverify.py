"""``rolloutd reverify``'s parts that need no server: which stored sessions a task id, a
results file or a store prefix names; the ``--evaluator`` choices; the summary of a run."""

from __future__ import annotations

import json
import re

import pytest

from rolloutd.activities.models import SessionRescore
from rolloutd.activities.reverify import summarize
from rolloutd.cli.rescoring import evaluator_map, exit_status, find_sessions, render
from rolloutd.cli.tables import text
from rolloutd.errors import ConfigError
from rolloutd.store import BlobStore, trajectory_key
from rolloutd.types import SessionResult, TaskResult, Trajectory


def cells(shown: str, first: str) -> list[str]:
    """The cells of the printed row whose first cell is ``first`` (cells stand 2+ spaces
    apart)."""
    row = next(line for line in shown.splitlines() if line.startswith(first + " "))
    return re.split(r"\s{2,}", row.strip())


@pytest.fixture
def store(tmp_path) -> BlobStore:
    """Sessions of two tasks of run-1 (one with a later attempt, one whose first attempt's
    folder has no trajectory, one sample replaced) and one of run-2."""
    store = BlobStore(str(tmp_path / "store"))
    sessions = ("run-1-a/0", "run-1-a/0/r1", "run-1-a/1.attempt-2", "run-1-a/10", "run-1-b/0")
    for session_id in (*sessions, "run-2-a/0"):
        task_id = session_id.split("/")[0]
        store.put_json(
            trajectory_key(session_id), Trajectory(session_id=session_id, task_id=task_id)
        )
    store.put_json("sessions/run-1-a/1/artifacts/harness.json", {})  # given-up attempt
    store.put_json("sessions/run-1-a/0.reverify-x/artifacts/check.json", {})  # a re-score's
    return store


def test_sessions_by_task_prefix_and_results(store, tmp_path):
    assert find_sessions(store, task_ids=["run-1-a"]) == [
        "run-1-a/0",
        "run-1-a/0/r1",  # a replacement of sample 0
        "run-1-a/1.attempt-2",
        "run-1-a/10",
    ]
    assert find_sessions(store, prefix="sessions/run-1-") == [
        "run-1-a/0",
        "run-1-a/0/r1",
        "run-1-a/1.attempt-2",
        "run-1-a/10",
        "run-1-b/0",
    ]
    assert find_sessions(store, prefix="run-1-a/1") == ["run-1-a/1.attempt-2", "run-1-a/10"]
    # a task id with nothing stored is named, to be reported missing
    assert find_sessions(store, task_ids=["nope"]) == ["nope/0"]
    group = TaskResult(
        task_id="run-2-a",
        sessions=[SessionResult(session_id="run-2-a/0", task_id="run-2-a", status="completed")],
    )
    results = tmp_path / "results.jsonl"
    results.write_text(
        group.model_dump_json() + "\n" + json.dumps({"session_id": "run-1-b/0"}) + "\n"
    )
    assert find_sessions(store, results=results, task_ids=["run-1-b"]) == [
        "run-1-b/0",
        "run-2-a/0",
    ]
    results.write_text(json.dumps([{"task_id": "x"}]))
    with pytest.raises(ConfigError, match="record 1"):
        find_sessions(store, results=results)
    with pytest.raises(ConfigError, match="name the sessions"):
        find_sessions(store)


def test_evaluator_choices():
    assert evaluator_map(None) == {}
    assert evaluator_map(["harbor"]) == {"*": "harbor"}
    assert evaluator_map(["tests_harbor_r1=harbor", "a=b"]) == {
        "tests_harbor_r1": "harbor",
        "a": "b",
    }
    for bad in (["a="], ["x", "y"]):
        with pytest.raises(ConfigError):
            evaluator_map(bad)


def test_summary_counts_changes_per_version_pair():
    old = {"old_evaluator": "h1", "old_version": "1", "new_evaluator": "h", "new_version": "2"}
    outcomes = [
        SessionRescore(
            index=0,
            session_id="t/0",
            status="rescored",
            old_reward=1.0,
            new_reward=0.0,
            changed=True,
            **old,
        ),
        SessionRescore(
            index=1, session_id="t/1", status="rescored", old_reward=1.0, new_reward=1.0, **old
        ),
        SessionRescore(
            index=2,
            session_id="t/2",
            status="rescored",
            old_reward=0.0,
            new_reward=0.5,
            changed=True,
            **old,
        ),
        SessionRescore(
            index=3,
            session_id="u/0",
            status="no_final_state",
            old_reward=1.0,
            detail="no final state stored (the task did not ask: store_final_state)",
        ),
        SessionRescore(index=4, session_id="v/0", status="failed", detail="runtime failed"),
    ]
    summary = summarize("r", outcomes)
    assert summary.counts == {"failed": 1, "no_final_state": 1, "rescored": 3}
    assert summary.num_changed == 2
    (pair,) = summary.by_version
    assert (pair.num_sessions, pair.num_changed, pair.num_lower, pair.num_higher) == (3, 2, 1, 1)
    assert pair.mean_old == pytest.approx(2 / 3) and pair.mean_new == pytest.approx(0.5)
    shown = text(render(summary))
    assert cells(shown, "h1 1") == ["h1 1", "h 2", "3", "2", "1", "1", "0.67", "0.50"]
    assert cells(shown, "t/0")[:4] == ["t/0", "changed", "1.00", "0.00"]
    assert cells(shown, "u/0") == [
        "u/0",
        "no_final_state",
        "-",
        "-",
        "no final state stored (the task did not ask: store_final_state)",
    ]
    assert cells(shown, "v/0") == ["v/0", "failed", "-", "-", "runtime failed"]
    assert exit_status(outcomes) == 1 and exit_status(outcomes[:4]) == 0
