"""The model call's keep-alive HTTP/1.1 pool (rolloutd.proxy.backends.keepalive) against real
loopback servers, and its answer parsing against every framing and every split of the bytes."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rolloutd.proxy.backends.keepalive import KeepAlivePool, _Connection
from tests.support.loopback import Handler, loopback_server


def _answer(body: bytes, *, status: str = "200 OK", extra: str = "") -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def _read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """(head, body) of one request framed by Content-Length."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    return head, await reader.readexactly(length)


async def post_each(url: str, bodies: list[bytes], **options: Any) -> list[tuple[int, bytes]]:
    """Each body POSTed in turn through one pool (closed after)."""
    pool = KeepAlivePool(url, **options)
    try:
        return [await pool.post("/a", body) for body in bodies]
    finally:
        await pool.aclose()


def echo(heads: list[bytes], connections: list[int]) -> Handler:
    """Answers every request of a connection with its body, keeping the connection."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     number: int) -> None:
        while True:
            head, body = await _read_request(reader)
            heads.append(head)
            connections.append(number)
            writer.write(_answer(body))
            await writer.drain()
    return handle


async def test_sequential_calls_share_one_connection_and_send_the_headers() -> None:
    connections: list[int] = []
    heads: list[bytes] = []
    async with loopback_server(echo(heads, connections)) as url:
        pool = KeepAlivePool(url + "/base/", headers={"Authorization": "Bearer k"})
        try:
            for i in range(3):
                assert await pool.post("/v1/x", b'{"i": %d}' % i) == (200, b'{"i": %d}' % i)
        finally:
            await pool.aclose()
    assert connections == [1, 1, 1]
    first = heads[0].split(b"\r\n")
    assert first[0] == b"POST /base/v1/x HTTP/1.1"
    assert b"Authorization: Bearer k" in first
    assert b"Host: " + url.removeprefix("http://").encode() in first
    assert b"Content-Type: application/json" in first


async def test_a_pooled_connection_closed_by_the_server_is_replaced_once() -> None:
    """The server drops its first connection on the second request without a word (an idle
    connection it timed out): the call goes through on a new connection."""
    seen: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     number: int) -> None:
        while True:
            _, body = await _read_request(reader)
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
    seen: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     number: int) -> None:
        await _read_request(reader)
        seen.append(number)

    async with loopback_server(handle) as url:
        with pytest.raises(httpx.RemoteProtocolError, match="without sending"):
            await post_each(url, [b"{}"])
    assert seen == [1]


async def test_connection_close_answers_are_not_reused() -> None:
    seen: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     number: int) -> None:
        _, body = await _read_request(reader)
        seen.append(number)
        writer.write(_answer(body, extra="Connection: close\r\n"))
        await writer.drain()

    async with loopback_server(handle) as url:
        answers = await post_each(url, [b"1", b"2"])
    assert answers == [(200, b"1"), (200, b"2")]
    assert seen == [1, 2]


async def test_the_limit_bounds_open_connections_and_every_call_is_answered() -> None:
    """Answers are held until two connections are open at once (the limit), so the calls
    queue; no third connection is ever opened."""
    open_now = 0
    most = 0
    both_open = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     number: int) -> None:
        nonlocal open_now, most
        open_now += 1
        most = max(most, open_now)
        if open_now == 2:
            both_open.set()
        try:
            while True:
                _, body = await _read_request(reader)
                await both_open.wait()
                writer.write(_answer(body))
                await writer.drain()
        finally:
            open_now -= 1

    async with loopback_server(handle) as url:
        pool = KeepAlivePool(url, limit=2)
        try:
            answers = await asyncio.wait_for(
                asyncio.gather(*(pool.post("/a", b"%d" % i) for i in range(7))), 10)
        finally:
            await pool.aclose()
    assert answers == [(200, b"%d" % i) for i in range(7)]
    assert most == 2


async def test_a_cancelled_call_gives_back_its_place_in_the_pool() -> None:
    """A call cancelled while waiting for its answer closes that connection (its answer
    would be read by the next call) and frees its place: with a limit of one, the next calls
    still go through."""
    closed_early: list[bool] = []
    slow_read = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     number: int) -> None:
        while True:
            _, body = await _read_request(reader)
            if body == b"slow":
                slow_read.set()
                try:  # the client's end of the connection, before the answer is ready
                    closed_early.append(await asyncio.wait_for(reader.read(), 1) == b"")
                except TimeoutError:
                    closed_early.append(False)
                return
            writer.write(_answer(body))
            await writer.drain()

    async with loopback_server(handle) as url:
        pool = KeepAlivePool(url, limit=1)
        try:
            slow = asyncio.create_task(pool.post("/a", b"slow"))
            waiting = asyncio.create_task(pool.post("/a", b"next"))
            await asyncio.wait_for(slow_read.wait(), 5)  # "next" waits for the one place
            assert not waiting.done()
            slow.cancel()
            assert await asyncio.wait_for(waiting, 5) == (200, b"next")
            assert await pool.post("/a", b"last") == (200, b"last")
        finally:
            await pool.aclose()
    with pytest.raises(asyncio.CancelledError):
        await slow
    assert closed_early == [True]


async def test_the_read_timeout_counts_from_the_last_byte() -> None:
    """An answer trickling in (each piece within the timeout, all of it past it) is read
    whole; a silent backend times out."""
    body = b'{"content": "' + b"x" * 40 + b'"}'

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     number: int) -> None:
        _, request = await _read_request(reader)
        if request == b"silent":
            await reader.read()  # until the client gives up and closes
            return
        answer = _answer(body)
        for i in range(0, len(answer), 16):
            writer.write(answer[i:i + 16])
            await writer.drain()
            await asyncio.sleep(0.1)

    async with loopback_server(handle) as url:
        pool = KeepAlivePool(url, read_timeout_s=0.3)
        try:
            assert await pool.post("/a", b"trickle") == (200, body)
            with pytest.raises(httpx.ReadTimeout, match="timed out"):
                await pool.post("/a", b"silent")
        finally:
            await pool.aclose()


async def test_refused_connections_are_connect_errors() -> None:
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    pool = KeepAlivePool(f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(httpx.ConnectError):
            await pool.post("/a", b"{}")
        with pytest.raises(httpx.ConnectError):  # the failed attempt left no place taken
            await pool.post("/a", b"{}")
        assert pool._open == 0
    finally:
        await pool.aclose()


async def test_a_closed_pool_refuses_calls() -> None:
    connections: list[int] = []
    async with loopback_server(echo([], connections)) as url:
        pool = KeepAlivePool(url)
        assert await pool.post("/a", b"1") == (200, b"1")
        await pool.aclose()
        with pytest.raises(httpx.ConnectError, match="closed"):
            await pool.post("/a", b"2")
    assert connections == [1]


def test_only_http_origins() -> None:
    with pytest.raises(ValueError, match="http://"):
        KeepAlivePool("https://api.example.com")


# -- answer parsing: every framing, every split ---------------------------------------------
class _Transport:
    """Stands in for a socket's transport: parsing needs no socket."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True


def _framed(body: bytes, framing: str, chunk_sizes: list[int]) -> bytes:
    if framing == "length":
        return _answer(body)
    if framing == "eof":
        return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + body
    out, at = [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"], 0
    for size in [*chunk_sizes, len(body)]:
        piece = body[at:at + max(1, size)]
        if piece:
            out.append(b"%x\r\n%s\r\n" % (len(piece), piece))
        at += len(piece)
    out.append(b"0\r\n\r\n")
    return b"".join(out)


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=300), framing=st.sampled_from(["length", "chunked", "eof"]),
       interim=st.booleans(), chunk_sizes=st.lists(st.integers(1, 64), max_size=8),
       cuts=st.lists(st.integers(0, 10_000), max_size=12))
def test_the_answer_is_read_whole_whatever_the_framing_and_the_splits(
        body: bytes, framing: str, interim: bool, chunk_sizes: list[int],
        cuts: list[int]) -> None:
    wire = (b"HTTP/1.1 100 Continue\r\n\r\n" if interim else b"") \
        + _framed(body, framing, chunk_sizes)
    points = sorted({c % (len(wire) + 1) for c in cuts} | {0, len(wire)})

    async def run() -> Any:
        conn = _Connection(asyncio.get_running_loop(), read_timeout_s=60)
        transport = _Transport()
        conn.connection_made(transport)
        waiter = conn.send(b"POST / HTTP/1.1\r\n\r\n")
        for a, b in itertools.pairwise(points):
            conn.data_received(wire[a:b])
        if framing == "eof":
            assert not waiter.done()  # only the end of the connection ends this answer
            conn.connection_lost(None)
        return await waiter

    assert asyncio.run(run()) == (200, body)


@settings(max_examples=100, deadline=None)
@given(body=st.binary(min_size=1, max_size=200), cut=st.integers(0, 10_000),
       framing=st.sampled_from(["length", "chunked"]))
def test_an_answer_cut_short_is_an_error_never_a_shorter_body(body: bytes, cut: int,
                                                              framing: str) -> None:
    wire = _framed(body, framing, [7])
    head_end = wire.index(b"\r\n\r\n") + 4
    cut_at = head_end + cut % (len(wire) - head_end)  # past the head, before the end

    async def run() -> Any:
        conn = _Connection(asyncio.get_running_loop(), read_timeout_s=60)
        conn.connection_made(_Transport())
        waiter = conn.send(b"POST / HTTP/1.1\r\n\r\n")
        conn.data_received(wire[:cut_at])
        conn.connection_lost(None)
        return await waiter

    with pytest.raises(httpx.RemoteProtocolError, match="before the end"):
        asyncio.run(run())
