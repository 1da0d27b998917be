"""A provider that refuses every call: shows what a real CLI sends before any model answers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

#: an error body each SDK reads: OpenAI's ``error`` object and Anthropic's ``type: error``
REFUSAL = b'{"type": "error", "error": {"message": "refused", "type": "invalid_request_error"}}'


@dataclass
class Refusing:
    """Where the provider listens and what it was sent."""

    url: str
    #: (request line, lower-cased headers) of every request
    seen: list[tuple[str, dict[str, str]]] = field(default_factory=list)


@contextlib.asynccontextmanager
async def refusing_provider() -> AsyncIterator[Refusing]:
    """An HTTP server on a free port that records each request and answers 400."""
    state = Refusing("")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        lines = (await reader.readuntil(b"\r\n\r\n")).decode().split("\r\n")
        headers = {
            k.lower(): v for k, v in (line.split(": ", 1) for line in lines[1:] if ": " in line)
        }
        await reader.readexactly(int(headers.get("content-length", 0)))
        state.seen.append((lines[0], headers))
        writer.write(
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(REFUSAL), REFUSAL)
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    state.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    async with server:
        yield state
