"""``LocalStack``: what ``rolloutd up`` runs on one machine, supervised.

Children, in start order: the codec server (when payloads are encrypted: ``rolloutd up``
generates a codec key as it generates the admin token, and the Temporal UI decodes through
it), the Temporal dev server (SQLite under the home, so workflows survive
its restart), llama-server (unless an external backend is given), and each fleet as its own
``rolloutd worker`` process. Each is restarted when it exits unexpectedly
(:mod:`rolloutd.stack.supervisor`); their record is the state file (:mod:`rolloutd.stack.state`).

Stopping is ordered and bounded: the fleets drain together (SIGTERM, the signal a cluster
sends: a worker stops polling and hands its running work back), then the engine, then
Temporal; last, runtimes left under the runtime root are reclaimed.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import structlog

from rolloutd import task_queues
from rolloutd.engine.control import EngineControlServer
from rolloutd.engine.models import CATALOG
from rolloutd.engine.server import LlamaServer
from rolloutd.errors import StackError
from rolloutd.processes import free_port, kill_group, spawn, stop_processes
from rolloutd.sandbox.reclaim import reclaim_orphans
from rolloutd.security.codec import generate_key, load_key_ring
from rolloutd.settings import (
    CommonSettings,
    HostSettings,
    admin_token_file,
    codec_key_file,
    codec_server_token_file,
    config_data,
    default_home,
    engine_api_key_file,
    write_secret,
)
from rolloutd.stack.processes import TemporalDevServer
from rolloutd.stack.state import (
    EngineState,
    ExternalEngine,
    StackState,
    read_state,
    write_state,
)
from rolloutd.stack.supervisor import ChildSpec, RestartPolicy, Supervisor

log = structlog.get_logger(__name__)

#: glibc malloc settings of every rolloutd process ``rolloutd up`` starts, each unless the
#: environment sets it (mallopt(3); glibc manual, "Memory Allocation Tunables"):
#: ``MALLOC_ARENA_MAX``: 2 arenas, not up to 8 per core (glibc hands a thread that finds the
#: arenas busy one of its own, and free memory stays in the arena it was freed to; the
#: Temporal SDK's core runs a thread pool beside Python); ``MALLOC_MMAP_THRESHOLD_``: 128 KiB,
#: glibc's initial value, kept fixed (by default each freed mmap'd block raises it, up to
#: 32 MiB, so later large buffers such as workflow activations and payloads are carved from the
#: heap and leave holes behind). In the first 1,250-1,300 sessions of a soak the workflows
#: fleet's malloc memory in use stayed at 30-39 MiB, while the free memory its arenas held grew
#: from 28 to 45 MiB with glibc's defaults (arenas 61 to 77 MiB), from 13 to 26 MiB with 2
#: arenas, and stayed at 4-10 MiB with both (arenas 37 to 40 MiB) (benchmarks/soak.py;
#: docs/measurements.md).
MALLOC_TUNABLES: dict[str, str] = {"MALLOC_ARENA_MAX": "2", "MALLOC_MMAP_THRESHOLD_": "131072"}


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


@dataclass
class LocalStack:
    """Everything ``rolloutd up`` runs, as supervised child processes.

    Attributes:
        home: state folder (Temporal SQLite, blob store, logs, runtimes, ``stack.json``).
        model: catalog model served by llama-server.
        fleets: which fleets run as child processes.
        engine_url: use this backend (or these, comma-separated) instead of starting
            llama-server; its kind and model are the gateway's settings (tests).
        external_engine: use this engine instead of starting llama-server (``rolloutd up
            --engine-url``): its URLs, kind, served model name, tokenizer and capture mode
            reach the fleets, and ``rolloutd status`` asks each URL whether it answers.
            Nothing supervises or reloads it (docs/own_engine.md).
        supervise: restart children that exit (off in tests that restart a fleet by hand, so
            two workers never share one host id).
        restart_policy: backoff and restart limit.
        drain_s: bound on the fleets' drain when the stack stops, s (then SIGKILL): the
            fleets' own grace (``ROLLOUTD_GRACEFUL_SHUTDOWN_S``, 25 s) plus 15 s for the
            teardown of runtimes a sandbox host still held then, and the exit
            (rolloutd.workers.drain).
        model_file: GGUF the engine serves (None: the catalog model's); see :meth:`load_model`.
        policy_version: version of the weights in ``model_file``.
        metrics_port: first of the fleets' metrics ports (docs/metrics.md): fleet i of
            :data:`rolloutd.workers.FLEETS` order serves on ``metrics_port + i``; 0: off (tests
            run several stacks on one machine).
        engine_control: the engine's control server (loopback HTTP; its URL and token go to
            the fleets as ``ROLLOUTD_ENGINE_CONTROL_URL`` / ``_TOKEN``), so that the gateway's
            ``POST /admin/engine/load`` reaches :meth:`load_model` from another process.
    """

    home: Path = field(default_factory=default_home)
    model: str = "qwen2.5-coder-0.5b"
    fleets: tuple[str, ...] = ("workflows", "sandbox", "gateway", "eval")
    engine_url: str | None = None
    external_engine: ExternalEngine | None = None
    temporal_port: int = 7233
    ui_port: int = 8233
    gateway_port: int = 8300
    engine_port: int = 8400
    engine_parallel: int = 4
    engine_ctx_size: int = 32768
    extra_env: dict[str, str] = field(default_factory=dict)
    supervise: bool = True
    restart_policy: RestartPolicy = field(default_factory=RestartPolicy)
    drain_s: float = 40.0
    model_file: Path | None = None
    policy_version: int = 0
    metrics_port: int = 0
    temporal: TemporalDevServer | None = None
    engine: LlamaServer | None = None
    engine_control: EngineControlServer | None = None
    #: the admin token ``start`` generated (None: the environment gives one)
    admin_token: str | None = None
    #: port of the codec server the stack runs for the Temporal UI (0: a free one)
    codec_port: int = 0
    #: the codec key file ``start`` generated or reused (None: the environment gives keys)
    codec_key_file: Path | None = None
    #: the codec server's URL (None: none runs: the codec is off, or
    #: ``ROLLOUTD_UI_CODEC_ENDPOINT`` names the operator's own)
    codec_url: str | None = None
    #: the Temporal UI's codec endpoint (the codec server's URL and its token), or None
    ui_codec_endpoint: str | None = None
    supervisor: Supervisor = field(init=False)
    state: StackState = field(init=False)

    def __post_init__(self) -> None:
        self.home = Path(self.home)
        if self.external_engine is not None:
            self.engine_url = ",".join(self.external_engine.urls)
        self.supervisor = Supervisor(self.restart_policy, self._write_state)
        self.supervisor.on_failure = self._stop_after_failure
        self.state = StackState(
            home=str(self.home),
            supervise=self.supervise,
            store_url=self.store_url,
            gateway_url=self.gateway_url,
            backend_url=self.engine_url,
            external_engine=self.external_engine,
        )
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()

    @property
    def logs(self) -> Path:
        """Folder of the children's logs."""
        return self.home / "logs"

    @property
    def store_url(self) -> str:
        """The blob store of the stack."""
        return str(self.home / "store")

    @property
    def runtime_root(self) -> Path:
        """Where the sandbox fleet creates runtimes."""
        return Path(self.extra_env.get("ROLLOUTD_RUNTIME_ROOT", self.home / "runtimes"))

    @property
    def gateway_url(self) -> str:
        """Base URL of the gateway."""
        return f"http://127.0.0.1:{self.gateway_port}"

    @property
    def host_id(self) -> str:
        """The host id of the fleets (their host queues), as the fleets' settings read it."""
        return self.extra_env.get("ROLLOUTD_HOST_ID") or CommonSettings().host_id

    @property
    def workers(self) -> dict[str, subprocess.Popen[bytes]]:
        """The current process of each fleet that has been started."""
        return {
            name: c.proc
            for name, c in self.supervisor.children.items()
            if c.spec.kind == "fleet" and c.proc is not None
        }

    def env(self) -> dict[str, str]:
        """Environment of the fleet processes (and the codec server): this process's, with
        the stack's settings, :data:`MALLOC_TUNABLES` where unset, then ``extra_env``."""
        env = {**MALLOC_TUNABLES, **os.environ}
        env.update(
            {
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
            }
        )
        if self.admin_token is not None:
            env["ROLLOUTD_ADMIN_TOKEN"] = self.admin_token
        if self.codec_key_file is not None:
            env["ROLLOUTD_CODEC_KEY_FILE"] = str(self.codec_key_file)
        if self.engine_control is not None:
            env["ROLLOUTD_ENGINE_CONTROL_URL"] = self.engine_control.url
            env["ROLLOUTD_ENGINE_CONTROL_TOKEN"] = self.engine_control.token
        entry = CATALOG.get(self.model)
        if self.external_engine is not None:
            env.update(self.external_engine.env())
            # a catalog model served by the user's engine keeps its catalog tool parser
            served = self.external_engine.model
            entry = next((e for e in CATALOG.values() if e.served_name == served), None)
        if entry is not None and entry.tool_parser and "ROLLOUTD_TOOL_PARSER" not in env:
            env["ROLLOUTD_TOOL_PARSER"] = entry.tool_parser
        env.update(self.extra_env)
        return env

    def fleet_queues(self, fleet: str) -> list[str]:
        """The task queues one fleet's process polls."""
        queues = [task_queues.FLEET_QUEUES[fleet]]
        if fleet in ("sandbox", "gateway"):
            queues.append(task_queues.host_queue(fleet, self.host_id))  # type: ignore[arg-type]
        return queues

    # --- children -------------------------------------------------------------------------

    def _spawn_temporal(self) -> subprocess.Popen[bytes]:
        assert self.temporal is not None
        self.temporal.process = spawn(self.temporal.command(), log_path=self.temporal.log_path)
        return self.temporal.process

    def _spawn_engine(self) -> subprocess.Popen[bytes]:
        assert self.engine is not None
        if self.model_file is not None:
            self.engine.files = dataclasses.replace(self.engine.files, gguf=self.model_file)
        self.engine.process = spawn(self.engine.command(), log_path=self.engine.log_path)
        return self.engine.process

    def metrics_ports(self) -> dict[str, int]:
        """Each fleet's metrics port (empty when :attr:`metrics_port` is 0)."""
        if not self.metrics_port:
            return {}
        order = ("workflows", "sandbox", "gateway", "eval")
        return {fleet: self.metrics_port + order.index(fleet) for fleet in self.fleets}

    def worker_env(self, fleet: str) -> dict[str, str]:
        """Environment of one fleet's process: :meth:`env`, its own metrics port, and for
        the gateway alone (the one fleet that calls it) the engine's API key."""
        env = self.env()
        # one port per process: a ROLLOUTD_METRICS_PORT inherited by all four would collide
        env["ROLLOUTD_METRICS_PORT"] = str(self.metrics_ports().get(fleet, 0))
        if fleet == "gateway" and self.engine is not None and self.engine.api_key_file:
            env["ROLLOUTD_BACKEND_API_KEY"] = self.engine.api_key_file.read_text().strip()
        return env

    def _spawn_worker(self, fleet: str) -> subprocess.Popen[bytes]:
        return spawn(
            [sys.executable, "-m", "rolloutd.cli", "worker", "--fleet", fleet],
            log_path=self.logs / f"{fleet}.log",
            env=self.worker_env(fleet),
        )

    def _spawn_codec_server(self) -> subprocess.Popen[bytes]:
        env = self.env()
        # the token stays off the command line (and out of the fleets' environment)
        env["ROLLOUTD_CODEC_SERVER_TOKEN"] = codec_server_token_file(self.home).read_text().strip()
        env["ROLLOUTD_CODEC_SERVER_ORIGINS"] = (
            f"http://127.0.0.1:{self.ui_port},http://localhost:{self.ui_port}"
        )
        return spawn(
            [
                sys.executable,
                "-m",
                "rolloutd.cli",
                "codec-server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.codec_port),
            ],
            log_path=self.logs / "codec-server.log",
            env=env,
        )

    def _add_codec_server(self) -> None:
        """With the codec on and no ``ROLLOUTD_UI_CODEC_ENDPOINT``, run ``rolloutd
        codec-server`` on loopback with a generated token (``{home}/codec_server_token``,
        0600), and point the Temporal UI at it: the UI shows decoded payloads to its user,
        while the history holds ciphertext."""
        env = self.env()
        self.ui_codec_endpoint = env.get("ROLLOUTD_UI_CODEC_ENDPOINT") or None
        keys = load_key_ring(
            env.get("ROLLOUTD_CODEC_KEYS"),
            env.get("ROLLOUTD_CODEC_KEY_FILE") or config_data().get("codec_key_file"),
        )
        if self.ui_codec_endpoint or not keys:
            return
        token_file = codec_server_token_file(self.home)
        if not token_file.is_file():
            write_secret(token_file, secrets.token_urlsafe(32))
        token = token_file.read_text().strip()
        self.codec_port = self.codec_port or free_port("127.0.0.1")
        self.codec_url = f"http://127.0.0.1:{self.codec_port}"
        self.ui_codec_endpoint = f"{self.codec_url}/{token}"
        port = self.codec_port
        self.supervisor.add(
            ChildSpec(
                "codec-server",
                "codec",
                self._spawn_codec_server,
                lambda: _port_open("127.0.0.1", port),
                self.logs / "codec-server.log",
            )
        )

    def _add_children(self) -> None:
        sup = self.supervisor
        self._add_codec_server()
        self.temporal = TemporalDevServer(
            self.home / "temporal.db",
            port=self.temporal_port,
            ui_port=self.ui_port,
            log_path=self.logs / "temporal.log",
            ui_codec_endpoint=self.ui_codec_endpoint,
            ui_env_file=self.home / "temporal_ui.yaml",
        )
        temporal = self.temporal
        sup.add(
            ChildSpec(
                "temporal",
                "temporal",
                self._spawn_temporal,
                lambda: _port_open(temporal.host, temporal.port),
                self.logs / "temporal.log",
            )
        )
        if self.engine_url is None:
            key_file = engine_api_key_file(self.home)
            if not key_file.is_file():
                write_secret(key_file, secrets.token_urlsafe(32))
            self.engine = LlamaServer(
                self.model,
                port=self.engine_port,
                parallel=self.engine_parallel,
                ctx_size=self.engine_ctx_size,
                log_path=self.logs / "engine.log",
                api_key_file=key_file,
            )
            engine = self.engine
            sup.add(
                ChildSpec(
                    "engine",
                    "engine",
                    self._spawn_engine,
                    lambda: _answers(f"{engine.url}/health"),
                    self.logs / "engine.log",
                )
            )
        for fleet in self.fleets:
            # the gateway is ready when it answers; other fleets have no port (the workers'
            # pollers show in Temporal's DescribeTaskQueue), so they count as ready at once
            ready = (
                (lambda: _answers(f"{self.gateway_url}/health"))
                if fleet == "gateway"
                else (lambda: True)
            )
            sup.add(
                ChildSpec(
                    fleet,
                    "fleet",
                    lambda f=fleet: self._spawn_worker(f),
                    ready,
                    self.logs / f"{fleet}.log",
                    self.fleet_queues(fleet),
                )
            )

    def _write_state(self) -> None:
        with self.supervisor.lock:
            st = self.state
            if self.temporal is not None:
                st.temporal_address, st.ui_url = self.temporal.address, self.temporal.ui_url
            if self.engine is not None:
                st.backend_url = self.engine.url
                st.engine = EngineState(
                    model=self.model,
                    model_file=str(self.model_file or self.engine.files.gguf),
                    policy_version=self.policy_version,
                    url=self.engine.url,
                    num_slots=self.engine_parallel,
                    ctx_size=self.engine_ctx_size,
                )
            st.children = [c.state for c in self.supervisor.children.values()]
            if self.supervisor.failure is not None:
                st.phase, st.error = "failed", self.supervisor.failure.message
            write_state(self.home, st)

    def reclaim_previous(self, timeout_s: float = 10.0) -> int:
        """Stop the children a killed ``up`` on this home left running, from its state file.

        Returns:
            The number of process groups stopped.

        Raises:
            StackError: another ``up`` is running on this home.
        """
        previous = read_state(self.home)
        if previous is None:
            return 0
        if (
            previous.alive()
            and previous.pid != os.getpid()
            and previous.phase not in ("stopped", "failed")
        ):
            raise StackError(
                f"a stack already runs on {self.home} (rolloutd up, pid "
                f"{previous.pid}); stop it first, or use another --home"
            )
        alive = [c for c in previous.children if c.alive()]
        for c in alive:
            kill_group(c.pid, signal.SIGTERM)  # type: ignore[arg-type]
        deadline = time.monotonic() + timeout_s
        while any(c.alive() for c in alive) and time.monotonic() < deadline:
            time.sleep(0.1)
        for c in alive:
            kill_group(c.pid)  # type: ignore[arg-type]
        if alive:
            log.warning(
                "stack_reclaimed", num_children=len(alive), children=[c.name for c in alive]
            )
        return len(alive)

    # --- life cycle -----------------------------------------------------------------------

    def _make_home(self) -> None:
        """The home, mode 0700 (also an older one): below it lie the store (every prompt and
        completion), the runtimes, the logs, Temporal's database and the secrets, and no
        other local user may read them (the default umask would let every user). The store
        and runtime roots the fleets make elsewhere are made 0700 too
        (:class:`rolloutd.store.BlobStore`, the sandbox fleet)."""
        self.home.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.home.chmod(0o700)
        self.logs.mkdir(mode=0o700, exist_ok=True)

    def _make_admin_token(self) -> None:
        """Without ``ROLLOUTD_ADMIN_TOKEN`` (the environment or ``extra_env``), generate the
        gateway's admin token and write it, mode 0600, where the trainer client and
        ``rolloutd rest`` find it (:func:`rolloutd.settings.find_admin_token`): weight sync and
        the backend routes work on a fresh ``up``."""
        if self.extra_env.get("ROLLOUTD_ADMIN_TOKEN") or HostSettings().admin_token:
            return
        self.admin_token = secrets.token_urlsafe(32)
        write_secret(admin_token_file(self.home), self.admin_token)

    def _make_codec_key(self) -> None:
        """Without codec keys (``ROLLOUTD_CODEC_KEYS``, ``ROLLOUTD_CODEC_KEY_FILE``: the
        environment or ``extra_env``; ``codec_key_file`` in the config file), use the stack's
        key file ``{home}/codec_keys``, generating it (mode 0600) on the first ``up``: every
        payload is encrypted by default, and a later ``up`` on this home still reads the
        histories it wrote. Processes on this machine find it as they find the admin token
        (:func:`rolloutd.security.connection.payload_codec`). ``ROLLOUTD_CODEC_KEYS=""``
        keeps the codec off."""
        env = {**os.environ, **self.extra_env}
        if (
            "ROLLOUTD_CODEC_KEYS" in env
            or "ROLLOUTD_CODEC_KEY_FILE" in env
            or "codec_key_file" in config_data()
        ):
            return
        path = codec_key_file(self.home)
        if not path.is_file():
            key_id = f"up-{time.strftime('%Y%m%d')}-{secrets.token_hex(2)}"
            write_secret(path, f"{key_id}:{generate_key()}")
        self.codec_key_file = path

    def start(self) -> LocalStack:
        """Reclaim what a killed ``up`` left, start Temporal, the engine and every fleet (each
        ready before the next), then supervise them.

        Raises:
            StackError: another stack runs on this home, or a child did not start.
        """
        self._make_home()
        self.reclaim_previous()
        self._make_admin_token()
        self._make_codec_key()
        self._add_children()
        try:
            if self.engine is not None:
                # before the fleets start: their environment carries its URL and token
                self.engine_control = EngineControlServer(self).start()
            for name in self.supervisor.children:
                self.supervisor.start(name)
            self.state.phase = "running"
            self._write_state()
            if self.supervise:
                self.supervisor.run()
        except BaseException:
            self.stop()
            raise
        log.info(
            "stack_started",
            home=str(self.home),
            supervise=self.supervise,
            children=list(self.supervisor.children),
        )
        return self

    def start_worker(self, fleet: str) -> subprocess.Popen[bytes]:
        """Start one fleet again by hand (tests that run with ``supervise=False``)."""
        child = self.supervisor.start(fleet)
        assert child.proc is not None
        return child.proc

    def wait_gateway(self, timeout_s: float = 120.0) -> None:
        """Wait until the gateway's ``/health`` answers 200.

        Raises:
            StackError: it did not within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while not _answers(f"{self.gateway_url}/health"):
            if time.monotonic() > deadline:
                raise StackError(
                    f"gateway not healthy after {timeout_s} s; see {self.logs / 'gateway.log'}"
                )
            time.sleep(0.2)

    def load_model(self, model_file: Path, policy_version: int, timeout_s: float = 120.0) -> None:
        """Serve new weights: the one control interface of the engine ("load this GGUF,
        answer when ready"). The supervisor then owns the file and version, and restarts a
        crashed engine on them; this restart is deliberate and not counted.

        Args:
            model_file: a GGUF with the catalog model's tokenizer.
            policy_version: the version of these weights (>= the current one).

        Raises:
            StackError: the stack runs no engine, or the engine did not answer in time.
        """
        if self.engine is None:
            raise StackError("this stack uses an external backend; it runs no engine")
        self.model_file, self.policy_version = Path(model_file), policy_version
        self.supervisor.reload("engine", timeout_s)
        log.info("engine_loaded", model_file=str(model_file), policy_version=policy_version)

    def serve_forever(self) -> StackError | None:
        """Run until SIGINT or SIGTERM (call from the main thread), or until the supervisor
        gives up.

        Returns:
            None after a signal; the supervisor's error when a child reached its restart limit
            (the stack has stopped then).
        """
        stop = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        while not stop.is_set() and not self.supervisor.failed.is_set():
            stop.wait(0.5)
        return self.supervisor.failure

    def _stop_after_failure(self) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop every child in order: fleets drain together (bounded by ``drain_s``), then
        the engine, then Temporal; then reclaim runtimes the fleets left. Idempotent; a
        second caller (``up``'s main thread while the supervisor stops a failed stack)
        waits until the first has finished."""
        sup = self.supervisor
        sup.stop_supervising()
        with self._stop_lock:
            if self._stopped.is_set():
                return
            self._stop_children()
            self._stopped.set()

    def _stop_children(self) -> None:
        t0 = time.monotonic()
        sup = self.supervisor
        with sup.lock:
            if self.state.phase != "failed":
                self.state.phase = "stopping"
            if sup.children:
                self._write_state()
        fleets = [c for c in sup.children.values() if c.spec.kind == "fleet"]
        killed = stop_processes([c.proc for c in fleets if c.proc], grace_s=self.drain_s)
        if self.engine_control is not None:
            self.engine_control.stop()
        if self.engine is not None and self.engine.process is not None:
            stop_processes([self.engine.process])
        if self.temporal is not None and self.temporal.process is not None:
            stop_processes([self.temporal.process])
        report = reclaim_orphans(self.runtime_root)
        with sup.lock:
            for c in sup.children.values():
                c.state.pid = c.state.start_ticks = None
                if c.state.phase != "failed":
                    c.state.phase = "stopped"
            if self.state.phase != "failed":
                self.state.phase = "stopped"
            if sup.children:
                self._write_state()
        log.info(
            "stack_stopped",
            duration_s=round(time.monotonic() - t0, 2),
            num_killed=len(killed),
            num_runtimes_reclaimed=len(report.runtime_ids),
        )

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
