"""A fleet's worker process (``rolloutd worker --fleet F``): connect to Temporal, run the fleet
(:func:`rolloutd.workers.fleets.run_fleet`) until SIGTERM or SIGINT, then drain and exit 0; the
gRPC health service and the Prometheus metrics when configured; the event loop each fleet runs on.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib.util
from collections.abc import Callable

import structlog
from temporalio.client import Client

from rolloutd.backoff import Backoff, retry_async
from rolloutd.observability.exporter import start_process_metrics
from rolloutd.security.connection import connect_temporal
from rolloutd.settings import (
    CommonSettings,
    EvalSettings,
    GatewaySettings,
    SandboxSettings,
)
from rolloutd.task_queues import Fleet
from rolloutd.workers.fleets import run_fleet
from rolloutd.workers.health import serve_health

log = structlog.get_logger(__name__)

#: waits between a worker's attempts to reach Temporal at start (:func:`connect`): 0.5 s,
#: doubled, at most 2 s
CONNECT_BACKOFF = Backoff(initial_s=0.5, max_s=2.0)


async def connect(settings: CommonSettings) -> Client:
    """Connect to Temporal with rolloutd's data converter (pydantic; the payload codec when
    keys are configured) and transport security
    (:func:`rolloutd.security.connection.connect_temporal`).

    With ``settings.metrics_port`` set, the process's metrics start first (once per process:
    :func:`rolloutd.observability.exporter.start_process_metrics`) and the client runs on
    their Temporal runtime, so the SDK's metrics of every worker on this client reach that
    port (docs/metrics.md).

    Temporal not answering yet (a refused or unresolvable address: the SDK's ``RuntimeError``)
    is retried with :data:`CONNECT_BACKOFF` for ``settings.temporal_connect_wait_s``, with a
    ``temporal_connect_retry`` log line each time: the pods of a fresh deployment start in any
    order, and a worker that started before its frontend would otherwise exit.

    Raises:
        OSError: the metrics port cannot be bound.
        ConfigError: bad codec keys or TLS files.
        RuntimeError: Temporal did not answer within ``temporal_connect_wait_s`` (the SDK's
            last "Failed client connect" error).
    """
    runtime = None
    if settings.metrics_port:
        runtime = start_process_metrics(settings.metrics_port, settings.metrics_host).runtime
        log.info("metrics_serving", port=settings.metrics_port, host=settings.metrics_host)

    def retrying(attempt: int, left_s: float, error: BaseException) -> None:
        log.warning(
            "temporal_connect_retry",
            address=settings.temporal_address,
            attempt=attempt,
            left_s=round(left_s, 1),
            error=str(error),
        )

    def giving_up(attempts: int, error: BaseException) -> None:
        log.error(
            "temporal_connect_failed",
            address=settings.temporal_address,
            attempts=attempts,
            wait_s=settings.temporal_connect_wait_s,
            error=str(error),
        )

    return await retry_async(
        lambda: connect_temporal(settings, runtime=runtime),
        retry_on=(RuntimeError,),  # temporalio's "Failed client connect: ..."
        backoff=CONNECT_BACKOFF,
        timeout_s=settings.temporal_connect_wait_s,
        on_retry=retrying,
        on_give_up=giving_up,
    )


async def run_forever(fleet: Fleet, metrics_port: int | None = None) -> None:
    """Entry point of ``rolloutd worker --fleet FLEET``: run until SIGINT/SIGTERM, then drain
    (:mod:`rolloutd.workers.drain`) and return (exit code 0).

    With ``ROLLOUTD_HEALTH_PORT`` set, the process also serves ``grpc.health.v1``
    (:mod:`rolloutd.workers.health`): SERVING while its workers poll, NOT_SERVING from the
    signal on, while they drain. With a metrics port (``metrics_port``, else
    ``ROLLOUTD_METRICS_PORT``), it serves its Prometheus metrics there (docs/metrics.md).
    """
    import signal

    overrides = {} if metrics_port is None else {"metrics_port": metrics_port}
    settings = {"sandbox": SandboxSettings, "gateway": GatewaySettings, "eval": EvalSettings}.get(
        fleet, CommonSettings
    )(**overrides)
    if isinstance(settings, GatewaySettings):  # refuse before connecting or loading anything
        from rolloutd.proxy.http.server import check_admin_exposure

        check_admin_exposure(settings)
    client = await connect(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if not stop.is_set():
            log.info(
                "drain_signal", fleet=fleet, signal=sig.name, grace_s=settings.graceful_shutdown_s
            )
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    async with contextlib.AsyncExitStack() as stack:
        # exits in reverse: the fleet's workers drain first, while the health service already
        # answers NOT_SERVING, then the health service stops
        health = None
        if settings.health_port:
            health = await stack.enter_async_context(
                serve_health(fleet, settings.health_host, settings.health_port)
            )
        handle = await stack.enter_async_context(run_fleet(fleet, client, settings))
        if fleet == "gateway":
            freeze_startup_objects()
        if health is not None:
            await health.serving(handle.workers)
        await stop.wait()
        if health is not None:
            await health.shutting_down()


def freeze_startup_objects() -> int:
    """Move every object the process holds now out of the garbage collector's reach
    (``gc.freeze``, after a collection), for a process that has loaded what it keeps for
    its whole life: the gateway's tokenizer, chat templates, app and libraries are about
    280,000 tracked objects, and each full collection walked them all (a stall of every
    session's call: docs/measurements.md); frozen, a full collection walks the sessions' data only.
    Objects created afterwards are collected as before.

    Returns:
        The number of objects frozen (``gc.get_freeze_count()``).
    """
    gc.collect()
    gc.freeze()
    count = gc.get_freeze_count()
    log.info("startup_objects_frozen", num_objects=count)
    return count


def loop_factory(fleet: Fleet) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop a fleet's process runs on: uvloop for the gateway fleet when installed
    (a dependency on Linux and macOS), else asyncio's default (None).

    The gateway's loop serves every harness call, and uvloop's costs less per call
    (benchmarks/gateway_overhead.py); that fleet runs activities only. The workflows fleet
    keeps the default loop: its workflow code runs on Temporal's own deterministic loop inside
    the worker, and uvloop under it is not verified; sandbox and eval gain nothing from it.
    """
    if fleet == "gateway" and importlib.util.find_spec("uvloop") is not None:
        import uvloop

        return uvloop.new_event_loop
    return None


def run_process(fleet: Fleet, metrics_port: int | None = None) -> None:
    """``rolloutd worker --fleet FLEET [--metrics-port N]``: :func:`run_forever` on
    :func:`loop_factory`'s loop."""
    with asyncio.Runner(loop_factory=loop_factory(fleet)) as runner:
        runner.run(run_forever(fleet, metrics_port))
