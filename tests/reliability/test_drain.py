"""SIGTERM (a pod's stop, and ``rolloutd up``'s Ctrl-C) drains a fleet's process: it stops
polling, hands a running harness back, lets short activities finish, and exits 0 within its
grace period; no session ends because of it and no completion is lost (docs/decisions.md,
"One drain"; docs/faults.md, "Drain").

Real parts: the reliability rig's Temporal dev server, llama-server and fleets as processes,
plus a second sandbox host (``rolloutd worker --fleet sandbox`` with its own host id and
runtime root); bwrap runtimes running a small agent that makes real calls through the gateway.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rolloutd.cli import reliability
from rolloutd.processes import spawn, stop_process
from rolloutd.store import BlobStore, CompletionLog
from rolloutd.trainer_client import RolloutClient
from rolloutd.types import SessionStatus, TaskResult
from tests.reliability.conftest import (
    NUM_CALLS,
    STACK_MARKS,
    Rig,
    agent_task,
    new_ids,
    poll,
    processes_with,
)
from tests.reliability.test_kills import check_batch, connect, phases, run_batch_with_fault

pytestmark = [*STACK_MARKS, pytest.mark.timeout(300)]

#: the second sandbox host's grace period, s (the rig's fleets keep the default, 25 s)
GRACE_B_S = 10.0
DEFAULT_GRACE_S = 25.0
HOST_B = "rel-host-b"


def runtime_sessions(root: Path, task_id: str) -> set[str]:
    """Session ids of the batch with a runtime folder under ``root`` now (a runtime id is
    ``{session id with '/' as '.'}-{8 hex}``: rolloutd.activities.sandbox)."""
    if not root.exists():
        return set()
    return {
        p.name.rsplit("-", 1)[0].replace(".", "/")
        for p in root.iterdir()
        if p.name.startswith(f"{task_id}.")
    }


def leftovers(root: Path) -> tuple[list[str], list[int]]:
    """Runtime folders under ``root``, and processes whose command line names one."""
    folders = [p.name for p in root.iterdir() if p.name != ".owners"] if root.exists() else []
    return folders, processes_with(f"{root}/")


async def sigterm_and_wait(proc: subprocess.Popen[bytes], limit_s: float) -> float:
    """SIGTERM one process by its pid (not its group: the drain must do the rest itself);
    return the seconds until it exited. Fails when it did not exit with 0 within
    ``limit_s``."""
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGTERM)
    code = await asyncio.to_thread(proc.wait, limit_s + 30)
    exit_s = time.monotonic() - t0
    assert code == 0, f"drained process exited with {code}"
    assert exit_s <= limit_s, f"drain took {exit_s:.1f} s, grace {limit_s} s"
    return exit_s


@pytest.mark.acceptance
async def test_sigterm_sandbox_host_mid_batch(rig: Rig):
    """Two sandbox hosts; SIGTERM the one running more sessions mid-run: it exits 0 within
    its grace period leaving no runtime, and every session completes, scored, those that ran
    on it after a new attempt on the other host that replayed its recorded calls. Acceptance
    tier (a long drain): about 36 s here."""
    stack = rig.stack
    root_b = stack.home / "runtimes-b"
    env = stack.env() | {
        "ROLLOUTD_HOST_ID": HOST_B,
        "ROLLOUTD_RUNTIME_ROOT": str(root_b),
        "ROLLOUTD_GRACEFUL_SHUTDOWN_S": str(GRACE_B_S),
        "ROLLOUTD_METRICS_PORT": "0",
    }
    log_b = stack.logs / "sandbox-b.log"
    host_b = spawn(
        [sys.executable, "-m", "rolloutd.cli", "worker", "--fleet", "sandbox"],
        log_path=log_b,
        env=env,
    )
    restart_a = False
    try:
        await poll(
            lambda: log_b.exists() and "fleet_started" in log_b.read_text(),
            60,
            "the second sandbox host to poll",
        )
        client = await connect(rig)
        store = BlobStore(stack.store_url)
        task_id, marker = new_ids("drain")
        engine_before = rig.engine_answers()
        t0 = time.monotonic()
        await RolloutClient(client, store).submit(agent_task(task_id, marker))
        hosts = {
            "rel-host": (stack.workers["sandbox"], rig.runtime_root, DEFAULT_GRACE_S),
            HOST_B: (host_b, root_b, GRACE_B_S),
        }

        async def running_on(root: Path) -> set[str]:
            # mid-run: at least one call recorded and one more to come (a harness on its
            # last pause might end before the drain reaches it)
            now = await phases(client, task_id)
            return {
                sid
                for sid in runtime_sessions(root, task_id)
                if now.get(int(sid.rsplit("/", 1)[1])) == "run"
                and 1 <= len(CompletionLog(store, sid)) < NUM_CALLS
            }

        async def target() -> str | None:
            counts = {h: len(await running_on(root)) for h, (_, root, _) in hosts.items()}
            best = max(counts, key=lambda h: counts[h])
            return best if counts[best] >= 2 else None

        drained_host = await poll(target, 120, "2 sessions mid-run on one host")
        proc, root, grace_s = hosts[drained_host]
        on_drained = await running_on(root)
        assert on_drained
        restart_a = drained_host == "rel-host"
        exit_s = await sigterm_and_wait(proc, grace_s)
        folders, procs = leftovers(root)
        assert folders == [] and procs == [], (folders, procs)

        group = await asyncio.wait_for(
            client.get_workflow_handle(f"task/{task_id}", result_type=TaskResult).result(), 240
        )
        await poll(lambda: not processes_with(marker), 15, "harness processes to end")
        figures = check_batch(
            rig, store, group, marker, engine_before=engine_before, calls_cut=True
        )
        by_id = {s.session_id.split(".attempt-")[0]: s for s in group.sessions}
        for s in group.sessions:
            assert s.status == SessionStatus.COMPLETED and s.reward == 1.0, s
        for sid in on_drained:
            s = by_id[sid]
            assert s.attempts, f"{sid} ran on the drained host and shows no new attempt"
            assert (
                "HostDrainingError" in s.attempts[0].error or "draining" in s.attempts[0].error
            ), s.attempts
            assert s.session_id.endswith(".attempt-2"), s.session_id
        replayed = sum(by_id[sid].replay.num_replayed for sid in on_drained)
        assert replayed >= len(on_drained), (replayed, on_drained)  # each had >= 1 call
        assert figures["lost"] == 0 and figures["duplicated"] == 0, figures
        reliability.record(
            "SIGTERM sandbox host mid-batch (drain)",
            **figures,
            drained_sessions=len(on_drained),
            replayed_completions=replayed,
            retried_sessions=sum(bool(s.attempts) for s in group.sessions),
            exit_s=round(exit_s, 2),
            grace_s=grace_s,
            seconds=round(time.monotonic() - t0, 1),
            ok=True,
        )
    finally:
        if host_b.poll() is None:
            stop_process(host_b, grace_s=GRACE_B_S + 10)
        if restart_a:
            stack.start_worker("sandbox")


@pytest.mark.acceptance
async def test_sigterm_gateway_mid_batch(rig: Rig):
    """The gateway drains: calls in flight are answered and recorded before it exits, so
    llama-server answered exactly the recorded completions (unlike kill -9). Acceptance tier (a
    long drain): about 36 s here."""
    exits: list[float] = []

    async def fault() -> None:
        exits.append(await sigterm_and_wait(rig.stack.workers["gateway"], DEFAULT_GRACE_S))
        rig.stack.start_worker("gateway")
        await asyncio.to_thread(rig.stack.wait_gateway)

    group = await run_batch_with_fault(
        rig, "drain-gateway", fault, scenario="SIGTERM gateway (drain)"
    )
    assert all(s.status == SessionStatus.COMPLETED and s.reward == 1.0 for s in group.sessions)
    reliability.record("SIGTERM gateway: exit", exit_s=round(exits[0], 2), ok=True)


@pytest.mark.acceptance
async def test_sigterm_evaluator_mid_batch(rig: Rig, tmp_path: Path):
    """The eval worker drains: the evaluations it runs finish within its grace period, each
    is computed once, and every session is scored. Acceptance tier (a long drain): about 33 s
    here."""
    from tests.reliability.slow_evaluator import journal_lines

    journal = tmp_path / "evaluations.log"
    exits: list[float] = []

    def slow_evaluator(marker: str) -> dict:
        return {
            "evaluator": {
                "type": "tests_slow",
                "params": {"journal": str(journal), "seconds": 8},
            }
        }

    async def fault() -> None:
        def scoring() -> int:
            events = journal_lines(journal)
            return sum(
                events.count(("start", sid)) > events.count(("done", sid)) for _, sid in set(events)
            )

        # sessions end staggered on a loaded machine: one evaluation in flight is the case
        await poll(lambda: scoring() >= 1, 180, "an evaluation in progress")
        exits.append(await sigterm_and_wait(rig.stack.workers["eval"], DEFAULT_GRACE_S))
        rig.stack.start_worker("eval")

    group = await run_batch_with_fault(
        rig, "drain-eval", fault, overrides=slow_evaluator, scenario="SIGTERM evaluator (drain)"
    )
    events = journal_lines(journal)
    for s in group.sessions:
        assert s.status == SessionStatus.COMPLETED and s.reward == 1.0, s
        # finished during the drain: never started again
        assert events.count(("start", s.session_id)) == 1, (s.session_id, events)
        assert events.count(("done", s.session_id)) == 1, (s.session_id, events)
    reliability.record("SIGTERM evaluator: exit", exit_s=round(exits[0], 2), ok=True)


@pytest.mark.acceptance
async def test_up_stop_drains_every_fleet_mid_batch(rig: Rig):
    """``rolloutd up``'s Ctrl-C: its fleets get SIGTERM together through the function
    ``LocalStack.stop`` uses (``stop_processes``, bounded by ``drain_s``) while sessions run.
    Each drains and exits 0 with nothing SIGKILLed; once the fleets are back (the next
    ``up``), every session completes: a Ctrl-C never ends a session. Acceptance tier (a long
    drain): about 28 s here."""
    from rolloutd.processes import stop_processes

    fleets = ("workflows", "sandbox", "gateway", "eval")
    stopped: dict[str, float] = {}

    async def fault() -> None:
        procs = [rig.stack.workers[f] for f in fleets]
        t0 = time.monotonic()
        killed = await asyncio.to_thread(stop_processes, procs, rig.stack.drain_s)
        stopped["stop_s"] = time.monotonic() - t0
        assert killed == [], killed
        assert [p.returncode for p in procs] == [0] * len(procs)
        for fleet in fleets:
            rig.stack.start_worker(fleet)
        await asyncio.to_thread(rig.stack.wait_gateway)

    group = await run_batch_with_fault(
        rig, "drain-up", fault, calls_cut=True, scenario="up's Ctrl-C: SIGTERM every fleet (drain)"
    )
    assert all(s.status == SessionStatus.COMPLETED and s.reward == 1.0 for s in group.sessions)
    assert any(s.attempts for s in group.sessions)  # the running harnesses were handed back
    reliability.record(
        "up's Ctrl-C: fleets stopped",
        stop_s=round(stopped["stop_s"], 2),
        drain_s=rig.stack.drain_s,
        ok=True,
    )
