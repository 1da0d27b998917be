"""``rolloutd submit`` and ``rolloutd tasks`` as a user runs them, against the shared fleets
(real Temporal, local runtimes, scripted shell harnesses): Ctrl-C leaves the tasks running and
says how to follow or cancel them (exit 130); ``rolloutd tasks list`` and ``cancel`` find and
end them; a second ``submit`` of the same file re-attaches (no ``WorkflowAlreadyStartedError``)
and prints the same results as the first; ``--out`` writes results.jsonl."""

from __future__ import annotations

import json
import uuid

import pytest
from temporalio.client import WorkflowExecutionStatus

from rolloutd.cli.results import ResultLine
from tests.support.buffer_tasks import poll
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

pytestmark = [pytest.mark.temporal, pytest.mark.engine, pytest.mark.timeout(600)]


def session_rows(stdout: str, prefix: str) -> list[str]:
    """The report table's rows of the run's sessions: lines whose first cell is a session id
    of the run (the title, with its wall time, and the notes left out)."""
    return [
        line
        for line in stdout.splitlines()
        if line.split() and line.split()[0].startswith(prefix) and "/" in line.split()[0]
    ]


async def test_interrupt_cancel_and_reattach(fleets, temporal_server, tmp_path):
    prefix = f"sa{uuid.uuid4().hex[:6]}"
    gate = tmp_path / "gate"
    keep, cancel = f"{prefix}-keep", f"{prefix}-cancel"
    tasks = write_jsonl(
        tmp_path / "tasks.jsonl",
        [gated_task(keep, gate, num_samples=2), gated_task(cancel, gate)],
    )
    env = cli_env(fleets.store_url)
    address = ["--address", temporal_server.address]
    proc = await start_cli("submit", str(tasks), *address, env=env)
    sessions = f"WorkflowType = 'RolloutSessionWorkflow' AND RolloutTaskId STARTS_WITH '{prefix}-'"
    await wait_count(fleets.client, sessions, 3)
    code, stdout, stderr = await interrupt(proc)
    assert code == 130, stdout + stderr
    assert "nothing was cancelled: 2 task(s) keep running" in stderr, stderr
    assert f"rolloutd submit {tasks}" in stderr
    assert f"rolloutd tasks cancel {keep} {cancel}" in stderr, stderr
    assert "Traceback" not in stderr

    code, listing, err = await run_cli(
        "tasks", "list", "--prefix", prefix, "--status", "running", "--json", *address, env=env
    )
    assert code == 0, err
    rows = [json.loads(line) for line in listing.splitlines()]
    assert sorted(r["task_id"] for r in rows) == [cancel, keep]
    assert {r["status"] for r in rows} == {"running"} and {r["harness"] for r in rows} == {"shell"}

    code, said, err = await run_cli("tasks", "cancel", cancel, *address, env=env)
    assert code == 0 and f"task {cancel}: cancelled" in said, said + err

    async def status_of(task_id: str) -> WorkflowExecutionStatus | None:
        return (await fleets.client.get_workflow_handle(f"task/{task_id}").describe()).status

    await poll(
        lambda: status_of(cancel), lambda s: s == WorkflowExecutionStatus.CANCELED, 60, "cancel"
    )
    assert await status_of(keep) == WorkflowExecutionStatus.RUNNING

    gate.touch()
    out = tmp_path / "out"
    code, first, err = await run_cli("submit", str(tasks), "--out", str(out), *address, env=env)
    assert code == 0, first + err
    assert "WorkflowAlreadyStartedError" not in first + err
    assert "followed 2 task(s) started before under the same id" in first
    assert "its workflow ended without a group (cancelled" in first
    lines = [
        ResultLine.model_validate_json(x) for x in (out / "results.jsonl").read_text().splitlines()
    ]
    assert sorted((x.task_id, x.sample, x.reward) for x in lines if x.task_id == keep) == [
        (keep, 0, 1.0),
        (keep, 1, 1.0),
    ]
    [cancelled] = [x for x in lines if x.task_id == cancel]
    assert cancelled.failure is not None and cancelled.failure.kind == "cancelled"

    code, second, err = await run_cli("submit", str(tasks), "--out", str(out), *address, env=env)
    assert code == 0, second + err
    assert session_rows(second, prefix) == session_rows(first, prefix) != []
    assert len((out / "results.jsonl").read_text().splitlines()) == len(lines)
    # nothing started twice: one session workflow per sample
    assert await count(fleets.client, sessions) == 3

    code, shown, err = await run_cli("tasks", "show", keep, *address, env=env)
    assert code == 0, err
    assert f"task {keep}: completed; 2/2 sessions ended" in shown
    assert "test_on_output" in shown and shown.count(f"{keep}/") >= 2, shown
    code, one, err = await run_cli("tasks", "show", keep, "--session", "1", *address, env=env)
    assert code == 0, err
    assert f"session {keep}/1: completed; reward 1" in one and "evaluation record:" in one
    print(first)
    print(shown)


@pytest.mark.acceptance
async def test_fresh_starts_new_ids_and_cancel_refuses_unknown_ids(
    fleets, temporal_server, tmp_path
):
    prefix = f"fr{uuid.uuid4().hex[:6]}"
    gate = tmp_path / "gate"
    gate.touch()
    tasks = write_jsonl(tmp_path / "t.jsonl", [gated_task(prefix, gate)])
    env = cli_env(fleets.store_url)
    address = ["--address", temporal_server.address]
    code, first, err = await run_cli("submit", str(tasks), *address, env=env)
    assert code == 0, first + err
    code, fresh, err = await run_cli("submit", str(tasks), "--fresh", *address, env=env)
    assert code == 0, fresh + err
    assert "new task ids end in -" in fresh and "followed" not in fresh
    sessions = f"WorkflowType = 'RolloutSessionWorkflow' AND RolloutTaskId STARTS_WITH '{prefix}'"
    assert await wait_count(fleets.client, sessions, 2) == 2
    code, _, err = await run_cli("tasks", "cancel", f"{prefix}-nosuch", *address, env=env)
    assert code == 1 and f"task {prefix}-nosuch: not cancelled" in err
