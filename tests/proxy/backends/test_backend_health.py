"""Backend health in the pool, on real sockets: a backend that refuses connections is marked
unhealthy by the call that found it; the next call of its session moves to a healthy backend
serving the same policy version (a real llama-server), or, when none is left, fails at once
with 503 instead of waiting out its timeout; a paused backend is not dead; a probe brings the
health back when the backend answers again."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rolloutd.proxy.http.server import Gateway
from rolloutd.settings import GatewaySettings
from rolloutd.stack import free_port
from rolloutd.types import SamplingParams
from tests.proxy.support import asgi_client

pytestmark = [pytest.mark.engine]


async def post(client: httpx.AsyncClient, key: str, text: str) -> httpx.Response:
    """One chat call of the session ``key``."""
    return await client.post(
        f"/s/{key}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": text}], "max_tokens": 4},
    )


@contextlib.asynccontextmanager
async def answering(port: int) -> AsyncIterator[None]:
    """A server on ``port`` that answers every request 200 (a backend come back)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    try:
        yield
    finally:
        server.close()
        await server.wait_closed()


async def test_a_refusing_backend_is_skipped_fails_fast_and_comes_back(
    tmp_path: Path, tokenizer: Any, llama_server: Any
) -> None:
    dead_port = free_port()
    dead = f"http://127.0.0.1:{dead_port}"
    settings = GatewaySettings(
        store_url=str(tmp_path / "store"),
        backend_url=f"{dead},{llama_server.url}",
        gateway_public_url="http://gateway.test",
        backend_timeout_s=300,
    )
    gateway = Gateway.from_settings(settings, tokenizer=tokenizer, ctx_size=4096)
    try:
        async with asgi_client(gateway, timeout=120) as client:
            info = await gateway.sessions.open_session(
                "h/0", "h", sampling=SamplingParams(max_tokens=4)
            )
            assert info.backend == dead  # least-assigned, first registered
            refused = await post(client, info.session_key, "one")
            assert refused.status_code == 503, refused.text
            health = (await client.get("/health")).json()["backend_health"]
            assert health["status"] == "ok"  # the llama-server still serves version 0

            moved = await post(client, info.session_key, "two")
            assert moved.status_code == 200, moved.text
            session = await gateway.sessions.get("h/0")
            assert session.state.backend == llama_server.url
            assert [m.moved_from for m in session.state.backend_moves] == [dead]
            # a new session goes to the healthy backend although the dead one has fewer
            assert gateway.pool.assign().name == llama_server.url

            # no healthy backend left: a call fails at once, not after its 300 s timeout
            await gateway.pool.remove([llama_server.url])
            other = await gateway.sessions.open_session(
                "h/1", "h", sampling=SamplingParams(max_tokens=4)
            )
            started = time.monotonic()
            fast = await post(client, other.session_key, "three")
            assert fast.status_code == 503, fast.text
            assert "no healthy backend serves policy version 0" in fast.json()["error"]["message"]
            assert time.monotonic() - started < 5
            health = (await client.get("/health")).json()["backend_health"]
            assert health["status"] == "unavailable"
            assert health["unavailable"][0]["policy_version"] == 0

            # paused for a weight update: not dead
            await gateway.pool.set_paused(True, [dead])
            assert (await client.get("/health")).json()["backend_health"]["status"] == "ok"
            await gateway.pool.set_paused(False, [dead])
            await post(client, other.session_key, "four")  # refused again
            assert (await client.get("/health")).json()["backend_health"]["status"] == "unavailable"

            # it answers again: a probe (with backoff) brings its health back
            async with answering(dead_port):
                deadline = time.monotonic() + 30
                while (await client.get("/health")).json()["backend_health"]["status"] != "ok":
                    assert time.monotonic() < deadline, "health did not come back"
                    await asyncio.sleep(0.2)  # polling the route, bounded by the deadline
    finally:
        await gateway.aclose()
