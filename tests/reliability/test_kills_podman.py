"""Kill -9 of the sandbox worker while a podman task runs (the bwrap versions are
tests/reliability/test_kills.py and test_replay.py): the session resumes on a new attempt on a
fresh container, replaying the calls the lost attempt recorded, and no container is left. The
killed worker's containers end by themselves (their exec server's socket closes, the
container exits, ``--rm`` removes it) before the worker is restarted; the restarted worker's
reclaim would remove any that did not (tests/sandbox/test_runtime_podman.py).

``acceptance``: the reliability stack (its own Temporal server, llama-server, each fleet a
process) and containers; about 60 s once the stack is up on a quiet machine, 156 s under load
13-14 here (starting the stack 108 s more).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from typing import Any

import pytest

from rolloutd.cli import reliability
from rolloutd.proxy.sessions.recorder import answer_id
from rolloutd.sandbox.runtimes.podman import ROOT_LABEL
from rolloutd.store import BlobStore, CompletionLog
from rolloutd.types import SessionStatus
from tests.reliability.conftest import AGENT, Rig, harness_ids, new_ids, poll, processes_with
from tests.reliability.test_replay import KILL_AT, NUM_CALLS, check_trajectory, logged, run

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.temporal,
    pytest.mark.engine,
    pytest.mark.timeout(420),
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed"),
]


def containers(rig: Rig) -> list[str]:
    """Containers (running or not) of the stack's runtime root."""
    return subprocess.run(
        [
            "podman",
            "ps",
            "--all",
            "--filter",
            f"label={ROOT_LABEL}={rig.runtime_root.absolute()}",
            "--format",
            "{{.ID}}",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()


def podman_task(task_id: str, marker: str, *, pause_s: float = 1.5) -> dict[str, Any]:
    """One sample of the reliability agent in a podman container (the Debian base image)."""
    return {
        "task_id": task_id,
        "instruction": "replay on podman",
        "num_samples": 1,
        "harness": {"type": "shell", "command": f"python3 agent.py {NUM_CALLS} {pause_s} {marker}"},
        "runtime": {
            "type": "podman",
            "files": {"agent.py": AGENT},
            "env": {"AGENT_TOOL": "wc -l < agent.py"},
        },
        "evaluator": {"type": "session_completed"},
        "sampling": {"max_tokens": 16},
        "phases": {"open_s": 20, "provision_s": 120, "run_s": 200},
        "timeout_s": 320,
    }


async def test_kill_sandbox_worker_mid_run_on_podman(rig: Rig) -> None:
    """kill -9 of the sandbox worker after a few recorded calls of a podman task: the container
    ends by itself, the session completes scored on a second attempt that replays the lost
    attempt's calls in order and samples the rest (the engine answers each call once, plus at
    most one cut in flight), and no container, process or runtime folder is left. About 160 s
    here under load 13-14 once the stack is up (its start took 108 s more)."""
    store = BlobStore(rig.stack.store_url)
    task_id, marker = new_ids("kill-podman")
    session_id = f"{task_id}/0"
    engine_before, t0 = rig.engine_answers(), time.monotonic()
    gone_s: list[float] = []

    async def fault() -> None:
        await poll(lambda: logged(store, session_id) >= KILL_AT, 200, f"{KILL_AT} calls")
        assert len(containers(rig)) == 1
        proc = rig.stack.workers["sandbox"]
        killed_at = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        # no worker runs on this root now: the container must end by itself
        await poll(lambda: not containers(rig), 30, "the killed worker's container to end")
        gone_s.append(time.monotonic() - killed_at)
        assert processes_with(marker) == []
        await asyncio.to_thread(rig.stack.start_worker, "sandbox")

    group = await run(rig, podman_task(task_id, marker), fault, wait_s=300)
    wall_s = time.monotonic() - t0
    [s] = group.sessions
    assert s.status == SessionStatus.COMPLETED and s.reward == 1.0, s
    [lost] = s.attempts
    assert "lost" in lost.error and lost.num_completions >= KILL_AT
    assert s.session_id.endswith(".attempt-2")
    completions = CompletionLog(store, s.session_id).read_all()
    assert len(completions) == NUM_CALLS
    # the new attempt replayed what the lost one recorded, in order, and sampled the rest
    assert [c.replayed_from for c in completions] == [
        f"{lost.session_id}#{i}" for i in range(lost.num_completions)
    ] + [None] * (NUM_CALLS - lost.num_completions)
    assert s.replay.num_replayed == lost.num_completions
    engine = rig.engine_answers() - engine_before
    assert NUM_CALLS <= engine <= NUM_CALLS + 1, engine  # + a call cut in flight by the kill
    assert harness_ids(store, s.session_id) == [answer_id(c) for c in completions]
    check_trajectory(store, s)
    await poll(lambda: not processes_with(marker), 15, "harness processes to end")
    assert containers(rig) == []
    leftover = [p.name for p in rig.runtime_root.iterdir() if p.name not in (".owners", ".images")]
    assert leftover == [], leftover
    reliability.record(
        "kill -9 sandbox worker mid-run (podman)",
        calls=NUM_CALLS,
        replayed=s.replay.num_replayed,
        engine_requests=engine,
        container_gone_s=round(gone_s[0], 2),
        seconds=round(wall_s, 1),
        ok=True,
    )
