"""The ``bwrap`` runtime: bubblewrap sandboxes over a read-only view of the host system.

Each command runs in its own ``bwrap`` invocation:

- mount namespace: the host's ``/usr``, ``/etc``, ``/opt`` (and ``/bin``, ``/lib*`` as symlinks
  or binds), the Python installation and the npm prefix of harness CLIs bound read-only at their
  host paths, or else ``spec.image`` as a read-only root folder (it must already hold
  ``/tmp``, ``/proc``, ``/dev``, ``/home/agent`` and the workdir as mount points); the
  workspace bound writable at ``spec.workdir``; a private HOME at ``/home/agent``; private
  ``/tmp`` (tmpfs), ``/proc`` and ``/dev``;
- PID, IPC and UTS namespaces (``--unshare-pid --unshare-ipc --unshare-uts``): the command is
  pid 2 under bwrap's init; killing the outer bwrap kills the whole namespace, so no process
  survives teardown, not even one that called ``setsid``;
- all capabilities dropped (``--cap-drop ALL``): as root without it, the sandbox could remount
  the read-only system writable;
- ``--die-with-parent``: the sandbox dies with the worker;
- network: ``host`` shares the host's network (the harness reaches the gateway on 127.0.0.1);
  ``none`` adds ``--unshare-net`` (loopback only); ``gateway`` is not built yet;
- environment: bwrap itself is started with an explicit environment (the equivalent of
  ``--clearenv`` plus ``--setenv``), which keeps secrets such as the session key out of the
  world-readable command line.

No ``--new-session``: it would move the command out of the outer process group, and the command
has no terminal to attack (stdin is /dev/null or a pipe).

Limits: ``memory_mb`` is RLIMIT_AS through ``prlimit`` (per process; node reserves a lot of
address space, so keep it >= 8192 for node harnesses). ``max_processes`` is not enforced:
RLIMIT_NPROC counts every process of the user on the host (we run as root), so it needs a pids
cgroup, which is left for later.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import structlog

from rolloutd.errors import ConfigError, RuntimeStartError
from rolloutd.sandbox.config import npm_prefix
from rolloutd.sandbox.runtimes.base import Runtime, check_spec_network
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


def python_dirs() -> list[Path]:
    """Folders of the worker's Python installation (base prefix and venv prefix)."""
    return sorted({Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()})


class BwrapRuntime(Runtime):
    """A runtime whose commands run in bubblewrap sandboxes; see the module docstring.

    Raises:
        ConfigError: ``spec.network`` is ``gateway``, or ``spec.workdir`` is not absolute.
    """

    type = "bwrap"
    spare_leader_on_term = True

    def __init__(self, spec: RuntimeSpec, runtime_id: str, root: Path, **kwargs: float) -> None:
        check_spec_network(spec, ("host", "none"), "bwrap")
        if not spec.workdir.startswith("/") or spec.workdir in ("/", HOME_INSIDE, "/tmp"):
            raise ConfigError(f"runtime.workdir {spec.workdir!r} must be an absolute folder "
                              f"other than /, /tmp and {HOME_INSIDE}")
        super().__init__(spec, runtime_id, root, **kwargs)
        self.workdir = spec.workdir
        self.home = HOME_INSIDE
        self.bwrap = shutil.which("bwrap")

    def _extra_ro_dirs(self) -> list[Path]:
        """Read-only binds beyond the system folders: Python, the npm prefix."""
        covered = [Path(d) for d in SYSTEM_DIRS]
        dirs = []
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
        args += ["--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev"]
        if not self.spec.image:
            for d in SYSTEM_DIRS:
                if os.path.isdir(d) and not os.path.islink(d):
                    args += ["--ro-bind", d, d]
            for d in SYSTEM_LINKS:
                if os.path.islink(d):
                    args += ["--symlink", os.readlink(d), d]
                elif os.path.isdir(d):
                    args += ["--ro-bind", d, d]
            for d in self._extra_ro_dirs():
                args += ["--ro-bind", str(d), str(d)]
        args += ["--bind", str(self.workspace), self.workdir,
                 "--bind", str(self.host_home), self.home,
                 "--chdir", cwd, "--"]
        return args

    def _wrap(self, argv: list[str], cwd: str) -> tuple[list[str], Path | None]:
        prefix = ["prlimit", f"--as={self.spec.memory_mb * 2**20}", "--"] \
            if self.spec.memory_mb else []
        # prlimit runs outside, so the limit is inherited by bwrap and everything inside.
        return prefix + self.bwrap_args(cwd) + argv, None

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

    async def _check(self) -> None:
        if self.bwrap is None:
            raise ConfigError("bwrap runtime: bubblewrap is not installed (apt-get install "
                              "bubblewrap)")
        if self.spec.max_processes:
            log.warning("runtime_limit_not_enforced", runtime=self.type, limit="max_processes")
        probe = await self.exec(["true"], timeout_s=PROBE_TIMEOUT_S)
        if probe.exit_code != 0:
            raise RuntimeStartError(
                f"bwrap runtime {self.runtime_id}: probe exited {probe.exit_code}: "
                f"{probe.stderr.strip()[-500:]}"
            )
