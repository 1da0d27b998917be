"""The ``bwrap`` runtime: bubblewrap sandboxes over a read-only view of the host system (or of
an image folder).

One sandbox per runtime (flags: bwrap(1), bubblewrap 0.8), started once by :meth:`start` and
running a small exec server (:mod:`~rolloutd.sandbox.runtimes.exec_server_inside`, the worker's side
in :mod:`~rolloutd.sandbox.runtimes.exec_server`) that forks every command of the runtime, harness
and ``exec`` alike, inside the same namespaces:

- mount namespace: the host's ``/usr``, ``/etc``, ``/opt`` (and ``/bin``, ``/lib*`` as symlinks
  or binds), the Python installation, the npm prefix of harness CLIs and the Python harness
  CLIs' environments (with the base Pythons they link to) bound read-only (``--ro-bind``) at
  their host paths; the workspace bound writable (``--bind``) at
  ``spec.workdir``; a private HOME at ``/home/agent``; private ``/tmp`` (``--tmpfs``),
  ``/proc`` (``--proc``) and ``/dev`` (``--dev``); the exec server's script, and with ``network:
  gateway`` the folder of the gateway socket, bound read-only under ``/run``; the root itself
  (bwrap's tmpfs) is made read-only (``--remount-ro /``). Nothing else of the host is visible;
- PID, IPC and UTS namespaces (``--unshare-pid --unshare-ipc --unshare-uts``): the exec server is
  pid 1 (``--as-pid-1``); when it exits (the worker closes its socket, or the holder is
  killed) the namespace dies, so no process survives teardown, not even one that called
  ``setsid``. Each command runs under a shim of the exec server, a child subreaper that kills what
  the command left behind when it exits (what a PID namespace per command used to do); when a
  run ends the exec server kills every other process of the sandbox (:meth:`cancel`), so nothing
  a harness started runs on while its files are collected, whether or not its shim lived;
- users: with a root worker, commands run as an unprivileged uid and gid of the runtime's own,
  claimed when it starts (:mod:`~rolloutd.sandbox.runtimes.uids`: one escaped sandbox owns no
  other's files) (user ``agent``, listed in the sandbox's ``/etc/passwd`` and
  ``/etc/group``, which are the host's plus that entry), a uid of the host's own user
  namespace (no user namespace: a file the sandbox writes is owned by that uid on the host
  too). The workspace and home are handed to it (:meth:`BwrapRuntime.adopt`, also for every
  upload and prepare step). The exec server and its shims stay root with ``CAP_SETUID``,
  ``CAP_SETGID`` and ``CAP_KILL`` only, which each command's own child drops with its uid before
  its execve; so no command can signal, trace or read the exec server or its shims, or read the
  host's root-only files (``/etc/shadow``). A worker that is not root cannot change uids:
  commands then run as the worker's own (unprivileged) uid, the shims' too, and a command can
  kill its shim (the end of a run does not rest on shims);
- all capabilities of commands dropped (``--cap-drop ALL``; the exec server's few above are added
  back for it alone): as root with them, the sandbox could remount the read-only system
  writable; bwrap always sets ``PR_SET_NO_NEW_PRIVS``, so set-uid programs do not regain them.
  The exec server is not dumpable, so commands cannot ptrace it or open its control socket through
  ``/proc`` even under the same uid;
- a seccomp filter (``--seccomp``, :mod:`~rolloutd.sandbox.runtimes.seccomp`): at least every
  system call Docker's default profile denies (new namespaces of any kind, mounts, the
  keyring, ``bpf``, ``kexec``, modules, ``ptrace``, ...), for every process of the sandbox;
- no user namespace can be made inside: the seccomp filter refuses ``unshare``, ``setns`` and a
  ``clone`` with ``CLONE_NEWUSER`` (``clone3`` answers ``ENOSYS``); a worker that runs commands
  as its own uid also gives bwrap ``--unshare-user --disable-userns`` (bwrap sets the
  namespace's ``user.max_user_namespaces`` to 1). A root worker cannot use
  ``--disable-userns``: it needs ``--unshare-user``, whose namespace maps one uid, and the exec
  server (root) and the commands (the runtime's uid) need two;
- ``--die-with-parent``: the sandbox dies with the worker;
- environment: the exec server runs with PATH, LANG and ``ROLLOUTD_RUNTIME_ID`` only; each command
  is spawned with exactly the environment in its request (the base variables, ``spec.env`` and the
  call's ``env``), sent over the exec server's socket, never on a command line, so the session key
  stays off the world-readable ``/proc/PID/cmdline``;
- standard streams: passed to the exec server as file descriptors (``SCM_RIGHTS``): pipes for
  :meth:`exec`, the log files for :meth:`spawn`; the logs folder itself is not visible.

Network (``spec.network``):

- ``gateway`` (the default): the sandbox has its own network namespace (``--unshare-net``;
  bwrap brings ``lo`` up in it) where the exec server listens on ``127.0.0.1:{GATEWAY_PORT}`` and
  relays to a unix socket bound from the host (``{runtime_dir}/net/gateway.sock``), where
  :class:`~rolloutd.sandbox.runtimes.gateway_relay.GatewayRelay` admits only the session's
  ``/s/{key}/`` routes. Inside, only loopback exists: the relay's port is the one thing
  listening, every other address is unreachable;
- ``none``: ``--unshare-net``, loopback only;
- ``host``: the host's network (the harness reaches the gateway on 127.0.0.1 directly).

With ``spec.image`` (a root folder) the root is composed of the image's top-level entries bound
read-only (:func:`image_root`; ``/home/agent``, or a workdir below one of them, must exist in
the image as a mount point) instead of the host's system, and everything else is the same: one
persistent sandbox, its exec server, the same users, limits and network. The exec server is the
worker's own Python, started by the host's dynamic loader with the host's libraries, all bound
read-only under :data:`HOST_INSIDE` (:func:`host_python`), so it runs whatever libc the image has
(or none); the commands it spawns are the image's.

Limits (:mod:`~rolloutd.sandbox.runtimes.limits`): ``max_processes``, ``cpus`` and ``memory_mb``
through a cgroup per runtime (``memory_mb`` as RLIMIT_AS only when there is no writable memory
controller; node reserves a lot of address space, keep that >= 8192 for node harnesses). The worker
moves the exec server into the cgroup while the sandbox starts (bwrap reports the exec server's host
pid on ``--info-fd`` right after its clone), and the exec server forks nothing before the worker's
first request, so every shim and command is born inside; moving a process costs the kernel an RCU
grace period (milliseconds), here overlapped with bwrap's set-up and the exec server's Python start.
The exec server and its idle shims (one to four: a shim is reused after its command) count against
``max_processes``, plus one shim per running command; bwrap's own outer process stays outside. Shims
and commands run with an OOM score adjustment of +500 (an unprivileged process may lower its own
only down to 0, the exec server's), so the kernel's OOM killer takes a command, not the exec server;
:attr:`ExecResult.oom_killed` reports it.

Latency (``benchmarks/runtime.py``): a command costs a wake-up of an idle shim and a fork of
it, not a bwrap and an ``nsenter`` (docs/measurements.md); the shim is reused afterwards.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import marshal
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import structlog

from rolloutd.errors import ConfigError, ExecServerError, RuntimeStartError
from rolloutd.sandbox.config import npm_prefix, tool_python_dirs, tools_dir
from rolloutd.sandbox.runtimes import beneath, exec_server_inside, seccomp
from rolloutd.sandbox.runtimes.base import check_spec_network
from rolloutd.sandbox.runtimes.disk import FULL_BELOW_BYTES
from rolloutd.sandbox.runtimes.exec_runtime import GATEWAY_PORT, ExecServerRuntime
from rolloutd.sandbox.runtimes.exec_server import ExecServerClient
from rolloutd.sandbox.runtimes.gateway_relay import GatewayRelay
from rolloutd.sandbox.runtimes.limits import RuntimeCgroup, rlimit_as, rlimit_fsize
from rolloutd.sandbox.runtimes.process import RuntimeProcess
from rolloutd.sandbox.runtimes.roots import (
    HOME_INSIDE,
    HOST_INSIDE,
    SYSTEM_DIRS,
    SYSTEM_LINKS,
    account_files,
    host_python,
    image_root,
    parents_to_create,
    python_dirs,
    system_binds,
)
from rolloutd.sandbox.runtimes.uids import claim_uid, release_uid
from rolloutd.types import RuntimeSpec

log = structlog.get_logger(__name__)

#: hostname inside the sandbox.
HOSTNAME = "rolloutd"
#: seconds the sandbox may take to start (bwrap's report, the exec server's ``ready``).
PROBE_TIMEOUT_S = 30.0
#: where the exec server sees the host folder holding the gateway socket.
NET_DIR_INSIDE = "/run/rolloutd"
#: the gateway socket's file name in that folder.
GATEWAY_SOCKET = "gateway.sock"
#: where the exec server's script, compiled (:func:`exec_server_pyc`), is bound read-only inside.
EXEC_SERVER_INSIDE = "/run/rolloutd-exec-server.pyc"
#: seconds the sandbox may take to exit once its exec server's control socket is closed.
EXEC_SERVER_EXIT_S = 2.0
#: the first field bwrap writes to ``--info-fd``.
CHILD_PID = re.compile(rb'"child-pid": *(\d+)')
#: capabilities the exec server keeps to run commands as the runtime's uid (bwrap ``--cap-add``),
#: with their numbers (linux/capability.h).
EXEC_SERVER_CAPS = {"CAP_KILL": 5, "CAP_SETGID": 6, "CAP_SETUID": 7}


@functools.cache
def can_run_as_sandbox_user() -> bool:
    """Whether commands can run as a uid of their own: the worker is root and its bounding
    set has :data:`EXEC_SERVER_CAPS` (bwrap 0.8 asked to add a capability outside the bounding set
    silently keeps them all, so that is checked here, not left to bwrap)."""
    if os.geteuid() != 0:
        return False
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapBnd:"):
            bounding = int(line.split()[1], 16)
            return all(bounding >> bit & 1 for bit in EXEC_SERVER_CAPS.values())
    return False


@functools.cache
def exec_server_pyc() -> bytes:
    """The exec server's script compiled once per worker process, as a ``.pyc`` file's bytes.

    Python runs a ``.pyc`` given as the script (same interpreter: the sandbox runs
    ``sys.executable``), so no sandbox spends its start compiling the exec server. Layout (PEP 552):
    magic number, flags 0b01 (hash-based, not checked), the source hash, the marshalled code.
    """
    source = Path(exec_server_inside.__file__).read_bytes()
    code = compile(source, EXEC_SERVER_INSIDE.removesuffix("c"), "exec", dont_inherit=True)
    return (
        importlib.util.MAGIC_NUMBER
        + (1).to_bytes(4, "little")
        + importlib.util.source_hash(source)
        + marshal.dumps(code)
    )


class BwrapRuntime(ExecServerRuntime):
    """A runtime whose commands run in bubblewrap sandboxes; see the module docstring.

    Raises:
        ConfigError: ``spec.workdir`` is not an absolute folder of its own.
    """

    type = "bwrap"
    spare_leader_on_term = True

    def __init__(self, spec: RuntimeSpec, runtime_id: str, root: Path, **kwargs: Any) -> None:
        check_spec_network(spec, ("gateway", "none", "host"), "bwrap")
        if not spec.workdir.startswith("/") or spec.workdir in ("/", HOME_INSIDE, "/tmp"):
            raise ConfigError(
                f"runtime.workdir {spec.workdir!r} must be an absolute folder "
                f"other than /, /tmp and {HOME_INSIDE}"
            )
        super().__init__(spec, runtime_id, root, **kwargs)
        self.workdir = spec.workdir
        self.home = HOME_INSIDE
        self.bwrap = shutil.which("bwrap")
        self.net_dir = self.runtime_dir / "net"
        self.cgroup: RuntimeCgroup | None = None
        self._holder: RuntimeProcess | None = None
        #: host pid of the exec server (pid 1 inside) once started.
        self.exec_server_pid: int | None = None
        #: ids commands run as (-1: the worker's own; see the module docstring, users): the
        #: runtime's own, claimed at start (:func:`~rolloutd.sandbox.runtimes.uids.claim_uid`)
        self.uid = self.gid = -1
        self._own_uid = can_run_as_sandbox_user()

    @property
    def holder_pgid(self) -> int | None:
        """Host process group of the sandbox holder (outer bwrap, the exec server and the exec
        server's shims; with ``spec.image``: the network holder), while it runs."""
        return self._holder.pgid if self._holder is not None else None

    def _extra_ro_dirs(self) -> list[Path]:
        """Read-only binds beyond the system folders: Python, the npm prefix, the Python
        harness CLIs' environments and the base Pythons they link to."""
        covered = [Path(d) for d in SYSTEM_DIRS]
        dirs: list[Path] = []
        for d in [*python_dirs(), npm_prefix(), tools_dir(), *tool_python_dirs()]:
            if d.is_dir() and not any(d.is_relative_to(c) for c in covered + dirs):
                dirs.append(d)
        return dirs

    def _python_bin(self) -> str:
        return str(Path(sys.executable).parent)

    def bwrap_args(self, cwd: str) -> list[str]:
        """The bwrap options (without the command) of the runtime's sandbox.

        Args:
            cwd: the working folder inside the sandbox.

        Returns:
            list[str]: ``bwrap`` and its options, ending with ``--``.
        """
        args = [
            self.bwrap or "bwrap",
            "--die-with-parent",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--hostname",
            HOSTNAME,
            "--cap-drop",
            "ALL",
        ]
        if self.uid < 0:
            # commands run as the worker's own uid: a user namespace mapping that uid alone,
            # in which no further one can be made (bwrap sets user.max_user_namespaces to 1)
            args += ["--unshare-user", "--disable-userns"]
        if self.spec.network in ("none", "gateway"):
            args.append("--unshare-net")
        # bwrap mounts in order: the root's entries first, then /tmp, then host folders (some
        # may live below /tmp), then the workspace and home.
        if self.spec.image:
            root_args, existing = image_root(self.spec.image)
            extra: list[Path] = []
        else:
            root_args, existing = system_binds(), (*SYSTEM_DIRS, *SYSTEM_LINKS)
            extra = self._extra_ro_dirs()
        args += root_args
        args += ["--perms", "1777"]
        if self.spec.tmpfs_mb:
            args += ["--size", str(self.spec.tmpfs_mb * 2**20)]
        args += ["--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev"]
        # bwrap creates missing parents of a mount point with mode 0700: a command that is not
        # root could not reach the Python installation, the workspace or its home
        for parent in parents_to_create(
            [*map(str, extra), self.workdir, self.home, EXEC_SERVER_INSIDE], existing
        ):
            args += ["--perms", "0755", "--dir", parent]
        for d in extra:
            args += ["--ro-bind", str(d), str(d)]
        if self.spec.image:
            prefix, _, libs = host_python()
            args += ["--ro-bind", str(prefix), f"{HOST_INSIDE}/python"]
            for name, path in libs.items():
                args += ["--ro-bind", str(path), f"{HOST_INSIDE}/lib/{name}"]
        args += [
            "--bind",
            str(self.workspace),
            self.workdir,
            "--bind",
            str(self.host_home),
            self.home,
            "--ro-bind",
            str(self.runtime_dir / "exec-server.pyc"),
            EXEC_SERVER_INSIDE,
            "--as-pid-1",
        ]
        if self.uid >= 0:
            for cap in EXEC_SERVER_CAPS:
                args += ["--cap-add", cap]
            for name in ("passwd", "group"):
                if (self.runtime_dir / name).exists():
                    args += ["--ro-bind", str(self.runtime_dir / name), f"/etc/{name}"]
        if self.spec.network == "gateway":
            args += ["--ro-bind", str(self.net_dir), NET_DIR_INSIDE]
        args += ["--remount-ro", "/", "--chdir", cwd, "--"]
        return args

    def _exec_server_argv(self) -> list[str]:
        """The exec server's interpreter command line inside: the worker's own Python, or with
        ``spec.image`` that Python started by the host's dynamic loader with the host's
        libraries (bound under :data:`HOST_INSIDE`), whatever the image's libc is."""
        if not self.spec.image:
            return [sys.executable, "-S", "-I"]
        _, executable, libs = host_python()
        loader = next(name for name in libs if name.startswith("ld-"))
        return [
            f"{HOST_INSIDE}/lib/{loader}",
            "--library-path",
            f"{HOST_INSIDE}/lib",
            f"{HOST_INSIDE}/python/{executable}",
            "-S",
            "-I",
        ]

    def _base_env(self) -> dict[str, str]:
        path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        if not self.spec.image:
            path = f"{self._python_bin()}:{path}"
        return {
            "PATH": path,
            "HOME": self.home,
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
            "TERM": "dumb",
            "ROLLOUTD_RUNTIME_ID": self.runtime_id,
        }

    # -- lifecycle ------------------------------------------------------------------------
    async def _check(self) -> None:
        if self.bwrap is None:
            raise ConfigError(
                "bwrap runtime: bubblewrap is not installed (apt-get install bubblewrap)"
            )
        if self._own_uid:
            self.uid = self.gid = await asyncio.to_thread(claim_uid, self.runtime_id)
        if self.spec.image:
            if not os.path.isdir(self.spec.image):
                raise ConfigError(f"bwrap runtime: image {self.spec.image!r} is not a folder")
            try:
                await asyncio.to_thread(host_python)
            except (OSError, ValueError, subprocess.CalledProcessError) as exc:
                raise ConfigError(
                    f"bwrap runtime: cannot find the libraries of this Python "
                    f"for an image sandbox: {exc}"
                ) from exc
        # the exec server answering proves the sandbox runs: no probe command needed
        await self._start_exec_server()

    def _oom_kills(self) -> int:
        return self.cgroup.oom_kills() if self.cgroup is not None else 0

    def ceilings_reached(self) -> dict[str, str]:
        """The ceilings the sandbox reached (see :meth:`Runtime.ceilings_reached`): forks the
        pids cgroup refused, processes the memory cgroup's OOM killer killed, a full disk
        (:meth:`disk_reached`), a full ``/tmp`` (its tmpfs, read through the exec server's
        ``/proc/{pid}/root``)."""
        spec, reached = self.spec, {}
        if self.cgroup is not None:
            if spec.max_processes and (refused := self.cgroup.forks_refused()):
                reached["max_processes"] = (
                    f"max_processes={spec.max_processes} reached: the kernel refused "
                    f"{refused} fork(s) (pids cgroup)"
                )
            if spec.memory_mb and (killed := self.cgroup.oom_kills()):
                reached["memory_mb"] = (
                    f"memory_mb={spec.memory_mb} reached: the kernel's OOM killer killed "
                    f"{killed} process(es) (memory cgroup)"
                )
        if why := self.disk_reached():
            reached["disk_mb"] = why
        if spec.tmpfs_mb and self.exec_server_pid is not None:
            try:
                tmp = os.statvfs(f"/proc/{self.exec_server_pid}/root/tmp")
            except OSError:  # the sandbox is gone
                tmp = None
            # full: less than 1 MiB free, or than 1/64 of a small /tmp
            if tmp is not None and tmp.f_bavail * tmp.f_frsize <= min(
                FULL_BELOW_BYTES, tmp.f_blocks * tmp.f_frsize // 64
            ):
                reached["tmpfs_mb"] = f"tmpfs_mb={spec.tmpfs_mb} reached: /tmp is full"
        return reached

    def _confine(self, pid: int) -> None:
        """Put the exec server (host ``pid``, not forking yet) under the runtime's limits.

        Runs in a thread: moving a process into a cgroup waits for the kernel (see limits.py).

        Raises:
            ConfigError: ``max_processes``/``cpus`` without a writable cgroup.
        """
        spec = self.spec
        self.cgroup = RuntimeCgroup.create(
            self.runtime_id,
            max_processes=spec.max_processes,
            cpus=spec.cpus,
            memory_mb=spec.memory_mb,
        )
        try:
            self.cgroup.attach(pid)
            if spec.memory_mb and self.cgroup.memory_dir is None:
                rlimit_as(pid, spec.memory_mb)
            if spec.disk_mb and self.disk is None:  # no sized disk: no file past the ceiling
                rlimit_fsize(pid, spec.disk_mb)
        except OSError as exc:
            raise RuntimeStartError(
                f"bwrap runtime {self.runtime_id}: cannot confine the sandbox: {exc}"
            ) from exc

    async def _start_exec_server(self) -> None:
        """Start the sandbox (a bwrap running the exec server as its pid 1), confine the exec
        server while it starts, wait until it is ready, then let it fork its first shim."""
        exec_server_args = [str(self.uid), str(self.gid)]
        if self.spec.network == "gateway":
            exec_server_args += [str(GATEWAY_PORT), f"{NET_DIR_INSIDE}/{GATEWAY_SOCKET}"]
            self.relay = GatewayRelay(self.net_dir / GATEWAY_SOCKET)
            await self.relay.start()
        (self.runtime_dir / "exec-server.pyc").write_bytes(exec_server_pyc())
        if self.uid >= 0:
            etc = Path(self.spec.image or "/") / "etc"
            for name, text in zip(
                ("passwd", "group"), account_files(etc, self.uid, self.gid), strict=True
            ):
                if (etc / name).is_file():  # an image without one gets none (no mount point)
                    (self.runtime_dir / name).write_bytes(text)
            for folder in (self.workspace, self.host_home):  # with spec.files, if any
                beneath.chown_tree(folder, (), (self.uid, self.gid), label=str(folder))
                folder.chmod(0o700)  # no other sandbox's uid may enter it
        filter_fd = seccomp.filter_fd()  # first: a missing libseccomp leaks nothing
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        info_r, info_w = os.pipe()
        argv = [
            # at /: the workspace may be its uid's alone (0700); each command enters its cwd
            *self.bwrap_args("/"),
            *self._exec_server_argv(),
            EXEC_SERVER_INSIDE,
            str(theirs.fileno()),
            *exec_server_args,
        ]
        argv[1:1] = ["--info-fd", str(info_w), "--seccomp", str(filter_fd)]
        stderr_path = self.logs_dir / "exec-server.stderr"
        # the exec server's own environment; each command gets its explicit one in its request
        env = {
            "PATH": self._base_env()["PATH"],
            "LANG": "C.UTF-8",
            "ROLLOUTD_RUNTIME_ID": self.runtime_id,
        }
        try:
            with open(stderr_path, "ab") as err:
                proc = await asyncio.create_subprocess_exec(
                    *argv,
                    env=env,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=err,
                    start_new_session=True,
                    pass_fds=(theirs.fileno(), info_w, filter_fd),
                )
        except BaseException:
            ours.close()
            os.close(info_r)
            raise
        finally:
            theirs.close()
            os.close(info_w)
            os.close(filter_fd)
        self._holder = RuntimeProcess(proc, name="sandbox", spare_leader_on_term=True, grace_s=0.5)
        self._exec_server = ExecServerClient(ours, self.runtime_id)
        try:
            try:
                pid = self.exec_server_pid = await _read_child_pid(info_r)
            finally:
                os.close(info_r)
            # the cgroup move waits for the kernel while bwrap sets up and Python starts
            spec = self.spec
            limited = spec.max_processes or spec.cpus or spec.memory_mb or spec.disk_mb
            confined = (
                asyncio.ensure_future(asyncio.to_thread(self._confine, pid)) if limited else None
            )
            try:
                await self._exec_server.ready(PROBE_TIMEOUT_S)
            finally:
                if confined is not None:
                    await confined
            await self._exec_server.prime()
        except (TimeoutError, ExecServerError, ValueError, KeyError) as exc:
            raise RuntimeStartError(
                f"bwrap runtime {self.runtime_id}: exec server did not start ({exc!r}): "
                f"{stderr_path.read_text(errors='replace')[-500:]}"
            ) from exc

    async def _cleanup(self) -> None:
        began = time.monotonic()
        if self._exec_server is not None:  # the exec server exits at EOF, and with it the sandbox
            self._exec_server.close()
            self._exec_server = None
            if self._holder is not None:
                await self._holder.wait(EXEC_SERVER_EXIT_S)
        if self._holder is not None:
            await self._holder.terminate()
            self._holder = None
        if self.relay is not None:
            await self.relay.close()
        if self.cgroup is not None:
            await asyncio.to_thread(self.cgroup.remove)
            self.cgroup = None
        if self._own_uid and self.uid >= 0:  # no process of it is left: the uid is free
            await asyncio.to_thread(release_uid, self.uid, self.runtime_id)
        log.debug(
            "runtime_cleaned_up",
            runtime_id=self.runtime_id,
            duration_s=round(time.monotonic() - began, 4),
        )


async def _read_child_pid(info_fd: int) -> int:
    """The host pid of bwrap's sandboxed child, from ``--info-fd`` (bwrap(1): a JSON object
    beginning with ``child-pid``, written right after the clone, in several writes, then
    closed; the child starts once it is closed).

    Read to the end: closing our end earlier would kill bwrap with SIGPIPE on its next write,
    and leave its child blocked forever.

    Raises:
        TimeoutError: no end within :data:`PROBE_TIMEOUT_S`.
        ValueError: bwrap ended without reporting its child.
    """
    loop = asyncio.get_running_loop()
    data = b""
    deadline = loop.time() + PROBE_TIMEOUT_S
    while True:
        readable: asyncio.Future[None] = loop.create_future()
        loop.add_reader(info_fd, lambda f=readable: f.done() or f.set_result(None))
        try:
            await asyncio.wait_for(readable, max(0.0, deadline - loop.time()))
        finally:
            loop.remove_reader(info_fd)
        chunk = os.read(info_fd, 65536)
        if not chunk:
            break
        data += chunk
    if not (found := CHILD_PID.search(data)):
        raise ValueError(f"bwrap ended without reporting its child: {data!r}")
    return int(found.group(1))
