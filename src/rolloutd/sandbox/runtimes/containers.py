"""The ``apptainer`` runtime: one long-lived Apptainer instance per runtime.

(The ``podman`` and ``docker`` runtimes are :mod:`rolloutd.sandbox.runtimes.podman`.)

It keeps one instance for the runtime's life, runs every command in it (``apptainer exec
instance://NAME``), and stops it at stop. Network ``gateway`` and ``none`` start the instance
without a network but loopback (``--net --network none``),
bind the runtime's ``net`` folder at ``/run/rolloutd`` and run the sandbox-side relay
(:mod:`~rolloutd.sandbox.runtimes.relay_inside`, copied there) with the image's ``python3``;
the host side is the same :class:`~rolloutd.sandbox.runtimes.gateway_relay.GatewayRelay` as
bwrap's. The image must therefore provide ``python3`` for ``network: gateway``.

Environment: never on the command line, and never the CLI's own. Apptainer reads
``APPTAINERENV_NAME`` from its own environment into the container's ``NAME`` even with
``--cleanenv`` (Apptainer user guide, "Environment and Metadata"). The start command line puts
``--`` before the image: what follows is never read as an option.

Flags used (checked by tests/sandbox/test_runtime_containers.py against the CLI reference):
``apptainer instance start`` (https://apptainer.org/docs/user/latest/cli/
apptainer_instance_start.html): ``--containall`` (own PID/IPC namespaces, no host HOME, /tmp
or /dev), ``--no-home``, ``--cleanenv``, ``--net --network none``, ``--fakeroot`` (where the
host allows it; ``RuntimeSpec.env`` cannot ask for it, the worker's settings do), ``--bind
SRC:DST[:ro]``, ``--pids-limit``, ``--memory``, ``--cpus``, ``--no-privs`` (a root worker's:
no capability inside); ``apptainer exec`` (apptainer_exec.html): ``--cleanenv``,
``--no-privs`` (likewise), ``--pwd``; ``apptainer instance stop``
(apptainer_instance_stop.html).

Processes: killing the CLI process group ends ``apptainer exec`` (the command is the exec'd
starter's own process).
"""

from __future__ import annotations

import abc
import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import structlog

from rolloutd.errors import ConfigError, RuntimeStartError
from rolloutd.sandbox.runtimes import podman_images, relay_inside
from rolloutd.sandbox.runtimes.base import Runtime, check_spec_network
from rolloutd.sandbox.runtimes.gateway_relay import GatewayRelay, rewrite_url
from rolloutd.types import RuntimeSpec

log = structlog.get_logger(__name__)

#: HOME inside containers.
HOME_INSIDE = "/home/agent"
#: where the runtime's ``net`` folder (gateway socket, relay script) is bound inside.
NET_DIR_INSIDE = "/run/rolloutd"
#: the loopback port where the gateway is reachable inside (as for bwrap).
GATEWAY_PORT = 8300
#: seconds container start and stop may take.
CONTAINER_TIMEOUT_S = 120.0


class ContainerRuntime(Runtime):
    """Shared lifecycle of the container runtimes: see the module docstring."""

    spare_leader_on_term = False
    binary_name = "container"

    def __init__(self, spec: RuntimeSpec, runtime_id: str, root: Path, **kwargs: Any) -> None:
        check_spec_network(spec, ("gateway", "none", "host"), self.type)
        if not spec.image:
            raise ConfigError(f"runtime.image is required for the {self.type} runtime")
        if not spec.workdir.startswith("/"):
            raise ConfigError(f"runtime.workdir {spec.workdir!r} must be absolute")
        super().__init__(spec, runtime_id, root, **kwargs)
        self.workdir = spec.workdir
        self.home = HOME_INSIDE
        self.binary = shutil.which(self.binary_name) or self.binary_name
        self.name = f"rolloutd-{runtime_id}"
        self.net_dir = self.runtime_dir / "net"
        self.relay: GatewayRelay | None = None

    # -- to implement ---------------------------------------------------------------------
    @abc.abstractmethod
    def start_argv(self) -> list[str]:
        """The command line that starts the runtime's container."""

    @abc.abstractmethod
    def stop_argv(self) -> list[str]:
        """The command line that removes the runtime's container."""

    def _base_env(self) -> dict[str, str]:
        return {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": self.home,
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
            "ROLLOUTD_RUNTIME_ID": self.runtime_id,
        }

    # -- lifecycle ------------------------------------------------------------------------
    async def _run_cli(self, argv: list[str]) -> tuple[int, str]:
        return await podman_images.cli(*argv, timeout_s=CONTAINER_TIMEOUT_S)

    async def _check(self) -> None:
        if shutil.which(self.binary_name) is None:
            raise ConfigError(f"{self.type} runtime: `{self.binary_name}` is not installed")
        self.net_dir.mkdir(parents=True, exist_ok=True)
        shutil.copy(relay_inside.__file__, self.net_dir / "relay.py")
        if self.spec.network == "gateway":
            self.relay = GatewayRelay(self.net_dir / "gateway.sock")
            await self.relay.start()
        code, out = await self._run_cli(self.start_argv())
        if code != 0:
            raise RuntimeStartError(
                f"{self.type} runtime {self.runtime_id}: start exited {code}: {out.strip()[-500:]}"
            )
        if self.spec.network == "gateway":
            relay = await self.spawn(
                [
                    "python3",
                    f"{NET_DIR_INSIDE}/relay.py",
                    str(GATEWAY_PORT),
                    f"{NET_DIR_INSIDE}/gateway.sock",
                ],
                name="relay",
            )
            self._relay_process = relay

    async def connect_gateway(self, *urls: str) -> list[str]:
        """As :meth:`BwrapRuntime.connect_gateway`: admit the session, rewrite its URLs."""
        if self.spec.network != "gateway" or not urls:
            return list(urls)
        assert self.relay is not None, "runtime not started"
        self.relay.attach(urls[0])
        return [rewrite_url(u, f"http://127.0.0.1:{GATEWAY_PORT}") for u in urls]

    async def cancel(self) -> None:
        """Terminate the runtime's commands, then kill every process left in the instance:
        ``kill -KILL -1`` run inside reaches every process of the instance's PID namespace
        but the instance's init and itself (kill(2)), daemons whose ``apptainer exec`` ended
        included. Not run here (apptainer cannot be installed on the test machine)."""
        await super().cancel()
        if self.state != "started":
            return
        result = await self.exec(["/bin/sh", "-c", "kill -KILL -1 2>/dev/null; exit 0"])
        if result.exit_code != 0:
            log.warning(
                "runtime_sweep_failed", runtime_id=self.runtime_id, error=result.stderr[-300:]
            )

    async def _cleanup(self) -> None:
        code, out = await self._run_cli(self.stop_argv())
        if code != 0:
            log.warning(
                "container_stop_failed",
                runtime=self.type,
                name=self.name,
                output=out.strip()[-300:],
            )
        if self.relay is not None:
            await self.relay.close()

    def limit_flags(self) -> list[str]:
        """``--pids-limit``, ``--memory``, ``--cpus`` from the spec (same names in both CLIs)."""
        flags: list[str] = []
        if self.spec.max_processes:
            flags += ["--pids-limit", str(self.spec.max_processes)]
        if self.spec.memory_mb:
            flags += ["--memory", f"{self.spec.memory_mb}m"]
        if self.spec.cpus:
            flags += ["--cpus", str(self.spec.cpus)]
        return flags


class ApptainerRuntime(ContainerRuntime):
    """Apptainer instances from a SIF image; see the module docstring.

    ``fakeroot``: add ``--fakeroot`` (user namespace with root mapping, where /etc/subuid
    allows it). The binary is found with spython's ``check_install``.
    """

    type = "apptainer"
    binary_name = "apptainer"

    def __init__(
        self,
        spec: RuntimeSpec,
        runtime_id: str,
        root: Path,
        *,
        fakeroot: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(spec, runtime_id, root, **kwargs)
        self.fakeroot = fakeroot

    def start_argv(self) -> list[str]:
        """``apptainer instance start`` with isolation, binds and limits."""
        argv = [self.binary, "instance", "start", "--containall", "--no-home", "--cleanenv"]
        argv += self._privilege_flags()
        if self.spec.network in ("gateway", "none"):
            argv += ["--net", "--network", "none"]
        if self.fakeroot:
            argv.append("--fakeroot")
        argv += [
            "--bind",
            f"{self.workspace}:{self.workdir}",
            "--bind",
            f"{self.host_home}:{self.home}",
            "--bind",
            f"{self.net_dir}:{NET_DIR_INSIDE}:ro",
            *self.limit_flags(),
            "--",  # what follows is never an option, whatever the task named
            str(self.spec.image),
            self.name,
        ]
        return argv

    def _privilege_flags(self) -> list[str]:
        """``--no-privs`` under a root worker (without ``fakeroot``): the container's root
        keeps no capability and cannot regain one (Apptainer user guide, "Security Options":
        it drops every capability and sets no_new_privs); an unprivileged worker has none to
        drop."""
        return ["--no-privs"] if os.geteuid() == 0 and not self.fakeroot else []

    def stop_argv(self) -> list[str]:
        return [self.binary, "instance", "stop", self.name]

    def _wrap(self, argv: list[str], cwd: str) -> tuple[list[str], Path | None]:
        return [
            self.binary,
            "exec",
            "--cleanenv",
            *self._privilege_flags(),
            "--pwd",
            cwd,
            f"instance://{self.name}",
            *argv,
        ], None

    def _host_env(
        self, argv: list[str], env: dict[str, str], host_argv: list[str]
    ) -> dict[str, str]:
        host = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
        return host | {f"APPTAINERENV_{k}": v for k, v in env.items()}

    async def _check(self) -> None:
        from spython.utils import check_install

        if not await asyncio.to_thread(check_install, self.binary_name):
            raise ConfigError("apptainer runtime: `apptainer` is not installed")
        await super()._check()
