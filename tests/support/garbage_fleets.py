"""Fleets in their own Temporal namespace whose gateway's backend answers garbage (200, JSON
content type, a body that is not JSON), and the ``rolloutd`` command of this environment: for
the tests of loud failures, tenancy and task replacements."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.loopback import loopback_server
from tests.support.namespaced_fleets import namespaced_fleets

REPO = Path(__file__).resolve().parents[2]


#: what the backend answers to every request: 200, JSON content type, not JSON
GARBAGE = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 9\r\n"
    b"Connection: close\r\n\r\n<garbage>"
)


async def answer_garbage(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _: int
) -> None:
    """Read one request (headers and body) and answer :data:`GARBAGE`."""
    head = await reader.readuntil(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            await reader.readexactly(int(value))
    writer.write(GARBAGE)
    await writer.drain()


@dataclass
class Rig:
    """Fleets in their own namespace."""

    address: str
    namespace: str
    store_url: str
    client: object
    #: the sandbox host's runtime slots (``None`` without the sandbox fleet)
    slots: object = None


@contextlib.asynccontextmanager
async def fleets_in_namespace(
    address: str,
    home: Path,
    *,
    sandbox: bool,
    tag: str = "loud",
    max_concurrent_sessions: int | None = None,
) -> AsyncIterator[Rig]:
    """The workflows, gateway (its backend answering :data:`GARBAGE`) and eval fleets, and
    the sandbox fleet when ``sandbox``, in a fresh namespace named after ``tag``; the sandbox
    host holds at most ``max_concurrent_sessions`` runtimes (``None``: its default)."""
    bound = (
        {}
        if max_concurrent_sessions is None
        else {"max_concurrent_sessions": max_concurrent_sessions}
    )
    async with (
        loopback_server(answer_garbage) as backend_url,
        namespaced_fleets(
            address, home, backend_url, tag=tag, sandbox=sandbox, sandbox_host=bound
        ) as fleets,
    ):
        host = fleets.handles.get("sandbox")
        slots = host.resources["slots"] if host is not None else None
        yield Rig(address, fleets.namespace, fleets.store_url, fleets.client, slots)


def rolloutd_command() -> list[str]:
    """The ``rolloutd`` console script of this environment (``python -m rolloutd.cli``
    when the package is not installed as a script)."""
    script = Path(sys.executable).parent / "rolloutd"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "rolloutd.cli"]
