"""The standard gRPC health service (``grpc.health.v1.Health``) of a worker process.

Kubernetes probes a pod with it (``grpc:`` liveness/readiness probes), as do load balancers
and ``grpc_health_probe``. Each worker process serves two names: the overall service ``""``
and its fleet's, ``rolloutd-{fleet}`` (the fleet's shared task queue, e.g.
``rolloutd-gateway``). Both answer NOT_SERVING while the process starts, SERVING while every
one of its Temporal workers runs (polls its task queue), and NOT_SERVING for good once the
process begins to shut down or a worker stopped (protocol: grpc/grpc doc/health-checking.md).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from temporalio.worker import Worker

from rolloutd.errors import ConfigError

log = structlog.get_logger(__name__)

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
#: how often a running process checks that its workers still run; a probe's period is 10 s
#: by default in Kubernetes, so a stopped worker shows within a fraction of it
WATCH_INTERVAL_S = 1.0


def service_name(fleet: str) -> str:
    """The health service name of a fleet: ``rolloutd-{fleet}``."""
    return f"rolloutd-{fleet}"


class WorkerHealth:
    """The health service of one worker process.

    Args:
        fleet: the process's fleet (``workflows``, ``sandbox``, ``gateway``, ``eval``).
        host: bind address (``0.0.0.0`` for a pod's probes).
        port: bind TCP port; 0 picks a free one (see :attr:`port` after :meth:`start`).
    """

    def __init__(self, fleet: str, host: str, port: int) -> None:
        self.fleet = fleet
        self.host = host
        self.port = port
        self.servicer = health_aio.HealthServicer()
        self._server: grpc.aio.Server | None = None
        self._watch: asyncio.Task[None] | None = None
        self._shutting_down = False

    async def start(self) -> WorkerHealth:
        """Listen, answering NOT_SERVING until :meth:`serving`.

        Raises:
            ConfigError: the port cannot be bound.
        """
        for name in ("", service_name(self.fleet)):
            await self.servicer.set(name, NOT_SERVING)
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)
        try:
            bound = server.add_insecure_port(f"{self.host}:{self.port}")
        except RuntimeError as e:  # grpcio raises when it cannot bind (older ones return 0)
            bound, reason = 0, str(e)
        else:
            reason = "address in use or not available"
        if not bound:
            raise ConfigError(f"health_port: cannot listen on {self.host}:{self.port} ({reason})")
        self.port = bound
        await server.start()
        self._server = server
        log.info("health_started", fleet=self.fleet, host=self.host, port=self.port)
        return self

    async def serving(self, workers: Sequence[Worker]) -> None:
        """Answer SERVING once every one of ``workers`` runs, and NOT_SERVING for good as
        soon as one of them stops (returns at once; a task watches them)."""
        self._watch = asyncio.create_task(self._watch_workers(list(workers)))

    async def _watch_workers(self, workers: list[Worker]) -> None:
        # a worker marks itself running inside its own start task, after ``async with``
        # entered it; a worker whose polling failed for good shuts down. The SDK offers no
        # callback for either, so both are polled.
        while not all(w.is_running for w in workers):
            if any(w.is_shutdown for w in workers):
                break
            await asyncio.sleep(0.05)
        else:
            for name in ("", service_name(self.fleet)):
                await self.servicer.set(name, SERVING)
            log.info("health_serving", fleet=self.fleet)
            while all(w.is_running for w in workers):
                await asyncio.sleep(WATCH_INTERVAL_S)
        if self._shutting_down:
            return  # the process drains its workers: not a failure
        stopped = [w.task_queue for w in workers if not w.is_running]
        log.warning("health_worker_stopped", fleet=self.fleet, task_queues=stopped)
        await self.servicer.enter_graceful_shutdown()

    async def shutting_down(self) -> None:
        """Answer NOT_SERVING for good (the process drains its workers next)."""
        self._shutting_down = True
        await self.servicer.enter_graceful_shutdown()
        log.info("health_not_serving", fleet=self.fleet)

    async def stop(self, grace_s: float = 1.0) -> None:
        """Stop the watcher and the server (open Watch streams end)."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        if self._server is not None:
            await self._server.stop(grace_s)


@contextlib.asynccontextmanager
async def serve_health(fleet: str, host: str, port: int) -> AsyncIterator[WorkerHealth]:
    """Run a :class:`WorkerHealth` for the block; NOT_SERVING, then stopped, on exit."""
    health = await WorkerHealth(fleet, host, port).start()
    try:
        yield health
    finally:
        await health.shutting_down()
        await health.stop()
