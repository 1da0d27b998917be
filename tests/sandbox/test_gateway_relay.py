"""The host side of ``network: gateway`` on real sockets: what it admits, refuses and forwards.

A client speaks raw HTTP/1.1 to the relay's unix socket; a fake gateway on the host's loopback
parses what reaches it with its own h11 connection and echoes the body it read.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import h11
import pytest

from rolloutd.sandbox.runtimes.gateway_relay import MAX_HEAD_BYTES, GatewayRelay


@dataclass
class Gateway:
    """What the fake gateway received: parsed requests, their bodies, and the raw bytes."""

    port: int
    requests: list[h11.Request] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)
    raw: bytearray = field(default_factory=bytearray)


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    state = Gateway(port=0)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=2 * MAX_HEAD_BYTES)
        body = bytearray()
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError:  # the relay cut the request short
                writer.close()
                return
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                state.raw += data
                conn.receive_data(data)
            elif isinstance(event, h11.Request):
                state.requests.append(event)
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
        state.bodies.append(bytes(body))
        writer.write(
            conn.send(
                h11.Response(
                    status_code=200,
                    headers=[(b"Content-Length", b"%d" % len(body)), (b"Connection", b"close")],
                )
            )
        )
        writer.write(conn.send(h11.Data(data=bytes(body))) + conn.send(h11.EndOfMessage()))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    state.port = server.sockets[0].getsockname()[1]
    yield state
    server.close()
    await server.wait_closed()


@pytest.fixture
async def relay(tmp_path: Path, gateway: Gateway) -> AsyncIterator[GatewayRelay]:
    relay = GatewayRelay(tmp_path / "gateway.sock")
    await relay.start()
    relay.attach(f"http://127.0.0.1:{gateway.port}/s/KEY/v1")
    yield relay
    await relay.close()


async def exchange(relay: GatewayRelay, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` through the relay; the response's status and body."""
    reader, writer = await asyncio.open_unix_connection(str(relay.socket_path))
    writer.write(request)
    await writer.drain()
    response = await asyncio.wait_for(reader.read(), timeout=10)
    writer.close()
    head, _, body = response.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


async def test_chunked_body_is_forwarded_reframed_with_host_and_close(relay, gateway):
    request = (
        b"POST /s/KEY/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8300\r\n"
        b"Connection: keep-alive\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n"
        b"X-Trace: 7\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
        # a second request in the same bytes must not reach the gateway
        b"GET /admin/backends HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    status, body = await exchange(relay, request)
    assert (status, body) == (200, b"hello world")
    (forwarded,) = gateway.requests
    headers = dict(forwarded.headers)
    assert forwarded.target == b"/s/KEY/v1/chat/completions"
    assert headers[b"host"] == b"127.0.0.1:%d" % gateway.port
    assert headers[b"connection"] == b"close"
    assert headers[b"transfer-encoding"] == b"chunked" and b"content-length" not in headers
    assert headers[b"x-trace"] == b"7"
    assert b"/admin" not in gateway.raw
    assert (relay.num_admitted, relay.num_refused) == (1, 0)


async def test_malformed_chunk_cuts_the_request_before_the_gateway_answers(relay, gateway):
    reader, writer = await asyncio.open_unix_connection(str(relay.socket_path))
    writer.write(
        b"POST /s/KEY/v1/responses HTTP/1.1\r\nHost: h\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n"
    )
    await writer.drain()
    assert await asyncio.wait_for(reader.read(), timeout=10) == b""
    writer.close()
    assert len(gateway.requests) == 1 and gateway.bodies == []


async def test_content_length_body_is_forwarded(relay, gateway):
    payload = b'{"model": "m", "messages": []}' * 1000
    status, body = await exchange(
        relay,
        b"POST /s/KEY/v1/responses HTTP/1.1\r\nHost: h\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload),
    )
    assert (status, body) == (200, payload)
    assert dict(gateway.requests[0].headers)[b"content-length"] == b"%d" % len(payload)


@pytest.mark.parametrize(
    "target",
    [
        b"/s/OTHER/v1/models",
        b"/admin/backends",
        b"/s/KEY/..%2f..%2fadmin",
        b"/s/KEY/%2e%2e/OTHER/v1/models",
        b"/s/KEY%2fv1/models",
        b"http://127.0.0.1:8300/s/KEY/v1/models",
    ],
)
async def test_targets_outside_the_session_are_refused_403(relay, gateway, target):
    status, body = await exchange(relay, b"GET %s HTTP/1.1\r\nHost: h\r\n\r\n" % target)
    assert status == 403 and b"rolloutd sandbox relay" in body
    assert gateway.requests == [] and relay.num_refused == 1


async def test_oversized_head_is_answered_431(relay, gateway):
    def head(size: int) -> bytes:
        start = b"GET /s/KEY/v1/models HTTP/1.1\r\nHost: h\r\nX-Pad: "
        return start + b"a" * (size - len(start) - 4) + b"\r\n\r\n"

    assert (await exchange(relay, head(MAX_HEAD_BYTES)))[0] == 200
    assert (await exchange(relay, head(MAX_HEAD_BYTES + 1)))[0] == 431
    assert len(gateway.requests) == 1 and relay.num_refused == 1


@pytest.mark.parametrize(
    ("request_bytes", "expected"),
    [
        (b"GET /s/KEY/v1/models\r\n\r\n", 400),  # no HTTP version
        (b"GET /s/KEY/v1/models HTTP/1.1\r\n\r\n", 400),  # HTTP/1.1 without Host
        (b"POST /s/KEY/v1/x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n", 501),
    ],
)
async def test_malformed_requests_are_answered_and_not_forwarded(
    relay, gateway, request_bytes, expected
):
    status, _ = await exchange(relay, request_bytes)
    assert status == expected and gateway.requests == []


async def test_unattached_relay_answers_503(tmp_path):
    relay = GatewayRelay(tmp_path / "gateway.sock")
    await relay.start()
    try:
        status, _ = await exchange(relay, b"GET /s/KEY/v1/models HTTP/1.1\r\nHost: h\r\n\r\n")
        assert status == 503
    finally:
        await relay.close()


async def test_unreachable_gateway_is_answered_502(tmp_path):
    with socket.socket() as probe:  # a loopback port nothing listens on once it is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    relay = GatewayRelay(tmp_path / "gateway.sock")
    await relay.start()
    relay.attach(f"http://127.0.0.1:{port}/s/KEY/v1")
    try:
        status, body = await exchange(relay, b"GET /s/KEY/v1/models HTTP/1.1\r\nHost: h\r\n\r\n")
        assert status == 502 and b"unreachable" in body
    finally:
        await relay.close()


async def test_sandbox_hanging_up_closes_the_gateway_connection(tmp_path):
    closed = asyncio.Event()

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # until the relay closes: the call's client is gone
        closed.set()
        writer.close()

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    relay = GatewayRelay(tmp_path / "gateway.sock")
    await relay.start()
    relay.attach(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/s/KEY/v1")
    try:
        _, writer = await asyncio.open_unix_connection(str(relay.socket_path))
        writer.write(b"POST /s/KEY/v1/responses HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}")
        await writer.drain()
        writer.close()
        await asyncio.wait_for(closed.wait(), timeout=10)
        assert relay.num_admitted == 1
    finally:
        await relay.close()
        server.close()
        await server.wait_closed()
