"""The ``bwrap`` runtime: bubblewrap sandboxes over a read-only view of the host system.

One sandbox per runtime (flags: bwrap(1), bubblewrap 0.8), started once by :meth:`start` and
running a small agent (:mod:`~rolloutd.sandbox.runtimes.agent_inside`, the worker's side in
:mod:`~rolloutd.sandbox.runtimes.agent`) that forks every command of the runtime, harness and
``exec`` alike, inside the same namespaces:

- mount namespace: the host's ``/usr``, ``/etc``, ``/opt`` (and ``/bin``, ``/lib*`` as symlinks
  or binds), the Python installation and the npm prefix of harness CLIs bound read-only
  (``--ro-bind``) at their host paths; the workspace bound writable (``--bind``) at
  ``spec.workdir``; a private HOME at ``/home/agent``; private ``/tmp`` (``--tmpfs``),
  ``/proc`` (``--proc``) and ``/dev`` (``--dev``); the agent's script, and with ``network:
  gateway`` the folder of the gateway socket, bound read-only under ``/run``; the root itself
  (bwrap's tmpfs) is made read-only (``--remount-ro /``). Nothing else of the host is visible;
- PID, IPC and UTS namespaces (``--unshare-pid --unshare-ipc --unshare-uts``): bwrap's init is
  pid 1, the agent pid 2; when the agent exits (the worker closes its socket, or the holder is
  killed) the namespace dies, so no process survives teardown, not even one that called
  ``setsid``. Each command runs under a shim of the agent, a child subreaper that kills what
  the command left behind when it exits (what a PID namespace per command used to do);
- all capabilities dropped (``--cap-drop ALL``): as root without it, the sandbox could remount
  the read-only system writable; bwrap always sets ``PR_SET_NO_NEW_PRIVS``, so set-uid
  programs do not regain them. The agent is not dumpable, so commands cannot ptrace it or open
  its control socket through ``/proc``;
- ``--die-with-parent``: the sandbox dies with the worker;
- environment: the agent runs with PATH, LANG and ``ROLLOUTD_RUNTIME_ID`` only; each command is
  spawned with exactly the environment in its request (the base variables, ``spec.env`` and
  the call's ``env``), sent over the agent's socket, never on a command line, so the session
  key stays off the world-readable ``/proc/PID/cmdline``;
- standard streams: passed to the agent as file descriptors (``SCM_RIGHTS``): pipes for
  :meth:`exec`, the log files for :meth:`spawn`; the logs folder itself is not visible.

Network (``spec.network``):

- ``gateway`` (the default): the sandbox has its own network namespace (``--unshare-net``;
  bwrap brings ``lo`` up in it) where the agent listens on ``127.0.0.1:{GATEWAY_PORT}`` and
  relays to a unix socket bound from the host (``{runtime_dir}/net/gateway.sock``), where
  :class:`~rolloutd.sandbox.runtimes.gateway_relay.GatewayRelay` admits only the session's
  ``/s/{key}/`` routes. Inside, only loopback exists: the relay's port is the one thing
  listening, every other address is unreachable;
- ``none``: ``--unshare-net``, loopback only;
- ``host``: the host's network (the harness reaches the gateway on 127.0.0.1 directly).

With ``spec.image`` (a read-only root folder holding ``/tmp``, ``/proc``, ``/dev``,
``/home/agent`` and the workdir as mount points) the host's Python may not run inside, so each
command still runs in a bwrap of its own: joining, for ``gateway``, the network namespace of a
*network holder* (a bwrap over the host system running
:mod:`~rolloutd.sandbox.runtimes.relay_inside`) with ``nsenter --net`` (util-linux nsenter(1))
on a namespace fd the worker holds open.

Limits: ``max_processes`` and ``cpus`` through a cgroup per runtime, ``memory_mb`` as RLIMIT_AS
(per process; node reserves a lot of address space, keep it >= 8192 for node harnesses): see
:mod:`~rolloutd.sandbox.runtimes.limits`. The sandbox joins the cgroup before bwrap starts, so
the agent and every command inherit it; bwrap's two processes, the agent and one idle shim are
always there and count against ``max_processes``, plus one shim per running command.

Latency (``benchmarks/runtime.py``): a command costs a wake-up of an idle shim and a
``posix_spawn``, not a bwrap (5-8 ms) and an ``nsenter``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import json
import marshal
import os
import shutil
import socket
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import structlog

from rolloutd.errors import ConfigError, RuntimeStartError
from rolloutd.sandbox.config import npm_prefix
from rolloutd.sandbox.runtimes import agent_inside, relay_inside
from rolloutd.sandbox.runtimes.agent import AgentError, SandboxAgent
from rolloutd.sandbox.runtimes.base import LaunchError, Runtime, check_spec_network
from rolloutd.sandbox.runtimes.gateway_relay import GatewayRelay, rewrite_url
from rolloutd.sandbox.runtimes.limits import RuntimeCgroup, wrapper_argv
from rolloutd.sandbox.runtimes.process import RuntimeProcess
from rolloutd.types import RuntimeSpec

log = structlog.get_logger(__name__)

#: host folders bound read-only when they exist (and are real folders, not symlinks).
SYSTEM_DIRS = ("/usr", "/etc", "/opt")
#: top-level entries that are symlinks into /usr on merged-/usr systems, or folders otherwise.
SYSTEM_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
#: HOME inside the sandbox.
HOME_INSIDE = "/home/agent"
#: hostname inside the sandbox.
HOSTNAME = "rolloutd"
#: seconds the start probe (``true`` in a fresh sandbox) may take.
PROBE_TIMEOUT_S = 30.0
#: the loopback port where the session's gateway is reachable inside (``network: gateway``).
GATEWAY_PORT = 8300
#: where the network holder sees the host folder holding the gateway socket.
NET_DIR_INSIDE = "/run/rolloutd"
#: the gateway socket's file name in that folder.
GATEWAY_SOCKET = "gateway.sock"
#: where the sandbox agent's script, compiled (:func:`agent_pyc`), is bound read-only inside.
AGENT_INSIDE = "/run/rolloutd-agent.pyc"
#: seconds the sandbox may take to exit once its agent's control socket is closed.
AGENT_EXIT_S = 2.0


@functools.cache
def agent_pyc() -> bytes:
    """The agent's script compiled once per worker process, as a ``.pyc`` file's bytes.

    Python runs a ``.pyc`` given as the script (same interpreter: the sandbox runs
    ``sys.executable``), so no sandbox spends its start compiling the agent. Layout (PEP 552):
    magic number, flags 0b01 (hash-based, not checked), the source hash, the marshalled code.
    """
    source = Path(agent_inside.__file__).read_bytes()
    code = compile(source, AGENT_INSIDE.removesuffix("c"), "exec", dont_inherit=True)
    return (importlib.util.MAGIC_NUMBER + (1).to_bytes(4, "little")
            + importlib.util.source_hash(source) + marshal.dumps(code))


def python_dirs() -> list[Path]:
    """Folders of the worker's Python installation (base prefix and venv prefix)."""
    return sorted({Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()})


def system_binds() -> list[str]:
    """bwrap options binding the host system read-only (``/usr``, ``/etc``, ``/opt``, links)."""
    args: list[str] = []
    for d in SYSTEM_DIRS:
        if os.path.isdir(d) and not os.path.islink(d):
            args += ["--ro-bind", d, d]
    for d in SYSTEM_LINKS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    return args


class BwrapRuntime(Runtime):
    """A runtime whose commands run in bubblewrap sandboxes; see the module docstring.

    Raises:
        ConfigError: ``spec.workdir`` is not an absolute folder of its own.
    """

    type = "bwrap"
    spare_leader_on_term = True

    def __init__(self, spec: RuntimeSpec, runtime_id: str, root: Path, **kwargs: float) -> None:
        check_spec_network(spec, ("gateway", "none", "host"), "bwrap")
        if not spec.workdir.startswith("/") or spec.workdir in ("/", HOME_INSIDE, "/tmp"):
            raise ConfigError(f"runtime.workdir {spec.workdir!r} must be an absolute folder "
                              f"other than /, /tmp and {HOME_INSIDE}")
        super().__init__(spec, runtime_id, root, **kwargs)
        self.workdir = spec.workdir
        self.home = HOME_INSIDE
        self.bwrap = shutil.which("bwrap")
        self.net_dir = self.runtime_dir / "net"
        self.cgroup: RuntimeCgroup | None = None
        self.relay: GatewayRelay | None = None
        self._holder: RuntimeProcess | None = None
        self._agent: SandboxAgent | None = None
        self._netns_fd: int | None = None
        self._prefix: list[str] = []

    @property
    def holder_pgid(self) -> int | None:
        """Host process group of the sandbox holder (outer bwrap, its init, the agent and the
        agent's shims; with ``spec.image``: the network holder), while it runs."""
        return self._holder.pgid if self._holder is not None else None

    def _extra_ro_dirs(self) -> list[Path]:
        """Read-only binds beyond the system folders: Python, the npm prefix."""
        covered = [Path(d) for d in SYSTEM_DIRS]
        dirs: list[Path] = []
        for d in [*python_dirs(), npm_prefix()]:
            if d.is_dir() and not any(d.is_relative_to(c) for c in covered + dirs):
                dirs.append(d)
        return dirs

    def _python_bin(self) -> str:
        return str(Path(sys.executable).parent)

    def bwrap_args(self, cwd: str, *, holder: bool = False) -> list[str]:
        """The bwrap options (without the command) of one invocation.

        Args:
            cwd: the working folder inside the sandbox.
            holder: options of the persistent sandbox the agent runs in: its own network
                namespace unless ``network: host``, the agent's script and (``gateway``) the
                gateway socket's folder bound read-only.

        Returns:
            list[str]: ``bwrap`` and its options, ending with ``--``.
        """
        args = [self.bwrap or "bwrap", "--die-with-parent", "--unshare-pid", "--unshare-ipc",
                "--unshare-uts", "--hostname", HOSTNAME, "--cap-drop", "ALL"]
        if self.spec.network == "none" or (holder and self.spec.network == "gateway"):
            args.append("--unshare-net")
        # bwrap mounts in order: the root image first, then /tmp, then host folders (some may
        # live below /tmp), then the workspace and home.
        if self.spec.image:
            args += ["--ro-bind", self.spec.image, "/"]
        args += ["--perms", "1777", "--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev"]
        if not self.spec.image:
            args += system_binds()
            for d in self._extra_ro_dirs():
                args += ["--ro-bind", str(d), str(d)]
        args += ["--bind", str(self.workspace), self.workdir,
                 "--bind", str(self.host_home), self.home]
        if holder:
            args += ["--ro-bind", str(self.runtime_dir / "agent.pyc"), AGENT_INSIDE]
            if self.spec.network == "gateway":
                args += ["--ro-bind", str(self.net_dir), NET_DIR_INSIDE]
        if not self.spec.image:  # the root is bwrap's tmpfs: make it read-only too
            args += ["--remount-ro", "/"]
        args += ["--chdir", cwd, "--"]
        return args

    def _wrap(self, argv: list[str], cwd: str) -> tuple[list[str], Path | None]:
        return self._prefix + self.bwrap_args(cwd) + argv, None

    async def _start_process(self, argv: list[str], cwd: str, env: dict[str, str], *,
                             name: str, stdin: int, stdout: object,
                             stderr: object) -> RuntimeProcess:
        """Start a command through the sandbox agent (a bwrap per command with ``image``)."""
        if self._agent is None:
            return await super()._start_process(argv, cwd, env, name=name, stdin=stdin,
                                                 stdout=stdout, stderr=stderr)
        try:
            return await self._agent.run(argv, env, cwd, name=name, grace_s=self.grace_s,
                                         stdin=stdin, stdout=stdout, stderr=stderr)
        except AgentError as exc:
            raise LaunchError(exc.message) from exc

    def _pass_fds(self) -> tuple[int, ...]:
        return (self._netns_fd,) if self._netns_fd is not None else ()

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
            raise ConfigError("bwrap runtime: bubblewrap is not installed (apt-get install "
                              "bubblewrap)")
        if self.spec.max_processes or self.spec.cpus:
            self.cgroup = await asyncio.to_thread(
                RuntimeCgroup.create, self.runtime_id, max_processes=self.spec.max_processes,
                cpus=self.spec.cpus)
        prefix = wrapper_argv(self.cgroup.procs_files if self.cgroup else [],
                              self.spec.memory_mb)
        if not self.spec.image:
            # the agent answering proves the sandbox runs Python: no probe command needed
            await self._start_agent(prefix)
            return
        if self.spec.network == "gateway":
            await self._start_network()
            prefix += ["nsenter", f"--net=/proc/self/fd/{self._netns_fd}", "--"]
        self._prefix = prefix
        probe = await self.exec(["true"], timeout_s=PROBE_TIMEOUT_S)
        if probe.exit_code != 0:
            raise RuntimeStartError(
                f"bwrap runtime {self.runtime_id}: probe exited {probe.exit_code}: "
                f"{probe.stderr.strip()[-500:]}"
            )

    async def _start_agent(self, prefix: list[str]) -> None:
        """Start the sandbox (a bwrap running the agent) and wait until the agent is ready.

        Args:
            prefix: the cgroup/rlimit wrapper (:func:`wrapper_argv`): the holder, the agent and
                every command it forks are in the runtime's cgroup with its RLIMIT_AS.
        """
        agent_args = [str(GATEWAY_PORT), f"{NET_DIR_INSIDE}/{GATEWAY_SOCKET}"] \
            if self.spec.network == "gateway" else []
        if agent_args:
            self.relay = GatewayRelay(self.net_dir / GATEWAY_SOCKET)
            await self.relay.start()
        (self.runtime_dir / "agent.pyc").write_bytes(agent_pyc())
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        argv = [*prefix, *self.bwrap_args(self.workdir, holder=True), sys.executable, "-S", "-I",
                AGENT_INSIDE, str(theirs.fileno()), *agent_args]
        stderr_path = self.logs_dir / "agent.stderr"
        # the agent's own environment; each command gets its explicit one in its request
        env = {"PATH": self._base_env()["PATH"], "LANG": "C.UTF-8",
               "ROLLOUTD_RUNTIME_ID": self.runtime_id}
        try:
            with open(stderr_path, "ab") as err:
                proc = await asyncio.create_subprocess_exec(
                    *argv, env=env, stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL, stderr=err, start_new_session=True,
                    pass_fds=(theirs.fileno(),))
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self._holder = RuntimeProcess(proc, name="sandbox", spare_leader_on_term=True,
                                      grace_s=0.5)
        self._agent = SandboxAgent(ours, self.runtime_id)
        try:
            await self._agent.ready(PROBE_TIMEOUT_S)
        except (TimeoutError, AgentError) as exc:
            raise RuntimeStartError(
                f"bwrap runtime {self.runtime_id}: sandbox agent did not start ({exc}): "
                f"{stderr_path.read_text(errors='replace')[-500:]}") from exc

    async def cancel(self) -> None:
        """Terminate every process of the runtime, then SIGKILL any left in the sandbox.

        Processes whose shim was killed from inside the sandbox would otherwise survive until
        :meth:`stop`; the agent counts them (``sweep``).
        """
        await super().cancel()
        if self._agent is not None and not self._agent.closed:
            try:
                num_killed = await self._agent.sweep()
            except (AgentError, TimeoutError) as exc:
                log.warning("runtime_sweep_failed", runtime_id=self.runtime_id, error=str(exc))
                return
            if num_killed:
                log.info("runtime_swept", runtime_id=self.runtime_id, num_killed=num_killed)

    async def _start_network(self) -> None:
        """Start the gateway relay and the network holder; keep an fd on its namespace."""
        self.relay = GatewayRelay(self.net_dir / GATEWAY_SOCKET)
        await self.relay.start()
        info_r, info_w = os.pipe()
        argv = [self.bwrap or "bwrap", "--die-with-parent", "--unshare-net", "--unshare-pid",
                "--unshare-ipc", "--unshare-uts", "--hostname", HOSTNAME, "--cap-drop", "ALL",
                "--info-fd", str(info_w), "--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev",
                *system_binds()]
        for d in python_dirs():
            if not any(d.is_relative_to(c) for c in SYSTEM_DIRS):
                argv += ["--ro-bind", str(d), str(d)]
        argv += ["--ro-bind", str(self.net_dir), NET_DIR_INSIDE,
                 "--ro-bind", relay_inside.__file__, "/relay.py", "--",
                 sys.executable, "-S", "-I", "/relay.py", str(GATEWAY_PORT),
                 f"{NET_DIR_INSIDE}/{GATEWAY_SOCKET}"]
        stderr_path = self.logs_dir / "netns.stderr"
        try:
            with open(stderr_path, "ab") as err:
                proc = await asyncio.create_subprocess_exec(
                    *argv, env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                    stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                    stderr=err, start_new_session=True, pass_fds=(info_w,))
        finally:
            os.close(info_w)
        self._holder = RuntimeProcess(proc, name="netns", spare_leader_on_term=True,
                                      grace_s=0.5)
        try:
            assert proc.stdout is not None
            ready = await asyncio.wait_for(proc.stdout.readline(), PROBE_TIMEOUT_S)
            if ready.strip() != b"ready":
                raise RuntimeStartError(
                    f"bwrap runtime {self.runtime_id}: network holder did not start: "
                    f"{stderr_path.read_text(errors='replace')[-500:]}")
            info = json.loads(os.read(info_r, 65536).decode() or "{}")
            child = int(info["child-pid"])
            self._netns_fd = os.open(f"/proc/{child}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        except (TimeoutError, KeyError, ValueError, OSError) as exc:
            raise RuntimeStartError(f"bwrap runtime {self.runtime_id}: network holder failed: "
                                    f"{exc!r}") from exc
        finally:
            os.close(info_r)

    async def connect_gateway(self, *urls: str) -> list[str]:
        """Admit the session of ``urls`` at the relay; return them as seen inside.

        With ``network: gateway`` each URL becomes ``http://127.0.0.1:{GATEWAY_PORT}{path}``;
        with ``host`` or ``none`` the URLs are returned unchanged.

        Raises:
            ConfigError: the URLs do not share one gateway origin.
        """
        if self.spec.network != "gateway" or not urls:
            return list(urls)
        assert self.relay is not None, "runtime not started"
        origins = {urlsplit(u)[:2] for u in urls}
        if len(origins) != 1:
            raise ConfigError(f"gateway URLs must share one origin, got {sorted(origins)}")
        self.relay.attach(urls[0])
        return [rewrite_url(u, f"http://127.0.0.1:{GATEWAY_PORT}") for u in urls]

    async def _cleanup(self) -> None:
        began = time.monotonic()
        if self._agent is not None:  # the agent exits at EOF, and with it the sandbox
            self._agent.close()
            self._agent = None
            if self._holder is not None:
                await self._holder.wait(AGENT_EXIT_S)
        if self._holder is not None:
            await self._holder.terminate()
            self._holder = None
        if self.relay is not None:
            await self.relay.close()
        if self._netns_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._netns_fd)
            self._netns_fd = None
        if self.cgroup is not None:
            await asyncio.to_thread(self.cgroup.remove)
            self.cgroup = None
        log.debug("runtime_cleaned_up", runtime_id=self.runtime_id,
                  duration_s=round(time.monotonic() - began, 4))
