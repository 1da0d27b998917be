"""The sandbox queue's backlog, read from Temporal (DescribeTaskQueue's stats), is the
sessions waiting for a sandbox host: what a host's warm pool is sized from
(rolloutd.workers.capacity.sandbox_backlog). A real dev server, no sandbox host: three
provisionings wait, and the reading says three waiting and no host polling.

``acceptance``: a namespace of its own (about 5 s here, most of it the server's backlog count
catching up).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from rolloutd.settings import SandboxSettings
from rolloutd.types import RuntimeSpec
from rolloutd.workers import connect
from rolloutd.workers.capacity import sandbox_backlog
from tests.support.namespaces import fresh_namespace
from tests.support.pool_sessions import Sessions

pytestmark = [pytest.mark.acceptance, pytest.mark.temporal, pytest.mark.timeout(60)]


async def test_waiting_provisionings_are_the_backlog(temporal_server) -> None:
    namespace = await fresh_namespace(temporal_server.address, f"bl{uuid.uuid4().hex[:6]}")
    client = await connect(
        SandboxSettings(temporal_address=temporal_server.address, temporal_namespace=namespace)
    )
    assert await sandbox_backlog(client) == (0, 0)  # control: nothing waits yet
    sessions = Sessions(client)
    async with sessions.worker():
        handles = [await sessions.start_provision(RuntimeSpec(type="podman")) for _ in range(3)]
        deadline, seen = time.monotonic() + 30, None
        while seen != (3, 0):
            assert time.monotonic() < deadline, seen
            await asyncio.sleep(0.2)
            seen = await sandbox_backlog(client)
        for handle in handles:
            await handle.terminate()
