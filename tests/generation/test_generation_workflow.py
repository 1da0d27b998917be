"""Offline generation against real Temporal, real fleets and the real engine.

- HumanEval, 10 problems x 2 samples: the generation worker and the CLI are SIGKILLed halfway,
  both are started again, and every row ends journaled once, each task and session workflow
  started once, the SFT JSONL and Parquet written and readable, token ids and loss masks aligned.
- A schedule made by ``rolloutd schedule create`` fires on ``trigger``, runs only the rows not
  yet journaled, and is listed by ``temporal schedule list``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rolloutd.generation.commands import generate, load_spec
from rolloutd.generation.outputs import journal_prefix, read_journal
from rolloutd.stack.processes import temporal_binary
from rolloutd.store import BlobStore
from rolloutd.types import SessionStatus
from rolloutd.workflows.generation.models import GenerationSummary
from tests.support.buffer_tasks import poll

pytestmark = [pytest.mark.temporal, pytest.mark.engine, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
ASK = (ROOT / "examples" / "generation" / "ask.py").read_text()


def run_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}


def spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env=run_env(),
        stdout=open(log, "ab"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def rolloutd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rolloutd.cli", *args],
        cwd=ROOT,
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def write_spec(path: Path, spec: dict) -> Path:
    path.write_text(json.dumps(spec))
    return path


@pytest.mark.timeout(2400)  # 20 engine sessions on a shared 2-core machine
async def test_killed_generation_resumes_and_does_every_row_once(fleets, temporal_server, tmp_path):
    name = f"he-{uuid.uuid4().hex[:6]}"
    queue = f"generation-test-{name}"
    address = temporal_server.address
    spec_path = write_spec(
        tmp_path / "spec.json",
        {
            "name": name,
            "source": {"type": "humaneval", "limit": 10},
            "template": {
                "instruction": "Complete this Python function. Answer with the whole function "
                "in one ```python code block.\n\n{prompt}",
                "num_samples": 2,
                "harness": {
                    "type": "shell",
                    "command": "python3 ask.py {instruction_file} solution.py",
                },
                "runtime": {"type": "local", "files": {"ask.py": ASK}},
                "evaluator": {"type": "humaneval", "timeout_s": 30},
                "sampling": {"temperature": 0.8, "max_tokens": 24, "seed": 7},
                "timeout_s": 600,
            },
            "outputs": {"dir": str(tmp_path / "out"), "datasets": True},
            "max_concurrent_rows": 3,
        },
    )
    store = BlobStore(fleets.store_url)
    journaled = lambda: asyncio.to_thread(store.list, journal_prefix(name))  # noqa: E731
    cli_args = [
        "-m",
        "rolloutd.cli",
        "generate",
        str(spec_path),
        "--address",
        address,
        "--task-queue",
        queue,
    ]
    worker_args = ["-m", "tests.support.generation_worker", address, queue]
    procs = [spawn(worker_args, tmp_path / "worker.log"), spawn(cli_args, tmp_path / "cli.log")]
    try:
        await poll(
            journaled, lambda keys: len(keys) >= 3, timeout_s=900, what="3 of 10 rows journaled"
        )
        for proc in procs:  # halfway: the generation's workflow worker and the CLI
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        num_at_kill = len(await journaled())
        assert num_at_kill < 10
        procs += [spawn(worker_args, tmp_path / "worker2.log")]
        cli = spawn(cli_args, tmp_path / "cli2.log")
        procs.append(cli)
        deadline = time.monotonic() + 1200
        while cli.poll() is None:
            assert time.monotonic() < deadline, "the resumed generation did not finish"
            await asyncio.sleep(0.5)
        output = (tmp_path / "cli2.log").read_text()
        assert cli.returncode == 0, output[-3000:]
    finally:
        for proc in procs:
            stop(proc)

    print(output[-3000:])  # the resumed CLI's progress lines and final table, for CI's log
    assert "pass@1" in output and "pass@2" in output and "rows" in output
    entries = read_journal(store, name)
    assert sorted(e.key for e in entries) == sorted(f"HumanEval/{i}" for i in range(10))
    assert all(len(e.result.sessions) == 2 for e in entries)
    # each row's task, and each sample's session, was started once over both runs
    ids = Counter()
    async for wf in fleets.client.list_workflows(f'WorkflowId STARTS_WITH "task/gen-{name}-"'):
        ids[wf.id] += 1
    assert ids and max(ids.values()) == 1, ids
    assert len([i for i in ids if i.count("/") == 1]) == 10
    sessions = {s.session_id for e in entries for s in e.result.sessions}
    assert len(sessions) == 20

    scored = [
        s
        for e in entries
        for s in e.result.sessions
        if s.reward is not None and s.status == SessionStatus.COMPLETED
    ]
    lines = [json.loads(line) for line in (tmp_path / "out" / "sft.jsonl").read_text().splitlines()]
    table = pq.read_table(tmp_path / "out" / "traces.parquet").to_pylist()
    assert len(lines) == len(table) >= len(scored) > 0
    assert all(m["messages"][-1]["role"] == "assistant" for m in lines)
    assert len({(r["session_id"], r["trace_index"]) for r in table}) == len(table)
    assert {r["session_id"] for r in table} <= sessions
    for row in table:
        assert (
            len(row["response_ids"]) == len(row["loss_mask"]) == len(row["response_logprobs"]) > 0
        )
        assert sum(row["loss_mask"]) > 0 and row["prompt_ids"]
    import datasets

    assert len(datasets.load_from_disk(str(tmp_path / "out" / "dataset"))) == len(table)


@pytest.mark.timeout(600)
async def test_schedule_fires_on_trigger_and_skips_rows_done(fleets, temporal_server, tmp_path):
    name = f"sched-{uuid.uuid4().hex[:6]}"
    address = temporal_server.address
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"id": f"r{i}", "q": f"say {i}"}) + "\n" for i in range(3)))
    spec = {
        "name": name,
        "source": {"type": "jsonl", "path": str(rows), "limit": 2},
        "template": {
            "instruction": "{q}",
            "num_samples": 1,
            "harness": {"type": "shell", "command": "echo {instruction}"},
            "runtime": {"type": "local"},
        },
        "outputs": {"dir": str(tmp_path / "out")},
    }
    first = await generate(fleets.client, load_spec(write_spec(tmp_path / "a.json", spec)))
    assert (first.num_rows, first.num_rows_this_run) == (2, 2)

    spec["source"]["limit"] = 3  # the schedule covers one more row
    created = rolloutd(
        "schedule",
        "create",
        str(write_spec(tmp_path / "b.json", spec)),
        "--every",
        "1d",
        "--address",
        address,
    )
    assert created.returncode == 0, created.stderr
    try:
        listed = subprocess.run(
            [temporal_binary(), "schedule", "list", "--address", address],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert f"generation-{name}" in listed.stdout, listed.stdout + listed.stderr
        assert rolloutd("schedule", "trigger", name, "--address", address).returncode == 0

        async def firing() -> list:
            d = json.loads(rolloutd("schedule", "describe", name, "--address", address).stdout)
            return d["recent"]

        recent = await poll(firing, lambda r: len(r) == 1, timeout_s=60, what="a firing")
        handle = fleets.client.get_workflow_handle(
            recent[0]["workflow_id"], result_type=GenerationSummary
        )
        summary = await asyncio.wait_for(handle.result(), 300)
        assert (summary.num_rows, summary.num_rows_this_run) == (3, 1)
        assert len(read_journal(BlobStore(fleets.store_url), name)) == 3
        assert rolloutd("schedule", "pause", name, "--address", address).returncode == 0
        described = json.loads(rolloutd("schedule", "describe", name, "--address", address).stdout)
        assert described["paused"] is True and described["overlap"] == "SKIP"
    finally:
        assert rolloutd("schedule", "delete", name, "--address", address).returncode == 0
    assert f"generation-{name}" not in rolloutd("schedule", "list", "--address", address).stdout
