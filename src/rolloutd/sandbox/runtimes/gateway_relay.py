"""Host side of ``network: gateway``: a unix socket that reaches one gateway session only.

A sandbox with its own network namespace cannot reach the host's gateway over TCP. The runtime
binds a host folder holding a unix socket into the sandbox's network holder; a forwarder there
(:mod:`rolloutd.sandbox.runtimes.relay_inside`) listens on the sandbox's loopback and relays each
connection to the socket; this module answers on the socket and relays to the gateway::

    harness --tcp--> 127.0.0.1:8300 (sandbox netns) --unix--> GatewayRelay --tcp/tls--> gateway

The relay parses each request with h11 (HTTP/1.1, RFC 9112) and admits it only when its
target is below the session's path prefix ``/s/{key}/`` (the session key is in the path:
docs/architecture.md, "One model call, step by step"), so a sandbox cannot use other
sessions' keys, the admin routes or any other host service.
It rewrites ``Host`` to the gateway's and forces ``Connection: close`` (RFC 9110 section 7.6.1),
so every request arrives on a connection of its own and is checked. The admitted request is
written again by h11 as a client, its body passed on as it arrives (chunked or Content-Length),
so the gateway frames it exactly as the relay did; the response, streamed or not, is piped back
unchanged. A head over :data:`MAX_HEAD_BYTES` is answered 431, one h11 cannot parse 400, and a
request the gateway cannot be reached for 502.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import ssl
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import h11
import structlog

from rolloutd.errors import ConfigError

log = structlog.get_logger(__name__)

#: bytes a request head may have (request line and headers); h11's
#: ``max_incomplete_event_size``, so a longer head is answered 431.
MAX_HEAD_BYTES = 64 * 1024
#: bytes read from a socket at a time.
_READ_BYTES = 65536
#: headers dropped from forwarded requests: hop-by-hop (RFC 9110 section 7.6.1) and Host.
HOP_HEADERS = {
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"upgrade",
    b"te",
    b"trailer",
    b"host",
    b"proxy-authorization",
}
#: the session prefix of a gateway base URL: ``.../s/{key}/``.
SESSION_PREFIX = re.compile(r"^(.*?/s/[^/]+/)")


def session_prefix(base_url: str) -> str:
    """The path prefix a session's requests must start with.

    Args:
        base_url: a session base URL, e.g. ``http://127.0.0.1:8300/s/KEY/v1``.

    Returns:
        ``/s/KEY/`` (with any path before it), or the URL's path with a trailing slash when it
        has no ``/s/{key}/`` segment.
    """
    path = urlsplit(base_url).path
    match = SESSION_PREFIX.match(path if path.endswith("/") else path + "/")
    if match:
        return match.group(1)
    return path if path.endswith("/") else path + "/"


def rewrite_url(url: str, inside_origin: str) -> str:
    """``url`` with its scheme and host replaced by the in-sandbox address.

    Args:
        url: a gateway URL (``http(s)://host:port/path``).
        inside_origin: ``http://127.0.0.1:PORT``.
    """
    parts, inside = urlsplit(url), urlsplit(inside_origin)
    return urlunsplit((inside.scheme, inside.netloc, parts.path, parts.query, parts.fragment))


class GatewayRelay:
    """A unix-socket server relaying one session's HTTP requests to its gateway.

    Args:
        socket_path: where to listen (created by :meth:`start`, removed by :meth:`close`).

    Attributes:
        num_admitted, num_refused: requests relayed and refused so far.
    """

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = Path(socket_path)
        self._server: asyncio.AbstractServer | None = None
        self._host = ""
        self._port = 0
        self._tls: ssl.SSLContext | None = None
        self._netloc = b""
        self._prefix = ""
        self._tasks: set[asyncio.Task[None]] = set()
        self.num_admitted = 0
        self.num_refused = 0

    async def start(self) -> None:
        """Listen on :attr:`socket_path` (mode 0666: the sandbox's user must connect)."""
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self._server = await asyncio.start_unix_server(self._accept, path=str(self.socket_path))
        os.chmod(self.socket_path, 0o666)

    def attach(self, base_url: str) -> None:
        """Point the relay at a session: its gateway's origin and path prefix.

        Args:
            base_url: the session's base URL (any of its dialects' URLs).

        Raises:
            ConfigError: not an http(s) URL with a host.
        """
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"gateway URL {base_url!r} must be http(s)://host[:port]/...")
        self._host = parts.hostname
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._tls = ssl.create_default_context() if parts.scheme == "https" else None
        self._netloc = parts.netloc.encode()
        self._prefix = session_prefix(base_url)

    @property
    def attached(self) -> bool:
        """Whether :meth:`attach` was called."""
        return bool(self._host)

    async def close(self) -> None:
        """Stop listening, cut every open connection, remove the socket. Idempotent."""
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    # -- one connection ----------------------------------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (ConnectionError, ssl.SSLError, OSError, h11.LocalProtocolError) as exc:
            log.info("gateway_relay_connection_failed", error=type(exc).__name__)
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        inbound = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        try:
            request = await _read_head(inbound, reader)
        except h11.RemoteProtocolError as exc:
            self.num_refused += 1
            status = exc.error_status_hint
            log.info("gateway_relay_refused", reason="malformed_request", status=status)
            await _refuse(writer, inbound, status, _MALFORMED.get(status, "malformed request"))
            return
        if not isinstance(request, h11.Request):  # the sandbox hung up before a request
            return
        reason = self._refusal(request.target.decode("latin-1"))
        if reason:
            self.num_refused += 1
            log.info("gateway_relay_refused", reason=reason)
            await _refuse(writer, inbound, 403 if self.attached else 503, reason)
            return
        outbound = h11.Connection(h11.CLIENT)
        head = outbound.send(
            h11.Request(
                method=request.method,
                target=request.target,
                headers=self._forwarded_headers(request),
            )
        )
        try:
            up_reader, up_writer = await asyncio.open_connection(
                self._host,
                self._port,
                ssl=self._tls,
                server_hostname=self._host if self._tls else None,
            )
        except OSError as exc:  # a gateway restarting: the harness sees a 502 it may retry
            log.info("gateway_relay_upstream_failed", error=type(exc).__name__)
            await _refuse(writer, inbound, 502, "the gateway is unreachable", kind="server_error")
            return
        self.num_admitted += 1
        try:
            up_writer.write(head)
            upload = asyncio.ensure_future(_upload(inbound, reader, outbound, up_writer))
            try:
                await _pipe(up_reader, writer)
            finally:
                upload.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await upload
        finally:
            up_writer.close()

    def _forwarded_headers(self, request: h11.Request) -> list[tuple[bytes, bytes]]:
        """The request's headers as sent to the gateway: hop-by-hop ones replaced.

        ``Host`` becomes the gateway's and ``Connection: close`` is added, so the gateway
        closes after one response and the sandbox's next request comes on a new, checked
        connection. With ``Transfer-Encoding`` present, ``Content-Length`` is dropped too:
        RFC 9112 section 6.3 has a forwarder remove it, so both sides frame the body alike.
        """
        chunked = any(name == b"transfer-encoding" for name, _ in request.headers)
        kept = [
            (name, value)
            for name, value in request.headers.raw_items()
            if name.lower() not in HOP_HEADERS
            and not (chunked and name.lower() == b"content-length")
        ]
        return [(b"Host", self._netloc), *kept, (b"Connection", b"close")]

    def _refusal(self, target: str) -> str | None:
        """Why ``target`` is refused, or None when it is below the session prefix."""
        if not self.attached:
            return "no gateway session attached to this runtime yet"
        if not target.startswith("/"):
            return "only origin-form request targets are relayed"
        path = target.split("?", 1)[0]
        decoded = unquote(path)
        if any(seg in (".", "..") for seg in decoded.split("/")) or "\\" in decoded:
            return "dot segments are not relayed"
        if not (path.startswith(self._prefix) and decoded.startswith(self._prefix)):
            return "outside this session's routes"
        return None


#: what a refused sandbox is told, by h11's status hint for a request it could not parse.
_MALFORMED = {
    400: "malformed request",
    431: f"request head over {MAX_HEAD_BYTES} bytes",
    501: "only the chunked transfer coding is relayed",
}


async def _next_event(conn: h11.Connection, reader: asyncio.StreamReader) -> Any:
    """The next event ``conn`` parses from ``reader``, reading as much as it needs.

    Returns:
        an ``h11.Event`` (Request, Data, EndOfMessage, ConnectionClosed) or ``h11.PAUSED``.

    Raises:
        h11.RemoteProtocolError: the bytes are not HTTP/1.1, or a head or chunk header is
            longer than the connection's ``max_incomplete_event_size`` (status hint 431).
    """
    while (event := conn.next_event()) is h11.NEED_DATA:
        conn.receive_data(await reader.read(_READ_BYTES))  # b"" at EOF: h11 decides if clean
    return event


async def _read_head(conn: h11.Connection, reader: asyncio.StreamReader) -> Any:
    """The request head's event (or ConnectionClosed), from at most MAX_HEAD_BYTES bytes.

    h11 refuses only a head still incomplete after ``max_incomplete_event_size`` buffered
    bytes, so one read that completes a longer head would pass; the relay feeds it no more
    than :data:`MAX_HEAD_BYTES` before the head is whole.

    Raises:
        h11.RemoteProtocolError: as :func:`_next_event`; status hint 431 for a longer head.
    """
    fed = 0
    while (event := conn.next_event()) is h11.NEED_DATA:
        if fed >= MAX_HEAD_BYTES:
            raise h11.RemoteProtocolError("request head too large", error_status_hint=431)
        data = await reader.read(min(_READ_BYTES, MAX_HEAD_BYTES - fed))
        fed += len(data)
        conn.receive_data(data)  # b"" at EOF: h11 tells a clean hang-up from a cut head
    return event


async def _upload(
    inbound: h11.Connection,
    reader: asyncio.StreamReader,
    outbound: h11.Connection,
    up_writer: asyncio.StreamWriter,
) -> None:
    """Send the request body to the gateway as it arrives, framed anew by ``outbound``.

    The body is parsed by ``inbound`` (chunked or Content-Length) and written by ``outbound``
    with the framing of the forwarded head, so the gateway reads exactly the body the relay
    read, and bytes after it (a pipelined request) never reach the gateway. Trailer fields are
    dropped (RFC 9110 section 6.5.1 lets a recipient discard them). A malformed body, or a
    sandbox that hangs up before the answer is through, aborts the gateway connection, which
    ends the response pipe.
    """
    try:
        while isinstance(event := await _next_event(inbound, reader), h11.Data):
            up_writer.write(outbound.send(h11.Data(data=event.data)))
            await up_writer.drain()
        if isinstance(event, h11.EndOfMessage):
            up_writer.write(outbound.send(h11.EndOfMessage()))
            await up_writer.drain()
            # later bytes are not relayed (the answer closes the connection), but the sandbox
            # hanging up is, as a proxy passes on a client's abort: the gateway then stops a
            # call nobody waits for (the response pipe cancels this once the answer is through)
            while await reader.read(_READ_BYTES):
                pass
            log.debug("gateway_relay_sandbox_closed")
            up_writer.transport.abort()
            return
        error = "unexpected_event"  # h11 yields nothing else mid-body; never leave it hanging
    except (h11.RemoteProtocolError, ConnectionError, OSError) as exc:
        error = type(exc).__name__
    log.info("gateway_relay_upload_failed", error=error)
    up_writer.transport.abort()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy ``reader`` to ``writer`` until EOF: the gateway's response, unchanged."""
    while chunk := await reader.read(_READ_BYTES):
        writer.write(chunk)
        await writer.drain()


async def _refuse(
    writer: asyncio.StreamWriter,
    conn: h11.Connection,
    status: int,
    reason: str,
    *,
    kind: str = "forbidden",
) -> None:
    """Answer ``status`` with an OpenAI-shaped error body and ``Connection: close``.

    h11 lets a server answer before it has a whole request (its IDLE state takes a Response),
    which is how a request it could not parse still gets a status.

    Args:
        writer: the sandbox's connection.
        conn: its h11 server connection.
        status: the HTTP status code.
        reason: the error message's tail, for the harness's log.
        kind: the error body's ``type``.
    """
    body = json.dumps(
        {"error": {"message": f"rolloutd sandbox relay: {reason}", "type": kind}}
    ).encode()
    headers = [
        (b"Content-Type", b"application/json"),
        (b"Content-Length", b"%d" % len(body)),
        (b"Connection", b"close"),
    ]
    writer.write(
        conn.send(
            h11.Response(
                status_code=status, headers=headers, reason=HTTPStatus(status).phrase.encode()
            )
        )
    )
    writer.write(conn.send(h11.Data(data=body)))
    writer.write(conn.send(h11.EndOfMessage()))
    await writer.drain()
