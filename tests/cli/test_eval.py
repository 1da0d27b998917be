"""``rolloutd eval`` as a user runs it, against the shared fleets (real Temporal, local
runtimes, shell harnesses that make no model call: a scripted harness is scored, never a
failure): a summary and ``results.jsonl`` whose lines validate against the documented schema;
Ctrl-C mid-run leaves the tasks running, and ``--resume`` finishes the run with no session
run twice (counted from Temporal); ``-a shell`` doing nothing scores 0.00 and exits 0, with
``--tracker tensorboard`` logging each task and the summary (read back with TensorBoard's own
reader). Every line is validated against docs/results_line.schema.json with ``jsonschema``."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import jsonschema
import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError

from rolloutd.cli.results import ResultLine, RunSummary
from tests.support.cli_runs import (
    cli_env,
    count,
    gated_task,
    interrupt,
    run_cli,
    start_cli,
    wait_count,
    write_jsonl,
)
from tests.support.tensorboard_events import scalars

pytestmark = [pytest.mark.temporal, pytest.mark.engine, pytest.mark.timeout(600)]
SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "docs" / "results_line.schema.json").read_text()
)


def read_lines(folder: Path) -> list[ResultLine]:
    """results.jsonl's lines, each validated against the documented schema."""
    text = (folder / "results.jsonl").read_text()
    for line in text.splitlines():
        jsonschema.validate(json.loads(line), SCHEMA)
    return [ResultLine.model_validate_json(line) for line in text.splitlines()]


async def test_interrupted_eval_resumes_without_running_a_session_twice(
    fleets, temporal_server, tmp_path
):
    run = f"ev{uuid.uuid4().hex[:6]}"
    gate = tmp_path / "gate"
    tasks = write_jsonl(
        tmp_path / "tasks.jsonl",
        [
            gated_task("a", gate),
            gated_task("b", gate, win=False),
            gated_task("c", gate),
        ],
    )
    out = tmp_path / "out"
    env = cli_env(fleets.store_url)
    common = ["--address", temporal_server.address, "--out", str(out)]
    # two sessions in flight at most: one task of two samples at a time, the rest wait
    proc = await start_cli(
        "eval", str(tasks), "-r", "2", "-c", "2", "--run-name", run, *common, env=env
    )
    sessions = f"WorkflowType = 'RolloutSessionWorkflow' AND RolloutTaskId STARTS_WITH '{run}-'"
    await wait_count(fleets.client, sessions, 2)
    code, stdout, stderr = await interrupt(proc)
    assert code == 130, stdout + stderr
    assert "interrupted (Ctrl-C); nothing was cancelled: 1 task(s) keep running" in stderr
    assert "2 not started" in stderr, stderr
    assert f"rolloutd tasks cancel --prefix {run}-" in stderr
    assert "--resume --out" in stderr
    described = await fleets.client.get_workflow_handle(f"task/{run}-a").describe()
    assert described.status == WorkflowExecutionStatus.RUNNING
    with pytest.raises(RPCError):  # never started
        await fleets.client.get_workflow_handle(f"task/{run}-b").describe()

    gate.touch()
    code, stdout, stderr = await run_cli(
        "eval", str(tasks), "-r", "2", "--resume", *common, env=env
    )
    assert code == 0, stdout + stderr
    assert "(resumed)" in stdout and "FAILED" not in stdout, stdout
    lines = read_lines(out)
    assert sorted((line.task_id, line.sample) for line in lines) == [
        (f"{run}-{key}", i) for key in "abc" for i in (0, 1)
    ]
    assert {line.task_id: line.reward for line in lines} == {
        f"{run}-a": 1.0,
        f"{run}-b": 0.0,
        f"{run}-c": 1.0,
    }
    assert all(line.run == run and line.failure is None for line in lines)
    assert all(line.num_completions == 0 and line.harness == "shell" for line in lines)
    assert all(line.evaluation is not None for line in lines)
    assert {line.row_key for line in lines} == {"a", "b", "c"}
    # no session ran twice: one session workflow per sample, one harness run each
    assert await count(fleets.client, sessions) == 6
    assert all(line.num_attempts == 1 for line in lines)
    summary = RunSummary.model_validate_json((out / "summary.json").read_text())
    assert summary.num_tasks == 3 and summary.num_sessions == 6
    assert summary.mean_reward == pytest.approx(4 / 6)
    assert summary.pass_at_1 == pytest.approx(2 / 3) and summary.pass_at_k == pytest.approx(2 / 3)
    assert summary.k == 2 and summary.failures_by_kind == {"none": 6}
    config = json.loads((out / "config.json").read_text())
    assert config["run"] == run and config["task_ids"] == [f"{run}-{k}" for k in "abc"]
    print(stdout)

    # a finished run resumed again starts nothing and says the same
    code, again, _ = await run_cli("eval", str(tasks), "-r", "2", "--resume", *common, env=env)
    assert code == 0 and len(read_lines(out)) == 6
    assert [x for x in again.splitlines() if "pass@" in x] == [
        x for x in stdout.splitlines() if "pass@" in x
    ]
    assert await count(fleets.client, sessions) == 6


async def test_a_scripted_harness_that_makes_no_call_is_scored_not_failed(
    fleets, temporal_server, tmp_path
):
    """``-a shell`` does nothing: 0.00 on every task, exit 0; a shell harness that does the
    work: 1.00, exit 0. Neither made a model call, and neither is an infrastructure failure."""
    gate = tmp_path / "gate"
    gate.touch()
    tasks = write_jsonl(tmp_path / "t.jsonl", [gated_task("x", gate), gated_task("y", gate)])
    env = cli_env(fleets.store_url)
    for harness, reward in (("shell", 0.0), ('{"type": "shell", "command": "touch won"}', 1.0)):
        out = tmp_path / f"out-{int(reward)}"
        code, stdout, stderr = await run_cli(
            "eval", str(tasks), "-a", harness, "--address", temporal_server.address,
            "--out", str(out), "--tracker", "tensorboard", env=env,
        )  # fmt: skip
        assert code == 0, stdout + stderr
        assert "FAILED" not in stdout and "no model call" not in stdout, stdout
        lines = read_lines(out)
        assert len(lines) == 2 and {line.reward for line in lines} == {reward}, lines
        assert "reward mean ± std" in stdout and f"{reward:.3f} ± 0.000" in stdout, stdout
        # the tracker: one batch a task (steps 1 and 2), the summary at the last
        series = scalars(out / "tracker")
        assert series["rolloutd/reward_mean"] == [(1, reward), (2, reward)], series
        assert series["rolloutd/eval/pass_at_1"] == [(2, reward)]
        assert series["rolloutd/eval/num_sessions"] == [(2, 2.0)]


async def test_a_store_url_the_embedded_stack_would_ignore_is_refused(tmp_path):
    """With no stack given or running on the home, ``eval`` would start the embedded stack,
    whose fleets write to ``HOME/store``: ``--store-url`` naming another store is refused
    before anything starts (no results folder, exit 1, the reason on stderr). Controls: the
    home's own store, absolute or relative to the working folder, is taken (the run then fails
    later, only on the missing source)."""
    tasks = write_jsonl(tmp_path / "t.jsonl", [gated_task("x", tmp_path / "gate")])
    home, out = tmp_path / "home", tmp_path / "out"
    env = cli_env(str(tmp_path / "elsewhere"))
    common = ["--home", str(home), "--out", str(out)]
    code, stdout, stderr = await run_cli(
        "eval", str(tasks), "--store-url", str(tmp_path / "elsewhere"), *common, env=env
    )
    assert code == 1 and not out.exists(), stdout + stderr
    assert f"the embedded stack keeps its store in {home / 'store'}" in stderr
    for own in (str(home / "store"), "home/store/"):
        code, stdout, stderr = await run_cli(
            "eval", str(tmp_path / "missing.jsonl"), "--store-url", own, *common, env=env,
            cwd=tmp_path,
        )  # fmt: skip
        assert code == 1 and "embedded stack" not in stderr and "missing.jsonl" in stderr, stderr
