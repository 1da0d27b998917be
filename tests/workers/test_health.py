"""A worker process serves grpc.health.v1: SERVING while its Temporal worker polls,
NOT_SERVING once it begins to shut down."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from rolloutd.stack import free_port, stop_process

pytestmark = pytest.mark.temporal

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def _status(stub: health_pb2_grpc.HealthStub, service: str) -> int | None:
    try:
        return stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=2).status
    except grpc.RpcError:
        return None  # not listening yet


def test_worker_process_serves_grpc_health(temporal_server, tmp_path: Path) -> None:
    port = free_port()
    env = dict(
        os.environ,
        ROLLOUTD_TEMPORAL_ADDRESS=temporal_server.address,
        ROLLOUTD_HEALTH_PORT=str(port),
        ROLLOUTD_HEALTH_HOST="127.0.0.1",
        ROLLOUTD_HOME=str(tmp_path),
        ROLLOUTD_LOG_JSON="false",
        PYTHONPATH=os.pathsep.join(sys.path),
    )
    log = open(tmp_path / "worker.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rolloutd.cli", "worker", "--fleet", "workflows"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        deadline = time.monotonic() + 60
        while _status(stub, "") != SERVING:
            assert proc.poll() is None, (tmp_path / "worker.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "worker.log").read_text()
            time.sleep(0.2)
        assert _status(stub, "rolloutd-workflows") == SERVING
        with pytest.raises(grpc.RpcError) as unknown:
            stub.Check(health_pb2.HealthCheckRequest(service="rolloutd-gateway"), timeout=2)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND

        # a watch opened while serving sees NOT_SERVING as the process starts to shut down
        watch = stub.Watch(health_pb2.HealthCheckRequest(service="rolloutd-workflows"), timeout=60)
        assert next(watch).status == SERVING
        os.kill(proc.pid, signal.SIGTERM)
        assert next(watch).status == NOT_SERVING
        assert proc.wait(timeout=60) == 0
    finally:
        channel.close()
        stop_process(proc)
        log.close()
