"""``rolloutd up`` keeps its fleets alive: on a supervised LocalStack (its own Temporal with
SQLite, its own llama-server, four fleets), SIGKILL each fleet in turn (sandbox, gateway,
workflows, eval) and then the engine while sessions of a real harness run. Nothing is started
by hand: the supervisor restarts each child; every session completes, the harness received
every recorded completion once, and after the stack stops no process and no runtime is left.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from temporalio.client import WorkflowQueryFailedError
from temporalio.service import RPCError

from rolloutd.cli import reliability
from rolloutd.proxy.sessions.recorder import answer_id
from rolloutd.stack import read_state
from rolloutd.store import BlobStore, CompletionLog
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import SessionStatus, TaskResult
from tests.reliability.conftest import (
    NUM_CALLS,
    STACK_MARKS,
    agent_task,
    harness_ids,
    new_ids,
    poll,
    processes_with,
    supervised_stack,
)

pytestmark = [*STACK_MARKS, pytest.mark.timeout(600)]

NUM_SESSIONS = 3
KILLED = ("sandbox", "gateway", "workflows", "eval", "engine")


def child(home: Path, name: str):
    """The state file's record of one child."""
    state = read_state(home)
    assert state is not None
    return next(c for c in state.children if c.name == name)


async def in_flight(client: RolloutClient, task_id: str) -> dict[int, str]:
    """The phase of each session of the task that answers its ``phase`` query now."""
    out = {}
    for i in range(NUM_SESSIONS):
        try:
            out[i] = await client.client.get_workflow_handle(f"task/{task_id}/{i}").query("phase")
        except (RPCError, WorkflowQueryFailedError):  # not started yet, or ended
            continue
    return {i: p for i, p in out.items() if p not in ("done", "pending")}


@pytest.mark.acceptance
async def test_every_child_killed_once_is_restarted_and_every_session_completes():
    """Every child of the embedded stack (Temporal, engine, each fleet) is SIGKILLed once mid-
    batch: the supervisor restarts each and every session completes. Acceptance tier (long
    kills): about 50 s here."""
    # not under pytest's basetemp, which other pytest runs on the machine prune while the
    # stack uses it; short, since runtimes hold AF_UNIX sockets (108 bytes)
    home = Path(tempfile.mkdtemp(prefix="rolloutd-sup-"))
    task_id, marker = new_ids("supervised")
    stack = supervised_stack(home, f"sup-{marker[-8:]}")
    t_test = time.monotonic()
    pids: set[int] = set()
    marker2 = marker
    kills: dict[str, dict] = {}
    status_text = ""
    try:
        await asyncio.to_thread(stack.start)
        assert stack.temporal is not None
        client = await RolloutClient.connect(stack.temporal.address, store_url=stack.store_url)
        store = BlobStore(stack.store_url)
        handle = await client.submit(
            agent_task(task_id, marker, num_samples=NUM_SESSIONS, pause_s=3.0)
        )
        result = asyncio.ensure_future(handle.result())

        def mid_run() -> bool:
            if result.done():
                raise AssertionError(f"the task ended before the kills: {result.result()}")
            return (
                sum(len(CompletionLog(store, f"{task_id}/{i}")) >= 1 for i in range(NUM_SESSIONS))
                >= 2
            )

        await poll(mid_run, 180, "sessions mid-run")
        for name in KILLED:
            before = child(home, name)
            assert before.phase == "running" and before.pid is not None
            pids.add(before.pid)
            sessions = len(await in_flight(client, task_id))
            t0 = time.monotonic()
            os.kill(before.pid, signal.SIGKILL)
            after = await poll(
                lambda n=name, p=before.pid: (
                    (c := child(home, n)).phase == "running" and c.pid not in (None, p) and c
                ),
                120,
                f"{name} restarted by the supervisor",
            )
            assert after.restarts == 1 and after.last_exit_code == -signal.SIGKILL
            pids.add(after.pid)
            kills[name] = {
                "sessions_in_flight": sessions,
                "restart_s": round(time.monotonic() - t0, 1),
            }
        group: TaskResult = await asyncio.wait_for(result, 300)
        done = subprocess.run(
            [sys.executable, "-m", "rolloutd.cli", "status", "--home", str(home)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        status_text = done.stdout
        print(f"\n$ rolloutd status --home {home}\n{status_text}\nkills: {kills}")
        assert done.returncode == 0, done.stdout + done.stderr
        for name in KILLED:  # restarts column: 1 for each killed child, 0 for Temporal
            row = next(r.split() for r in status_text.splitlines() if r.startswith(name + " "))
            assert row[1] == "running" and row[4] == "1", row
        lost = 0
        for s in group.sessions:
            assert s.status == SessionStatus.COMPLETED and s.reward == 1.0, s
            completions = CompletionLog(store, s.session_id).read_all()
            expected = [answer_id(c) for c in completions]
            ids = harness_ids(store, s.session_id) or []
            lost += len(set(expected) - set(ids))
            assert ids == expected and len(completions) == NUM_CALLS, (s.session_id, ids)
        assert lost == 0
        pids |= {c.pid for c in read_state(home).children if c.pid}  # type: ignore[union-attr]
        # Ctrl-C's path with sessions running: the stack stops in order, in bounded time
        task_id2, marker2 = new_ids("supervised-stop")
        await client.submit(agent_task(task_id2, marker2, num_samples=2, pause_s=3.0))
        await poll(
            lambda: any(len(CompletionLog(store, f"{task_id2}/{i}")) >= 1 for i in range(2)),
            120,
            "sessions of the second task mid-run",
        )
    finally:
        t_stop = time.monotonic()
        await asyncio.to_thread(stack.stop)
        stop_s = time.monotonic() - t_stop
    assert stop_s < stack.drain_s + 30, stop_s
    assert processes_with(marker2) == []
    left = [p for p in pids if Path(f"/proc/{p}").exists()]
    runtimes = (
        [p.name for p in stack.runtime_root.iterdir() if p.name != ".owners"]
        if stack.runtime_root.exists()
        else []
    )
    reliability.record(
        "supervised up: kill -9 each fleet and the engine",
        sessions=NUM_SESSIONS,
        completed=sum(s.status == SessionStatus.COMPLETED for s in group.sessions),
        lost=lost,
        orphans=len(left) + len(processes_with(marker)),
        leftover_runtimes=len(runtimes),
        retried_sessions=sum(bool(s.attempts) for s in group.sessions),
        seconds=round(time.monotonic() - t_test, 1),
        stop_s=round(stop_s, 1),
        ok=True,
    )
    assert left == [] and processes_with(marker) == [] and runtimes == []
    assert read_state(home).phase == "stopped"  # type: ignore[union-attr]
    shutil.rmtree(home, ignore_errors=True)
