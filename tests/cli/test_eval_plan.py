"""What ``rolloutd eval`` plans before it touches a stack, and its results file, in process:
each SOURCE kind read as tasks with deterministic ids; ``-a``/``-m``/``-r``/``-n`` over the
rows; a new run never written over another; ``--resume`` refused when the tasks changed;
``results.jsonl`` read back whole after a crash cut its last line."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from rolloutd.cli.eval_sources import Overrides, detect, plan
from rolloutd.cli.evaluation import set_up
from rolloutd.cli.results import ResultLine, ResultsFile, summarize, task_lines
from rolloutd.errors import ConfigError
from rolloutd.types import FailureCause, SessionResult, SessionStatus, TaskResult
from tests.support.cli_runs import gated_task, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = ROOT / "docs" / "results_line.schema.json"
SCHEMA = json.loads(SCHEMA_FILE.read_text())


def test_the_documented_schema_is_the_code_s() -> None:
    """docs/results_line.schema.json is ResultLine's JSON Schema (regenerate it with
    ``python -c 'import json; from rolloutd.cli.results import ResultLine;
    print(json.dumps(ResultLine.model_json_schema(), indent=2, sort_keys=True))'``), and
    docs/evaluation.md's table names every field."""
    assert SCHEMA == ResultLine.model_json_schema()
    page = (ROOT / "docs" / "evaluation.md").read_text()
    assert [f for f in ResultLine.model_fields if f"`{f}`" not in page] == []


def test_every_source_kind_becomes_tasks_with_deterministic_ids(tmp_path):
    harbor = plan(str(ROOT / "examples" / "harbor"), "hb", Overrides(harness="oracle"))
    assert harbor.kind == "harbor" and len(harbor.tasks) == 6
    assert harbor.tasks[0].task_id == "hb-archive-text-files"
    assert {t.runtime.type for t in harbor.tasks} == {"podman"}
    assert {t.harness.type for t in harbor.tasks} == {"oracle"}

    he = plan("humaneval", "he", Overrides(harness="qwen_code", num_rows=3, num_samples=4))
    assert [t.task_id for t in he.tasks] == [f"he-HumanEval_{i}" for i in range(3)]
    assert {t.num_samples for t in he.tasks} == {4} and he.num_samples == 4
    assert he.tasks[0].evaluator.type == "humaneval"
    # a generate spec is an eval config: its template, its harness, its rows
    spec = plan(str(ROOT / "examples/generation/humaneval.json"), "g", Overrides(num_rows=2))
    assert spec.kind == "humaneval" and [t.harness.type for t in spec.tasks] == ["shell"] * 2
    assert spec.concurrency == 4

    rows = write_jsonl(tmp_path / "t.jsonl", [gated_task("a", tmp_path), gated_task("b", tmp_path)])
    tasks = plan(str(rows), "r1", Overrides(model="m", num_samples=3))
    assert [t.task_id for t in tasks.tasks] == ["r1-a", "r1-b"]
    assert {(t.model, t.num_samples) for t in tasks.tasks} == {("m", 3)}
    assert tasks.tasks[0].metadata["row_key"] == "a" and tasks.row_keys == {
        "r1-a": "a",
        "r1-b": "b",
    }
    # `-a shell` alone does nothing: a baseline
    nothing = plan(str(rows), "r2", Overrides(harness="shell"))
    assert {t.harness.command for t in nothing.tasks} == {"true"}

    with pytest.raises(ConfigError, match="neither tasks"):
        detect(str(write_jsonl(tmp_path / "x.jsonl", [{"question": "?"}])))
    with pytest.raises(ConfigError, match="give -a HARNESS"):
        plan("humaneval", "he", Overrides(num_rows=1))


def test_a_run_is_never_written_over_and_resume_needs_the_same_tasks(tmp_path):
    rows = write_jsonl(tmp_path / "t.jsonl", [gated_task("x", tmp_path)])
    out = tmp_path / "out"
    setup = set_up(str(rows), Overrides(), run_name="first", out=out)
    config = json.loads((out / "config.json").read_text())
    assert config["run"] == "first" and config["task_ids"] == ["first-x"]
    with pytest.raises(ConfigError, match="holds run 'first': --resume to continue it"):
        set_up(str(rows), Overrides(), run_name="second", out=out)
    again = set_up(str(rows), Overrides(), out=out, resume=True)
    assert again.resumed and again.run == "first" and again.task_ids == setup.task_ids
    with pytest.raises(ConfigError, match=r"ran with other options \(harness\)"):
        set_up(str(rows), Overrides(harness="shell"), out=out, resume=True)
    write_jsonl(rows, [gated_task("x", tmp_path), gated_task("y", tmp_path)])
    with pytest.raises(ConfigError, match=r"other tasks than run 'first' had \(1 new, 0 gone\)"):
        set_up(str(rows), Overrides(), out=out, resume=True)
    with pytest.raises(ConfigError, match="--resume needs --out"):
        set_up(str(rows), Overrides(), resume=True)


def session(task: str, index: int, reward: float | None, **fields) -> SessionResult:
    return SessionResult(
        session_id=f"{task}/{index}",
        task_id=task,
        sample_index=index,
        reward=reward,
        **{"status": SessionStatus.COMPLETED, **fields},
    )


def test_results_file_keeps_whole_tasks_and_the_summary_counts_them(tmp_path):
    lost = FailureCause(kind="sandbox", message="lost host", phase="run")
    a = TaskResult(
        task_id="a",
        sessions=[session("a", 0, 1.0), session("a", 1, 0.0)],
        replaced=[session("a", 1, None, failure=lost, status=SessionStatus.FAILED)],
    )
    b = TaskResult(task_id="b", sessions=[session("b", 0, 1.0), session("b", 1, 1.0)])
    results = ResultsFile(tmp_path)
    results.append(task_lines(a, run="r", harness="shell"))
    results.append(task_lines(b, run="r", harness="shell"))
    text = (tmp_path / "results.jsonl").read_text()
    for line in text.splitlines():  # the documented schema
        jsonschema.validate(json.loads(line), SCHEMA)
    # a crash cut the file inside b's last line: b is left out and written again on resume
    (tmp_path / "results.jsonl").write_text(text[: text.rindex('"b/1"') + 3])
    whole = results.read()
    assert sorted(whole) == ["a"] and len(whole["a"]) == 3
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 3
    results.append(task_lines(b, run="r", harness="shell"))
    summary = summarize(results.read().values(), k=2)
    assert summary.num_tasks == 2 and summary.num_sessions == 4 and summary.num_replacements == 1
    assert summary.mean_reward == pytest.approx(0.75)
    assert summary.pass_at_1 == pytest.approx(0.75) and summary.pass_at_k == pytest.approx(1.0)
    assert summary.failures_by_kind == {"none": 4}


def test_eval_uses_the_up_stack_alive_on_its_home(tmp_path):
    """A running ``up`` stack's addresses and the codec key file it keeps on its home; one
    still starting is waited for; a state file left by a dead ``up`` (or none) means the
    embedded stack."""
    import argparse
    import threading

    from rolloutd.cli.commands import evaluate
    from rolloutd.settings import CommonSettings
    from rolloutd.stack.state import StackState, write_state

    args = argparse.Namespace(address=None, store_url=None, home=tmp_path)
    settings = CommonSettings()
    assert evaluate._running_stack(args, settings) is None
    up = StackState(
        home=str(tmp_path),
        phase="starting",
        temporal_address="127.0.0.1:7299",
        store_url="/s",
        gateway_url="http://g",
    )
    write_state(tmp_path, up)
    later = up.model_copy(update={"phase": "running"})
    timer = threading.Timer(1.5, write_state, (tmp_path, later))
    timer.start()
    try:
        assert evaluate._running_stack(args, settings) == (
            "127.0.0.1:7299",
            "/s",
            "http://g",
            None,
        )
    finally:
        timer.cancel()
    (tmp_path / "codec_keys").write_text("k1:" + "A" * 44)
    assert evaluate._running_stack(args, settings)[3] == tmp_path / "codec_keys"
    write_state(tmp_path, later.model_copy(update={"pid": 2**22 + 1, "start_ticks": 1}))
    assert evaluate._running_stack(args, settings) is None
    args.address = "10.0.0.1:7233"
    assert evaluate._running_stack(args, settings)[0] == "10.0.0.1:7233"
