"""Sandbox side of the bwrap runtime: one exec server per sandbox that runs every command in it.

Run as a script by the runtime's sandbox, as its pid 1 (standard library only, ``python3 -S -I``)::

    python3 -S -I exec_server_inside.py CONTROL_FD|CONTROL_PATH UID GID [PORT SOCKET]

``CONTROL_FD`` is one end of a ``SOCK_SEQPACKET`` socket pair (unix(7): message boundaries are
kept, so a send is atomic; requests are ``marshal``-ed dicts, written by the worker, which the
exec server trusts; events are flat JSON objects, the worker trusts nothing else) whose other end
the worker holds; nothing inside the sandbox can open it (it has no path, and the exec server is not
dumpable, see below). A container runtime, whose CLI cannot hand a container an open socket,
gives ``CONTROL_PATH`` instead: the exec server connects to the worker's listening
``SOCK_SEQPACKET`` socket there, first thing as the container's pid 1, and the worker stops
listening (and removes the path) once it accepted that one connection, before any command runs.
``UID GID`` (-1: keep the exec server's own) are the ids commands run as: each command's own
child drops to them (setgroups, setresgid, setresuid) before its execve, which clears every
capability it had; the exec server and its shims keep root and the few capabilities they need
(``CAP_SETUID``, ``CAP_SETGID``, ``CAP_KILL``), none of which a command ever holds, so a
command can neither signal nor trace its shim (kill(2) needs a matching uid or ``CAP_KILL``).
With -1 (a worker that is not root, a container) shims and commands share one uid: a command
can kill its shim, and what must hold then does not rest on shims (below). With
``PORT SOCKET`` the exec server also relays TCP connections to ``127.0.0.1:PORT`` byte for byte to
the unix socket ``SOCKET`` (``network: gateway``; the host side,
:mod:`rolloutd.sandbox.runtimes.gateway_relay`, checks each request); it does no filtering.

Commands run under *shims*: forks of the exec server, each with a ``SOCK_SEQPACKET`` pair of its own
whose other end goes to the worker (``SCM_RIGHTS``). A shim serves one command at a time:

1. it sets itself up once: raises its OOM score adjustment (so the OOM killer takes a command
   before the exec server), becomes a child subreaper (prctl(2) ``PR_SET_CHILD_SUBREAPER``),
   sends ``{"event": "idle"}`` and blocks, so a request finds it scheduled and ready;
2. request ``{"op": "run", "argv", "env", "cwd", "fds": ["stdout", ...]}`` with those fds
   attached (missing streams: ``/dev/null``); a request longer than one message comes as
   ``{"op": "indirect"}`` with a memfd holding it as the first fd;
3. it starts the command with exactly ``env``, in its own process group, signals at their
   defaults, as ``UID GID`` (:func:`spawn_as`: fork(2), the drop of ids in the child, then
   execve(2)); sends ``{"event": "started", "pid"}`` (a pid inside the sandbox) before the
   child may execve, so the worker knows the pid before the command can act (even against its
   shim), or on failure an exit 127/126 with the reason on the command's stderr;
4. ``{"op": "signal", "sig"}`` requests are ``killpg`` on the command's group, until the
   command exits; then it SIGKILLs whatever the command left behind (its orphans, ``setsid``
   daemons included, are reparented to the shim) and sends ``{"event": "exit", "code"}``
   (negative: killed by that signal, as ``os.waitstatus_to_exitcode``). So, as when every
   command had a PID namespace of its own, nothing a command started outlives it, and a
   reported exit means an empty process tree;
5. it is idle again: the worker may send the next command on the same socket (a ``signal``
   request that crossed the exit report is ignored), or close it to end the shim. Reusing a
   shim saves a fork, its set-up and its exit per command.

Control requests (worker -> exec server): ``{"op": "shims", "n"}`` forks ``n`` more shims (event
``{"event": "shim", "pid"}`` with the worker's end attached, or ``{"event": "shim_failed"}``
when fork fails, e.g. at the pids limit); ``{"op": "sweep", "id"}`` SIGKILLs every process
but the exec server, shims included, with one ``kill(-1, SIGKILL)`` as the namespace's init
(``{"event": "swept", "id", "num_killed"}``): the worker sends it when a run ends, so nothing
the run started outlives it whether or not its shim lives; ``{"op": "watch", "pid"}`` asks for
the exit of a command whose shim died before reporting it (the command, reparented to the exec
server, is reaped here: ``{"event": "reaped", "pid", "code"}``, with ``"lost": 1`` when the shim
had reaped it and died before reporting); ``{"op": "kill", "pid", "sig"}`` signals such a
command's process group. The exec server
sends ``{"event": "ready"}`` once it listens, then forks nothing until the first ``shims`` request:
meanwhile the worker moves it into the runtime's cgroup, so every shim and command is born inside.
It exits when the worker closes its end; it is the sandbox's pid 1 (``bwrap --as-pid-1``), so its
exit ends the PID namespace and everything in it, and no process of the sandbox can signal it (the
kernel drops signals to a namespace's init from inside, unless it handles them: it handles only
SIGCHLD).

The exec server is not dumpable (``PR_SET_DUMPABLE`` 0, inherited by the shims): processes of the
sandbox, which have no capabilities (and, with ``UID``, another uid), cannot ptrace it or open
its ``/proc/PID/fd``, ``environ`` or ``mem``; a command gets the default (dumpable) state back
at ``execve``. The worker does not trust the exec server either: it runs inside.

One module, over the house's 600 lines, on purpose: it runs by path under ``python3 -S -I``, which
puts neither its own folder nor rolloutd on ``sys.path`` (isolated mode), so it cannot import a
sibling module, and every module it imports adds to each sandbox's start.
"""

from __future__ import annotations

# the C modules, not socket, signal, json, selectors and ctypes: those import enum, re and
# struct, which would add milliseconds to every sandbox's start (python3 -X importtime;
# docs/measurements.md)
import _ctypes
import _signal as signal
import _socket
import array
import gc
import marshal
import os
import select
import sys
import time

#: prctl(2) options (linux/prctl.h).
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
#: the OOM score adjustment of a shim and its commands: the OOM killer prefers them to the
#: exec server (0); without CAP_SYS_RESOURCE a command can lower its own to 0, not below.
SHIM_OOM_SCORE_ADJ = 500
#: bytes read from a relayed socket at a time.
CHUNK = 65536
#: seconds a sweep keeps killing before it gives up (a process in D state may linger).
SWEEP_TIMEOUT_S = 5.0
#: exit codes of reaped orphans kept for a late ``watch`` request.
MAX_REAPED = 256
#: signals reset to their default action in a command (Python ignores SIGPIPE and SIGXFSZ,
#: and an ignored signal stays ignored across execve).
RESET_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD, signal.SIGINT, signal.SIGTERM)
#: PATH searched when a command's environment has none (execvp(3)'s default).
DEFAULT_PATH = "/bin:/usr/bin"

#: epoll(7) events as the selectors module names them.
EVENT_READ, EVENT_WRITE = select.EPOLLIN, select.EPOLLOUT


class _Int(_ctypes._SimpleCData):
    _type_ = "i"


class _ULong(_ctypes._SimpleCData):
    _type_ = "L"


class _CFunction(_ctypes.CFuncPtr):
    """A libc function returning ``int`` that sets errno (what ctypes.CDLL builds)."""

    _flags_ = _ctypes.FUNCFLAG_CDECL | _ctypes.FUNCFLAG_USE_ERRNO
    _restype_ = _Int


class _Libc:
    _handle = _ctypes.dlopen(None)


_prctl = _CFunction(("prctl", _Libc()))
_capset = _CFunction(("capset", _Libc()))
#: capset(2) header: _LINUX_CAPABILITY_VERSION_3 for the calling thread; empty sets (2 x 3 u32).
CAP_HEADER_V3 = array.array("I", [0x20080522, 0]).tobytes()
NO_CAPS_V3 = bytes(24)


class Selector:
    """A minimal ``selectors.EpollSelector``: register a socket with data, poll for events.

    An error or hang-up is reported as readable and writable, as selectors does, so the next
    read or write sees it.
    """

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._keys: dict[int, tuple[object, object]] = {}

    def register(self, obj: object, events: int, data: object) -> None:
        """Watch ``obj`` (a socket or an fd) for ``events``; ``data`` comes back with them."""
        fd = obj if isinstance(obj, int) else obj.fileno()  # type: ignore[attr-defined]
        self._epoll.register(fd, events)
        self._keys[fd] = (obj, data)

    def modify(self, obj: object, events: int, data: object) -> None:
        """Change what ``obj`` is watched for."""
        fd = obj.fileno()  # type: ignore[attr-defined]
        self._epoll.modify(fd, events)
        self._keys[fd] = (obj, data)

    def unregister(self, obj: object) -> None:
        """Stop watching ``obj``."""
        fd = obj.fileno()  # type: ignore[attr-defined]
        self._epoll.unregister(fd)
        del self._keys[fd]

    def select(self) -> list[tuple[object, object, int]]:
        """Block until events: ``(obj, data, events)`` per ready object."""
        ready = []
        for fd, event in self._epoll.poll():
            if fd in self._keys:
                mask = event & (EVENT_READ | EVENT_WRITE)
                if event & ~(EVENT_READ | EVENT_WRITE):
                    mask = EVENT_READ | EVENT_WRITE
                ready.append((*self._keys[fd], mask))
        return ready


def dumps(message: dict) -> bytes:
    """One event as JSON (RFC 8259): a flat object of str keys and str or int values."""
    parts = []
    for key, value in message.items():
        if isinstance(value, int):
            parts.append(f'"{key}": {value}')
        else:
            text = "".join(
                c if c >= " " and c not in '"\\' else f"\\u{ord(c):04x}" for c in str(value)
            )
            parts.append(f'"{key}": "{text}"')
    return ("{" + ", ".join(parts) + "}").encode()


def recv_fds(
    sock: _socket.socket, bufsize: int, maxfds: int, flags: int = 0
) -> tuple[bytes, list[int]]:
    """One message and the fds passed with it (``SCM_RIGHTS``), as ``socket.recv_fds``."""
    fds = array.array("i")
    data, ancdata, _, _ = sock.recvmsg(bufsize, _socket.CMSG_LEN(maxfds * fds.itemsize), flags)
    for level, kind, cmsg in ancdata:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds.frombytes(cmsg[: len(cmsg) - (len(cmsg) % fds.itemsize)])
    return data, list(fds)


def send_fds(sock: _socket.socket, data: bytes, fds: list[int]) -> None:
    """Send one message with ``fds`` (``SCM_RIGHTS``), as ``socket.send_fds``."""
    sock.sendmsg([data], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, array.array("i", fds))])


def prctl(option: int, value: int) -> None:
    """Call prctl(2) with one argument; raise OSError on failure."""
    if _prctl(option, _ULong(value), _ULong(0), _ULong(0), _ULong(0)) != 0:
        err = _ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def send(ctl: _socket.socket, message: dict) -> None:
    """Send one event to the worker; a worker that went away is ignored (it kills us next)."""
    try:
        ctl.send(dumps(message))
    except OSError:
        pass  # the worker closed its end: the sandbox is being torn down


def live_processes() -> list[tuple[int, int]]:
    """``(pid, parent pid)`` of every live (non-zombie) process of this PID namespace, from
    ``/proc/{pid}/stat`` (fields 3 and 4, after the command name: proc(5))."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # exited while we listed /proc
        if fields[0] != b"Z":
            found.append((int(entry), int(fields[1])))
    return found


def children_of(pid: int) -> list[int]:
    """Live (non-zombie) processes whose parent is ``pid`` (a scan of this namespace's /proc)."""
    return [child for child, parent in live_processes() if parent == pid]


def shim(sock: _socket.socket, uid: int, gid: int) -> None:
    """Body of a forked shim: run commands one at a time, clean up after each; never returns.

    Args:
        sock: the shim's end of its own ``SOCK_SEQPACKET`` pair; the worker holds the other.
        uid, gid: the ids to run commands as (-1: keep the exec server's).
    """
    code = 70
    try:
        gc.disable()  # collecting would only copy the exec server's pages
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        for entry in os.listdir("/proc/self/fd"):
            fd = int(entry)
            if fd > 2 and fd != sock.fileno():
                try:
                    os.close(fd)
                except OSError:
                    continue  # the fd of the listdir itself, already closed
        sock.setblocking(True)
        set_oom_score_adj(SHIM_OOM_SCORE_ADJ)
        # with UID the shim stays the exec server's user (commands drop in their own child,
        # spawn_as): a command can then neither signal nor trace its shim
        prctl(PR_SET_CHILD_SUBREAPER, 1)
        send(sock, {"event": "idle"})  # set up and scheduled once: a request wakes it fast
        while True:
            # CLOEXEC: the command gets these fds only where its child dup2s them
            data, fds = recv_fds(sock, CHUNK, 16, _socket.MSG_CMSG_CLOEXEC)
            if not data:
                code = 0
                return  # the worker closed the shim
            request = marshal.loads(data)  # written by the worker, which the exec server trusts
            if request["op"] == "indirect":
                with os.fdopen(fds[0], "rb") as f:
                    request = marshal.loads(f.read())
                fds = fds[1:]
            if request["op"] != "run":  # a signal for a command that already exited
                for fd in fds:
                    os.close(fd)
                continue
            code = run(sock, request, dict(zip(request.get("fds", []), fds)), uid, gid)
            if code:
                return
    finally:
        os._exit(code)


def set_oom_score_adj(value: int) -> None:
    """Set this process's OOM score adjustment (proc(5)); its children inherit it."""
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(value))
    except OSError:
        pass  # no /proc (never in the sandbox) or not allowed: the default stays


def which(name: str, path: str) -> str:
    """The executable ``name`` resolves to in ``path`` (execvp(3) rules); ``name`` itself if
    it has a slash or nothing matches (the spawn then fails with ENOENT)."""
    if "/" in name:
        return name
    for folder in path.split(":"):
        candidate = os.path.join(folder or ".", name)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return name


def drop_to(uid: int, gid: int) -> None:
    """Become ``uid``/``gid`` (-1: keep) with no supplementary groups and no capabilities."""
    if gid >= 0:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
    if uid >= 0:  # all uids nonzero: every capability is gone (capabilities(7))
        os.setresuid(uid, uid, uid)
        _capset(CAP_HEADER_V3, NO_CAPS_V3)  # the inheritable set too


def spawn_as(
    argv: list[str], env: dict, cwd: str, fds: dict[str, int], uid: int, gid: int, announce
) -> int:
    """Start a command as ``uid``/``gid`` (-1: the shim's) in its own process group; return
    its pid.

    fork(2); the child does what posix_spawn's attributes would (its own process group, the
    standard streams, signals at their defaults), drops its ids and capabilities (which
    posix_spawn cannot), enters ``cwd`` and finds ``argv[0]`` on ``PATH`` as the command's user,
    then waits: ``announce(pid)`` runs (the shim reports the command started) before the child
    may execve(2), so the worker knows the command's pid before the command can act, even
    against its own shim. A failure before the wait comes back through a close-on-exec pipe as
    its errno; an execve that fails after it is the command's exit (127: not found, else 126),
    the reason on its stderr.

    Raises:
        OSError: the command could not be started (the child's errno; FileNotFoundError for a
            program or folder that is not there).
    """
    report_r, report_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing but system calls until execve
        ready = False
        try:
            os.close(report_r)
            os.close(go_w)
            os.setpgid(0, 0)
            for target, name in enumerate(("stdin", "stdout", "stderr")):
                fd = fds.get(name)
                os.dup2(os.open("/dev/null", os.O_RDWR) if fd is None else fd, target)
            for sig in RESET_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            drop_to(uid, gid)
            os.chdir(cwd)  # as the command's user: its permissions apply
            path = which(argv[0], env.get("PATH", DEFAULT_PATH))
            if "/" not in path:
                raise FileNotFoundError(2, os.strerror(2))
            os.write(report_w, b"R")
            ready = True
            if os.read(go_r, 1) != b"g":  # the shim died before reporting the pid
                os._exit(126)
            os.execve(path, argv, env)
        except OSError as exc:
            err = exc.errno or 0
            if not ready:
                os.write(report_w, str(err).encode())
            else:
                reason = f"rolloutd: cannot run {argv[0]!r} in {cwd}: {os.strerror(err)}\n"
                os.write(2, reason.encode())
            os._exit(127 if err == 2 else 126)
        finally:
            os._exit(126)
    os.close(report_w)
    os.close(go_r)
    try:
        report = os.read(report_r, 32)
        if report != b"R":
            os.waitpid(pid, 0)
            err = int(report or b"0")
            raise (FileNotFoundError if err == 2 else OSError)(err, os.strerror(err))
        announce(pid)
        try:
            os.write(go_w, b"g")
        except BrokenPipeError:
            pass  # the child was killed meanwhile (a sweep): its exit is reaped as any other
    finally:
        os.close(report_r)
        os.close(go_w)
    return pid


def run(sock: _socket.socket, request: dict, fds: dict[str, int], uid: int, gid: int) -> int:
    """Run one command (:func:`spawn_as`), serve signal requests until it exits, kill what it
    left behind, report; return 0 to stay for the next command, 1 when the worker closed the
    shim's socket."""
    argv, cwd, env = request["argv"], request["cwd"], request["env"]
    try:
        pid = spawn_as(
            argv,
            env,
            cwd,
            fds,
            uid,
            gid,
            lambda pid: send(sock, {"event": "started", "pid": pid}),
        )
    except OSError as exc:
        message = f"rolloutd: cannot run {argv[0]!r} in {cwd}: {exc.strerror or exc}\n"
        if "stderr" in fds:
            os.write(fds["stderr"], message.encode())
        send(
            sock,
            {
                "event": "exit",
                "code": 127 if isinstance(exc, FileNotFoundError) else 126,
                "message": message.strip(),
            },
        )
        return 0
    finally:
        for fd in fds.values():
            os.close(fd)
    gone = False  # the worker closed the shim's socket
    pidfd = os.pidfd_open(pid)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.register(sock, select.POLLIN)
    while True:
        if pidfd in {fd for fd, _ in poller.poll()}:
            break
        try:
            data = sock.recv(CHUNK)
        except OSError:
            data = b""
        # the worker went away: nobody will read the exit, end the command now
        sig = int(marshal.loads(data)["sig"]) if data else signal.SIGKILL
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            pass  # the group is gone: its leader is about to be reaped
        if not data:
            gone = True
            break
    os.close(pidfd)
    _, status = os.waitpid(pid, 0)
    exit_code = os.waitstatus_to_exitcode(status)
    # kill what the command left behind until nothing is left: orphans come to us
    while True:
        for orphan in children_of(os.getpid()):
            try:
                os.kill(orphan, signal.SIGKILL)
            except ProcessLookupError:
                continue
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    send(sock, {"event": "exit", "code": exit_code})
    return 1 if gone else 0


def sweep() -> int:
    """SIGKILL every process of the sandbox but this exec server, its shims included, until
    none is left (or :data:`SWEEP_TIMEOUT_S` passed: a process in D state may linger); return
    how many there were.

    As the PID namespace's init, one ``kill(-1, SIGKILL)`` reaches every process of the namespace
    but itself (kill(2)), all at once: a process forking meanwhile does not outrun it (a fork
    with a fatal signal pending fails). Not pid 1 (never so in a runtime), each listed process is
    killed instead.
    """
    me, killed = os.getpid(), set()
    deadline = time.monotonic() + SWEEP_TIMEOUT_S
    while time.monotonic() < deadline:
        victims = [pid for pid, _ in live_processes() if pid != me]
        if not victims:
            break
        killed.update(victims)
        if me == 1:
            try:
                os.kill(-1, signal.SIGKILL)
            except ProcessLookupError:
                pass  # nothing left to signal
        else:
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
        time.sleep(0.002)  # killed processes take a moment to exit
    return len(killed)


class Relay:
    """Non-blocking byte relay between an accepted TCP connection and the unix socket.

    Args:
        sel: the exec server's selector.
        client: the accepted connection.
        path: the unix socket to connect to.

    Raises:
        OSError: the unix socket cannot be connected.
    """

    def __init__(self, sel: Selector, client: _socket.socket, path: str) -> None:
        self.sel = sel
        upstream = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            upstream.connect(path)  # a local unix socket: returns at once
        except OSError:
            upstream.close()
            raise
        client.setblocking(False)
        upstream.setblocking(False)
        self.socks = (client, upstream)
        self.buf = {client: b"", upstream: b""}  # bytes read from a socket, for its peer
        self.eof = {client: False, upstream: False}  # the socket's reading side ended
        self.shut = {client: False, upstream: False}  # that EOF was passed on to the peer
        self.masks = {client: 0, upstream: 0}
        self.closed = False
        self._update()

    def peer(self, sock: _socket.socket) -> _socket.socket:
        """The other socket of the pair."""
        return self.socks[1] if sock is self.socks[0] else self.socks[0]

    def on_event(self, sock: _socket.socket, mask: int) -> None:
        """Read from ``sock`` when readable; flush pending bytes both ways."""
        if self.closed:
            return
        try:
            if mask & EVENT_READ:
                data = sock.recv(CHUNK)
                if data:
                    self.buf[sock] += data
                else:
                    self.eof[sock] = True
            for src in self.socks:
                dst = self.peer(src)
                if self.buf[src]:
                    try:
                        sent = dst.send(self.buf[src])
                    except BlockingIOError:
                        sent = 0
                    self.buf[src] = self.buf[src][sent:]
                if self.eof[src] and not self.buf[src] and not self.shut[src]:
                    dst.shutdown(_socket.SHUT_WR)
                    self.shut[src] = True
        except OSError:  # a side reset the connection: the relay ends either way
            self.close()
            return
        self._update()

    def _update(self) -> None:
        """Read while a socket's bytes can be passed on; write while its peer's bytes wait."""
        if all(self.shut.values()):
            self.close()
            return
        for sock in self.socks:
            mask = 0
            if not self.eof[sock] and not self.buf[sock]:
                mask |= EVENT_READ
            if self.buf[self.peer(sock)]:
                mask |= EVENT_WRITE
            old, self.masks[sock] = self.masks[sock], mask
            if mask == old:
                continue
            if not old:
                self.sel.register(sock, mask, self)
            elif not mask:
                self.sel.unregister(sock)
            else:
                self.sel.modify(sock, mask, self)

    def close(self) -> None:
        """Close both sockets (idempotent)."""
        if self.closed:
            return
        self.closed = True
        for sock in self.socks:
            if self.masks[sock]:
                self.sel.unregister(sock)
            sock.close()


class ExecServer:
    """The exec server's event loop: control requests, child exits and (optionally) the relay.

    Args:
        ctl: the control socket (``SOCK_SEQPACKET``).
        uid, gid: the ids commands run as (-1: the exec server's own).
        relay: ``(port, unix socket path)`` to relay, or None.
    """

    def __init__(
        self, ctl: _socket.socket, uid: int, gid: int, relay: tuple[int, str] | None
    ) -> None:
        self.ctl = ctl
        self.uid, self.gid = uid, gid
        self.shims: set[int] = set()  # pids of live shims
        self.watched: set[int] = set()  # commands whose exit the worker waits for (watch)
        self.reaped: dict[int, int] = {}  # exit codes of orphans reaped lately, oldest first
        self.sel = Selector()
        self.relay_path = relay[1] if relay else ""
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_r, False)
        os.set_blocking(wake_w, False)
        self.wake_r = wake_r
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        # blocking sends (a slow worker slows the exec server, events are never dropped),
        # non-blocking reads (MSG_DONTWAIT)
        ctl.setblocking(True)
        self.sel.register(ctl, EVENT_READ, self.on_control)
        self.sel.register(wake_r, EVENT_READ, self.on_child)
        if relay:
            self.listener = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
            self.listener.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
            self.listener.bind(("127.0.0.1", relay[0]))
            self.listener.listen(128)
            self.listener.setblocking(False)
            self.sel.register(self.listener, EVENT_READ, self.on_accept)

    def run(self) -> int:
        """Serve until the worker closes the control socket."""
        # before the first shim exists nothing of the sandbox runs that could attach to us
        prctl(PR_SET_DUMPABLE, 0)
        send(self.ctl, {"event": "ready"})
        gc.freeze()  # what exists now stays out of collections: forked shims share its pages
        while True:
            for obj, data, mask in self.sel.select():
                if isinstance(data, Relay):
                    data.on_event(obj, mask)  # type: ignore[arg-type]
                elif data(mask) is False:  # type: ignore[operator]
                    return 0

    def on_accept(self, mask: int) -> None:
        """Accept relayed connections."""
        while True:
            try:
                fd, _ = self.listener._accept()
                client = _socket.socket(fileno=fd)
            except BlockingIOError:
                return
            try:
                Relay(self.sel, client, self.relay_path)
            except OSError:
                client.close()  # the host side is gone: the client sees the connection end

    def on_control(self, mask: int) -> bool:
        """Handle pending requests; False once the worker closed its end."""
        while True:
            try:
                data = self.ctl.recv(CHUNK, _socket.MSG_DONTWAIT)
            except BlockingIOError:
                return True
            if not data:
                return False
            request = marshal.loads(data)
            if request["op"] == "shims":
                self.fork_shims(int(request["n"]))
            elif request["op"] == "sweep":
                num_killed = sweep()
                self.on_child(0)  # reap them now: a command the worker watches is reported
                send(self.ctl, {"id": request["id"], "event": "swept", "num_killed": num_killed})
            elif request["op"] == "watch":
                self.watch(int(request["pid"]))
            elif request["op"] == "kill":
                try:
                    os.killpg(int(request["pid"]), int(request["sig"]))
                except OSError:
                    pass  # the group is gone (its exit is reported by watch)

    def fork_shims(self, num: int) -> None:
        """Fork ``num`` idle shims; pass the worker its end of each one's socket (``shim``)."""
        for _ in range(num):
            ours, theirs = _socket.socketpair(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
            try:
                pid = os.fork()
            except OSError as exc:  # e.g. EAGAIN: the runtime's pids limit is reached
                ours.close()
                theirs.close()
                send(self.ctl, {"event": "shim_failed", "message": f"fork: {exc.strerror}"})
                continue
            if pid == 0:
                shim(theirs, self.uid, self.gid)
            self.shims.add(pid)
            theirs.close()
            try:
                send_fds(self.ctl, dumps({"event": "shim", "pid": pid}), [ours.fileno()])
            except OSError:
                pass  # the worker closed its end: the sandbox is being torn down
            ours.close()

    def on_child(self, mask: int) -> None:
        """Reap exited shims (each reported to the worker itself, or its socket closed) and, as
        the namespace's init, orphans of a shim that was killed."""
        try:
            while os.read(self.wake_r, 4096):
                pass
        except BlockingIOError:
            pass  # drained
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.shims:
                self.shims.discard(pid)
                continue
            code = os.waitstatus_to_exitcode(status)
            if pid in self.watched:
                self.watched.discard(pid)
                send(self.ctl, {"event": "reaped", "pid": pid, "code": code})
            else:
                self.reaped[pid] = code
                if len(self.reaped) > MAX_REAPED:
                    del self.reaped[next(iter(self.reaped))]

    def watch(self, pid: int) -> None:
        """Report the exit of ``pid``, a command whose shim died before reporting it (the
        command, now the exec server's child, is reaped here): ``{"event": "reaped", "pid",
        "code"}`` once it exited, or with ``"lost": 1`` when its status is gone (its shim
        reaped it before dying)."""
        if pid in self.reaped:
            send(self.ctl, {"event": "reaped", "pid": pid, "code": self.reaped.pop(pid)})
        elif os.path.exists(f"/proc/{pid}"):  # alive, or a zombie about to be ours
            self.watched.add(pid)
        else:
            send(self.ctl, {"event": "reaped", "pid": pid, "code": -signal.SIGKILL, "lost": 1})


def main(argv: list[str]) -> int:
    """Run the exec server (see the module docstring for the arguments)."""
    # a handled signal reaches a namespace's init from inside; Python handles SIGINT
    # (KeyboardInterrupt): commands that may share the exec server's uid (a container's root)
    # must not end it with one
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if argv[1].startswith("/"):  # a container runtime: connect back to the worker's socket
        ctl = _socket.socket(_socket.AF_UNIX, _socket.SOCK_SEQPACKET)
        ctl.connect(argv[1])
    else:
        ctl = _socket.socket(fileno=int(argv[1]))
    os.set_inheritable(ctl.fileno(), False)
    relay = (int(argv[4]), argv[5]) if len(argv) > 5 else None
    return ExecServer(ctl, int(argv[2]), int(argv[3]), relay).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
