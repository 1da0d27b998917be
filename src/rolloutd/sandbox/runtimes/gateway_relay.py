"""Host side of ``network: gateway``: a unix socket that reaches one gateway session only.

A sandbox with its own network namespace cannot reach the host's gateway over TCP. The runtime
binds a host folder holding a unix socket into the sandbox's network holder; a forwarder there
(:mod:`rolloutd.sandbox.runtimes.relay_inside`) listens on the sandbox's loopback and relays each
connection to the socket; this module answers on the socket and relays to the gateway::

    harness --tcp--> 127.0.0.1:8300 (sandbox netns) --unix--> GatewayRelay --tcp/tls--> gateway

The relay reads each request's head (HTTP/1.1, RFC 9112 section 3) and admits it only when its
target is below the session's path prefix ``/s/{key}/`` (DESIGN.md, Gateway: the key is in the
path), so a sandbox cannot use other sessions' keys, the admin routes or any other host service.
It rewrites ``Host`` to the gateway's and forces ``Connection: close`` (RFC 9110 section 7.6.1),
so every request arrives on a connection of its own and is checked; the response body, streamed
or not, is piped back unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import ssl
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

import structlog

from rolloutd.errors import ConfigError

log = structlog.get_logger(__name__)

#: bytes a request head may have (request line and headers).
MAX_HEAD_BYTES = 64 * 1024
#: headers dropped from forwarded requests: hop-by-hop (RFC 9110 section 7.6.1) and Host.
HOP_HEADERS = {b"connection", b"keep-alive", b"proxy-connection", b"upgrade", b"te",
               b"trailer", b"host", b"proxy-authorization"}
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
        self._server = await asyncio.start_unix_server(self._accept, path=str(self.socket_path),
                                                       limit=MAX_HEAD_BYTES)
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
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                ssl.SSLError, OSError) as exc:
            log.info("gateway_relay_connection_failed", error=type(exc).__name__)
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head[:-4].split(b"\r\n")
        parts = lines[0].split(b" ")
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
            await _refuse(writer, 400, "malformed request line")
            self.num_refused += 1
            return
        target = parts[1].decode("latin-1")
        reason = self._refusal(target)
        if reason:
            self.num_refused += 1
            log.info("gateway_relay_refused", reason=reason)
            await _refuse(writer, 403 if self.attached else 503, reason)
            return
        headers = [line for line in lines[1:]
                   if line.split(b":", 1)[0].strip().lower() not in HOP_HEADERS]
        forwarded = b"\r\n".join([lines[0], b"Host: " + self._netloc, *headers,
                                  b"Connection: close", b"", b""])
        up_reader, up_writer = await asyncio.open_connection(
            self._host, self._port, ssl=self._tls,
            server_hostname=self._host if self._tls else None)
        self.num_admitted += 1
        try:
            up_writer.write(forwarded)
            upload = asyncio.ensure_future(_pipe(reader, up_writer, half_close=self._tls is None))
            try:
                await _pipe(up_reader, writer, half_close=False)
            finally:
                upload.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
                    await upload
        finally:
            up_writer.close()

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


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                half_close: bool) -> None:
    """Copy ``reader`` to ``writer`` until EOF; then half-close ``writer`` when asked."""
    while chunk := await reader.read(65536):
        writer.write(chunk)
        await writer.drain()
    if half_close and writer.can_write_eof():
        writer.write_eof()


async def _refuse(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    body = json.dumps({"error": {"message": f"rolloutd sandbox relay: {reason}",
                                 "type": "forbidden"}}).encode()
    phrase = {400: "Bad Request", 403: "Forbidden", 503: "Service Unavailable"}[status]
    writer.write(b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\nConnection: close\r\n\r\n%s"
                 % (status, phrase.encode(), len(body), body))
    await writer.drain()
