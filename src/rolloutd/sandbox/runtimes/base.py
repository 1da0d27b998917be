"""The runtime contract: start, exec, spawn, upload, download, cancel, stop.

Long on purpose: the contract and the parts every runtime shares (folders, environments,
process groups, path checks, the policy check) are read together by each runtime's author.

A runtime owns one folder on the host, ``{root}/{runtime_id}``::

    workspace/   the agent's working folder, seen inside the runtime at :attr:`Runtime.workdir`
    home/        a private HOME, seen inside at :attr:`Runtime.home` (harness configs live here)
    logs/        stdout/stderr files of spawned processes (never visible inside)

Every process it starts leads its own process group and is tracked, so :meth:`Runtime.cancel`
and :meth:`Runtime.stop` reach all of them: SIGTERM, a grace period, then SIGKILL to each group.
Environments are never inherited from the worker: each command gets the runtime's base
environment (PATH, HOME, LANG, ...), then ``spec.env``, then the call's ``env``.

Prepare steps (``RuntimeSpec.prepare``) run at the end of :meth:`Runtime.start`, in order,
before any harness (:mod:`rolloutd.sandbox.runtimes.prepare`).

Policy: a runtime created with the sandbox fleet's :class:`~rolloutd.sandbox_policy.SandboxPolicy`
checks its spec against it when it starts (host paths resolved, symlinks followed) and each
upload's source again right before reading it; outside the policy it raises
:class:`~rolloutd.errors.PolicyError` and starts nothing. Without a policy (tests, benchmarks:
a trusted caller) nothing is checked.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import os
import posixpath
import re
import shutil
import time
from pathlib import Path, PurePosixPath
from typing import ClassVar, Literal

import structlog
from pydantic import BaseModel, Field

from rolloutd.errors import ConfigError, PolicyError, RolloutdError
from rolloutd.sandbox.runtimes import beneath
from rolloutd.sandbox.runtimes.prepare import run_prepare
from rolloutd.sandbox.runtimes.process import BoundedOutput, RuntimeProcess, drain
from rolloutd.sandbox_policy import SandboxPolicy, check_message, violations
from rolloutd.types import RuntimeSpec

log = structlog.get_logger(__name__)

#: runtime ids become folder names: letters, digits, '.', '_' and '-' only.
RUNTIME_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")

#: bytes of stdout and of stderr :meth:`Runtime.exec` keeps per stream (head and tail halves).
DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024

#: bytes :meth:`Runtime.download` reads of one file unless told otherwise.
DEFAULT_MAX_DOWNLOAD_BYTES = 16 * 2**20

#: seconds left to read pipes after an exec'd command exited (a background child may hold them).
PIPE_DRAIN_S = 1.0

Command = str | list[str]


class LaunchError(RolloutdError):
    """A command could not be started at all (no such program or working folder)."""


class ExecResult(BaseModel):
    """The result of :meth:`Runtime.exec`.

    Attributes:
        exit_code: exit status; negative when a signal killed the command (-9: SIGKILL).
        stdout, stderr: decoded output (UTF-8, invalid bytes replaced), at most
            ``max_output_bytes`` each: the head and tail halves with a marker in between.
        truncated: whether stdout or stderr lost bytes.
        timed_out: whether the command was killed because ``timeout_s`` passed.
        oom_killed: whether the kernel's OOM killer killed a process of the runtime while the
            command ran (its memory limit was reached: ``spec.memory_mb`` as a memory cgroup);
            with concurrent commands it may have been another one's process.
        duration_s: wall-clock seconds from launch to exit.
    """

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    truncated: bool = False
    timed_out: bool = False
    oom_killed: bool = False
    duration_s: float = Field(default=0.0, ge=0)


class Runtime(abc.ABC):
    """An environment a harness runs in.

    Args:
        spec: the task's runtime spec.
        runtime_id: unique on this host; a folder name (see :data:`RUNTIME_ID_PATTERN`).
        root: host folder holding the runtimes' folders (``SandboxSettings.runtime_root``).
        grace_s: seconds between SIGTERM and SIGKILL when processes are terminated.
        policy: the sandbox fleet's policy, checked at :meth:`start` (None: not checked).

    Attributes:
        runtime_id, spec, policy: as given.
        runtime_dir: ``{root}/{runtime_id}`` on the host.
        workspace: the host path of the workspace.
        workdir: the workspace's path as seen by processes inside the runtime.
        home: HOME as seen inside the runtime; its host path is :attr:`host_home`.

    Raises:
        ConfigError: ``runtime_id`` is not a safe folder name.
    """

    type: ClassVar[str] = "abstract"
    #: whether SIGTERM must spare the group leader (bwrap's outer process: see process.py).
    spare_leader_on_term: ClassVar[bool] = False

    def __init__(
        self,
        spec: RuntimeSpec,
        runtime_id: str,
        root: Path,
        *,
        grace_s: float = 5.0,
        policy: SandboxPolicy | None = None,
    ) -> None:
        if not RUNTIME_ID_PATTERN.match(runtime_id):
            raise ConfigError(
                f"runtime_id {runtime_id!r} must be 1-200 letters, digits, '.', '_' or '-' "
                "(replace '/' in session ids)"
            )
        self.spec = spec
        self.policy = policy
        self.runtime_id = runtime_id
        self.runtime_dir = Path(root).expanduser().absolute() / runtime_id
        self.workspace = self.runtime_dir / "workspace"
        self.host_home = self.runtime_dir / "home"
        self.logs_dir = self.runtime_dir / "logs"
        self.grace_s = grace_s
        self.workdir: str = str(self.workspace)
        self.home: str = str(self.host_home)
        self.state: Literal["new", "started", "stopped"] = "new"
        self._processes: list[RuntimeProcess] = []
        self._num_spawned = 0
        self._num_oom_kills_seen = 0

    # -- to implement -------------------------------------------------------------------
    def _wrap(self, argv: list[str], cwd: str) -> tuple[list[str], Path | None]:
        """Turn a command as run inside the runtime into the host command line that
        :meth:`_start_process` launches; by default the command itself in the host folder
        ``cwd``. Runtimes that start commands another way (an exec server inside the
        enclosure) override :meth:`_start_process` and never call this.

        Args:
            argv: the command inside the runtime.
            cwd: the working folder inside the runtime (absolute).

        Returns:
            (host argv, host cwd or None).
        """
        return argv, Path(cwd)

    @abc.abstractmethod
    def _base_env(self) -> dict[str, str]:
        """The environment every command starts from (PATH, HOME, LANG, ...)."""

    async def _check(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Check the runtime works after its folders exist; raise :class:`RuntimeStartError`."""

    async def _cleanup(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release what :meth:`_check` set up (after every process is gone, before rmtree)."""

    async def _make_runtime_dir(self) -> None:  # noqa: B027 - optional hook
        """Prepare :attr:`runtime_dir` before its folders are made (a sized disk mounted
        there); by default nothing: the folders are made below a plain folder."""

    async def _release_runtime_dir(self) -> None:  # noqa: B027 - optional hook
        """Undo :meth:`_make_runtime_dir` (after :meth:`_cleanup`, before rmtree); idempotent."""

    def ceilings_reached(self) -> dict[str, str]:
        """The runtime's resource ceilings its processes reached so far: limit name
        (``max_processes``, ``memory_mb``, ``disk_mb``, ``tmpfs_mb``) -> what happened, naming
        the limit. Cheap (a few small reads): the harness's watch calls it every heartbeat.
        Empty by default (a runtime that cannot tell)."""
        return {}

    def _host_env(
        self, argv: list[str], env: dict[str, str], host_argv: list[str]
    ) -> dict[str, str]:
        """The environment of the host command (default: the command's own environment).

        Container runtimes pass it on through their CLI: they may edit ``host_argv`` in place
        (``docker exec -e NAME``) and return what the CLI process needs.
        """
        return env

    def _pass_fds(self) -> tuple[int, ...]:
        """File descriptors every launched host command inherits (e.g. a namespace fd)."""
        return ()

    def _oom_kills(self) -> int:
        """Processes of the runtime the kernel's OOM killer killed so far (0: not tracked)."""
        return 0

    @property
    def num_oom_kills(self) -> int:
        """Processes of the runtime killed for exceeding its memory limit so far (the memory
        cgroup's count; 0 where a runtime cannot tell)."""
        return self._oom_kills()

    async def connect_gateway(self, *urls: str) -> list[str]:
        """Make a session's gateway reachable from inside; return the URLs to use inside.

        Args:
            urls: the session's base URLs (same gateway origin and session prefix).

        Returns:
            list[str], same length: the URLs a harness inside the runtime must use. The
            default (``host`` or ``none`` network) returns them unchanged.
        """
        return list(urls)

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Create the runtime's folders, write ``spec.files``, run ``spec.prepare`` steps.

        A folder left by an earlier attempt with the same id is removed first, so a retried
        provisioning starts fresh. Calling ``start`` twice on one object does nothing.

        Raises:
            RuntimeStartError: the runtime cannot run commands (retryable).
            ConfigError: the spec asks for something this runtime cannot do.
            PolicyError: the spec is outside :attr:`policy` (nothing was started).
        """
        if self.state == "started":
            return
        if self.state == "stopped":
            raise RolloutdError(f"runtime {self.runtime_id} was stopped; create a new one")
        if self.policy is not None:
            found = await asyncio.to_thread(violations, self.spec, self.policy, resolve=True)
            if found:
                raise PolicyError(f"runtime {self.runtime_id}: {check_message(found)}")
        began = time.monotonic()
        if self.runtime_dir.exists():
            shutil.rmtree(self.runtime_dir)
        try:
            await self._make_runtime_dir()
        except BaseException:
            await self._release_runtime_dir()
            raise
        for folder in (self.workspace, self.host_home, self.logs_dir):
            folder.mkdir(parents=True)
        for path, text in self.spec.files.items():
            root, parts = self._locate(path)
            beneath.write_file(root, parts, text.encode("utf-8"), label=path)
        self.state = "started"
        try:
            await self._check()
            if self.spec.prepare:
                await run_prepare(self, self.spec.prepare)
        except BaseException:
            await self.stop()
            raise
        log.info(
            "runtime_started",
            runtime=self.type,
            runtime_id=self.runtime_id,
            num_files=len(self.spec.files),
            duration_s=round(time.monotonic() - began, 3),
        )

    async def cancel(self) -> None:
        """Terminate every process of the runtime (SIGTERM, grace, SIGKILL); keep its files.

        The runtime stays usable: artifacts can still be downloaded and commands run.
        """
        live = [p for p in self._processes if p.alive()]
        if live:
            await asyncio.gather(*(p.terminate() for p in live))
        self._processes = [p for p in self._processes if p.alive()]

    async def stop(self) -> None:
        """Terminate every process of the runtime, then remove its folder. Idempotent."""
        if self.state == "stopped":
            return
        began = time.monotonic()
        await self.cancel()
        self.state = "stopped"
        try:
            await self._cleanup()
        finally:
            try:
                await self._release_runtime_dir()
            finally:
                shutil.rmtree(self.runtime_dir, ignore_errors=True)
        log.info(
            "runtime_stopped",
            runtime=self.type,
            runtime_id=self.runtime_id,
            duration_s=round(time.monotonic() - began, 3),
        )

    # -- commands -----------------------------------------------------------------------
    async def exec(
        self,
        command: Command,
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        timeout_s: float | None = None,
        stdin: bytes | None = None,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> ExecResult:
        """Run a command to completion and capture its output.

        Args:
            command: argv, or a string run by ``/bin/sh -c``.
            env: variables added on top of the base environment and ``spec.env``.
            cwd: working folder inside the runtime; relative to :attr:`workdir`; default workdir.
            timeout_s: seconds before the command's process group is killed; None:
                ``spec.wall_time_s`` (None there too: no limit).
            stdin: bytes fed to standard input (then closed); None: /dev/null.
            max_output_bytes: bytes kept of stdout and of stderr each.

        Returns:
            The :class:`ExecResult`; a timeout is reported (``timed_out``), not raised.

        Raises:
            RolloutdError: the runtime is not started.
        """
        began = time.monotonic()
        if timeout_s is None:
            timeout_s = self.spec.wall_time_s
        try:
            process = await self._launch(
                command,
                env=env,
                cwd=cwd,
                name="exec",
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except LaunchError as exc:  # like a shell: 127, the reason on stderr
            return ExecResult(
                exit_code=127, stderr=exc.message + "\n", duration_s=time.monotonic() - began
            )
        proc = process.process
        out, err = BoundedOutput(max_output_bytes), BoundedOutput(max_output_bytes)
        readers = [
            asyncio.ensure_future(drain(proc.stdout, out)),  # type: ignore[arg-type]
            asyncio.ensure_future(drain(proc.stderr, err)),
        ]  # type: ignore[arg-type]
        feeder = asyncio.ensure_future(_feed(proc, stdin)) if stdin is not None else None
        timed_out = False
        try:
            if await process.wait(timeout_s) is None:
                timed_out = True
                log.info("runtime_exec_timed_out", runtime_id=self.runtime_id, timeout_s=timeout_s)
                await process.terminate(grace_s=min(self.grace_s, 1.0))
            # a background child may keep the pipes open: read what is there, then give up.
            await asyncio.wait(readers, timeout=PIPE_DRAIN_S)
        finally:
            for task in [*readers, *([feeder] if feeder else [])]:
                task.cancel()
            if (timed_out or process.returncode is None) and process.alive():
                await process.kill()
            process.close_pipes()
        exit_code = process.returncode if process.returncode is not None else -9
        oom_killed = False
        if exit_code != 0 and (num_oom_kills := self._oom_kills()) > self._num_oom_kills_seen:
            self._num_oom_kills_seen = num_oom_kills
            oom_killed = True
            log.warning(
                "runtime_oom_killed",
                runtime_id=self.runtime_id,
                exit_code=exit_code,
                num_oom_kills=num_oom_kills,
            )
        return ExecResult(
            exit_code=exit_code,
            stdout=out.text(),
            stderr=err.text(),
            truncated=out.truncated or err.truncated,
            timed_out=timed_out,
            oom_killed=oom_killed,
            duration_s=time.monotonic() - began,
        )

    async def spawn(
        self,
        command: Command,
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdout_path: Path | None = None,
        stderr_path: Path | None = None,
        name: str = "harness",
    ) -> RuntimeProcess:
        """Start a long-running command (a harness) in the background.

        Args:
            command: argv, or a string run by ``/bin/sh -c``.
            env: variables added on top of the base environment and ``spec.env``.
            cwd: working folder inside the runtime; default :attr:`workdir`.
            stdout_path, stderr_path: host files receiving the output (appended); default
                ``{runtime_dir}/logs/{name}-{n}.stdout`` / ``.stderr``.
            name: a label for logs and the default log file names.

        Returns:
            The :class:`RuntimeProcess`: ``wait``, ``terminate``, ``returncode``.

        Raises:
            RolloutdError: the runtime is not started.
            LaunchError: the command could not be started (local runtime; under bwrap a
                missing program is a non-zero exit instead).
        """
        self._num_spawned += 1
        stem = self.logs_dir / f"{name}-{self._num_spawned}"
        stdout_path = Path(stdout_path) if stdout_path else stem.with_suffix(".stdout")
        stderr_path = Path(stderr_path) if stderr_path else stem.with_suffix(".stderr")
        stdout_path.parent.mkdir(parents=True, exist_ok=True)
        stderr_path.parent.mkdir(parents=True, exist_ok=True)
        with open(stdout_path, "ab") as out, open(stderr_path, "ab") as err:
            process = await self._launch(
                command,
                env=env,
                cwd=cwd,
                name=name,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=err,
            )
        process.stdout_path, process.stderr_path = stdout_path, stderr_path
        log.info("runtime_process_spawned", runtime_id=self.runtime_id, name=name, pid=process.pid)
        return process

    async def _launch(
        self,
        command: Command,
        *,
        env: dict[str, str] | None,
        cwd: str | None,
        name: str,
        stdin: int,
        stdout: object,
        stderr: object,
    ) -> RuntimeProcess:
        if self.state != "started":
            raise RolloutdError(f"runtime {self.runtime_id} is {self.state}, not started")
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else list(command)
        if not argv:
            raise ConfigError("command must not be empty")
        inside_cwd = self._inside_cwd(cwd)
        full_env = {**self._base_env(), **self.spec.env, **(env or {})}
        process = await self._start_process(
            argv, inside_cwd, full_env, name=name, stdin=stdin, stdout=stdout, stderr=stderr
        )
        self._processes = [p for p in self._processes if p.maybe_alive()] + [process]
        return process

    async def _start_process(
        self,
        argv: list[str],
        cwd: str,
        env: dict[str, str],
        *,
        name: str,
        stdin: int,
        stdout: object,
        stderr: object,
    ) -> RuntimeProcess:
        """Start one command; by default a host process (:meth:`_wrap`), in its own session.

        Args:
            argv: the command inside the runtime.
            cwd: its working folder inside the runtime (absolute).
            env: its whole environment.
            name: a label for logs.
            stdin, stdout, stderr: ``asyncio.subprocess.PIPE``, ``DEVNULL`` or an open file.

        Returns:
            The started :class:`RuntimeProcess`.

        Raises:
            LaunchError: the command could not be started.
        """
        host_argv, host_cwd = self._wrap(argv, cwd)
        env = self._host_env(argv, env, host_argv)
        try:
            proc = await asyncio.create_subprocess_exec(
                *host_argv,
                env=env,
                cwd=host_cwd,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
                start_new_session=True,
                pass_fds=self._pass_fds(),
            )
        except OSError as exc:  # local runtime: no such program or folder
            raise LaunchError(
                f"runtime {self.runtime_id}: cannot run {argv[0]!r} in {cwd}: {exc.strerror or exc}"
            ) from exc
        return RuntimeProcess(
            proc, name=name, spare_leader_on_term=self.spare_leader_on_term, grace_s=self.grace_s
        )

    @property
    def processes(self) -> list[RuntimeProcess]:
        """Processes started by this runtime that may still be alive."""
        return list(self._processes)

    # -- files --------------------------------------------------------------------------
    async def upload(self, path: str, data: bytes) -> None:
        """Write ``data`` to a file of the runtime, creating its folders, handed to the user
        commands run as.

        Written without following a link (:func:`~rolloutd.sandbox.runtimes.beneath.write_file`):
        a fresh file renamed over the target, so a link the runtime's processes put there (or
        on the way) is replaced or refused, never written through.

        Args:
            path: relative to the workspace, or absolute inside :attr:`workdir` or :attr:`home`.
            data: the file's bytes.

        Raises:
            ConfigError: the path leaves the workspace and the home.
            PathRefusedError: a link or a file where a folder belongs on the way, a folder
                at the end, or a permission the runtime's processes set.
        """
        root, parts = self._locate(path)
        await asyncio.to_thread(
            beneath.write_file, root, parts, data, label=path, owner=self._file_owner()
        )

    async def adopt(self, host_path: Path) -> None:
        """Hand a file or folder the worker wrote into the runtime (recursively) to the user
        commands run as, never following a link (the runtimes that change owners override
        :meth:`_file_owner`).

        Args:
            host_path: a host path below the workspace or home (a folder: recursively).

        Raises:
            ConfigError: the path is not below the workspace or home.
            PathRefusedError: a link on the way.
        """
        owner = self._file_owner()
        if owner is None:
            return
        for root in (self.workspace, self.host_home):
            if host_path == root or host_path.is_relative_to(root):
                parts = host_path.relative_to(root).parts
                await asyncio.to_thread(
                    beneath.chown_tree, root, parts, owner, label=str(host_path)
                )
                return
        raise ConfigError(f"{host_path} is not below the runtime's workspace or home")

    def _file_owner(self) -> tuple[int, int] | None:
        """``(uid, gid)`` files the worker writes into the runtime are handed to (None: they
        stay the worker's)."""
        return None

    def host_path(self, path: str) -> Path:
        """The host path of a runtime path (see :meth:`upload` for what is accepted), links
        resolved as they are now.

        Only for paths nothing in the runtime can change any more: a file opened through it
        may be a link by the time it is opened. :meth:`upload`, :meth:`download` and
        :meth:`copy_in` open paths safely.

        Raises:
            ConfigError: the path leaves the workspace and the home.
        """
        return self._host_path(path)

    async def download(self, path: str, *, max_bytes: int = DEFAULT_MAX_DOWNLOAD_BYTES) -> bytes:
        """Read a file of the runtime, in chunks, never more than ``max_bytes`` of it.

        Opened without following a link (:func:`~rolloutd.sandbox.runtimes.beneath.read_file`):
        a link on the way or at the end is refused, as is anything but a regular file (a
        FIFO cannot block the worker).

        Args:
            path: relative to the workspace, or absolute inside :attr:`workdir` or :attr:`home`.
            max_bytes: the file's size limit; a larger file is refused before it is read, and
                one that grows past it while read is refused then.

        Returns:
            The file's bytes.

        Raises:
            ConfigError: the path leaves the workspace and the home.
            NotFoundError: no such file.
            PathRefusedError: a link on the way or at the end, or not a regular file.
            ArtifactTooLargeError: the file is larger than ``max_bytes``.
        """
        root, parts = self._locate(path)
        return await asyncio.to_thread(
            beneath.read_file, root, parts, label=path, max_bytes=max_bytes
        )

    async def copy_in(self, source: Path, path: str) -> None:
        """Copy the host folder ``source`` into the runtime folder ``path`` (merged; links
        copied as links, owners handed over as :meth:`upload` does), never following a link on
        the runtime's side.

        Raises:
            ConfigError: the path leaves the workspace and the home.
            PathRefusedError: a link or a file where a folder belongs in the runtime.
        """
        root, parts = self._locate(path, allow_root=True)
        owner = self._file_owner()

        def copy() -> None:
            with contextlib.ExitStack() as stack:
                src = os.open(source, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                stack.callback(os.close, src)
                root_fd = beneath.open_root(root)
                stack.callback(os.close, root_fd)
                folder = beneath.walk(root_fd, parts, label=path, create=True, owner=owner)
                stack.callback(os.close, folder)
                dst = os.open(".", beneath.READ_DIR_FLAGS, dir_fd=folder)
                stack.callback(os.close, dst)
                beneath.copy_tree(src, dst, label=path, owner=owner)

        await asyncio.to_thread(copy)

    def _locate(self, path: str, *, allow_root: bool = False) -> tuple[Path, tuple[str, ...]]:
        """The host root (workspace or home) a runtime path lies below, and its components
        below it, normalised lexically (``..`` and ``.`` resolved as text; nothing on disk is
        looked at, so links are left to the opening walk).

        Raises:
            ConfigError: the path is empty, leaves the workspace and the home, or is one of
                them (unless ``allow_root``).
        """
        if not path:
            raise ConfigError("path must not be empty")
        inside = path if path.startswith("/") else f"{self.workdir}/{path}"
        inside = posixpath.normpath(inside)
        for inside_root, host_root in (
            (self.workdir, self.workspace),
            (self.home, self.host_home),
        ):
            if inside == inside_root or inside.startswith(inside_root.rstrip("/") + "/"):
                parts = tuple(PurePosixPath(inside).relative_to(inside_root).parts)
                if parts or allow_root:
                    return host_root, parts
        raise ConfigError(
            f"path {path!r} leaves the runtime's workspace {self.workdir} and home {self.home}"
        )

    def _host_path(self, path: str) -> Path:
        """Map a runtime path to its host path, refusing any escape (symlinks resolved now)."""
        if not path:
            raise ConfigError("path must not be empty")
        inside = PurePosixPath(path)
        candidates = [
            (PurePosixPath(self.workdir), self.workspace),
            (PurePosixPath(self.home), self.host_home),
        ]
        if not inside.is_absolute():
            inside = PurePosixPath(self.workdir) / inside
        for inside_root, host_root in candidates:
            if inside.is_relative_to(inside_root):
                host = (host_root / inside.relative_to(inside_root)).resolve()
                if host.is_relative_to(host_root.resolve()):
                    return host
        raise ConfigError(
            f"path {path!r} leaves the runtime's workspace {self.workdir} and home {self.home}"
        )

    def _inside_cwd(self, cwd: str | None) -> str:
        if cwd is None:
            return self.workdir
        inside = PurePosixPath(cwd)
        return str(inside if inside.is_absolute() else PurePosixPath(self.workdir) / inside)


async def _feed(proc: asyncio.subprocess.Process, data: bytes) -> None:
    """Write ``data`` to the process's stdin and close it; a process that exits early is fine."""
    assert proc.stdin is not None
    try:
        proc.stdin.write(data)
        await proc.stdin.drain()
    except (BrokenPipeError, ConnectionResetError):
        return
    finally:
        proc.stdin.close()


def check_spec_network(spec: RuntimeSpec, supported: tuple[str, ...], runtime: str) -> None:
    """Refuse a network policy a runtime cannot enforce.

    Raises:
        ConfigError: ``spec.network`` is not in ``supported``.
    """
    if spec.network not in supported:
        raise ConfigError(
            f"runtime.network={spec.network!r} cannot be enforced by the {runtime} runtime; "
            f"use one of {', '.join(supported)}"
        )
