"""Worker side of the bwrap runtime's exec server: requests, events and sandbox processes.

The exec server (:mod:`rolloutd.sandbox.runtimes.exec_server_inside`, one Python process started
once per runtime inside its sandbox) forks every command of the runtime; the worker talks to it over
``SOCK_SEQPACKET`` socket pairs (unix(7)), one message per request (``marshal``: the exec server
trusts the worker, and the same interpreter runs on both sides) or event (JSON: the worker does not
trust the exec server, and reads nothing else from it), and passes the commands' standard streams as
file descriptors (``SCM_RIGHTS``): pipes for :meth:`Runtime.exec`, the log files for
:meth:`Runtime.spawn`. The protocol is described in ``exec_server_inside``'s docstring.

A :class:`SandboxProcess` stands for one such command: its ``pid``/``pgid`` are the command's pid
inside the sandbox's PID namespace (it leads its own process group there); signals go through
the exec server (``killpg``), and the exit is reported by the command's shim once everything the
command started is gone, so a reported exit means an empty process tree. The shim is then idle
again and goes back to the pool (up to :data:`MAX_IDLE_SHIMS`), so a sequence of commands costs
no fork but the commands' own.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import marshal
import os
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from rolloutd.errors import ExecServerError
from rolloutd.sandbox.runtimes.process import RuntimeProcess

log = structlog.get_logger(__name__)

#: bytes of a request sent inline; longer ones (a long argv or env) go through a memfd.
MAX_INLINE_BYTES = 32 * 1024
#: bytes of one event read from the exec server (events are small JSON objects).
MAX_EVENT_BYTES = 64 * 1024
#: seconds :meth:`SandboxProcess.terminate` waits for the exit after SIGKILL before giving up.
KILL_WAIT_S = 10.0
#: idle shims kept ready, so a command does not wait for a fork.
NUM_IDLE_SHIMS = 1
#: idle shims kept at most: a shim whose command exited is reused while fewer are idle.
MAX_IDLE_SHIMS = 4
#: the exit code of a command whose status was lost with its shim (killed from inside the
#: sandbox between reaping the command and reporting it): 128 + SIGKILL, what a shell reports
#: for a child killed so, an exit code of the sandbox's own doing, not a death by a signal
#: the session did not send.
LOST_EXIT_CODE = 128 + signal.SIGKILL


@dataclass
class SandboxPipes:
    """The worker's ends of a command's pipes (None: not a pipe), like asyncio's Process."""

    stdin: asyncio.StreamWriter | None = None
    stdout: asyncio.StreamReader | None = None
    stderr: asyncio.StreamReader | None = None
    transports: list[asyncio.BaseTransport] = field(default_factory=list)


class SandboxProcess(RuntimeProcess):
    """A command run by a shim of the exec server; same interface as :class:`RuntimeProcess`.

    Args:
        server: the exec server whose shim runs it.
        sock: the worker's end of the shim's socket (owned from now on).
        name: a short label for logs.
        grace_s: seconds between SIGTERM and SIGKILL in :meth:`terminate`.
        pipes: the worker's ends of its pipes.

    Attributes:
        pid, pgid: the command's pid inside the sandbox (it leads its own group); 0 until the
            shim reported it started.
    """

    def __init__(
        self,
        server: ExecServerClient,
        sock: socket.socket,
        *,
        name: str,
        grace_s: float,
        pipes: SandboxPipes,
    ) -> None:
        # no super().__init__: there is no host process to wrap
        self._exec_server = server
        self._sock = sock
        self.name = name
        self.pid = 0
        self.pgid = 0
        self.spare_leader_on_term = False
        self.stdout_path: Path | None = None
        self.stderr_path: Path | None = None
        self.grace_s = grace_s
        self.started_at = time.monotonic()
        self._pipes = pipes
        self._returncode: int | None = None
        #: the shim died before it reported the exit (killed from inside the sandbox): the
        #: exit is the exec server's report, signals go through the exec server
        self.shim_lost = False
        #: ...and the exit status was gone with it (reported as :data:`LOST_EXIT_CODE`)
        self.exit_lost = False
        self._loop = asyncio.get_running_loop()
        self._started: asyncio.Future[None] = self._loop.create_future()
        self._exited: asyncio.Future[int] = self._loop.create_future()
        self._loop.add_reader(sock.fileno(), self._on_readable)

    @property
    def returncode(self) -> int | None:
        """Exit code once reported (negative: killed by that signal)."""
        return self._returncode

    @property
    def process(self) -> SandboxPipes:  # type: ignore[override]
        """The worker's ends of the command's pipes (``stdin``, ``stdout``, ``stderr``)."""
        return self._pipes

    async def wait(self, timeout_s: float | None = None) -> int | None:
        """Wait for the exit report; None when ``timeout_s`` passed first."""
        try:
            return await asyncio.wait_for(asyncio.shield(self._exited), timeout_s)
        except TimeoutError:
            return None

    def maybe_alive(self) -> bool:
        """Whether the exit was not reported yet (a reported exit means nothing is left)."""
        return self._returncode is None

    def alive(self) -> bool:
        """Same as :meth:`maybe_alive`: the shim reports only after cleaning up."""
        return self._returncode is None

    async def terminate(self, grace_s: float | None = None) -> int | None:
        """SIGTERM the command's process group, then SIGKILL it after the grace period.

        Returns once the exit was reported (bounded: the grace period plus
        :data:`KILL_WAIT_S`); the shim kills the rest of the command's processes first.

        Args:
            grace_s: seconds between SIGTERM and SIGKILL; default :attr:`grace_s`.

        Returns:
            The exit code (negative: the signal that killed the command).
        """
        grace = self.grace_s if grace_s is None else grace_s
        if self._returncode is not None:
            return self._returncode
        self._signal(signal.SIGTERM)
        graceful = await self.wait(grace) is not None
        if not graceful:
            self._signal(signal.SIGKILL)
            if await self.wait(KILL_WAIT_S) is None:
                log.error("runtime_process_survived_kill", name=self.name, pid=self.pid)
        log.info(
            "runtime_process_terminated",
            name=self.name,
            pid=self.pid,
            exit_code=self._returncode,
            graceful=graceful,
        )
        return self._returncode

    def close_pipes(self) -> None:
        """Close the worker's ends of the pipes (after an exec, whatever was read)."""
        for transport in self._pipes.transports:
            transport.close()

    def _signal(self, sig: signal.Signals) -> None:
        """Ask the shim to ``killpg`` the command's group (it knows whether it was reaped), or
        the exec server when the shim is gone."""
        if self.shim_lost:
            self._exec_server.kill_group(self.pgid, sig)
            return
        try:
            self._sock.send(marshal.dumps({"op": "signal", "sig": int(sig)}))
        except BlockingIOError:  # the shim does not read: it is stuck or being killed
            log.warning("runtime_signal_not_sent", name=self.name, pid=self.pid, sig=int(sig))
        except OSError:  # the shim is gone, and with it the sandbox
            self._on_gone()

    def _on_readable(self) -> None:
        while True:
            try:
                data = self._sock.recv(MAX_EVENT_BYTES)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:  # the shim ended without reporting
                self._on_shim_gone()
                return
            try:
                event = json.loads(data)
            except ValueError:
                log.warning("exec_server_bad_event", name=self.name)
                continue
            if event.get("event") == "started" and not self._started.done():
                self.pid = self.pgid = int(event["pid"])
                self._started.set_result(None)
            elif event.get("event") == "exit":
                self._set_exit(int(event["code"]), reusable=True)
                return

    def _on_shim_gone(self) -> None:
        """The shim died before reporting the exit: killed from inside the sandbox (a command
        of the same uid, the OOM killer) when the exec server lives on, which then reaps the
        command (its orphan now) and reports its exit (``watch``); else the sandbox died."""
        if self._exec_server.closed or not self._started.done() or not self.pid:
            self._on_gone()
            return
        self.shim_lost = True
        self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        log.warning("exec_server_shim_lost", name=self.name, pid=self.pid)
        self._exec_server.watch(self)

    def on_reaped(self, code: int, *, lost: bool) -> None:
        """The exec server reaped the command after its shim died; ``lost``: the shim had
        reaped it and died before reporting, the status went with it (:data:`LOST_EXIT_CODE`)."""
        self.exit_lost = lost
        self._set_exit(LOST_EXIT_CODE if lost else code)

    def _on_gone(self) -> None:
        if not self._started.done():
            self._started.set_exception(ExecServerError("the exec server is gone"))
            self._started.exception()  # retrieved: run() may not be waiting
        self._set_exit(-signal.SIGKILL)

    def _set_exit(self, code: int, *, reusable: bool = False) -> None:
        """Record the exit; hand the shim back to the exec server (``reusable``: it reported the
        exit and waits for the next command) or close its socket (the shim then ends)."""
        if not self._started.done():
            self._started.set_result(None)
        if self._returncode is None:
            self._returncode = code
            self._exited.set_result(code)
        if self._sock.fileno() >= 0:
            self._loop.remove_reader(self._sock.fileno())
            if reusable:
                self._exec_server.reuse(self._sock)
            else:
                self._sock.close()
        self._exec_server.forget(self)


class ExecServerClient:
    """The worker's end of one exec server: its control socket and a pool of idle shims.

    Args:
        sock: the worker's end of the control ``SOCK_SEQPACKET`` pair.
        label: names the runtime in errors and logs.
    """

    def __init__(self, sock: socket.socket, label: str) -> None:
        self._sock = sock
        self._sock.setblocking(False)
        self._label = label
        self._loop = asyncio.get_running_loop()
        self._ids = itertools.count(1)
        self._idle: collections.deque[socket.socket] = collections.deque()
        self._starting: set[socket.socket] = set()  # shims not idle yet
        self._shim_waiters: collections.deque[asyncio.Future[socket.socket]] = collections.deque()
        self._num_requested = 0  # shims asked for, not idle yet
        self._sweeps: dict[int, asyncio.Future[int]] = {}
        self._running: set[SandboxProcess] = set()
        self._watched: dict[int, SandboxProcess] = {}  # pid -> command whose shim died
        self._requests: set[asyncio.Future[None]] = set()  # requests sent from callbacks
        self._ready: asyncio.Future[None] = self._loop.create_future()
        self.closed = False
        self._loop.add_reader(self._sock.fileno(), self._on_readable)

    async def ready(self, timeout_s: float) -> None:
        """Wait for the exec server's ``ready`` event.

        Raises:
            ExecServerError: the exec server ended first.
            TimeoutError: ``timeout_s`` passed first.
        """
        await asyncio.wait_for(asyncio.shield(self._ready), timeout_s)

    async def prime(self) -> None:
        """Ask for the first idle shim: until then the exec server forks nothing, so the worker can
        move it into the runtime's cgroup first.

        Raises:
            ExecServerError: the exec server is gone.
        """
        self._check_open()
        await self._request_shims()

    async def run(
        self,
        argv: list[str],
        env: dict[str, str],
        cwd: str,
        *,
        name: str,
        grace_s: float,
        stdin: Any,
        stdout: Any,
        stderr: Any,
    ) -> SandboxProcess:
        """Start a command in the sandbox through an idle shim; return once it started.

        Args:
            argv: the command; ``argv[0]`` is searched in ``env["PATH"]``.
            env: its whole environment.
            cwd: its working folder inside the sandbox.
            name: a label for logs.
            grace_s: seconds between SIGTERM and SIGKILL when it is terminated.
            stdin, stdout, stderr: ``asyncio.subprocess.PIPE``, ``DEVNULL`` or an open file.

        Returns:
            The :class:`SandboxProcess`; a program that cannot be run is a 126/127 exit.

        Raises:
            ExecServerError: the exec server is gone, or could not fork (e.g. the pids limit
                is reached).
        """
        shim = await self._take_shim()
        pipes, names, send_fds, own_fds = SandboxPipes(), [], [], []
        process: SandboxProcess | None = None
        try:
            for stream, spec in (("stdin", stdin), ("stdout", stdout), ("stderr", stderr)):
                if spec == asyncio.subprocess.DEVNULL or spec is None:
                    continue
                if spec == asyncio.subprocess.PIPE:
                    read_fd, write_fd = os.pipe()
                    own_fds += [read_fd, write_fd]
                    if stream == "stdin":
                        send_fds.append(read_fd)
                        pipes.stdin = await self._writer(write_fd, pipes)
                    else:
                        send_fds.append(write_fd)
                        setattr(pipes, stream, await self._reader(read_fd, pipes))
                    own_fds.remove(read_fd if stream != "stdin" else write_fd)  # a transport's
                else:
                    send_fds.append(spec.fileno())
                names.append(stream)
            process = SandboxProcess(self, shim, name=name, grace_s=grace_s, pipes=pipes)
            self._running.add(process)
            await _send(
                shim,
                self._loop,
                {"op": "run", "argv": argv, "env": env, "cwd": cwd, "fds": names},
                send_fds,
            )
        except BaseException:
            if process is not None:
                process._on_gone()  # closes the shim's socket; the shim then exits
            else:
                shim.close()
            for transport in pipes.transports:
                transport.close()
            raise
        finally:  # the shim has its own copies now; ours would hold the pipes open
            for fd in own_fds:
                os.close(fd)
        # the next idle shim is forked while this command starts, not before
        await self._request_shims()
        try:
            await process._started
        except BaseException:
            process.close_pipes()
            raise
        return process

    async def sweep(self, timeout_s: float = 10.0) -> int:
        """SIGKILL every process of the sandbox but the exec server, its shims included; return
        how many there were. Commands whose shims die with them are reported as killed once the
        exec server reaped them (:meth:`watch`).

        Raises:
            ExecServerError: the exec server is gone.
            TimeoutError: no answer within ``timeout_s``.
        """
        self._check_open()
        request_id = next(self._ids)
        answer: asyncio.Future[int] = self._loop.create_future()
        self._sweeps[request_id] = answer
        try:
            await _send(self._sock, self._loop, {"op": "sweep", "id": request_id}, [])
            return await asyncio.wait_for(answer, timeout_s)
        finally:
            self._sweeps.pop(request_id, None)

    def watch(self, process: SandboxProcess) -> None:
        """Ask the exec server for the exit of ``process``, whose shim died before reporting
        it (:meth:`SandboxProcess.on_reaped` gets it)."""
        self._watched[process.pid] = process
        self._request({"op": "watch", "pid": process.pid})

    def kill_group(self, pgid: int, sig: int) -> None:
        """Have the exec server signal the process group ``pgid`` (a command whose shim died)."""
        self._request({"op": "kill", "pid": pgid, "sig": int(sig)})

    def _request(self, request: dict[str, Any]) -> None:
        """Send a request from a synchronous caller (an event callback)."""
        if self.closed:
            return
        sending = asyncio.ensure_future(_send(self._sock, self._loop, request, []))
        self._requests.add(sending)
        sending.add_done_callback(self._request_sent)

    def _request_sent(self, sending: asyncio.Future[None]) -> None:
        self._requests.discard(sending)
        if not sending.cancelled() and sending.exception() is not None:
            self._on_gone(f"request failed: {sending.exception()}")

    def forget(self, process: SandboxProcess) -> None:
        """Drop a process whose exit was reported."""
        self._running.discard(process)
        if self._watched.get(process.pid) is process:
            del self._watched[process.pid]

    def reuse(self, shim: socket.socket) -> None:
        """Take back a shim whose command exited: give it to a waiting command, keep it idle,
        or close it (the shim ends) when enough are idle or the exec server is gone."""
        while self._shim_waiters and self._shim_waiters[0].done():
            self._shim_waiters.popleft()  # cancelled
        if self.closed:
            shim.close()
        elif self._shim_waiters:
            self._shim_waiters.popleft().set_result(shim)
        elif len(self._idle) < MAX_IDLE_SHIMS:
            self._idle.append(shim)
        else:
            shim.close()

    def close(self) -> None:
        """Close every socket: the exec server exits, and with it the sandbox. Idempotent."""
        self._on_gone("closed by the worker")

    # -- plumbing ---------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.closed:
            raise ExecServerError(f"runtime {self._label}: the exec server is gone")

    async def _take_shim(self) -> socket.socket:
        """An idle shim's socket (waiting for one to be forked when there is none)."""
        self._check_open()
        while self._idle:
            shim = self._idle.popleft()
            try:  # a command may have killed an idle shim (same uid): its socket is at EOF
                alive = shim.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
            except BlockingIOError:
                alive = True
            except OSError:
                alive = False
            if alive:
                return shim
            shim.close()
        waiter: asyncio.Future[socket.socket] = self._loop.create_future()
        self._shim_waiters.append(waiter)
        await self._request_shims()
        return await waiter

    async def _request_shims(self) -> None:
        missing = NUM_IDLE_SHIMS + len(self._shim_waiters) - len(self._idle) - self._num_requested
        if missing > 0:
            self._num_requested += missing
            await _send(self._sock, self._loop, {"op": "shims", "n": missing}, [])

    async def _reader(self, fd: int, pipes: SandboxPipes) -> asyncio.StreamReader:
        reader = asyncio.StreamReader(limit=2**16)
        transport, _ = await self._loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", buffering=0)
        )
        pipes.transports.append(transport)
        return reader

    async def _writer(self, fd: int, pipes: SandboxPipes) -> asyncio.StreamWriter:
        transport, protocol = await self._loop.connect_write_pipe(
            lambda: asyncio.streams.FlowControlMixin(), os.fdopen(fd, "wb", buffering=0)
        )
        pipes.transports.append(transport)
        return asyncio.StreamWriter(transport, protocol, None, self._loop)

    def _on_readable(self) -> None:
        while not self.closed:
            try:
                # CLOEXEC at once: a shim's socket must never leak into another host process
                data, fds, _, _ = socket.recv_fds(
                    self._sock, MAX_EVENT_BYTES, 4, socket.MSG_CMSG_CLOEXEC
                )
            except BlockingIOError:
                return
            except OSError as exc:
                self._on_gone(f"receive failed: {exc}")
                return
            if not data and not fds:
                self._on_gone("the exec server ended")
                return
            try:
                event = json.loads(data)
            except ValueError:
                event = {}
            kind = event.get("event")
            if kind == "shim" and len(fds) == 1:
                shim = socket.socket(fileno=fds.pop())
                shim.setblocking(False)
                self._starting.add(shim)
                self._loop.add_reader(shim.fileno(), self._on_shim_idle, shim)
            elif kind == "shim_failed":
                self._num_requested -= 1
                if self._shim_waiters:
                    self._shim_waiters.popleft().set_exception(
                        ExecServerError(
                            f"runtime {self._label}: cannot start a command: {event.get('message')}"
                        )
                    )
            elif kind == "ready" and not self._ready.done():
                self._ready.set_result(None)
            elif kind == "reaped":
                watched = self._watched.pop(int(event.get("pid", 0)), None)
                if watched is not None:
                    watched.on_reaped(int(event.get("code", -9)), lost=bool(event.get("lost")))
            elif kind == "swept":
                answer = self._sweeps.get(event.get("id", -1))
                if answer is not None and not answer.done():
                    answer.set_result(int(event.get("num_killed", 0)))
            else:
                log.warning("exec_server_bad_event", runtime_id=self._label, kind=kind)
            for fd in fds:  # none expected
                os.close(fd)

    def _on_shim_idle(self, shim: socket.socket) -> None:
        """A new shim finished setting up (``idle``): it can take a command without delay."""
        self._loop.remove_reader(shim.fileno())
        self._starting.discard(shim)
        self._num_requested -= 1
        try:
            idle = json.loads(shim.recv(MAX_EVENT_BYTES)).get("event") == "idle"
        except (OSError, ValueError, AttributeError):
            idle = False
        if not idle:  # it died while setting up (a sweep, or the sandbox is going away)
            shim.close()
            if self._shim_waiters and not self.closed:  # a command waits for it: ask again
                sending = asyncio.ensure_future(self._request_shims())
                self._requests.add(sending)
                sending.add_done_callback(self._request_sent)
            return
        while self._shim_waiters and self._shim_waiters[0].done():
            self._shim_waiters.popleft()  # cancelled
        if self._shim_waiters:
            self._shim_waiters.popleft().set_result(shim)
        else:
            self._idle.append(shim)

    def _on_gone(self, reason: str) -> None:
        """The exec server is gone or closed: so is the sandbox, with every command in it."""
        if self.closed:
            return
        self.closed = True
        if self._sock.fileno() >= 0:
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
        while self._idle:
            self._idle.popleft().close()
        for shim in self._starting:
            self._loop.remove_reader(shim.fileno())
            shim.close()
        self._starting.clear()
        error = ExecServerError(f"runtime {self._label}: the exec server is gone ({reason})")
        if not self._ready.done():
            self._ready.set_exception(error)
            self._ready.exception()  # retrieved: nobody may be waiting
        for waiter in [*self._shim_waiters, *self._sweeps.values()]:
            if not waiter.done():
                waiter.set_exception(error)
        self._shim_waiters.clear()
        for process in list(self._running):
            process._on_gone()
        log.debug("exec_server_gone", runtime_id=self._label, reason=reason)


async def _send(
    sock: socket.socket, loop: asyncio.AbstractEventLoop, request: dict[str, Any], fds: list[int]
) -> None:
    """Send one request (with ``fds``) on a non-blocking ``SOCK_SEQPACKET`` socket.

    A request longer than :data:`MAX_INLINE_BYTES` travels in a memfd (memfd_create(2)),
    passed first, behind ``{"op": "indirect"}``.

    Raises:
        ExecServerError: the peer is gone.
    """
    data = marshal.dumps(request)
    memfd = None
    if len(data) > MAX_INLINE_BYTES:
        memfd = os.memfd_create("rolloutd-request", os.MFD_CLOEXEC)
        os.write(memfd, data)  # a memfd takes any size in one write
        os.lseek(memfd, 0, os.SEEK_SET)
        data, fds = marshal.dumps({"op": "indirect"}), [memfd, *fds]
    try:
        while True:
            try:
                socket.send_fds(sock, [data], fds)
                return
            except BlockingIOError:
                writable: asyncio.Future[None] = loop.create_future()
                loop.add_writer(sock.fileno(), writable.set_result, None)
                try:
                    await writable
                finally:
                    loop.remove_writer(sock.fileno())
            except OSError as exc:
                raise ExecServerError(f"the exec server is gone: {exc}") from exc
    finally:
        if memfd is not None:
            os.close(memfd)
