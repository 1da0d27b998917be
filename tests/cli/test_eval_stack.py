"""``rolloutd eval`` and ``rolloutd submit`` as a user runs them, on the real parts: Temporal,
llama-server (Qwen2.5-Coder-0.5B) behind the gateway, Harbor tasks on podman, HumanEval on
bwrap, qwen-code on bwrap.

- ``rolloutd eval examples/harbor -a oracle -m MODEL -r 2``: 1.00 on every task, exit 0;
  ``-a shell`` (doing nothing): 0.00, exit 0; interrupted with SIGINT mid-run and resumed with
  ``--resume``: no session run twice (session workflows counted in Temporal);
- HumanEval (a subset, ``rolloutd generate``'s example spec as the eval config): pass@1 and
  pass@k in ``summary.json`` equal what ``generate``'s summary reports over the same groups;
- ``rolloutd submit examples/tasks.jsonl`` twice: the second follows the first's tasks and
  prints the same rows;
- ``rolloutd eval examples/tasks.jsonl`` with no stack given or running on its home: it starts
  the embedded stack (the codec key it generates on that home included), runs the file on it
  with ``--tracker tensorboard`` and stops it.

Every ``results.jsonl`` line is validated against docs/results_line.schema.json with
``jsonschema``. Figures printed: wall times, rewards, the session count at the interrupt.

The same points on a JSONL task file (a harness that does the work 1.00, ``-a shell`` 0.00,
Ctrl-C then ``--resume`` counted, lines against the schema) are ``test_eval.py``'s, in the
default tier; Ctrl-C during ``submit``, the tasks left running and ``rolloutd tasks cancel``
ending them are ``test_submit_attach.py``'s. Acceptance tier, load 2-3 with one other heavy
run beside it: the first three 190 s in all; the embedded stack's 32 s.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from rolloutd.cli.results import RunSummary
from rolloutd.generation.outputs import summarize as generation_summary
from rolloutd.processes import free_port
from rolloutd.stack.state import read_state
from rolloutd.workflows.generation.models import GenerationSpec, JournalEntry
from tests.support.cli_runs import (
    cli_env,
    count,
    interrupt,
    run_cli,
    start_cli,
    wait_count,
    write_jsonl,
)
from tests.support.taskset_stack import taskset_rig
from tests.support.tensorboard_events import scalars

ROOT = Path(__file__).resolve().parents[2]
MODEL = "qwen2.5-coder-0.5b"
SCHEMA = json.loads((ROOT / "docs" / "results_line.schema.json").read_text())

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.temporal,
    pytest.mark.engine,
    pytest.mark.timeout(3600),
]


#: a progress line of the bar once sessions run
RUNNING = re.compile(r"running [1-9]")


async def read_until(proc: Any, pattern: re.Pattern[str], timeout_s: float) -> str:
    """Read a started command's stderr (where the bar prints its lines when stdout is not a
    terminal: one a change, at most one every 5 s) line by line until a line matches
    ``pattern``: what it printed so far (the rest stays in the pipe for :func:`interrupt`)."""
    seen: list[str] = []

    async def lines() -> str:
        while True:
            line = (await proc.stderr.readline()).decode()
            if not line:
                raise AssertionError(f"ended before {pattern.pattern!r}: {''.join(seen)}")
            seen.append(line)
            if pattern.search(line):
                return "".join(seen)

    return await asyncio.wait_for(lines(), timeout_s)


def read_lines(folder: Path) -> list[dict]:
    """results.jsonl's lines, each validated against the documented schema."""
    lines = [json.loads(x) for x in (folder / "results.jsonl").read_text().splitlines()]
    for line in lines:
        jsonschema.validate(line, SCHEMA)
    return lines


def rewards(lines: list[dict]) -> dict[str, list[float | None]]:
    out: dict[str, list[float | None]] = {}
    for line in sorted(lines, key=lambda x: (x["task_id"], x["sample"])):
        if not line["superseded"]:
            out.setdefault(line["task_id"], []).append(line["reward"])
    return out


@pytest.mark.skipif(shutil.which("podman") is None, reason="needs podman")
async def test_harbor_oracle_nothing_and_an_interrupted_run_resumed(
    temporal_server, engine, tmp_path_factory
):
    root = tmp_path_factory.mktemp("evalsets")
    harbor = root / "harbor"
    shutil.copytree(ROOT / "examples" / "harbor", harbor)
    async with taskset_rig(temporal_server.address, engine.url, root, "evalcli") as rig:
        env = {
            **cli_env(rig.store.url),
            "ROLLOUTD_TEMPORAL_NAMESPACE": rig.client.client.namespace,
        }
        address = ["--address", temporal_server.address]
        out = root / "runs"
        u = uuid.uuid4().hex[:4]

        t0 = time.monotonic()
        code, stdout, stderr = await run_cli(
            "eval", str(harbor), "-a", "oracle", "-m", MODEL, "-r", "2",
            "--out", str(out / "a"), "--run-name", f"or{u}", *address, env=env, timeout_s=1200,
        )  # fmt: skip
        print(stdout, f"oracle: {time.monotonic() - t0:.0f} s")
        assert code == 0, stdout + stderr
        assert "FAILED" not in stdout and "no model call" not in stdout
        got = rewards(read_lines(out / "a"))
        assert len(got) == 6 and all(r == [1.0, 1.0] for r in got.values()), got
        summary = RunSummary.model_validate_json((out / "a" / "summary.json").read_text())
        assert summary.pass_at_1 == 1.0 and summary.pass_at_k == 1.0 and summary.k == 2

        t0 = time.monotonic()
        code, stdout, stderr = await run_cli(
            "eval", str(harbor), "-a", "shell", "-m", MODEL, "-r", "1", "--out", str(out / "nop"),
            "--run-name", f"nop{u}", *address, env=env, timeout_s=1200,
        )  # fmt: skip
        print(stdout, f"nothing: {time.monotonic() - t0:.0f} s")
        assert code == 0, stdout + stderr
        got = rewards(read_lines(out / "nop"))
        assert len(got) == 6 and all(r == [0.0] for r in got.values()), got

        # two sessions in flight at most; Ctrl-C as soon as the bar shows sessions running
        # (the oracle's 12 sessions take about 16 s in all: a wait on Temporal's visibility
        # was seen to come after the run had ended), then --resume
        run = f"rs{u}"
        common = ["-a", "oracle", "-m", MODEL, "-r", "2", "-c", "2", "--out", str(out / "r")]
        proc = await start_cli("eval", str(harbor), *common, "--run-name", run, *address, env=env)
        sessions = f"WorkflowType = 'RolloutSessionWorkflow' AND RolloutTaskId STARTS_WITH '{run}-'"
        await read_until(proc, RUNNING, timeout_s=300)
        code, stdout, stderr = await interrupt(proc)
        assert code == 130, stdout + stderr
        assert "nothing was cancelled" in stderr and "--resume" in stderr, stderr
        before = await count(rig.client.client, sessions)
        t0 = time.monotonic()
        code, stdout, stderr = await run_cli(
            "eval", str(harbor), *common, "--resume", *address, env=env, timeout_s=1200
        )
        print(stdout, f"resumed: {time.monotonic() - t0:.0f} s; {before} sessions before")
        assert code == 0, stdout + stderr
        assert "(resumed)" in stdout
        lines = read_lines(out / "r")
        got = rewards(lines)
        assert len(got) == 6 and all(r == [1.0, 1.0] for r in got.values()), got
        # no session ran twice: 12 session workflows for 12 samples, one harness run each
        assert await count(rig.client.client, sessions) == 12
        assert all(line["num_attempts"] == 1 for line in lines)
        print(f"interrupted with {before} of 12 session workflows started; 12 after --resume")


async def test_humaneval_subset_scores_as_generate_reports(fleets, temporal_server, tmp_path):
    spec_path = ROOT / "examples" / "generation" / "humaneval.json"
    run = f"he{uuid.uuid4().hex[:4]}"
    out = tmp_path / "he"
    t0 = time.monotonic()
    code, stdout, stderr = await run_cli(
        "eval", str(spec_path), "-n", "4", "-r", "2", "--run-name", run, "--out", str(out),
        "--address", temporal_server.address, env=cli_env(fleets.store_url), timeout_s=1200,
    )  # fmt: skip
    print(stdout, f"humaneval: {time.monotonic() - t0:.0f} s")
    assert code == 0, stdout + stderr
    lines = read_lines(out)
    assert len(rewards(lines)) == 4 and all(line["num_completions"] >= 1 for line in lines)
    summary = RunSummary.model_validate_json((out / "summary.json").read_text())
    # generate's own summary over the same groups, read back from Temporal
    spec = GenerationSpec.model_validate_json(spec_path.read_text())
    spec = spec.model_copy(update={"template": spec.template.model_copy(update={"num_samples": 2})})
    entries = []
    for task_id in sorted({line["task_id"] for line in lines}):
        group = await fleets.client.get_workflow_handle(f"task/{task_id}").result()
        entries.append(JournalEntry(key=task_id, task_id=task_id, result=group))
    reported = generation_summary(spec, entries)
    print(f"eval pass@1 {summary.pass_at_1} pass@2 {summary.pass_at_k}; generate's", reported)
    assert reported.pass_at_1 == pytest.approx(summary.pass_at_1)
    assert reported.pass_at_k == pytest.approx(summary.pass_at_k)
    assert reported.num_rows == summary.num_tasks == 4


async def test_submit_the_example_twice_follows_the_first_run(fleets, temporal_server, tmp_path):
    """examples/tasks.jsonl (qwen-code on bwrap, the real model), its ids made unique to this
    test: the second ``submit`` starts nothing and prints the same session rows."""
    u = uuid.uuid4().hex[:4]
    rows = [
        {**json.loads(x), "task_id": f"{json.loads(x)['task_id']}-{u}"}
        for x in (ROOT / "examples" / "tasks.jsonl").read_text().splitlines()
    ]
    tasks = write_jsonl(tmp_path / "tasks.jsonl", rows)
    env = cli_env(fleets.store_url)
    address = ["--address", temporal_server.address]
    t0 = time.monotonic()
    code, first, err = await run_cli(
        "submit", str(tasks), "--out", str(tmp_path / "out"), *address, env=env, timeout_s=1200
    )
    print(first, f"first: {time.monotonic() - t0:.0f} s")
    assert code in (0, 1), first + err  # 1 only for an infrastructure failure, said below
    sessions = (
        f"WorkflowType = 'RolloutSessionWorkflow' AND RolloutTaskId STARTS_WITH 'hello-py-{u}'"
    )
    started = await wait_count(fleets.client, sessions, 2)
    t0 = time.monotonic()
    code2, second, err = await run_cli(
        "submit", str(tasks), "--out", str(tmp_path / "out"), *address, env=env
    )
    print(second, f"second: {time.monotonic() - t0:.0f} s")
    assert code2 == code, second + err
    assert "followed 2 task(s) started before under the same id" in second
    rows_of = [
        [
            x
            for x in text.splitlines()
            if x.split() and x.split()[0].startswith(("hello-py", "sum-"))
        ]
        for text in (first, second)
    ]
    assert rows_of[0] == rows_of[1] and len(rows_of[0]) == 4, rows_of
    lines = read_lines(tmp_path / "out")
    assert len([x for x in lines if not x["superseded"]]) == 4
    assert await count(fleets.client, sessions) == started  # nothing started again


async def test_eval_on_the_embedded_stack(tmp_path):
    """No ``--address`` and no ``up`` stack on the home: ``eval`` starts the embedded stack
    (Temporal, llama-server on the catalog model, the four fleets as processes), runs the
    example task file's first task (qwen-code on bwrap) on it, and stops it. The stack encrypts
    payloads with the key it generates on that home, which the command must read back. Its
    Temporal, UI and gateway ports are free ones; llama-server takes the stack's own 8400."""
    home = Path(tempfile.mkdtemp(prefix="ee-", dir="/tmp"))  # short: unix socket paths
    env = {
        k: v
        for k, v in cli_env(str(home / "store")).items()
        if not k.startswith("ROLLOUTD_") or k == "ROLLOUTD_LOG_LEVEL"
    }
    out = tmp_path / "out"
    ports = ["--temporal-port", str(free_port()), "--ui-port", str(free_port())]
    ports += ["--gateway-port", str(free_port())]
    t0 = time.monotonic()
    try:
        code, stdout, stderr = await run_cli(
            "eval", str(ROOT / "examples" / "tasks.jsonl"), "-n", "1", "-r", "1", "-m", MODEL,
            "--home", str(home), "--out", str(out), "--tracker", "tensorboard", *ports,
            env=env, timeout_s=1200,
        )  # fmt: skip
        print(stdout, f"embedded: {time.monotonic() - t0:.0f} s")
        assert code == 0, stdout + stderr
        assert "embedded stack up in" in stdout and "Traceback" not in stderr, stdout + stderr
        [line] = read_lines(out)
        assert line["harness"] == "qwen_code" and line["failure"] is None, line
        assert line["num_completions"] >= 1 and line["reward"] in (0.0, 1.0), line
        assert scalars(out / "tracker")["rolloutd/eval/num_sessions"] == [(1, 1.0)]
        state = read_state(home)
        assert state is not None and state.phase == "stopped" and not state.alive(), state
        assert (home / "codec_keys").is_file()  # the stack's payloads were encrypted
    finally:
        shutil.rmtree(home, ignore_errors=True)
