"""Replay across attempts on the real stack: a session's sandbox worker is killed
with SIGKILL once 4 calls are in its log; its next attempt, on a fresh bwrap runtime, replays
the recorded calls without an engine request (the Tee in front of llama-server counts them),
samples the rest, and its trajectory has the traces of an uninterrupted run.

Harnesses: the shell harness running a small agent that runs a tool (a shell command) every
turn and sends its output back, and qwen_code (the real CLI) on a task that uses its tools.
The same agent with a tool that prints the current time ends replay at its first differing
request. A gateway killed in the middle of a replay resumes it at the right position.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from typing import Any

import pytest

from rolloutd.cli import reliability
from rolloutd.proxy.sessions.recorder import answer_id
from rolloutd.store import BlobStore, CompletionLog
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import SessionResult, SessionStatus, TaskResult, Trajectory
from tests.reliability.conftest import (
    AGENT,
    STACK_MARKS,
    Rig,
    harness_ids,
    new_ids,
    poll,
    processes_with,
)
from tests.reliability.test_kills import connect, kill9_and_restart

pytestmark = [*STACK_MARKS, pytest.mark.timeout(300)]

#: model calls of the scripted agent
NUM_CALLS = 8
#: calls in attempt 1's log when its sandbox worker is killed
KILL_AT = 4


def tool_task(task_id: str, marker: str, tool: str, *, pause_s: float = 1.5) -> dict[str, Any]:
    """One sample of the reliability agent (:data:`tests.reliability.conftest.AGENT`, at
    temperature 0) on bwrap with ``tool`` as its tool."""
    return {
        "task_id": task_id,
        "instruction": "replay",
        "num_samples": 1,
        "harness": {"type": "shell", "command": f"python3 agent.py {NUM_CALLS} {pause_s} {marker}"},
        "runtime": {"type": "bwrap", "files": {"agent.py": AGENT}, "env": {"AGENT_TOOL": tool}},
        "evaluator": {"type": "session_completed"},
        "sampling": {"max_tokens": 16},
        "phases": {"open_s": 20, "provision_s": 60, "run_s": 200},
        "timeout_s": 280,
    }


async def run(rig: Rig, task: dict[str, Any], fault=None, wait_s: float = 240) -> TaskResult:
    """Submit ``task``; run ``fault()`` meanwhile (when given); return the group within
    ``wait_s``."""
    client = await connect(rig)
    store = BlobStore(rig.stack.store_url)
    await RolloutClient(client, store).submit(task)
    if fault is not None:
        await fault()
        client = await connect(rig)
    return await asyncio.wait_for(
        client.get_workflow_handle(f"task/{task['task_id']}", result_type=TaskResult).result(),
        wait_s,
    )


def logged(store: BlobStore, session_id: str) -> int:
    return len(CompletionLog(store, session_id))


async def kill_sandbox_after(
    rig: Rig, store: BlobStore, session_id: str, calls: int, wait_s: float = 150
) -> None:
    await poll(lambda: logged(store, session_id) >= calls, wait_s, f"{calls} calls in the log")
    await kill9_and_restart(rig, "sandbox")


def check_trajectory(store: BlobStore, result: SessionResult) -> Trajectory:
    """Every trainable token of the session's trajectory has its sampled logprob."""
    assert result.trajectory_ref is not None
    trajectory = store.get_model(result.trajectory_ref, Trajectory)
    for trace in trajectory.traces:
        assert len(trace.response_ids) == len(trace.loss_mask) == len(trace.response_logprobs)
        trainable = [
            lp for lp, m in zip(trace.response_logprobs, trace.loss_mask, strict=True) if m
        ]
        assert trainable and all(math.isfinite(lp) and lp <= 0.0 for lp in trainable)
    return trajectory


async def test_shell_agent_killed_after_4_calls_replays_them(rig: Rig):
    store = BlobStore(rig.stack.store_url)
    tool = "wc -l < agent.py"
    # the same task uninterrupted: what the resumed session's trajectory must look like
    task_id, marker = new_ids("replay-base")
    base = (await run(rig, tool_task(task_id, marker, tool))).sessions[0]
    assert base.status == SessionStatus.COMPLETED and base.num_completions == NUM_CALLS

    task_id, marker = new_ids("replay-shell")
    engine_before, t0 = rig.engine_answers(), time.monotonic()
    group = await run(
        rig,
        tool_task(task_id, marker, tool),
        lambda: kill_sandbox_after(rig, store, f"{task_id}/0", KILL_AT),
    )
    wall_s = time.monotonic() - t0
    [s] = group.sessions
    assert s.status == SessionStatus.COMPLETED and s.reward == 1.0, s
    [lost] = s.attempts
    assert lost.num_completions >= KILL_AT
    completions = CompletionLog(store, s.session_id).read_all()
    assert len(completions) == NUM_CALLS
    # every call attempt 1 recorded is replayed, in order, the rest sampled
    assert [c.replayed_from for c in completions] == [
        f"{lost.session_id}#{i}" for i in range(lost.num_completions)
    ] + [None] * (NUM_CALLS - lost.num_completions)
    assert s.replay.num_replayed == lost.num_completions and s.replay.num_not_replayed == 0
    assert [e.reason for e in s.replay.ends] == ["source_ended"]
    # each call was sampled once (a call cut in flight by the kill may be sampled twice)
    engine = rig.engine_answers() - engine_before
    assert NUM_CALLS <= engine <= NUM_CALLS + 1, engine
    assert harness_ids(store, s.session_id) == [answer_id(c) for c in completions]
    check_trajectory(store, s)
    assert (s.num_traces, s.num_completions) == (base.num_traces, base.num_completions)
    assert s.replay.num_response_tokens_saved > 0
    await poll(lambda: not processes_with(marker), 15, "harness processes to end")
    reliability.record(
        "replay: shell agent killed after 4 calls",
        calls=NUM_CALLS,
        replayed=s.replay.num_replayed,
        engine_requests=engine,
        traces=s.num_traces,
        seconds=round(wall_s, 1),
        ok=True,
    )


@pytest.mark.acceptance  # about 40-55 s on 2 cores: the default tier's budget
async def test_a_tool_printing_the_time_ends_replay_at_the_first_difference(rig: Rig):
    store = BlobStore(rig.stack.store_url)
    task_id, marker = new_ids("replay-time")
    engine_before = rig.engine_answers()
    group = await run(
        rig,
        tool_task(task_id, marker, "date +%s.%N"),
        lambda: kill_sandbox_after(rig, store, f"{task_id}/0", KILL_AT),
    )
    [s] = group.sessions
    assert s.status == SessionStatus.COMPLETED and s.reward == 1.0, s  # completed, scored
    [lost] = s.attempts
    completions = CompletionLog(store, s.session_id).read_all()
    assert len(completions) == NUM_CALLS
    # the first request is the same; its tool's output (the time) changes the second
    assert [c.replayed_from is not None for c in completions] == [True] + [False] * (NUM_CALLS - 1)
    assert s.replay.num_replayed == 1
    assert s.replay.num_not_replayed == lost.num_completions - 1
    assert [(e.last_index, e.reason) for e in s.replay.ends] == [(0, "body_differed")]
    engine = rig.engine_answers() - engine_before
    assert lost.num_completions + NUM_CALLS - 1 <= engine <= lost.num_completions + NUM_CALLS
    check_trajectory(store, s)
    await poll(lambda: not processes_with(marker), 15, "harness processes to end")


@pytest.mark.acceptance  # about 40-55 s on 2 cores: the default tier's budget
async def test_a_gateway_killed_mid_replay_resumes_at_the_right_position(rig: Rig):
    store = BlobStore(rig.stack.store_url)
    task_id, marker = new_ids("replay-gw")
    session_id = f"{task_id}/0"
    engine_before = rig.engine_answers()

    async def faults() -> None:
        await kill_sandbox_after(rig, store, session_id, KILL_AT)
        # attempt 2 replays (its harness pauses between calls): kill the gateway after 2
        await poll(lambda: logged(store, f"{session_id}.attempt-2") >= 2, 150, "2 replayed calls")
        await kill9_and_restart(rig, "gateway")
        await asyncio.to_thread(rig.stack.wait_gateway)

    group = await run(rig, tool_task(task_id, marker, "echo 7", pause_s=2.0), faults)
    [s] = group.sessions
    assert s.status == SessionStatus.COMPLETED and s.reward == 1.0, s
    [lost] = s.attempts
    completions = CompletionLog(store, s.session_id).read_all()
    assert len(completions) == NUM_CALLS
    assert [c.replayed_from for c in completions] == [
        f"{lost.session_id}#{i}" for i in range(lost.num_completions)
    ] + [None] * (NUM_CALLS - lost.num_completions)
    engine = rig.engine_answers() - engine_before
    assert NUM_CALLS <= engine <= NUM_CALLS + 2, engine  # + calls cut by either kill
    assert harness_ids(store, s.session_id) == [answer_id(c) for c in completions]
    check_trajectory(store, s)
    await poll(lambda: not processes_with(marker), 15, "harness processes to end")


QWEN_TASK = "Run the command `sh next.sh` with the run_shell_command tool and do what it says."
#: each run tells the model what to do next (a small model follows the newest instruction more
#: reliably than a plan of six steps), so the task takes 6 tool calls and a final reply; the
#: counter starts at 0 in every fresh runtime, so both attempts see the same outputs
NEXT_SH = """n=$(cat .count 2>/dev/null || echo 0); n=$((n + 1)); echo $n > .count
if [ $n -lt 6 ]; then echo "Step $n of 6 done. Now run the command: sh next.sh"
else echo "Step 6 of 6 done. All steps are finished. Reply with one word: done."; fi
"""


@pytest.mark.acceptance
@pytest.mark.timeout(1200)  # Qwen Code's first request is 3.2K tokens of prefill on a CPU
async def test_qwen_code_killed_after_4_calls_replays_them(rig: Rig):
    """A real Qwen Code session killed after 4 calls: the second attempt answers those 4 from
    the first attempt's record and samples only what follows. Acceptance tier: two Qwen Code
    sessions of 6+ calls with 3K-token prompts take about 12 minutes of CPU prefill (720 s
    here: attempt 2 replayed 4 of 4, sampled 6, 11 engine requests, 13,235 prompt tokens
    saved)."""
    from rolloutd.sandbox.config import npm_prefix
    from rolloutd.sandbox.harnesses.qwen_code import ENTRY_POINT

    if not (npm_prefix() / ENTRY_POINT).is_file():
        pytest.skip(f"qwen-code is not installed in {npm_prefix()}")
    store = BlobStore(rig.stack.store_url)

    def task(task_id: str) -> dict[str, Any]:
        return {
            "task_id": task_id,
            "instruction": QWEN_TASK,
            "num_samples": 1,
            "harness": {"type": "qwen_code", "profile": "compact", "max_turns": 10},
            "runtime": {"type": "bwrap", "files": {"next.sh": NEXT_SH}},
            "evaluator": {"type": "session_completed"},
            "sampling": {"temperature": 0.0, "max_tokens": 96},
            "phases": {"open_s": 20, "provision_s": 60, "run_s": 500},
            "timeout_s": 560,
        }

    base_id, _ = new_ids("replay-qwen-base")
    base = (await run(rig, task(base_id), wait_s=560)).sessions[0]
    assert base.status == SessionStatus.COMPLETED, base
    assert base.num_completions >= 6, base.num_completions

    task_id, _ = new_ids("replay-qwen")
    engine_before, t0 = rig.engine_answers(), time.monotonic()
    group = await run(
        rig,
        task(task_id),
        lambda: kill_sandbox_after(rig, store, f"{task_id}/0", KILL_AT, 500),
        wait_s=560,
    )
    wall_s = time.monotonic() - t0
    [s] = group.sessions
    assert s.status == SessionStatus.COMPLETED, s
    [lost] = s.attempts
    completions = CompletionLog(store, s.session_id).read_all()
    replayed = [c.replayed_from for c in completions if c.replayed_from]
    assert replayed == [f"{lost.session_id}#{i}" for i in range(lost.num_completions)], (
        replayed,
        s.replay.ends,
    )
    engine = rig.engine_answers() - engine_before
    sampled = len(completions) - len(replayed)
    assert lost.num_completions + sampled <= engine <= lost.num_completions + sampled + 1
    check_trajectory(store, s)
    assert (s.num_traces, s.num_completions) == (base.num_traces, base.num_completions)
    reliability.record(
        "replay: qwen_code killed after 4 calls",
        calls=len(completions),
        replayed=len(replayed),
        engine_requests=engine,
        traces=s.num_traces,
        seconds=round(wall_s, 1),
        ok=True,
    )
    print("qwen_code replay:", json.dumps(s.replay.model_dump()))
