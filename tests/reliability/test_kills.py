"""Kill -9 a fleet process (sandbox during provisioning and during the run, gateway, workflows,
evaluator) and restart the Temporal dev server in the middle of a batch of 8 sessions with a
real harness (a small agent loop making real calls through the real gateway to the real
llama-server): every session completes, no completion is lost or duplicated, nothing is left
running (docs/faults.md).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.service import RPCError

from rolloutd.cli import reliability
from rolloutd.proxy.sessions.recorder import answer_id
from rolloutd.security.connection import data_converter
from rolloutd.store import BlobStore, CompletionLog
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import SessionStatus, TaskResult
from tests.reliability.conftest import (
    NUM_CALLS,
    STACK_MARKS,
    Rig,
    agent_task,
    harness_ids,
    new_ids,
    poll,
    processes_with,
)

pytestmark = [*STACK_MARKS, pytest.mark.timeout(300)]

NUM_SESSIONS = 8


async def connect(rig: Rig) -> Client:
    """A client of the stack's Temporal server."""
    assert rig.stack.temporal is not None
    return await Client.connect(rig.stack.temporal.address, data_converter=data_converter())


async def phases(client: Client, task_id: str) -> dict[int, str]:
    """The phase of each session of the batch whose workflow answers the query now."""
    out = {}
    for i in range(NUM_SESSIONS):
        try:
            out[i] = await client.get_workflow_handle(f"task/{task_id}/{i}").query("phase")
        except RPCError:
            continue
    return out


async def sessions_in_phase(client: Client, task_id: str, phase: str, minimum: int) -> bool:
    """Whether at least ``minimum`` sessions of the batch are in ``phase`` now."""
    return sum(now == phase for now in (await phases(client, task_id)).values()) >= minimum


async def activity_attempts(client: Client, workflow_id: str, activity: str) -> int:
    """The highest attempt number with which ``activity`` started in a workflow's history."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    scheduled = {
        e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    }
    return max(
        (
            e.activity_task_started_event_attributes.attempt
            for e in history.events
            if e.HasField("activity_task_started_event_attributes")
            and scheduled.get(e.activity_task_started_event_attributes.scheduled_event_id)
            == activity
        ),
        default=0,
    )


async def sessions_in_run_with_calls(
    client: Client, store: BlobStore, task_id: str, minimum: int
) -> bool:
    """Whether at least ``minimum`` sessions are running their harness with >= 1 completion."""
    return (
        sum(
            phase == "run" and len(CompletionLog(store, f"{task_id}/{i}")) >= 1
            for i, phase in (await phases(client, task_id)).items()
        )
        >= minimum
    )


def check_batch(
    rig: Rig,
    store: BlobStore,
    group: TaskResult,
    marker: str,
    *,
    engine_before: int,
    calls_cut: bool,
) -> dict:
    """Assert the batch's invariants; return its figures for ``rolloutd doctor``."""
    statuses = [s.status for s in group.sessions]
    failed = [s for s in group.sessions if s.status != SessionStatus.COMPLETED]
    for s in failed:  # allowed only with an explicit reason, when attempts ran out
        assert s.status == SessionStatus.FAILED and s.error and "giving up" in s.error, s
    recorded = lost = duplicated = 0
    for s in group.sessions:
        given_up = sum(a.num_completions for a in s.attempts)
        completions = CompletionLog(store, s.session_id).read_all()
        # a call the next attempt replayed from an earlier one was not sampled again
        assert s.replay.num_replayed == sum(c.replayed_from is not None for c in completions)
        recorded += len(completions) - s.replay.num_replayed + given_up
        assert [c.index for c in completions] == list(range(len(completions)))
        if s.status != SessionStatus.COMPLETED:
            continue
        # the harness received exactly the recorded answers, each once, in order
        ids = harness_ids(store, s.session_id)
        assert ids is not None, f"{s.session_id}: harness printed no ids"
        expected = [answer_id(c) for c in completions]
        lost += len(set(expected) - set(ids))
        duplicated += len(ids) - len(set(ids)) + max(0, len(completions) - NUM_CALLS)
        assert ids == expected and len(completions) == NUM_CALLS, (s.session_id, ids, expected)
        assert s.num_completions == NUM_CALLS
    engine = rig.engine_answers() - engine_before
    if calls_cut:
        # a call in flight when the gateway died, or whose harness died with its sandbox host,
        # was sampled but never answered, so not recorded (the log holds what was returned);
        # the retry or the next attempt samples again
        assert recorded <= engine <= recorded + NUM_SESSIONS, (recorded, engine)
    else:
        assert engine == recorded, (engine, recorded)
    orphans = processes_with(marker)
    assert orphans == [], orphans
    return {
        "sessions": len(statuses),
        "completed": statuses.count(SessionStatus.COMPLETED),
        "failed": statuses.count(SessionStatus.FAILED),
        "completions_recorded": recorded,
        "engine_requests": engine,
        "lost": lost,
        "duplicated": duplicated,
        "orphans": len(orphans),
    }


async def run_batch_with_fault(
    rig: Rig,
    prefix: str,
    fault,
    *,
    calls_cut: bool = False,
    scenario: str,
    when: str = "run",
    overrides: Callable[[str], dict] | None = None,
) -> TaskResult:
    """Submit 8 sessions, wait until at least 3 are in phase ``when`` ("run": mid-run with
    recorded calls), inject ``fault``, wait for the group and check it.

    ``overrides(marker)`` gives TaskRequest fields to change in :func:`agent_task`'s task.
    """
    client = await connect(rig)
    store = BlobStore(rig.stack.store_url)
    task_id, marker = new_ids(prefix)
    engine_before = rig.engine_answers()
    t0 = time.monotonic()
    await RolloutClient(client, store).submit(
        agent_task(task_id, marker, **(overrides(marker) if overrides else {}))
    )
    if when == "run":
        await poll(
            lambda: sessions_in_run_with_calls(client, store, task_id, 3), 120, "sessions mid-run"
        )
    else:
        await poll(lambda: sessions_in_phase(client, task_id, when, 3), 120, f"sessions in {when}")
    await fault()
    client = await connect(rig)  # a fresh client: the Temporal server may have restarted
    group = await asyncio.wait_for(
        client.get_workflow_handle(f"task/{task_id}", result_type=TaskResult).result(), 240
    )
    await poll(lambda: not processes_with(marker), 15, "harness processes to end")
    figures = check_batch(
        rig, store, group, marker, engine_before=engine_before, calls_cut=calls_cut
    )
    leftover = (
        [p.name for p in rig.runtime_root.iterdir() if p.name != ".owners"]
        if rig.runtime_root.exists()
        else []
    )
    figures |= {
        "seconds": time.monotonic() - t0,
        "leftover_runtimes": len(leftover),
        "retried_sessions": sum(bool(s.attempts) for s in group.sessions),
    }
    reliability.record(scenario, **figures, ok=True)
    assert leftover == [], leftover
    return group


def kill9(rig: Rig, fleet: str) -> int:
    """SIGKILL one fleet's worker process by its pid; return the pid."""
    proc = rig.stack.workers[fleet]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    return proc.pid


async def kill9_and_restart(rig: Rig, fleet: str, outage_s: float = 1.0) -> None:
    """SIGKILL a fleet's worker, keep its host down for ``outage_s`` (a simulated outage,
    not a wait), then start it again."""
    kill9(rig, fleet)
    await asyncio.sleep(outage_s)
    rig.stack.start_worker(fleet)


async def test_kill_sandbox_worker_mid_batch(rig: Rig):
    async def fault() -> None:
        await kill9_and_restart(rig, "sandbox")

    group = await run_batch_with_fault(
        rig, "kill-sandbox", fault, calls_cut=True, scenario="kill -9 sandbox worker"
    )
    # the sessions that were running lost their host and started again on a fresh runtime
    retried = [s for s in group.sessions if s.attempts]
    assert retried, "no session noticed the dead sandbox worker"
    for s in retried:
        assert s.session_id.endswith(f".attempt-{len(s.attempts) + 1}")
        assert all("lost" in a.error for a in s.attempts)


async def test_kill_sandbox_worker_during_provisioning(rig: Rig):
    """Every runtime is still running its prepare step (8 s) when its host is killed: the
    provision activity's heartbeat stops, it is retried on the shared sandbox queue (the
    restarted host, which first reclaimed the half-built runtimes), and every session runs on
    a fresh runtime. No call was in flight, so llama-server answered exactly the recorded
    completions."""

    def slow_prepare(marker: str) -> dict:
        # a shell that stays alive (not a lone command sh would exec), marker on its line
        return {"prepare": [{"type": "exec", "command": f"sleep 8; true {marker}"}]}

    client = await connect(rig)

    async def fault() -> None:
        await kill9_and_restart(rig, "sandbox")

    group = await run_batch_with_fault(
        rig,
        "kill-provision",
        fault,
        when="provision",
        overrides=slow_prepare,
        scenario="kill -9 sandbox worker while provisioning",
    )
    attempts = [
        await activity_attempts(client, f"task/{group.task_id}/{i}", "provision_runtime")
        for i in range(NUM_SESSIONS)
    ]
    assert sum(a >= 2 for a in attempts) >= 3, attempts  # provisioning retried, not the session
    assert all(s.status == SessionStatus.COMPLETED for s in group.sessions)


async def test_kill_evaluator_mid_batch(rig: Rig, tmp_path: Path):
    """The eval worker dies while it scores: ``evaluate`` stops heartbeating, is retried on the
    restarted worker, and every session gets its reward, computed to completion once."""
    from tests.reliability.slow_evaluator import journal_lines

    journal = tmp_path / "evaluations.log"

    def slow_evaluator(marker: str) -> dict:
        return {
            "evaluator": {
                "type": "tests_slow",
                "params": {"journal": str(journal), "seconds": 6},
            }
        }

    async def fault() -> None:
        def scoring() -> int:  # evaluations begun and not finished
            events = journal_lines(journal)
            return sum(
                events.count(("start", sid)) > events.count(("done", sid)) for _, sid in set(events)
            )

        await poll(lambda: scoring() >= 3, 60, "3 evaluations in progress")
        await kill9_and_restart(rig, "eval")

    group = await run_batch_with_fault(
        rig,
        "kill-eval",
        fault,
        when="evaluate",
        overrides=slow_evaluator,
        scenario="kill -9 evaluator",
    )
    events = journal_lines(journal)
    for s in group.sessions:
        assert s.status == SessionStatus.COMPLETED and s.reward == 1.0, s
        assert events.count(("done", s.session_id)) == 1, (s.session_id, events)
    restarted = [s.session_id for s in group.sessions if events.count(("start", s.session_id)) >= 2]
    assert len(restarted) >= 3, events  # the killed evaluations ran again, and only they
    reliability.record(
        "kill -9 evaluator: rewards",
        sessions=len(group.sessions),
        evaluations_restarted=len(restarted),
        rewards_computed=sum(e == "done" for e, _ in events),
        ok=True,
    )


async def test_kill_gateway_mid_batch(rig: Rig):
    async def fault() -> None:
        await kill9_and_restart(rig, "gateway")
        await asyncio.to_thread(rig.stack.wait_gateway)

    await run_batch_with_fault(
        rig, "kill-gateway", fault, calls_cut=True, scenario="kill -9 gateway"
    )


async def test_kill_workflow_worker_mid_batch(rig: Rig):
    async def fault() -> None:
        await kill9_and_restart(rig, "workflows")

    await run_batch_with_fault(rig, "kill-workflows", fault, scenario="kill -9 workflow worker")


@pytest.mark.acceptance
async def test_restart_temporal_server_mid_batch(rig: Rig):
    """The Temporal dev server restarted mid-batch: no session is lost or run twice. Acceptance
    tier (a long kill): about 50 s here."""

    async def fault() -> None:
        assert rig.stack.temporal is not None
        await asyncio.to_thread(rig.stack.temporal.restart)

    await run_batch_with_fault(
        rig, "restart-temporal", fault, scenario="restart Temporal dev server"
    )


async def test_no_session_key_or_prompt_in_any_log(rig: Rig):
    """After the batches above: no fleet's log (INFO level) holds a session key or prompt.

    The gateway stores only the keys' hashes, so every key-shaped word of a log
    (``token_urlsafe(24)``: 32 URL-safe characters) is hashed and looked up among them.
    """
    import re

    from rolloutd.proxy.sessions.state import SessionState, hash_session_key, session_state_key

    store = BlobStore(rig.stack.store_url)
    hashes = set()
    for path in (rig.stack.home / "store" / "sessions").rglob("session.json"):
        session_id = str(path.parent.relative_to(rig.stack.home / "store" / "sessions"))
        hashes.add(store.get_model(session_state_key(session_id), SessionState).session_key_sha256)
    assert len(hashes) >= NUM_SESSIONS
    logs = {p.name: p.read_text(errors="replace") for p in rig.stack.logs.glob("*.log")}
    word = re.compile(r"(?<![A-Za-z0-9_-])[A-Za-z0-9_-]{32}(?![A-Za-z0-9_-])")
    leaked = [
        (name, "key")
        for name, text in logs.items()
        for w in set(word.findall(text))
        if hash_session_key(w) in hashes
    ]
    leaked += [(name, "prompt") for name, text in logs.items() if "Say one short word" in text]
    reliability.record(
        "keys and prompts in INFO logs",
        sessions=len(hashes),
        leaked=len(leaked),
        log_files=len(logs),
        ok=not leaked,
    )
    assert leaked == []
