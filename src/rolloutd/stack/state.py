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

from pydantic import Field

from rolloutd.payload import Payload
from rolloutd.processes import process_start_ticks
from rolloutd.stack.engine_check import EngineKind


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


class ChildState(Payload):
    """One supervised child process."""

    name: str = Field(description="``temporal``, ``engine``, or a fleet's name")
    kind: ChildKind = Field(description="what it is")
    phase: ChildPhase = Field(
        default="starting",
        description="``starting`` (spawned, not answering yet), ``running``, ``backoff`` (exited,"
        " waiting to be started again), ``reloading`` (a deliberate engine restart), "
        "``stopped``, ``failed`` (restart limit reached)",
    )
    pid: int | None = Field(
        default=None, description="its pid (also its process group id); None when not running"
    )
    start_ticks: int | None = Field(
        default=None, description="the pid's start time in clock ticks since boot"
    )
    started_at: float | None = Field(
        default=None, description="when this incarnation started, Unix seconds"
    )
    restarts: int = Field(
        default=0,
        ge=0,
        description="unexpected exits followed by a restart, since the stack started",
    )
    last_exit_code: int | None = Field(
        default=None,
        description="exit status of the last unexpected exit (negative: killed by signal)",
    )
    last_exit_at: float | None = Field(default=None, description="when it happened, Unix seconds")
    task_queues: list[str] = Field(
        default_factory=list, description="the Temporal task queues a fleet polls"
    )
    log: str | None = Field(default=None, description="its log file")

    def alive(self) -> bool:
        """Whether the recorded pid still names this process (start time checked)."""
        return running(self.pid, self.start_ticks)


class EngineState(Payload):
    """The engine the stack runs (absent when the stack uses an engine it does not run)."""

    model: str = Field(description="catalog name")
    model_file: str = Field(description="the GGUF llama-server serves now")
    policy_version: int = Field(
        default=0, ge=0, description="version of the weights in ``model_file`` (0: the catalog's)"
    )
    url: str = Field(description="base URL")
    num_slots: int = Field(ge=1, description="concurrent sequences (llama-server ``--parallel``)")
    ctx_size: int = Field(ge=1, description="context window in tokens, shared by the slots")


class ExternalEngine(Payload):
    """An engine the stack uses but does not run (``rolloutd up --engine-url``): ``up``
    neither starts, supervises nor reloads it; the gateway sends it the sessions' model calls.

    What reaches the gateway (:meth:`env`): its URLs as the backend pool, their kind, the
    served model name (what harnesses see and the backends are asked for), the tokenizer the
    gateway renders with, and the capture mode of every session (``passthrough`` for an
    OpenAI-compatible API, which takes no token prompts; ``tokens`` for the others).
    """

    urls: list[str] = Field(min_length=1, description="base URLs; several make a pool")
    kind: EngineKind = Field(description="the server's kind (docs/backends.md)")
    model: str = Field(min_length=1, description="the name the engine serves the model under")
    tokenizer: str = Field(
        min_length=1, description="a tokenizer folder, catalog name or Hugging Face repo id"
    )
    tokenizer_revision: str | None = Field(
        default=None, description="the revision of a repo-id tokenizer"
    )
    capture_mode: Literal["tokens", "passthrough"] = Field(
        default="tokens", description="the capture mode of the sessions"
    )

    def env(self) -> dict[str, str]:
        """The fleets' ``ROLLOUTD_*`` variables for this engine (docs/settings.md)."""
        env = {
            "ROLLOUTD_BACKEND_URL": ",".join(self.urls),
            "ROLLOUTD_BACKEND_TYPE": self.kind,
            "ROLLOUTD_MODEL": self.model,
            "ROLLOUTD_TOKENIZER": self.tokenizer,
            "ROLLOUTD_CAPTURE_MODE": self.capture_mode,
        }
        if self.tokenizer_revision:
            env["ROLLOUTD_TOKENIZER_REVISION"] = self.tokenizer_revision
        return env


class StackState(Payload):
    """Everything ``rolloutd status`` shows without asking Temporal."""

    phase: StackPhase = Field(default="starting", description="the stack's phase")
    error: str | None = Field(
        default=None, description="why it failed (the restart limit), when it did"
    )
    pid: int = Field(default_factory=os.getpid, description="pid of the ``rolloutd up`` process")
    start_ticks: int | None = Field(
        default_factory=lambda: process_start_ticks(os.getpid()),
        description="its start time in clock ticks since boot",
    )
    started_at: float = Field(
        default_factory=time.time, description="when the stack started, Unix seconds"
    )
    updated_at: float = Field(
        default_factory=time.time, description="when this file was written, Unix seconds"
    )
    home: str = Field(description="the stack's state folder")
    temporal_address: str | None = Field(default=None, description="Temporal's host:port")
    ui_url: str | None = Field(default=None, description="the Temporal UI's URL")
    gateway_url: str | None = Field(default=None, description="the gateway's base URL")
    store_url: str | None = Field(default=None, description="the blob store's fsspec URL")
    backend_url: str | None = Field(default=None, description="the engine's base URL")
    supervise: bool = Field(default=True, description="whether children are restarted")
    engine: EngineState | None = Field(
        default=None, description="the stack's engine, if it runs one"
    )
    external_engine: ExternalEngine | None = Field(
        default=None, description="the engine the stack uses without running it, if any"
    )
    children: list[ChildState] = Field(default_factory=list, description="in start order")

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
