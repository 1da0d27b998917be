"""`rolloutd rest` serves the Temporal namespace of ROLLOUTD_TEMPORAL_NAMESPACE (the Helm chart
sets it for every pod; the facade used to connect to `default` whatever it said)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid

import httpx
import pytest
from google.protobuf.duration_pb2 import Duration
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
from temporalio.service import RPCError

from rolloutd.processes import free_port, wait_port
from rolloutd.security.connection import connect_temporal

pytestmark = [pytest.mark.temporal, pytest.mark.timeout(120)]


async def start_tasks(address: str, namespace: str, n: int) -> None:
    """Register ``namespace`` and start ``n`` RolloutTaskWorkflow executions in it on a queue
    no worker polls, so they stay running."""
    client = await connect_temporal(address=address, namespace=namespace)
    await client.workflow_service.register_namespace(
        RegisterNamespaceRequest(
            namespace=namespace, workflow_execution_retention_period=Duration(seconds=86400)
        )
    )
    started, deadline = 0, time.monotonic() + 60
    while started < n:
        try:  # a new namespace reaches the frontend's cache within seconds
            await client.start_workflow(
                "RolloutTaskWorkflow",
                id=f"ns-task-{started}",
                task_queue=f"nobody-{uuid.uuid4().hex[:6]}",
            )
            started += 1
        except RPCError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


def test_rest_facade_reads_the_configured_namespace(temporal_server) -> None:
    namespace = f"rest-{uuid.uuid4().hex[:8]}"
    asyncio.run(start_tasks(temporal_server.address, namespace, 2))
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLOUTD_")}
    env.update(ROLLOUTD_TEMPORAL_NAMESPACE=namespace, ROLLOUTD_LOG_JSON="false")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rolloutd.cli",
            "rest",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--address",
            temporal_server.address,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_port("127.0.0.1", port, 60, proc)
        deadline = time.monotonic() + 30
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as http:
            while True:  # visibility (what count reads) trails the starts
                status = http.get("/rollout/status").json()
                if status["running_tasks"] == 2 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
        assert status["running_tasks"] == 2, status
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
