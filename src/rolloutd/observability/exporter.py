"""A worker process's metrics port: prometheus-client's metrics and the Temporal SDK's, on
one port.

The Temporal SDK exports its own metrics (and the workflow metrics of
:mod:`rolloutd.observability.names`) through its Prometheus exporter, which serves its own
socket: ``temporalio.runtime.Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(
bind_address=...)))`` (docs.temporal.io/develop/python/observability). Here it binds a
loopback port of its own, and :class:`TemporalMetrics` re-exports its scrape through
prometheus-client's registry, so a process has one scrape address
(``ROLLOUTD_METRICS_PORT``), and the gateway's ``/metrics`` shows its process's Temporal
metrics too. The SDK's exporter must exist before the process's Temporal client does: the
client is connected on its runtime (:func:`rolloutd.workers.connect`).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client import REGISTRY, start_http_server
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from rolloutd.observability import names

#: how long a scrape waits for the SDK's exporter on loopback, s
SDK_SCRAPE_TIMEOUT_S = 5.0


class TemporalMetrics(Collector):
    """Re-exports the Temporal SDK exporter's metrics at each scrape.

    Args:
        url: the SDK exporter's scrape URL (``http://127.0.0.1:{port}/metrics``).

    Raises (at collection):
        httpx.HTTPError: the exporter did not answer; the scrape fails with it, loudly.
    """

    def __init__(self, url: str) -> None:
        self.url = url

    def collect(self) -> Iterator[Metric]:
        text = httpx.get(self.url, timeout=SDK_SCRAPE_TIMEOUT_S).raise_for_status().text
        yield from text_string_to_metric_families(text)

    def describe(self) -> Iterator[Metric]:
        # its names are the SDK's to choose: nothing to check against the registry's
        return iter(())


@dataclass
class ProcessMetrics:
    """The metrics of one process: the SDK's runtime and exporter, and the port serving
    both.

    Attributes:
        runtime: the Temporal runtime every client of the process is connected on.
        sdk_url: the SDK exporter's own scrape URL (loopback).
        port: the process's metrics port (prometheus-client's HTTP server).
    """

    runtime: Runtime
    sdk_url: str
    port: int
    server: Any = None
    thread: Any = None

    @property
    def url(self) -> str:
        """The process's scrape URL on loopback."""
        return f"http://127.0.0.1:{self.port}/metrics"

    def stop(self) -> None:
        """Stop serving the metrics port (the SDK's exporter lives with the runtime)."""
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


_lock = threading.Lock()
_process: ProcessMetrics | None = None


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sdk_runtime(bind_address: str) -> Runtime:
    """A Temporal runtime whose Prometheus exporter serves on ``bind_address``
    (``host:port``), with rolloutd's bucket bounds for the phase histogram (seconds; the
    SDK's own latencies stay in milliseconds, as its docs name them)."""
    return Runtime(
        telemetry=TelemetryConfig(
            metrics=PrometheusConfig(
                bind_address=bind_address,
                # counters named as prometheus-client names them, so the re-exported scrape
                # (TemporalMetrics) shows the names the SDK's exporter serves
                counters_total_suffix=True,
                histogram_bucket_overrides={
                    names.SESSION_PHASE_SECONDS: list(names.PHASE_BUCKETS_S),
                    names.GROUP_STALENESS: list(names.STALENESS_BUCKETS),
                },
            )
        )
    )


def start_process_metrics(port: int, host: str = "0.0.0.0") -> ProcessMetrics:
    """Start this process's metrics (once; later calls return the first one's).

    Args:
        port: the metrics port (> 0): prometheus-client's registry, the Temporal SDK's
            metrics included, served at ``http://{host}:{port}/metrics``.
        host: bind address of the metrics port.

    Returns:
        The process's :class:`ProcessMetrics`; connect Temporal clients on its ``runtime``.

    Raises:
        ValueError: ``port`` is not in 1..65535.
        OSError: the port cannot be bound.
    """
    global _process
    if not 0 < port < 65536:
        raise ValueError(f"metrics port must be in 1..65535, got {port}")
    with _lock:
        if _process is not None:
            return _process
        sdk_port = _free_loopback_port()
        runtime = sdk_runtime(f"127.0.0.1:{sdk_port}")
        sdk_url = f"http://127.0.0.1:{sdk_port}/metrics"
        server, thread = start_http_server(port, addr=host)
        REGISTRY.register(TemporalMetrics(sdk_url))
        _process = ProcessMetrics(
            runtime=runtime, sdk_url=sdk_url, port=port, server=server, thread=thread
        )
        return _process


def process_metrics() -> ProcessMetrics | None:
    """This process's metrics when :func:`start_process_metrics` ran, else None."""
    return _process
