"""The supervisor of ``rolloutd up`` with real child processes (no Temporal, no engine):
restart after SIGKILL with backoff, the restart limit that stops everything with an error
naming the child, children that die with the thread that created them, and ``rolloutd status``
reading the state file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from rolloutd.errors import StackError
from rolloutd.processes import process_start_ticks
from rolloutd.stack import (
    RestartPolicy,
    StackState,
    free_port,
    read_state,
    spawn,
    stop_processes,
)
from rolloutd.stack.local import LocalStack
from rolloutd.stack.state import ChildState, write_state
from rolloutd.stack.supervisor import ChildSpec, Supervisor
from tests.support.procs import processes_with

pytestmark = pytest.mark.timeout(60)


def poll(predicate, timeout_s: float, what: str):
    """Call ``predicate`` until truthy; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)
    return value


def sleeper(marker: str, log: Path, code: str = "import time; time.sleep(600)"):
    """A spawn function for a child whose command line carries ``marker``."""
    return lambda: spawn([sys.executable, "-c", code, marker], log_path=log)


def status(home: Path) -> tuple[int, str]:
    """Run ``rolloutd status --home HOME``; its exit code and output."""
    done = subprocess.run(
        [sys.executable, "-m", "rolloutd.cli", "status", "--home", str(home)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout


def stack_of(tmp_path: Path, policy: RestartPolicy) -> tuple[Supervisor, StackState]:
    state = StackState(home=str(tmp_path), phase="running")
    sup = Supervisor(policy, lambda: None, tick_s=0.05)

    def on_change() -> None:
        state.children = [c.state for c in sup.children.values()]
        if sup.failure is not None:
            state.phase, state.error = "failed", sup.failure.message
        write_state(tmp_path, state)

    sup.on_change = on_change
    return sup, state


def test_killed_child_is_restarted_and_status_shows_it(tmp_path: Path):
    marker = f"rolloutd-sup-{uuid.uuid4().hex[:8]}"
    sup, _ = stack_of(tmp_path, RestartPolicy(initial_backoff_s=0.3))
    sup.add(
        ChildSpec(
            "sandbox",
            "fleet",
            sleeper(marker, tmp_path / "sandbox.log"),
            lambda: True,
            tmp_path / "sandbox.log",
            ["rolloutd-sandbox"],
        )
    )
    first = sup.start("sandbox").state.pid
    sup.run()
    try:
        t_kill = time.monotonic()
        os.kill(first, signal.SIGKILL)
        state = poll(
            lambda: (
                (s := read_state(tmp_path))
                and s.children[0].phase == "running"
                and s.children[0].pid not in (None, first)
                and s
            ),
            10,
            "a restart",
        )
        assert time.monotonic() - t_kill >= 0.3  # the backoff was kept
        child = state.children[0]
        assert child.restarts == 1 and child.last_exit_code == -signal.SIGKILL
        assert processes_with(marker) == [child.pid]  # one process, never two
        code, out = status(tmp_path)
        assert code == 0, out
        row = next(line for line in out.splitlines() if line.startswith("sandbox"))
        assert row.split()[:5] == ["sandbox", "running", str(child.pid), row.split()[3], "1"]
        assert "rolloutd-sandbox" in row
    finally:
        sup.stop_supervising()
        stop_processes([c.proc for c in sup.children.values() if c.proc])
    assert processes_with(marker) == []


def test_restart_limit_stops_with_an_error_naming_the_child(tmp_path: Path):
    marker = f"rolloutd-sup-{uuid.uuid4().hex[:8]}"
    policy = RestartPolicy(initial_backoff_s=0.05, max_backoff_s=0.2, max_restarts=3, window_s=60)
    sup, _ = stack_of(tmp_path, policy)
    stopped = threading.Event()
    sup.on_failure = stopped.set
    sup.add(
        ChildSpec(
            "steady",
            "fleet",
            sleeper(marker, tmp_path / "steady.log"),
            lambda: True,
            tmp_path / "steady.log",
        )
    )
    sup.add(
        ChildSpec(
            "eval",
            "fleet",
            sleeper(
                marker, tmp_path / "eval.log", "import time; time.sleep(0.3); raise SystemExit(3)"
            ),
            lambda: True,
            tmp_path / "eval.log",
        )
    )
    sup.start("steady")
    sup.start("eval")
    sup.run()
    try:
        poll(stopped.is_set, 20, "the supervisor to give up")
        assert sup.failure is not None
        assert "eval exited 4 times" in sup.failure.message
        assert "exit code 3" in sup.failure.message and "eval.log" in sup.failure.message
        state = read_state(tmp_path)
        assert state is not None and state.phase == "failed" and "eval" in (state.error or "")
        assert [c.restarts for c in state.children] == [0, 3]
        assert status(tmp_path)[0] == 1
    finally:
        sup.stop_supervising()
        stop_processes([c.proc for c in sup.children.values() if c.proc])
    assert processes_with(marker) == []


def test_children_die_with_the_thread_that_created_them(tmp_path: Path):
    marker = f"rolloutd-sup-{uuid.uuid4().hex[:8]}"
    procs = []
    thread = threading.Thread(target=lambda: procs.append(sleeper(marker, tmp_path / "l")()))
    thread.start()
    thread.join()
    pid = procs[0].pid
    poll(lambda: procs[0].poll() is not None, 10, "the orphan to get SIGTERM")
    assert procs[0].returncode == -signal.SIGTERM
    assert process_start_ticks(pid) is None and processes_with(marker) == []


def test_status_without_a_stack(tmp_path: Path):
    code, out = status(tmp_path)
    assert code == 2 and "no stack has run" in out


def test_next_up_reclaims_what_a_killed_up_left_and_refuses_a_live_one(tmp_path: Path):
    marker = f"rolloutd-sup-{uuid.uuid4().hex[:8]}"
    orphan = spawn(
        [sys.executable, "-c", "import time; time.sleep(600)", marker], die_with_parent=False
    )
    fake_up = spawn([sys.executable, "-c", "import time; time.sleep(600)", marker])
    try:
        record = ChildState(
            name="sandbox",
            kind="fleet",
            phase="running",
            pid=orphan.pid,
            start_ticks=process_start_ticks(orphan.pid),
        )
        # a live up on this home: refused, and its children are left alone
        write_state(
            tmp_path,
            StackState(
                home=str(tmp_path),
                phase="running",
                pid=fake_up.pid,
                start_ticks=process_start_ticks(fake_up.pid),
                children=[record],
            ),
        )
        with pytest.raises(StackError, match=f"already runs on .*pid {fake_up.pid}"):
            LocalStack(home=tmp_path).reclaim_previous()
        assert orphan.poll() is None
        # that up killed (SIGKILL: nothing ran its cleanup): its child is stopped by its pid
        os.kill(fake_up.pid, signal.SIGKILL)
        fake_up.wait()
        assert LocalStack(home=tmp_path).reclaim_previous() == 1
        assert orphan.wait(timeout=10) == -signal.SIGTERM
    finally:
        stop_processes([orphan, fake_up])
    assert processes_with(marker) == []


def test_a_reload_is_not_a_crash_and_a_crash_restarts_on_the_current_settings(tmp_path: Path):
    marker = f"rolloutd-sup-{uuid.uuid4().hex[:8]}"
    v0, v1 = f"{marker}-v0.gguf", f"{marker}-v1.gguf"
    current = {"model_file": v0}  # what LocalStack.load_model changes

    def spawn_engine():
        return spawn(
            [sys.executable, "-c", "import time; time.sleep(600)", current["model_file"]],
            log_path=tmp_path / "engine.log",
        )

    sup, _ = stack_of(tmp_path, RestartPolicy(initial_backoff_s=0.1))
    sup.add(ChildSpec("engine", "engine", spawn_engine, lambda: True, tmp_path / "engine.log"))
    sup.start("engine")
    sup.run()
    try:
        current["model_file"] = v1
        sup.reload("engine", timeout_s=10)
        reloaded = read_state(tmp_path).children[0]  # type: ignore[union-attr]
        assert reloaded.phase == "running" and reloaded.restarts == 0
        assert processes_with(v1) == [reloaded.pid] and processes_with(v0) == []
        os.kill(reloaded.pid, signal.SIGKILL)  # type: ignore[arg-type]
        state = poll(
            lambda: (
                (s := read_state(tmp_path))
                and s.children[0].restarts == 1
                and s.children[0].phase == "running"
                and s
            ),
            10,
            "the crash restart",
        )
        assert processes_with(v1) == [state.children[0].pid]
    finally:
        sup.stop_supervising()
        stop_processes([c.proc for c in sup.children.values() if c.proc])
    assert processes_with(marker) == []


@pytest.mark.temporal
def test_a_stack_past_its_restart_limit_is_stopped_completely_once(tmp_path: Path):
    """Temporal SIGKILLed twice with one restart allowed: the supervisor stops the stack from
    its thread while ``up``'s main thread stops it too; the main thread's stop returns only
    when the fleet is gone and the state file says so."""
    stack = LocalStack(
        home=tmp_path,
        fleets=("eval",),
        engine_url="http://127.0.0.1:9",
        temporal_port=free_port(),
        ui_port=free_port(),
        drain_s=10,
        restart_policy=RestartPolicy(initial_backoff_s=0.1, max_restarts=1),
    )
    stack.start()
    try:
        pid = None
        for _ in range(2):
            pid = poll(
                lambda p=pid: (
                    (c := stack.supervisor.children["temporal"].state).phase == "running"
                    and c.pid not in (None, p)
                    and c.pid
                ),
                30,
                "Temporal up",
            )
            os.kill(pid, signal.SIGKILL)
        poll(stack.supervisor.failed.is_set, 30, "the restart limit")
    finally:
        stack.stop()
    eval_proc = stack.supervisor.children["eval"].proc
    assert eval_proc is not None and eval_proc.poll() is not None
    state = read_state(tmp_path)
    assert state is not None and state.phase == "failed"
    assert "temporal exited 2 times" in (state.error or "")
    assert [(c.name, c.phase, c.pid) for c in state.children] == [
        ("temporal", "failed", None),
        ("eval", "stopped", None),
    ]
