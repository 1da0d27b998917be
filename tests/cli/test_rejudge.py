"""``rolloutd rejudge``'s own parts, without a stack: which judge it judges with (the task's
own from its task file, or a judge file), which stored sessions it judges (one that failed
before its judging is left out, never rewarded), and its table read by column values. The
command end to end, against the fleets and a real judge, is in
tests/evaluators/test_judge_faults.py (acceptance)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rolloutd.activities.models import JudgedSession
from rolloutd.cli import tables
from rolloutd.cli.commands.rejudge import judge_spec, render, stored_sessions
from rolloutd.cli.parser import build_parser
from rolloutd.errors import ConfigError
from rolloutd.scoring import judge_failure
from rolloutd.store import BlobStore, trajectory_key
from rolloutd.types import EvaluationRecord, FailureCause, Trajectory
from rolloutd.workflows.session.judging import RejudgeOutput
from tests.support.judge_stack import DOCSTRING_RUBRIC, docstring_task


def test_the_judge_is_the_tasks_own_or_the_one_given(tmp_path: Path) -> None:
    task = docstring_task(2, task_id="doc-1")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"task_id": "other"} | task | {"task_id": "other"}) + "\n")
    tasks.write_text(tasks.read_text() + json.dumps(task) + "\n")
    own = judge_spec("doc-1", tasks, None)
    assert own.type == "llm_judge" and own.judge.rubric.name == "docstring"
    # a judge file of its own: a bare judge object, or a whole evaluator
    fixed = tmp_path / "judge.json"
    fixed.write_text(json.dumps({"rubric": DOCSTRING_RUBRIC | {"version": 2}, "mode": "group"}))
    given = judge_spec("doc-1", tasks, fixed)
    assert given.judge.rubric.version == 2 and given.judge.mode == "group"
    with pytest.raises(ConfigError, match="no task 'doc-9'"):
        judge_spec("doc-9", tasks, None)
    with pytest.raises(ConfigError, match="give the judge"):
        judge_spec("doc-1", None, None)
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps(task | {"evaluator": {"type": "session_completed"}}))
    with pytest.raises(ConfigError, match="not scored by llm_judge"):
        judge_spec("doc-1", plain, None)


def _store(tmp_path: Path) -> BlobStore:
    store = BlobStore(str(tmp_path / "store"))
    cases = {
        "0": (0.5, None),
        "1": (None, judge_failure("judge pool down")),
        "2": (None, FailureCause(kind="harness", message="killed", phase="run")),
    }
    for index, (reward, failure) in cases.items():
        trajectory = Trajectory(
            session_id=f"doc-1/{index}", task_id="doc-1", reward=reward, failure=failure
        )
        store.put_json(trajectory_key(f"doc-1/{index}"), trajectory)
    return store


def test_a_session_failed_before_its_judging_is_left_out(tmp_path: Path) -> None:
    store = _store(tmp_path)
    sessions, left_out = stored_sessions(store, "doc-1", None)
    assert [s.session_id for s in sessions] == ["doc-1/0", "doc-1/1"]
    assert all(s.trajectory_ref == trajectory_key(s.session_id) for s in sessions)
    assert list(left_out) == ["doc-1/2"] and "harness" in left_out["doc-1/2"]
    with pytest.raises(ConfigError, match="doc-1/7"):
        stored_sessions(store, "doc-1", ["doc-1/0", "doc-1/7"])


def test_the_table_reads_by_column_values(tmp_path: Path) -> None:
    store = _store(tmp_path)
    record = EvaluationRecord(evaluator="llm_judge", reward=0.25, reason="accuracy=2, clarity=3")
    output = RejudgeOutput(
        judged=[JudgedSession(session_id="doc-1/0", reward=0.25, evaluation=record)],
        errors={"doc-1/1": "judging given up after 3 attempt(s): judge unreachable"},
    )
    lines = tables.text(render(output, store, {"doc-1/2": "failed before its judging"}))
    rows = [re.split(r"\s{2,}", line.strip()) for line in lines.splitlines()]
    assert rows[0] == ["1 judged, 1 failed"]
    assert rows[1] == ["session", "status", "judged", "reward", "detail"]
    # the judge said 0.25; the reward handed out (0.5) stands
    assert rows[3] == ["doc-1/0", "judged", "0.25", "0.50", "accuracy=2, clarity=3"]
    assert rows[4][:4] == ["doc-1/1", "failed", "-", "-"]
    assert rows[5][:2] == ["doc-1/2", "left out"]


def test_the_command_parses_its_options() -> None:
    args = build_parser().parse_args(
        ["rejudge", "--task", "doc-1", "--judge", "j.json", "--session", "doc-1/0"]
    )
    assert args.handler.__module__ == "rolloutd.cli.commands.rejudge"
    assert (args.task, args.session, args.max_concurrent) == ("doc-1", ["doc-1/0"], 4)
