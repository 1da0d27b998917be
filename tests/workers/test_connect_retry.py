"""A worker started before Temporal answers waits for it (the pods of a fresh deployment
start in any order; a worker exited "connection refused" when its Temporal frontend was not up
yet).

The late frontend is the real dev server behind a TCP relay that starts listening only after
a delay, so the first attempts are refused exactly as a pod's are before Temporal's starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
import structlog
from temporalio.api.workflowservice.v1 import GetSystemInfoRequest

from rolloutd.processes import free_port
from rolloutd.settings import CommonSettings
from rolloutd.workers import connect

pytestmark = [pytest.mark.temporal, pytest.mark.timeout(120)]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def _relay_after(delay_s: float, port: int, target: str) -> asyncio.Server:
    """Listen on ``port`` after ``delay_s``, relaying each connection to ``target``."""
    await asyncio.sleep(delay_s)
    host, target_port = target.rsplit(":", 1)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, int(target_port))
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    return await asyncio.start_server(handle, "127.0.0.1", port)


async def test_a_worker_waits_for_a_temporal_that_starts_after_it(temporal_server) -> None:
    port = free_port()
    settings = CommonSettings(temporal_address=f"127.0.0.1:{port}", temporal_connect_wait_s=60)
    relay = asyncio.create_task(_relay_after(4.0, port, temporal_server.address))
    t0 = time.monotonic()
    with structlog.testing.capture_logs() as logs:
        client = await connect(settings)
    waited_s = time.monotonic() - t0
    server = await relay
    try:
        retries = [e for e in logs if e["event"] == "temporal_connect_retry"]
        assert retries, logs  # it was refused first, and said so
        assert all(e["address"] == settings.temporal_address and e["error"] for e in retries)
        assert waited_s >= 4.0
        # the client is live: it answers through the relay
        info = await client.workflow_service.get_system_info(GetSystemInfoRequest())
        assert info.server_version, info
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await server.wait_closed()


async def test_the_wait_is_bounded_and_the_error_says_where() -> None:
    port = free_port()  # nothing will ever listen here
    settings = CommonSettings(temporal_address=f"127.0.0.1:{port}", temporal_connect_wait_s=3)
    t0 = time.monotonic()
    with (
        structlog.testing.capture_logs() as logs,
        pytest.raises(RuntimeError, match="Failed client connect"),
    ):
        await connect(settings)
    assert 3.0 <= time.monotonic() - t0 < 20
    failed = [e for e in logs if e["event"] == "temporal_connect_failed"]
    assert len(failed) == 1 and failed[0]["address"] == settings.temporal_address, logs
    assert failed[0]["attempts"] >= 2
