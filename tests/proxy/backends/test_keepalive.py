"""The backends' keep-alive connections (httpx over aiohttp, rolloutd.proxy.backends.http)
against real loopback servers: reuse, the one resend of a request a pooled connection lost,
the connection limit, the keep-alive expiry, the read timeout and cancellation."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from rolloutd.proxy.backends.http import new_client
from tests.support.loopback import Handler, loopback_server, read_request


def _answer(body: bytes, *, extra: str = "") -> bytes:
    return (
        f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def post_each(url: str, bodies: list[bytes], **options: Any) -> list[tuple[int, bytes]]:
    """Each body POSTed in turn through one backend client (closed after)."""
    client = new_client(url, 30.0, None, **options)
    try:
        return [
            ((r := await client.post("/a", content=body)).status_code, r.content) for body in bodies
        ]
    finally:
        await client.aclose()


def echo(heads: list[bytes], connections: list[int]) -> Handler:
    """Answers every request of a connection with its body, keeping the connection."""

    async def handle(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int
    ) -> None:
        while True:
            head, body = await read_request(reader)
            heads.append(head)
            connections.append(number)
            writer.write(_answer(body))
            await writer.drain()

    return handle


async def test_sequential_calls_share_one_connection_and_send_the_headers() -> None:
    connections: list[int] = []
    heads: list[bytes] = []
    async with loopback_server(echo(heads, connections)) as url:
        client = new_client(url + "/base", 30.0, None, {"Authorization": "Bearer k"})
        try:
            for i in range(3):
                response = await client.post("/v1/x", json={"i": i})
                assert (response.status_code, response.json()) == (200, {"i": i})
        finally:
            await client.aclose()
    assert connections == [1, 1, 1]
    first = [line.lower() for line in heads[0].split(b"\r\n")]
    assert first[0] == b"post /base/v1/x http/1.1"
    assert b"authorization: bearer k" in first
    assert b"host: " + url.removeprefix("http://").encode() in first
    assert b"content-type: application/json" in first


async def test_a_pooled_connection_closed_by_the_server_is_replaced_once() -> None:
    """The server drops its first connection on the second request without a word (an idle
    connection it timed out as the request came): the call goes through on a new connection,
    sent once there."""
    seen: list[int] = []

    async def handle(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int
    ) -> None:
        while True:
            _, body = await read_request(reader)
            seen.append(number)
            if number == 1 and len(seen) == 2:
                return  # closed without an answer
            writer.write(_answer(body))
            await writer.drain()

    async with loopback_server(handle) as url:
        answers = await post_each(url, [b"1", b"2", b"3"])
    assert answers == [(200, b"1"), (200, b"2"), (200, b"3")]
    assert seen == [1, 1, 2, 2]


async def test_a_new_connection_dropped_without_an_answer_is_not_sent_again() -> None:
    """The backend may have started sampling: sending again could sample twice."""
    seen: list[int] = []

    async def handle(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int
    ) -> None:
        await read_request(reader)
        seen.append(number)

    async with loopback_server(handle) as url:
        with pytest.raises(httpx.RemoteProtocolError, match="ServerDisconnected"):
            await post_each(url, [b"{}"])
    assert seen == [1]


async def test_connection_close_answers_are_not_reused() -> None:
    seen: list[int] = []

    async def handle(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int
    ) -> None:
        _, body = await read_request(reader)
        seen.append(number)
        writer.write(_answer(body, extra="Connection: close\r\n"))
        await writer.drain()

    async with loopback_server(handle) as url:
        answers = await post_each(url, [b"1", b"2"])
    assert answers == [(200, b"1"), (200, b"2")]
    assert seen == [1, 2]


async def test_an_idle_connection_past_the_expiry_is_not_reused() -> None:
    """Calls in quick succession share a connection; after the keep-alive expiry (kept below
    the backend's own idle timeout) the next call opens a new one."""
    connections: list[int] = []
    async with loopback_server(echo([], connections)) as url:
        client = new_client(url, 30.0, None, keepalive_expiry_s=0.2)
        try:
            for body in (b"1", b"2"):
                await client.post("/a", content=body)
            await asyncio.sleep(0.3)  # the idle time under test, not a wait for an event
            await client.post("/a", content=b"3")
        finally:
            await client.aclose()
    assert connections == [1, 1, 2]


async def test_the_limit_bounds_open_connections_and_every_call_is_answered() -> None:
    """Answers are held until two connections are open at once (the limit), so the calls
    queue; no third connection is ever opened."""
    open_now = 0
    most = 0
    both_open = asyncio.Event()

    async def handle(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int
    ) -> None:
        nonlocal open_now, most
        open_now += 1
        most = max(most, open_now)
        if open_now == 2:
            both_open.set()
        try:
            while True:
                _, body = await read_request(reader)
                await both_open.wait()
                writer.write(_answer(body))
                await writer.drain()
        finally:
            open_now -= 1

    async with loopback_server(handle) as url:
        client = new_client(url, 30.0, None, max_connections=2)
        try:
            answers = await asyncio.wait_for(
                asyncio.gather(*(client.post("/a", content=b"%d" % i) for i in range(7))), 10
            )
        finally:
            await client.aclose()
    assert [a.content for a in answers] == [b"%d" % i for i in range(7)]
    assert most == 2


async def test_a_cancelled_call_gives_back_its_place_in_the_pool() -> None:
    """A call cancelled while waiting for its answer closes that connection (its answer
    would be read by the next call) and frees its place: with a limit of one, the next calls
    still go through."""
    closed_early: list[bool] = []
    slow_read = asyncio.Event()

    async def handle(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int
    ) -> None:
        while True:
            _, body = await read_request(reader)
            if body == b"slow":
                slow_read.set()
                try:  # the client's end of the connection, before the answer is ready
                    closed_early.append(await asyncio.wait_for(reader.read(), 5) == b"")
                except TimeoutError:
                    closed_early.append(False)
                return
            writer.write(_answer(body))
            await writer.drain()

    async with loopback_server(handle) as url:
        client = new_client(url, 30.0, None, max_connections=1)
        try:
            slow = asyncio.create_task(client.post("/a", content=b"slow"))
            waiting = asyncio.create_task(client.post("/a", content=b"next"))
            await asyncio.wait_for(slow_read.wait(), 5)  # "next" waits for the one place
            assert not waiting.done()
            slow.cancel()
            assert (await asyncio.wait_for(waiting, 5)).content == b"next"
            assert (await client.post("/a", content=b"last")).content == b"last"
        finally:
            await client.aclose()
    with pytest.raises(asyncio.CancelledError):
        await slow
    assert closed_early == [True]


async def test_the_read_timeout_counts_from_the_last_byte() -> None:
    """An answer trickling in (each piece within the timeout, all of it past it) is read
    whole; a silent backend times out."""
    body = b'{"content": "' + b"x" * 40 + b'"}'

    async def handle(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int
    ) -> None:
        _, request = await read_request(reader)
        if request == b"silent":
            await reader.read()  # until the client gives up and closes
            return
        answer = _answer(body)
        for i in range(0, len(answer), 16):
            writer.write(answer[i : i + 16])
            await writer.drain()
            await asyncio.sleep(0.1)  # the pace under test

    async with loopback_server(handle) as url:
        client = new_client(url, 0.3, None)
        try:
            assert (await client.post("/a", content=b"trickle")).content == body
            with pytest.raises(httpx.ReadTimeout):
                await client.post("/a", content=b"silent")
        finally:
            await client.aclose()
