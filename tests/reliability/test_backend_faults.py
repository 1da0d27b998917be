"""A backend that answers garbage or hangs: the harness gets a clear error in its dialect's
shape within the backend timeout, nothing is recorded in the completion log, every failed call
is recorded in the session's state (``num_errors``, ``errors``, kept after a
restart), and the session is not stuck (its lock is free: it can be closed at once)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from rolloutd.cli import reliability
from rolloutd.proxy.http.server import Gateway
from rolloutd.proxy.sessions.manager import SessionManager
from rolloutd.settings import GatewaySettings
from rolloutd.store import CompletionLog
from rolloutd.trajectory import build_traces
from rolloutd.types import BuilderSpec
from tests.proxy.support import MODEL

BACKEND_TIMEOUT_S = 2.0

#: raw HTTP answers of a misbehaving llama-server: not JSON, JSON of the wrong kind, a
#: truncated body, a 500 with HTML; ``None``: accept the request and never answer.
BEHAVIOURS: dict[str, bytes | None] = {
    "not_json": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 9\r\n"
    b"\r\n<garbage>",
    "wrong_json": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n"
    b'\r\n{"tokens": "x"}',
    "truncated": b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n"
    b'\r\n{"content":',
    "html_500": b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/html\r\n"
    b"Content-Length: 13\r\n\r\n<h1>oops</h1>",
    "hang": None,
}


async def misbehaving_backend(answer: bytes | None) -> tuple[asyncio.Server, str]:
    """A TCP server that reads a request and sends ``answer`` (or nothing, ever)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            if answer is not None:
                writer.write(answer)
                await writer.drain()
                writer.close()
            else:
                await reader.read()  # until the gateway gives up and closes
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


@pytest.fixture
async def tokenizer_():
    from rolloutd.engine.models import load_tokenizer

    return await asyncio.to_thread(load_tokenizer, MODEL)


@pytest.mark.parametrize("behaviour", list(BEHAVIOURS))
async def test_bad_backend_gives_a_clear_error_and_no_stuck_session(
    tmp_path, tokenizer_, behaviour: str
):
    server, url = await misbehaving_backend(BEHAVIOURS[behaviour])
    gateway = Gateway.from_settings(
        GatewaySettings(
            store_url=str(tmp_path / "store"),
            backend_url=url,
            backend_timeout_s=BACKEND_TIMEOUT_S,
            gateway_public_url="http://gateway.test",
        ),
        tokenizer=tokenizer_,
        ctx_size=4096,
    )
    try:
        info = await gateway.sessions.open_session("bad/0", "bad")
        body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=gateway.app),
            base_url="http://gateway.test",
            timeout=30,
        ) as client:
            t0 = time.monotonic()
            response = await client.post(f"/s/{info.session_key}/v1/chat/completions", json=body)
            elapsed = time.monotonic() - t0
            anthropic = await client.post(f"/s/{info.session_key}/v1/messages", json=body)
            streamed = await client.post(
                f"/s/{info.session_key}/v1/chat/completions", json={**body, "stream": True}
            )
        assert response.status_code in (502, 503, 504), response.text
        error = response.json()["error"]
        assert error["message"] and "internal error" not in error["message"], error
        assert anthropic.status_code in (502, 503, 504)
        assert anthropic.json()["type"] == "error"
        assert streamed.status_code in (502, 503, 504)
        streamed_message = streamed.json()["error"]["message"]
        assert streamed_message and "internal error" not in streamed_message
        assert elapsed < BACKEND_TIMEOUT_S + 5
        # nothing in the log, and the session's lock is free: closing does not wait
        num = await asyncio.wait_for(gateway.sessions.close_session("bad/0"), 5)
        assert num == 0
        # every failed call is in the sealed session's state, also after a restart
        session = await gateway.sessions.get("bad/0")
        reloaded = await SessionManager(
            gateway.store, gateway.pool, public_url="http://x", default_model="m"
        ).get("bad/0")
        for state in (session.state, reloaded.state):
            assert state.closed and state.num_errors == 3
            assert [(e.at_index, e.status_code, e.stream) for e in state.errors] == [
                (0, response.status_code, False),
                (0, anthropic.status_code, False),
                (0, streamed.status_code, True),
            ]
            assert all(
                e.error_type.startswith("Backend") and e.backend == state.backend
                for e in state.errors
            )
            assert state.errors[0].message == error["message"]
        # the builder sees an empty log, not the failed calls
        completions = CompletionLog(gateway.store, "bad/0").read_all()
        assert build_traces(completions, BuilderSpec(), end_of_turn_id=0)[0] == []
        reliability.record(
            f"backend {behaviour}",
            sessions=1,
            status=response.status_code,
            seconds=elapsed,
            completions_recorded=num,
            ok=True,
        )
    finally:
        server.close()
        await gateway.aclose()
