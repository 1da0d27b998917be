"""Keep-alive HTTP/1.1 connections for the model call's POST: the request written in one piece,
the answer parsed by httptools (llhttp, the parser uvicorn serves the gateway with).

Why not aiohttp's client here: a model call crosses the gateway twice per turn of every
harness, and aiohttp's request and response machinery (its session, connector, request and
response objects, payload writers, stream reader) cost 176 us of CPU per call against 31 us for
this path, on the same loopback backend (benchmarks/gateway_overhead.py's fake backend, one
call at a time, uvloop). Everything else (streams, ``GET``, https origins, tests with an httpx
transport) stays on httpx over aiohttp (:mod:`rolloutd.proxy.backends.http`).

What it speaks: ``POST`` with a ``Content-Length`` body; answers framed by ``Content-Length``,
``Transfer-Encoding: chunked`` or the end of the connection (RFC 9112 section 6.3), interim
1xx answers skipped. It sends no ``Accept-Encoding``, so answers come uncompressed.

Errors are the httpx errors httpcore raises for the same failures (:func:`rolloutd.proxy.
backends.http.transport_error` maps them): a refused or unresolvable connection is
``httpx.ConnectError``, a connection not made in time ``httpx.ConnectTimeout``, no byte of the
answer within the read timeout ``httpx.ReadTimeout``, a connection dropped before the answer
ends or an answer that is not HTTP ``httpx.RemoteProtocolError``.

A request on a connection reused from the pool that loses it before any byte of the answer
(the server closed it while idle, a race every keep-alive client meets) is sent once more on a
new connection: the first one was never answered, so nothing of it was recorded.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import httptools
import httpx

__all__ = ["KeepAlivePool"]


class _Lost(Exception):
    """The connection ended before any byte of the answer (the request may be sent again on
    a new connection when this one came from the pool)."""


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection: at most one request in flight (no pipelining)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout_s: float) -> None:
        self.loop = loop
        self.read_timeout_s = read_timeout_s
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.status = 0
        self.chunks: list[bytes] = []
        self.received = False  # a byte of the current answer arrived
        self.framed = False  # the current answer has Content-Length or Transfer-Encoding
        self.last_read = 0.0
        self.timer: asyncio.TimerHandle | None = None

    # -- asyncio.Protocol --------------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.received = True
        self.last_read = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(httpx.RemoteProtocolError(f"malformed answer from the backend: {e}"))
            self.close()

    def eof_received(self) -> bool:
        return False  # close the transport (connection_lost follows)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_timer()
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if self.status >= 200 and not self.framed:
            # an answer delimited by the end of the connection (RFC 9112 section 6.3, 8.)
            self.waiter = None
            waiter.set_result((self.status, b"".join(self.chunks)))
        elif not self.received:
            self._fail(_Lost("Server disconnected without sending a response."))
        else:
            self._fail(httpx.RemoteProtocolError(
                "Server disconnected before the end of the response."))

    # -- httptools callbacks -----------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) in (14, 17) and name.lower() in (b"content-length",
                                                      b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        if self.status < 200:  # an interim answer (100 Continue, 103 Early Hints)
            self.chunks, self.framed = [], False
            return
        self._stop_timer()
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((self.status, b"".join(self.chunks)))
        if not self.parser.should_keep_alive():
            self.close()

    # -- requests ----------------------------------------------------------------------------
    def send(self, request: bytes) -> asyncio.Future[tuple[int, bytes]]:
        """Write ``request`` (head and body); the future holds ``(status, body)``."""
        assert self.transport is not None and self.waiter is None
        self.status, self.chunks, self.received, self.framed = 0, [], False, False
        self.waiter = waiter = self.loop.create_future()
        self.last_read = self.loop.time()
        self.timer = self.loop.call_at(self.last_read + self.read_timeout_s, self._on_timer)
        self.transport.write(request)
        return waiter

    def _on_timer(self) -> None:
        self.timer = None
        if self.waiter is None:
            return
        due = self.last_read + self.read_timeout_s
        if self.loop.time() < due:  # bytes arrived since: wait from the last read
            self.timer = self.loop.call_at(due, self._on_timer)
            return
        self._fail(httpx.ReadTimeout("timed out"))
        self.close()

    def _stop_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _fail(self, error: BaseException) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    @property
    def idle(self) -> bool:
        return self.waiter is None and not self.closed

    def close(self) -> None:
        self.closed = True
        self._stop_timer()
        if self.transport is not None:
            self.transport.close()


class KeepAlivePool:
    """``POST`` over pooled keep-alive HTTP/1.1 connections to one ``http://`` origin.

    Args:
        base_url: ``http://host[:port][/prefix]``; request paths are appended to it.
        headers: sent with every request, besides ``Host``, ``Content-Type:
            application/json`` and ``Content-Length``.
        limit: connections open at most (>= 1); further requests wait for a free one.
        connect_timeout_s: seconds to open a connection.
        read_timeout_s: seconds without a byte of the answer before giving up (the
            answer of a non-streamed sampling call comes at its end: the backend's
            longest generation must fit).

    Raises:
        ValueError: ``base_url`` is not ``http://``.
    """

    def __init__(self, base_url: str, *, headers: dict[str, str] | None = None,
                 limit: int = 128, connect_timeout_s: float = 10.0,
                 read_timeout_s: float = 600.0) -> None:
        url = httpx.URL(base_url)
        if url.scheme != "http" or not url.host:
            raise ValueError(f"KeepAlivePool needs an http:// origin, not {base_url!r}")
        self.host = url.host
        self.port = url.port or 80
        self.prefix = url.raw_path.rstrip(b"/").split(b"?", 1)[0]
        self.limit = max(1, limit)
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        host = url.netloc  # as written, with the port when it has one
        lines = [b"Host: " + host, b"Accept: application/json",
                 b"Content-Type: application/json"]
        for name, value in (headers or {}).items():
            if name.lower() in ("host", "content-type", "content-length", "accept"):
                continue
            lines.append(name.encode("latin-1") + b": " + value.encode("latin-1"))
        self._head_tail = b" HTTP/1.1\r\n" + b"\r\n".join(lines) + b"\r\nContent-Length: "
        self._targets: dict[str, bytes] = {}
        self._idle: deque[_Connection] = deque()
        self._open = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    def _request(self, path: str, body: bytes) -> bytes:
        target = self._targets.get(path)
        if target is None:
            target = self._targets[path] = b"POST " + self.prefix + path.encode("ascii")
        return b"".join((target, self._head_tail, str(len(body)).encode(), b"\r\n\r\n", body))

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        """POST ``body`` (JSON) to ``path`` and read the whole answer.

        Returns:
            ``(status code, body)``; any status (the caller maps errors).

        Raises:
            httpx.TransportError: see the module docstring.
        """
        request = self._request(path, body)
        conn = await self._acquire()
        reused = conn.transport is not None
        try:
            if conn.transport is None:
                await self._connect(conn)
            try:
                return await conn.send(request)
            except _Lost as e:
                if not reused:
                    raise httpx.RemoteProtocolError(str(e)) from None
            # the pooled connection was closed by the server before it read the request
            conn.close()
            conn = _Connection(asyncio.get_running_loop(), self.read_timeout_s)
            await self._connect(conn)
            try:
                return await conn.send(request)
            except _Lost as e:
                raise httpx.RemoteProtocolError(str(e)) from None
        finally:
            self._release(conn)

    async def _acquire(self) -> _Connection:
        """An idle pooled connection, or a new (unconnected) one within the limit."""
        while True:
            while self._idle:
                conn = self._idle.pop()  # the most recently used: the least likely stale
                if conn.idle:
                    return conn
                self._open -= 1
            if self._closed:
                raise httpx.ConnectError("the backend's connection pool is closed")
            if self._open < self.limit:
                self._open += 1
                return _Connection(asyncio.get_running_loop(), self.read_timeout_s)
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake()  # pass the turn on
                raise

    async def _connect(self, conn: _Connection) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await loop.create_connection(lambda: conn, self.host, self.port)
        except TimeoutError:
            raise httpx.ConnectTimeout("timed out") from None
        except OSError as e:
            raise httpx.ConnectError(str(e) or type(e).__name__) from e

    def _release(self, conn: _Connection) -> None:
        if conn.idle and conn.transport is not None and not self._closed:
            self._idle.append(conn)
        else:
            if not conn.closed or conn.waiter is not None:
                conn.waiter = None  # a cancelled call: the answer would be unread
                conn.close()
            self._open -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def aclose(self) -> None:
        """Close every idle connection; those in use close when their call ends."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()
            self._open -= 1
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
