"""A recording reverse proxy for tests: forwards every request to an upstream and keeps a copy
of each exchange, so a test can compare what a server really answered with what rolloutd
recorded or what a harness received."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Exchange:
    """One request and its response as seen on the wire."""

    method: str
    path: str
    request_body: bytes
    status: int = 0
    response_body: bytes = b""
    content_type: str = ""
    complete: bool = False  # the whole body reached the client (False: it hung up mid-way)

    def request_json(self) -> Any:
        """The request body as JSON."""
        return json.loads(self.request_body)

    def response_json(self) -> Any:
        """The response body as JSON (non-streamed responses)."""
        return json.loads(self.response_body)

    def sse_events(self) -> list[Any]:
        """The ``data:`` payloads of a streamed (SSE) response, parsed where JSON."""
        events = []
        for line in self.response_body.decode().splitlines():
            if line.startswith("data:"):
                data = line[5:].strip()
                events.append(data if data == "[DONE]" else json.loads(data))
        return events


@dataclass
class Tee:
    """The proxy: ``url`` forwards to ``upstream``; ``exchanges`` records every exchange."""

    upstream: str
    exchanges: list[Exchange] = field(default_factory=list)
    url: str = ""
    #: the next this-many POSTs are answered 500 (not forwarded): a backend failing for a
    #: while
    fail_next_posts: int = 0
    #: while True, every request waits unanswered (neither forwarded nor refused) until
    #: :meth:`release` or :meth:`stop`: a backend that hangs, its health probe included
    hanging: bool = False
    _released: asyncio.Event = field(default_factory=asyncio.Event)
    _server: uvicorn.Server | None = None
    _task: asyncio.Task[None] | None = None

    def app(self) -> Starlette:
        client = httpx.AsyncClient(base_url=self.upstream, timeout=None)

        async def forward(request: Request) -> Response:
            body = await request.body()
            ex = Exchange(request.method, request.url.path, body)
            self.exchanges.append(ex)
            if self.hanging:
                await self._released.wait()
            if request.method == "POST" and self.fail_next_posts > 0:
                self.fail_next_posts -= 1
                ex.status, ex.complete = 500, True
                return Response(
                    b'{"error": {"message": "injected failure"}}',
                    status_code=500,
                    media_type="application/json",
                )
            headers = {
                k: v
                for k, v in request.headers.items()
                if k.lower() not in ("host", "content-length")
            }
            upstream = client.build_request(
                request.method,
                request.url.path + (f"?{request.url.query}" if request.url.query else ""),
                content=body,
                headers=headers,
            )
            resp = await client.send(upstream, stream=True)
            ex.status = resp.status_code
            ex.content_type = resp.headers.get("content-type", "")

            async def body_iter():
                chunks = []
                try:
                    async for chunk in resp.aiter_raw():
                        chunks.append(chunk)
                        yield chunk
                    ex.complete = True
                finally:
                    ex.response_body = b"".join(chunks)
                    await resp.aclose()

            passed = {
                k: v
                for k, v in resp.headers.items()
                if k.lower() not in ("content-length", "transfer-encoding", "connection")
            }
            return StreamingResponse(body_iter(), status_code=resp.status_code, headers=passed)

        return Starlette(
            routes=[Route("/{path:path}", forward, methods=["GET", "POST", "DELETE", "PUT"])]
        )

    async def start(self) -> Tee:
        config = uvicorn.Config(
            self.app(), host="127.0.0.1", port=0, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while not self._server.started:
            if loop.time() > deadline or self._task.done():
                raise RuntimeError("tee proxy did not start")
            await asyncio.sleep(0.02)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def release(self) -> None:
        """Stop hanging: the waiting requests are forwarded, and so are later ones."""
        self.hanging = False
        self._released.set()

    async def stop(self) -> None:
        self.release()
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
