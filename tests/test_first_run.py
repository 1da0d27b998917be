"""The task set docs/first_run.md evaluates and then trains on (examples/one_word.jsonl) and
how examples/grpo_loop.py reads it (``--tasks``): as ``rolloutd eval`` reads a SOURCE, each
task with its own harness and evaluator. Default tier, no stack: the check script runs here
with this Python, as the sandbox runs it with its own."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TASKS = ROOT / "examples" / "one_word.jsonl"


def grpo_loop():
    """examples/grpo_loop.py as a module (the examples folder is not a package)."""
    spec = importlib.util.spec_from_file_location("grpo_loop", ROOT / "examples" / "grpo_loop.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_task_file_is_the_examples_family():
    """One row per training category, the example's prompt, its one-call harness; held-out
    categories stay out of the file."""
    example = grpo_loop()
    rows = [json.loads(line) for line in TASKS.read_text().splitlines()]
    assert [r["instruction"] for r in rows] == [example.prompt_of(c) for c in example.CATEGORIES]
    assert {r["runtime"]["files"]["ask.py"] for r in rows} == {example.ASK_PY}
    assert not {example.prompt_of(c) for c in example.HELD_OUT} & {r["instruction"] for r in rows}


def test_the_check_passes_one_word_only(tmp_path: Path):
    """The rows' check (``test_on_output``: exit 0 is reward 1.0) passes a one-word reply and
    fails a longer one or none."""
    check = json.loads(TASKS.read_text().splitlines()[0])["runtime"]["files"]["check.py"]
    (tmp_path / "check.py").write_text(check)

    def exit_code(reply: str) -> int:
        (tmp_path / "reply.txt").write_text(reply)
        return subprocess.run(
            [sys.executable, "check.py"], cwd=tmp_path, capture_output=True
        ).returncode

    assert exit_code("Plum.") == 0
    assert exit_code(" Kiwi\n") == 0
    assert exit_code("A plum") == 1
    assert exit_code("Sure! Here is a fruit") == 1
    assert exit_code("...") == 1


def test_grpo_loop_reads_tasks_as_eval_does():
    """``--tasks SOURCE -n N``: eval's reader, the first N rows in turn, each copy its own id,
    each task its own evaluator (no family task)."""
    from rolloutd.cli.eval_sources import Overrides, plan

    example = grpo_loop()
    pool = example.task_pool(str(TASKS), 3, 7, "run")
    planned = plan(str(TASKS), "run", Overrides(num_rows=3)).tasks
    assert [t.task_id for t in pool] == [f"{planned[i % 3].task_id}-{i}" for i in range(7)]
    assert [t.instruction for t in pool] == [planned[i % 3].instruction for i in range(7)]
    assert {t.evaluator.type for t in pool} == {"test_on_output"}
    args = example.parse_args(["--tasks", str(TASKS), "-n", "3"])
    assert (args.tasks, args.num_rows) == (str(TASKS), 3)
    assert example.parse_args([]).tasks is None
