"""What the bwrap and container runtimes share: commands start through an exec server running
inside the runtime (:mod:`rolloutd.sandbox.runtimes.exec_server`), the gateway is reached
through a relay (:mod:`rolloutd.sandbox.runtimes.gateway_relay`), files the worker writes
for the runtime are handed to the user commands run as, and the runtime's folder is a sized
disk (``disk_mb``, :mod:`rolloutd.sandbox.runtimes.disk`) where the host can make one.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar
from urllib.parse import urlsplit

import structlog

from rolloutd.errors import ConfigError, ExecServerError, RuntimeStartError
from rolloutd.sandbox.runtimes.base import LaunchError, Runtime
from rolloutd.sandbox.runtimes.disk import RuntimeDisk, folder_bytes, sized_disks_available
from rolloutd.sandbox.runtimes.exec_server import ExecServerClient
from rolloutd.sandbox.runtimes.gateway_relay import GatewayRelay, rewrite_url
from rolloutd.sandbox.runtimes.process import RuntimeProcess

log = structlog.get_logger(__name__)

#: the relay's port inside a runtime with ``network: gateway``.
GATEWAY_PORT = 8300


class ExecServerRuntime(Runtime):
    """A runtime whose commands start through its exec server and reach the gateway through a
    relay.

    Args:
        *args, **kwargs: as :class:`Runtime`.

    Attributes:
        relay: the gateway relay, once started with ``network: gateway`` (else None).
        uid, gid: host ids :meth:`adopt` hands files to (set by the subclass).
        disk: the sized disk mounted at the runtime's folder (None: no ``disk_mb``, or a
            host that cannot make one: see :meth:`disk_reached`).
    """

    #: what the runtime's commands run in, for error messages ("sandbox", "container").
    enclosure: ClassVar[str] = "sandbox"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.relay: GatewayRelay | None = None
        self._exec_server: ExecServerClient | None = None
        self.uid = self.gid = -1
        self.disk: RuntimeDisk | None = None

    async def _make_runtime_dir(self) -> None:
        """Mount a file system of ``spec.disk_mb`` at the runtime's folder, where the host can.

        A host that has loop devices but cannot attach one more (a container's ``/dev`` holds
        only the loop devices there were when it started) falls back to the per-file limit and
        the measurement (:meth:`disk_reached`), with a warning.
        """
        if self.spec.disk_mb and sized_disks_available():
            try:
                self.disk = await asyncio.to_thread(
                    RuntimeDisk.create,
                    self.runtime_dir.parent,
                    self.runtime_id,
                    self.runtime_dir,
                    self.spec.disk_mb,
                )
            except RuntimeStartError as exc:
                log.warning(
                    "runtime_disk_unavailable", runtime_id=self.runtime_id, error=exc.message
                )

    async def _release_runtime_dir(self) -> None:
        if self.disk is not None:
            await asyncio.to_thread(self.disk.remove)
            self.disk = None

    def disk_reached(self) -> str | None:
        """``disk_mb`` in words when the runtime filled its disk, else None: its sized disk is
        full, or (a host without sized disks) its folder holds more than ``disk_mb``."""
        limit = self.spec.disk_mb
        if not limit or self.state != "started":
            return None
        if self.disk is not None:
            if self.disk.full():
                return f"disk_mb={limit} reached: the runtime's disk is full"
            return None
        used = folder_bytes(self.runtime_dir)
        if used >= limit * 2**20:
            return f"disk_mb={limit} reached: the runtime's files take {used >> 20} MiB"
        return None

    def _adopts(self) -> bool:
        """Whether :meth:`adopt` hands files to :attr:`uid`/:attr:`gid` (False: files stay
        the worker's)."""
        return self.uid >= 0

    def _file_owner(self) -> tuple[int, int] | None:
        """:attr:`uid`/:attr:`gid` when :meth:`_adopts`, else None."""
        return (self.uid, self.gid) if self._adopts() else None

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
        """Start a command through the exec server."""
        if self._exec_server is None:
            raise LaunchError(f"runtime {self.runtime_id}: the {self.enclosure} is not running")
        try:
            return await self._exec_server.run(
                argv,
                env,
                cwd,
                name=name,
                grace_s=self.grace_s,
                stdin=stdin,
                stdout=stdout,
                stderr=stderr,
            )
        except ExecServerError as exc:
            raise LaunchError(exc.message) from exc

    async def cancel(self) -> None:
        """Terminate every process of the runtime, then have the exec server (the sandbox's
        pid 1) SIGKILL every other process inside, shims included (``sweep``).

        This does not depend on any shim being alive: processes whose shim was killed from
        inside the runtime, and daemons that left their process group, are the exec server's
        to kill as the PID namespace's init.
        """
        await super().cancel()
        if self._exec_server is not None and not self._exec_server.closed:
            try:
                num_killed = await self._exec_server.sweep()
            except (ExecServerError, TimeoutError) as exc:
                log.warning("runtime_sweep_failed", runtime_id=self.runtime_id, error=str(exc))
                return
            if num_killed:
                log.info("runtime_swept", runtime_id=self.runtime_id, num_killed=num_killed)

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
