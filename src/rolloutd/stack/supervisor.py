"""Supervision of the embedded stack's children: a child that exits unexpectedly is started
again after a backoff, and one that keeps exiting stops the stack with an error that names it.

The policy is Erlang/OTP's supervisor restart intensity (at most ``max_restarts`` restarts in
``window_s`` seconds, else the supervisor gives up) with systemd's capped exponential delay
between restarts (``RestartSec``, ``RestartSteps``/``RestartMaxDelaySec``). A deliberate
restart (an engine loading new weights) is not an exit: it is never counted.

All children are created by one thread per phase of life: the caller's thread while the stack
starts, the supervisor's thread afterwards. Children die with the thread that created them
(``PR_SET_PDEATHSIG``), so both threads live as long as the stack.
"""

from __future__ import annotations

import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from pydantic import BaseModel, Field

from rolloutd.backoff import Backoff
from rolloutd.errors import StackError
from rolloutd.processes import kill_group, process_start_ticks, stop_processes
from rolloutd.stack.state import ChildKind, ChildState

log = structlog.get_logger(__name__)


class RestartPolicy(BaseModel):
    """How the supervisor restarts a child that exited unexpectedly.

    The n-th consecutive restart waits ``min(max_backoff_s, initial_backoff_s * 2**(n-1))``;
    a child that ran ``stable_s`` before it exited starts the sequence over. More than
    ``max_restarts`` exits of one child within ``window_s`` stop the stack.
    """

    initial_backoff_s: float = Field(
        default=1.0, gt=0, le=60, description="delay before the first restart, s"
    )
    max_backoff_s: float = Field(default=30.0, gt=0, le=600, description="cap of the delay, s")
    max_restarts: int = Field(
        default=5, ge=0, le=1000, description="restarts of one child allowed within window_s"
    )
    window_s: float = Field(default=300.0, gt=0, description="restart-limit window, s")
    stable_s: float = Field(
        default=60.0, gt=0, description="uptime after which the backoff starts over, s"
    )
    ready_timeout_s: float = Field(
        default=180.0, gt=0, description="a started child not ready by then has failed, s"
    )

    def backoff_s(self, num_consecutive: int) -> float:
        """Delay before restart number ``num_consecutive`` (1-based) of a run of exits."""
        backoff = Backoff(initial_s=self.initial_backoff_s, max_s=self.max_backoff_s)
        return backoff.delay_s(num_consecutive)


@dataclass
class ChildSpec:
    """How to run one child.

    Attributes:
        name: unique in the stack (``temporal``, ``engine``, a fleet).
        kind: what it is.
        spawn: starts it and returns the process (started in its own session); called again
            on every restart, so it reads the current settings (the engine's model file).
        ready: one quick, non-blocking check that it answers (a port, ``/health``).
        log_path: where its output goes.
        task_queues: the Temporal task queues it polls (fleets).
    """

    name: str
    kind: ChildKind
    spawn: Callable[[], subprocess.Popen[bytes]]
    ready: Callable[[], bool]
    log_path: Path
    task_queues: list[str] = field(default_factory=list)


@dataclass
class Child:
    """A supervised child: its spec, its current process and its record."""

    spec: ChildSpec
    state: ChildState
    proc: subprocess.Popen[bytes] | None = None
    started_mono: float = 0.0
    ready_deadline: float = 0.0
    next_start_at: float = 0.0
    #: exit times (monotonic) within the restart window
    exits: deque[float] = field(default_factory=deque)
    num_consecutive: int = 0
    reload_requested: bool = False


class Supervisor:
    """Watches the children and restarts those that exit, from its own thread.

    Args:
        policy: the restart policy.
        on_change: called (under the supervisor's lock) whenever a child's record changes;
            the stack writes its state file there.
        tick_s: how often the children are checked, s.
    """

    def __init__(
        self, policy: RestartPolicy, on_change: Callable[[], None], tick_s: float = 0.2
    ) -> None:
        self.policy = policy
        self.on_change = on_change
        self.tick_s = tick_s
        self.children: dict[str, Child] = {}
        self.failure: StackError | None = None
        self.failed = threading.Event()
        self.on_failure: Callable[[], None] | None = None
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def lock(self) -> threading.RLock:
        """Held while the children's records change."""
        return self._lock

    def add(self, spec: ChildSpec) -> Child:
        """Register a child (not started)."""
        child = Child(
            spec=spec,
            state=ChildState(
                name=spec.name,
                kind=spec.kind,
                phase="stopped",
                task_queues=spec.task_queues,
                log=str(spec.log_path),
            ),
        )
        self.children[spec.name] = child
        return child

    def _spawn(self, child: Child, *, restart: bool) -> None:
        proc = child.spec.spawn()
        now = time.monotonic()
        child.proc, child.started_mono = proc, now
        child.ready_deadline = now + self.policy.ready_timeout_s
        st = child.state
        st.pid, st.start_ticks, st.started_at = proc.pid, process_start_ticks(proc.pid), time.time()
        st.phase = "starting"
        if restart:
            st.restarts += 1
            log.warning("child_restarted", child=st.name, pid=proc.pid, num_restarts=st.restarts)
        self._notify()

    def start(self, name: str, timeout_s: float | None = None) -> Child:
        """Start a child now and wait until it is ready (the stack's start-up, or a restart by
        hand when supervision is off).

        Raises:
            StackError: it exited, or was not ready within ``timeout_s`` (default: the
                policy's ``ready_timeout_s``).
        """
        child = self.children[name]
        with self._lock:
            if child.proc is not None and child.proc.poll() is None:
                raise StackError(f"{name} is already running as pid {child.proc.pid}")
            self._spawn(child, restart=child.state.started_at is not None)
        assert child.proc is not None
        deadline = time.monotonic() + (timeout_s or self.policy.ready_timeout_s)
        while True:
            if (code := child.proc.poll()) is not None:
                with self._lock:
                    child.state.phase, child.state.last_exit_code = "failed", code
                    self._notify()
                raise StackError(
                    f"{name} exited with {code} while starting; see {child.spec.log_path}"
                )
            if child.spec.ready():
                with self._lock:
                    child.state.phase = "running"
                    self._notify()
                log.info(
                    "child_ready",
                    child=name,
                    pid=child.proc.pid,
                    duration_s=round(time.monotonic() - child.started_mono, 2),
                )
                return child
            if time.monotonic() > deadline:
                raise StackError(f"{name} not ready after {timeout_s} s; see {child.spec.log_path}")
            time.sleep(0.1)

    def run(self) -> None:
        """Start supervising, in a daemon thread, until :meth:`stop_supervising`."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="rolloutd-supervisor", daemon=True)
        self._thread.start()

    @property
    def running(self) -> bool:
        """Whether the supervisor's thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def stop_supervising(self) -> None:
        """Stop watching (children keep running); waits for the thread unless called from it."""
        self._stop.set()
        if self._thread is not None and threading.current_thread() is not self._thread:
            self._thread.join()

    def reload(self, name: str, timeout_s: float | None = None) -> None:
        """Restart a child on purpose (the engine on new weights): stop it, start it again
        with its spec's current settings, wait until it is ready. Not counted as a restart.

        Raises:
            StackError: it did not come back within ``timeout_s``, or the stack failed.
        """
        child = self.children[name]
        if not self.running:
            with self._lock:
                child.state.phase = "reloading"
                self._notify()
            if child.proc is not None:
                stop_processes([child.proc])
            self.start(name, timeout_s)
            return
        deadline = time.monotonic() + (timeout_s or self.policy.ready_timeout_s)
        with self._changed:
            child.reload_requested = True
            ok = self._changed.wait_for(
                lambda: (
                    self.failure is not None
                    or (not child.reload_requested and child.state.phase == "running")
                ),
                timeout=max(0.0, deadline - time.monotonic()),
            )
        if self.failure is not None:
            raise self.failure
        if not ok:
            raise StackError(
                f"{name} not ready {timeout_s} s after a reload; see {child.spec.log_path}"
            )

    def _notify(self) -> None:
        try:
            self.on_change()
        except OSError as e:  # the state file is a report: never let it stop supervision
            log.error("stack_state_unwritable", error=str(e))
        self._changed.notify_all()

    def _loop(self) -> None:
        while not self._stop.wait(self.tick_s):
            with self._lock:
                for child in self.children.values():
                    self._check(child, time.monotonic())
                    if self.failure is not None:
                        break
            if self.failure is not None:
                break
        if self.failure is not None and self.on_failure is not None:
            self.on_failure()

    def _check(self, child: Child, now: float) -> None:
        st = child.state
        if child.reload_requested:
            st.phase = "reloading"
            if child.proc is not None:
                stop_processes([child.proc])
            log.info("child_reloading", child=st.name)
            self._spawn(child, restart=False)
            child.reload_requested = False
            return
        if st.phase in ("starting", "running") and child.proc is not None:
            if (code := child.proc.poll()) is not None:
                self._exited(child, code, now)
            elif st.phase == "starting":
                if child.spec.ready():
                    st.phase = "running"
                    log.info(
                        "child_ready",
                        child=st.name,
                        pid=child.proc.pid,
                        duration_s=round(now - child.started_mono, 2),
                    )
                    self._notify()
                elif now > child.ready_deadline:
                    log.error(
                        "child_not_ready",
                        child=st.name,
                        pid=child.proc.pid,
                        timeout_s=self.policy.ready_timeout_s,
                    )
                    kill_group(child.proc.pid)
                    self._exited(child, child.proc.wait(), now)
        elif st.phase == "backoff" and now >= child.next_start_at:
            self._spawn(child, restart=True)

    def _exited(self, child: Child, code: int, now: float) -> None:
        st, p = child.state, self.policy
        assert child.proc is not None
        kill_group(child.proc.pid)  # what the child left in its group goes with it
        uptime_s = now - child.started_mono
        st.pid = st.start_ticks = None
        st.last_exit_code, st.last_exit_at = code, time.time()
        child.exits.append(now)
        while child.exits and child.exits[0] < now - p.window_s:
            child.exits.popleft()
        child.num_consecutive = 1 if uptime_s >= p.stable_s else child.num_consecutive + 1
        if len(child.exits) > p.max_restarts:
            st.phase = "failed"
            self.failure = StackError(
                f"{st.name} exited {len(child.exits)} times within {p.window_s:.0f} s (last "
                f"exit code {code}), more than the {p.max_restarts} restarts allowed: the stack "
                f"stops; see {child.spec.log_path}"
            )
            log.error(
                "child_restart_limit",
                child=st.name,
                exit_code=code,
                num_exits=len(child.exits),
                window_s=p.window_s,
                log=st.log,
            )
            self.failed.set()
            self._notify()
            return
        delay_s = p.backoff_s(child.num_consecutive)
        st.phase, child.next_start_at = "backoff", now + delay_s
        log.warning(
            "child_exited",
            child=st.name,
            exit_code=code,
            uptime_s=round(uptime_s, 1),
            restart_in_s=delay_s,
            num_exits_in_window=len(child.exits),
        )
        self._notify()
