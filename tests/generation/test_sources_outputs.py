"""Generation rows, keys, filters and the pass@k estimate, without a server."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rolloutd.errors import ConfigError
from rolloutd.generation.outputs import journal_row, read_journal, select, summarize
from rolloutd.generation.sources import read_rows, row_to_task, safe_key
from rolloutd.scoring import pass_at_k
from rolloutd.store import BlobStore
from rolloutd.types import SessionResult, SessionStatus, TaskResult, Trace, Trajectory
from rolloutd.workflows.generation.models import GenerationSpec, JournalEntry

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ROWS = [{"id": "a/1", "q": "x"}, {"id": "b", "q": "y"}, {"id": "c", "q": "z"}]


def spec(source: dict, **filters) -> GenerationSpec:
    return GenerationSpec.model_validate(
        {
            "name": "t",
            "source": source,
            "outputs": {"dir": "/tmp/unused"},
            "filters": filters,
            "template": {
                "instruction": "Q: {q}",
                "num_samples": 2,
                "harness": {"type": "shell", "command": "true"},
                "evaluator": {"type": "math_answer", "params": {"answer": "1"}},
                "evaluator_params": {"answer": "id"},
            },
        }
    )


def test_keys_map_to_task_ids_and_stay_distinct():
    assert safe_key("HumanEval/12") == "HumanEval_12"
    assert safe_key("a b") != safe_key("a?b") and safe_key("a b").startswith("a_b-")
    assert len(safe_key("x" * 300)) <= 48


@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "datasets"])
def test_rows_read_from_every_format(tmp_path, fmt):
    path = tmp_path / f"rows.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    elif fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(ROWS), path)
    else:
        import datasets

        datasets.Dataset.from_list(ROWS).save_to_disk(str(path))
    s = spec({"type": fmt, "path": str(path), "offset": 1, "limit": 5})
    rows = read_rows(s.source)
    assert [key for key, _ in rows] == ["b", "c"]
    task = row_to_task(s, *rows[0])
    assert task.task_id == "gen-t-b" and task.instruction == "Q: y"
    assert task.evaluator.params == {"answer": "b"} and task.num_samples == 2


def test_humaneval_rows_and_colliding_keys(tmp_path):
    s = spec({"type": "humaneval", "limit": 3})
    s.template.evaluator = s.template.evaluator.model_copy(
        update={"type": "humaneval", "params": {}}
    )
    s.template.evaluator_params = {}
    s.template.instruction = "{prompt}"
    rows = read_rows(s.source)
    assert [k for k, _ in rows] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    task = row_to_task(s, *rows[0])
    assert task.task_id == "gen-t-HumanEval_0"
    assert set(task.evaluator.params) == {"prompt", "test", "entry_point"}
    path = tmp_path / "dup.jsonl"
    path.write_text('{"id": "a/1"}\n{"id": "a_1"}\n')
    with pytest.raises(ConfigError, match="one task id"):
        read_rows(spec({"type": "jsonl", "path": str(path)}).source)


def test_pass_at_k_is_the_unbiased_estimate():
    assert pass_at_k(2, 0, 2) == 0.0 and pass_at_k(2, 1, 2) == 1.0
    assert pass_at_k(2, 1, 1) == 0.5 and pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)


def entry(key: str, rewards: list[float | None], answers: list[str]) -> JournalEntry:
    sessions = [
        SessionResult(
            session_id=f"{key}/{i}",
            task_id=key,
            sample_index=i,
            status=SessionStatus.COMPLETED,
            reward=r,
            num_trainable_tokens=5,
            trajectory_ref=f"traj/{key}/{i}",
        )
        for i, r in enumerate(rewards)
    ]
    return JournalEntry(key=key, task_id=key, result=TaskResult(task_id=key, sessions=sessions))


def test_filters_and_summary(tmp_path):
    entries = [
        entry("solved", [1.0, 1.0], ["A", "A"]),
        entry("half", [1.0, 0.0], ["A", "B"]),
        entry("failed", [None, None], ["", ""]),
    ]

    def load(ref: str) -> Trajectory:
        key, i = ref.split("/")[1:]
        answer = {"solved": "A", "half": "AB"[int(i)]}[key]
        trace = Trace(
            prompt_ids=[1],
            response_ids=[2],
            loss_mask=[1],
            response_logprobs=[0.0],
            response_messages=[{"role": "assistant", "content": f" {answer} "}],
        )
        return Trajectory(session_id=ref, task_id=key, sample_index=int(i), traces=[trace])

    def kept(**filters) -> list[str]:
        return [
            t.session_id
            for t in select(entries, spec({"type": "humaneval"}, **filters).filters, load)
        ]

    assert kept() == ["traj/solved/0", "traj/solved/1", "traj/half/0", "traj/half/1"]
    assert kept(min_reward=1.0) == ["traj/solved/0", "traj/solved/1", "traj/half/0"]
    assert kept(distinct_answers=True) == ["traj/solved/0", "traj/half/0", "traj/half/1"]
    assert kept(max_pass_rate=0.5) == ["traj/half/0", "traj/half/1"]
    assert kept(min_pass_rate=0.75) == ["traj/solved/0", "traj/solved/1"]
    summary = summarize(spec({"type": "humaneval"}), entries)
    assert (summary.num_rows, summary.num_rows_failed, summary.num_samples) == (3, 1, 6)
    assert summary.pass_at_1 == pytest.approx(0.75) and summary.pass_at_k == 1.0
    assert summary.num_tokens == 30


def test_journal_writes_a_row_once(tmp_path):
    store = BlobStore(str(tmp_path))
    e = entry("HumanEval/3", [1.0], ["A"])
    assert journal_row(store, "t", e) is True
    assert journal_row(store, "t", e.model_copy(update={"task_id": "other"})) is False
    assert [j.task_id for j in read_journal(store, "t")] == ["HumanEval/3"]


def test_a_row_journaled_by_reference_is_read_back_whole(tmp_path):
    store = BlobStore(str(tmp_path / "store"))
    whole = entry("big", [1.0, 0.0, None], ["a", "b", ""])
    store.put_bytes("groups/big.json", whole.result.model_dump_json().encode())
    summary_only = whole.result.model_copy(
        update={"sessions": [], "stored_key": "groups/big.json", "num_sessions": 3}
    )
    journal_row(store, "g", whole.model_copy(update={"result": summary_only}))
    [read] = read_journal(store, "g")
    assert read.result.sessions == whole.result.sessions


def test_swebench_instances_become_tasks_with_the_instances_tests():
    s = GenerationSpec.model_validate(
        {
            "name": "swe",
            "outputs": {"dir": "/tmp/unused"},
            "source": {"type": "swebench", "path": str(EXAMPLES / "swebench_instances.jsonl")},
            "template": {
                "instruction": "{problem_statement}",
                "harness": {"type": "shell", "command": "true"},
                "evaluator": {"type": "swebench", "runtime": "fresh"},
            },
        }
    )
    ((key, row),) = read_rows(s.source)
    task = row_to_task(s, key, row)
    assert key == "local__calc-1" and task.task_id == "gen-swe-local__calc-1"
    assert task.evaluator.params["fail_to_pass"] == [
        "tests/test_mean.py::test_mean_is_exact",
        "tests/test_mean.py::test_mean_of_empty_raises",
    ]
    assert task.evaluator.params["test_patch"].startswith("diff --git")
