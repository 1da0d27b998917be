"""The state file of a running ``rolloutd up``: ``{home}/stack.json``.

The supervisor rewrites it on every change (a child started, ready, exited, restarted; the
engine reloaded; the stack stopping); ``rolloutd status`` reads it, and the next ``up`` on the
same home reclaims the children a killed ``up`` left running from it. Pids are recorded with
their start time (proc(5) stat field 22) so a recycled pid is never taken for a child.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from rolloutd.processes import process_start_ticks


def running(pid: int | None, start_ticks: int | None) -> bool:
    """Whether ``pid`` is still the process that started at ``start_ticks`` and has not exited
    (a zombie, exited but not yet reaped by its parent, is not running; proc(5) stat field 3).
    """
    if pid is None or start_ticks is None or process_start_ticks(pid) != start_ticks:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2 :].split()[0] != "Z"


#: the state file's name under the stack's home.
STATE_FILE = "stack.json"

ChildKind = Literal["temporal", "engine", "fleet", "codec"]
ChildPhase = Literal["starting", "running", "backoff", "reloading", "stopped", "failed"]
StackPhase = Literal["starting", "running", "stopping", "stopped", "failed"]


class ChildState(BaseModel):
    """One supervised child process.

    Attributes:
        name: ``temporal``, ``engine``, or a fleet's name.
        kind: what it is.
        phase: ``starting`` (spawned, not answering yet), ``running``, ``backoff`` (exited,
            waiting to be started again), ``reloading`` (a deliberate engine restart),
            ``stopped``, ``failed`` (restart limit reached).
        pid: its pid (also its process group id); None when not running.
        start_ticks: the pid's start time in clock ticks since boot.
        started_at: when this incarnation started, Unix seconds.
        restarts: unexpected exits followed by a restart, since the stack started.
        last_exit_code: exit status of the last unexpected exit (negative: killed by signal).
        last_exit_at: when it happened, Unix seconds.
        task_queues: the Temporal task queues a fleet polls.
        log: its log file.
    """

    name: str
    kind: ChildKind
    phase: ChildPhase = "starting"
    pid: int | None = None
    start_ticks: int | None = None
    started_at: float | None = None
    restarts: int = Field(default=0, ge=0)
    last_exit_code: int | None = None
    last_exit_at: float | None = None
    task_queues: list[str] = Field(default_factory=list)
    log: str | None = None

    def alive(self) -> bool:
        """Whether the recorded pid still names this process (start time checked)."""
        return running(self.pid, self.start_ticks)


class EngineState(BaseModel):
    """The engine the stack runs (absent when the stack uses an external backend).

    Attributes:
        model: catalog name.
        model_file: the GGUF llama-server serves now.
        policy_version: version of the weights in ``model_file`` (0: the catalog's).
        url: base URL.
        num_slots: concurrent sequences (llama-server ``--parallel``).
        ctx_size: context window in tokens, shared by the slots.
    """

    model: str
    model_file: str
    policy_version: int = Field(default=0, ge=0)
    url: str
    num_slots: int = Field(ge=1)
    ctx_size: int = Field(ge=1)


class StackState(BaseModel):
    """Everything ``rolloutd status`` shows without asking Temporal.

    Attributes:
        phase: the stack's phase.
        error: why it failed (the restart limit), when it did.
        pid, start_ticks: the ``rolloutd up`` process.
        started_at: when the stack started, Unix seconds.
        updated_at: when this file was written, Unix seconds.
        home, temporal_address, ui_url, gateway_url, store_url, backend_url: where things are.
        supervise: whether children are restarted.
        engine: the stack's engine, if it runs one.
        children: in start order.
    """

    phase: StackPhase = "starting"
    error: str | None = None
    pid: int = Field(default_factory=os.getpid)
    start_ticks: int | None = Field(default_factory=lambda: process_start_ticks(os.getpid()))
    started_at: float = Field(default_factory=time.time)
    updated_at: float = Field(default_factory=time.time)
    home: str
    temporal_address: str | None = None
    ui_url: str | None = None
    gateway_url: str | None = None
    store_url: str | None = None
    backend_url: str | None = None
    supervise: bool = True
    engine: EngineState | None = None
    children: list[ChildState] = Field(default_factory=list)

    def alive(self) -> bool:
        """Whether the ``up`` process that wrote this is still running."""
        return running(self.pid, self.start_ticks)


def state_path(home: Path) -> Path:
    """Where the state file of the stack on ``home`` lives."""
    return Path(home) / STATE_FILE


def read_state(home: Path) -> StackState | None:
    """The state file of the stack on ``home``; None when there is none."""
    path = state_path(home)
    try:
        return StackState.model_validate_json(path.read_text())
    except FileNotFoundError:
        return None


def write_state(home: Path, state: StackState) -> None:
    """Write the state file atomically (a reader never sees half a file)."""
    state.updated_at = time.time()
    path = state_path(home)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(state.model_dump_json(indent=2))
    os.replace(tmp, path)
