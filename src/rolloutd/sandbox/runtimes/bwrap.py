"""The ``bwrap`` runtime: bubblewrap sandboxes over a read-only view of the host system.

Each command runs in its own ``bwrap`` invocation (flags: bwrap(1), bubblewrap 0.8):

- mount namespace: the host's ``/usr``, ``/etc``, ``/opt`` (and ``/bin``, ``/lib*`` as symlinks
  or binds), the Python installation and the npm prefix of harness CLIs bound read-only
  (``--ro-bind``) at their host paths, or else ``spec.image`` as a read-only root folder (it
  must already hold ``/tmp``, ``/proc``, ``/dev``, ``/home/agent`` and the workdir as mount
  points); the workspace bound writable (``--bind``) at ``spec.workdir``; a private HOME at
  ``/home/agent``; private ``/tmp`` (``--tmpfs``), ``/proc`` (``--proc``) and ``/dev``
  (``--dev``); the root itself (bwrap's tmpfs) is made read-only (``--remount-ro /``).
  Nothing else of the host is visible;
- PID, IPC and UTS namespaces (``--unshare-pid --unshare-ipc --unshare-uts``): the command is
  pid 2 under bwrap's init; killing the outer bwrap kills the whole namespace, so no process
  survives teardown, not even one that called ``setsid``;
- all capabilities dropped (``--cap-drop ALL``): as root without it, the sandbox could remount
  the read-only system writable; bwrap always sets ``PR_SET_NO_NEW_PRIVS``, so set-uid
  programs do not regain them;
- ``--die-with-parent``: the sandbox dies with the worker;
- environment: bwrap is started with an explicit environment (the equivalent of
  ``--clearenv`` plus ``--setenv``): the base variables, ``spec.env`` and the call's ``env``,
  nothing of the worker's; this also keeps the session key off the world-readable command line.

Network (``spec.network``):

- ``gateway`` (the default): the runtime owns one network namespace, created at start by a
  *network holder*, a bwrap with ``--unshare-net`` (bwrap brings ``lo`` up in it) running
  :mod:`~rolloutd.sandbox.runtimes.relay_inside` on ``127.0.0.1:{GATEWAY_PORT}``, which relays to
  a unix socket bound from the host (``{runtime_dir}/net/gateway.sock``), where
  :class:`~rolloutd.sandbox.runtimes.gateway_relay.GatewayRelay` admits only the session's
  ``/s/{key}/`` routes. Every command joins that namespace with ``nsenter --net`` (util-linux
  nsenter(1)) on a namespace fd the worker holds open (so a recycled pid can never redirect it),
  then starts its bwrap without ``--unshare-net``. Inside, only loopback exists: the relay's
  port is the one thing listening, every other address is unreachable;
- ``none``: ``--unshare-net`` per command, loopback only;
- ``host``: the host's network (the harness reaches the gateway on 127.0.0.1 directly).

Limits: ``max_processes`` and ``cpus`` through a cgroup per runtime, ``memory_mb`` as RLIMIT_AS
(per process; node reserves a lot of address space, keep it >= 8192 for node harnesses): see
:mod:`~rolloutd.sandbox.runtimes.limits`. Each running command also holds bwrap's own two
processes (outer bwrap and its init), which count against ``max_processes``.

No ``--new-session``: it would move the command out of the outer process group, and the command
has no terminal to attack (stdin is /dev/null or a pipe).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import structlog

from rolloutd.errors import ConfigError, RuntimeStartError
from rolloutd.sandbox.config import npm_prefix
from rolloutd.sandbox.runtimes import relay_inside
from rolloutd.sandbox.runtimes.base import Runtime, check_spec_network
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
        self._netns_fd: int | None = None
        self._prefix: list[str] = []

    @property
    def holder_pgid(self) -> int | None:
        """Process group of the network holder (``network: gateway``), while it runs."""
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

    def bwrap_args(self, cwd: str) -> list[str]:
        """The bwrap options (without the command) of one invocation.

        Args:
            cwd: the working folder inside the sandbox.

        Returns:
            list[str]: ``bwrap`` and its options, ending with ``--``.
        """
        args = [self.bwrap or "bwrap", "--die-with-parent", "--unshare-pid", "--unshare-ipc",
                "--unshare-uts", "--hostname", HOSTNAME, "--cap-drop", "ALL"]
        if self.spec.network == "none":
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
        if not self.spec.image:  # the root is bwrap's tmpfs: make it read-only too
            args += ["--remount-ro", "/"]
        args += ["--chdir", cwd, "--"]
        return args

    def _wrap(self, argv: list[str], cwd: str) -> tuple[list[str], Path | None]:
        return self._prefix + self.bwrap_args(cwd) + argv, None

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
