"""An ASGI app served over real HTTP (uvicorn on a free port) for the length of a block: the
callback receivers and facades the tests reach the way a real client would."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import uvicorn

from rolloutd.processes import free_port
from tests.support.buffer_tasks import poll


@contextlib.asynccontextmanager
async def served(app: Any, host: str = "127.0.0.1", timeout_s: float = 10) -> AsyncIterator[str]:
    """Serve ``app`` on a free port of ``host`` until the block exits; yields its base URL
    (``http://host:port``).

    Raises:
        AssertionError: the server did not start within ``timeout_s`` seconds.
    """
    port = free_port(host)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="error"))
    serving = asyncio.create_task(server.serve())
    try:
        await poll(
            lambda: asyncio.sleep(0, server.started or serving.done()),
            bool,
            timeout_s=timeout_s,
            what="the server up",
        )
        assert server.started, "the server did not start"
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        await serving
