"""The gateway: owns settings, blob store, tokenizer, backends, sessions; serves the app.

The gateway worker process runs the HTTP server and a Temporal worker in one event loop::

    gateway = Gateway.from_settings(GatewaySettings())
    handle = await serve(gateway)                  # uvicorn, bound, in this loop
    info = await gateway.sessions.open_session("mytask/0", "mytask", sampling=...)
    ...
    num_completions = await gateway.sessions.close_session("mytask/0")
    await handle.shutdown()
    await gateway.aclose()
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import structlog
import uvicorn
from fastapi import FastAPI

from rolloutd.engine.models import CATALOG, load_tokenizer
from rolloutd.errors import RolloutdError
from rolloutd.observability import metrics
from rolloutd.proxy.backends.pool import BackendPool
from rolloutd.proxy.backends.saturation import BackendCapacity
from rolloutd.proxy.calls.service import ChatService
from rolloutd.proxy.http.app import create_app
from rolloutd.proxy.render.chat_template import ChatTemplate
from rolloutd.proxy.render.reasoning_parsers import parsers_for_model
from rolloutd.proxy.sessions.manager import SessionManager
from rolloutd.proxy.sessions.recorder import Recorder
from rolloutd.security.exposure import require_token_off_loopback
from rolloutd.settings import GatewaySettings
from rolloutd.store import BlobStore

log = structlog.get_logger(__name__)


def served_model_name(model: str) -> str:
    """The model name harnesses see: the catalog's served name, else ``model`` itself."""
    entry = CATALOG.get(model)
    return entry.served_name if entry else model


def check_admin_exposure(settings: GatewaySettings, host: str | None = None) -> None:
    """Refuse a gateway that would serve its admin routes to the network without a token.

    Args:
        settings: ``gateway_host`` and ``admin_token``.
        host: the bind address, when not ``settings.gateway_host``.

    Raises:
        ConfigError: the bind address is not loopback and ``admin_token`` is unset
            (admin routes need a token off loopback).
    """
    require_token_off_loopback(
        settings.gateway_host if host is None else host,
        settings.admin_token,
        service="the gateway",
        token_setting="ROLLOUTD_ADMIN_TOKEN",
        protects="its admin routes (backend pool, pause and drain, policy version)",
    )


class Gateway:
    """Everything the gateway's routes and activities use.

    Args:
        settings: gateway settings.
        store: the blob store (completion logs, session state).
        template: the model's chat template.
        pool: the backends.
        model_name: default model name shown to harnesses.
        tool_parser: tool-call parser name (``hermes`` for Qwen2.5).
        reasoning_parser: reasoning parser name, or None.

    Attributes:
        sessions: open/close/lookup sessions (what the Temporal activities call).
        service: the generation pipeline.
        app: the FastAPI app (built on first use).
    """

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        store: BlobStore,
        template: ChatTemplate,
        pool: BackendPool,
        model_name: str,
        tool_parser: str = "hermes",
        reasoning_parser: str | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.template = template
        self.pool = pool
        metrics.watch_pool(pool)  # its backends' state, read at each scrape
        self.model_name = model_name
        public_url = settings.gateway_public_url or (
            f"http://{settings.gateway_host}:{settings.gateway_port}"
        )
        self.sessions = SessionManager(
            store,
            pool,
            public_url=public_url,
            default_model=model_name,
            max_calls_per_session=settings.max_calls_per_session,
            default_capture_mode=settings.capture_mode,
        )
        self.sessions.capacity = BackendCapacity(
            pool,
            max_sessions_per_slot=settings.max_sessions_per_slot,
            backend_slots=settings.backend_slots,
        )
        self.recorder = Recorder()
        self.service = ChatService(
            template,
            pool,
            self.recorder,
            tool_parser=tool_parser,
            reasoning_parser=reasoning_parser,
        )
        self._app: FastAPI | None = None

    @classmethod
    def from_settings(
        cls,
        settings: GatewaySettings,
        *,
        tokenizer: Any | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        ctx_size: int | None = None,
        tool_parser: str | None = None,
        reasoning_parser: str | None = None,
    ) -> Gateway:
        """Build a gateway from settings (loads the tokenizer: takes a few seconds).

        Args:
            settings: ``store_url``, ``model``, ``tokenizer``, ``capture_mode`` (of the
                sessions it opens), ``backend_url`` (comma-separated URLs; used until an admin
                manages the durable pool), ``backend_timeout_s``, ``gateway_*``.
            tokenizer: a loaded tokenizer (default: :func:`load_tokenizer` of
                ``settings.tokenizer`` at ``settings.tokenizer_revision``, else of
                ``settings.model``).
            transport: httpx transport for backend clients (tests record through it).
            ctx_size: context window per sequence; None asks each backend's ``/props``.
            tool_parser: tool-call parser name; default ``settings.tool_parser``, else the
                model's (:func:`rolloutd.proxy.render.reasoning_parsers.parsers_for_model`).
            reasoning_parser: reasoning parser name; default ``settings.reasoning_parser``,
                else the model's.

        Raises:
            rolloutd.errors.ConfigError: unknown model, no chat template, unsupported backend.
        """
        template = ChatTemplate(
            tokenizer
            if tokenizer is not None
            else load_tokenizer(
                settings.tokenizer or settings.model, revision=settings.tokenizer_revision
            ),
            incremental=settings.incremental_render,
        )
        store = BlobStore(
            settings.store_url,
            sync=settings.store_sync,
            group_commit_s=settings.store_group_commit_s,
        )
        pool = BackendPool.from_settings(
            settings, transport=transport, ctx_size=ctx_size, store=store
        )
        defaults = parsers_for_model(settings.model)
        return cls(
            settings,
            store=store,
            template=template,
            pool=pool,
            model_name=served_model_name(settings.model),
            tool_parser=tool_parser or settings.tool_parser or defaults.tool_parser,
            reasoning_parser=reasoning_parser
            or settings.reasoning_parser
            or defaults.reasoning_parser,
        )

    @property
    def app(self) -> FastAPI:
        """The FastAPI app of this gateway."""
        if self._app is None:
            self._app = create_app(self)
        return self._app

    def set_public_url(self, url: str) -> None:
        """Base URL put in new sessions' base URLs (known once the port is bound)."""
        self.sessions.public_url = url.rstrip("/")

    async def aclose(self) -> None:
        """Close backend clients; fsync what the store wrote (``store_sync`` ``group``)."""
        await self.pool.aclose()
        await asyncio.to_thread(self.store.flush)


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without signal handlers: the host process (Temporal worker) owns signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class ServerHandle:
    """A running gateway HTTP server.

    Attributes:
        host: bound address.
        port: bound port (the real one when 0 was asked for).
        http_parser: the HTTP/1.1 parser uvicorn serves with: ``httptools`` when installed
            (a C parser), else ``h11`` (pure Python, slower).
        event_loop: the event loop's class (``uvloop.Loop`` when the process runs on uvloop,
            see :func:`rolloutd.workers.run_process`).
    """

    host: str
    port: int
    server: uvicorn.Server
    task: asyncio.Task[None]
    http_parser: str = "h11"
    event_loop: str = "asyncio"

    @property
    def url(self) -> str:
        """``http://{host}:{port}``."""
        return f"http://{self.host}:{self.port}"

    async def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop accepting, finish in-flight requests for up to ``timeout_s``, then force."""
        self.server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout_s)
        except TimeoutError:
            self.server.force_exit = True
            await self.task
        log.info("gateway_stopped", port=self.port)


async def serve(
    gateway: Gateway,
    host: str | None = None,
    port: int | None = None,
    *,
    startup_timeout_s: float = 30.0,
) -> ServerHandle:
    """Run the gateway's app with uvicorn in the running event loop.

    The socket is bound here, so a port in use raises ``OSError`` to the caller instead of
    exiting the process. When ``settings.gateway_public_url`` is unset, the gateway's public
    URL becomes ``http://{host}:{bound port}``. uvicorn parses HTTP with httptools when it is
    installed (a dependency; h11 otherwise, which is pure Python and slower); the event loop
    is the caller's, so running the process on uvloop is the caller's choice
    (:func:`rolloutd.workers.run_process` does for the gateway fleet). Both are logged with
    ``gateway_started`` and kept on the handle.

    Args:
        gateway: the gateway.
        host: bind address (default ``settings.gateway_host``).
        port: bind port, 0 for any (default ``settings.gateway_port``).
        startup_timeout_s: limit for uvicorn to start serving.

    Returns:
        A handle with the bound port and ``shutdown()``.

    Raises:
        OSError: the address cannot be bound.
        ConfigError: ``host`` is not loopback and no admin token is configured.
        RolloutdError: uvicorn did not start within ``startup_timeout_s``.
    """
    host = host if host is not None else gateway.settings.gateway_host
    port = port if port is not None else gateway.settings.gateway_port
    check_admin_exposure(gateway.settings, host)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted sockets only then;
    # without it Nagle plus delayed ACK add ~40 ms to every answer
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(
        gateway.app,
        host=host,
        port=bound_port,
        log_config=None,
        access_log=False,
        lifespan="off",
        # no client addresses are used: skip X-Forwarded-* parsing per call
        proxy_headers=False,
        h11_max_incomplete_event_size=gateway.settings.max_header_bytes,
        timeout_keep_alive=int(max(1, gateway.settings.keep_alive_s)),
    )
    config.load()  # resolves http="auto" now, so the parser in use can be reported
    http_parser = config.http_protocol_class.__module__.rsplit(".", 1)[-1].removesuffix("_impl")
    server = _EmbeddedServer(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="rolloutd-gateway-http")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + startup_timeout_s
    while not server.started:
        if task.done():
            sock.close()
            raise RolloutdError("gateway HTTP server stopped during startup") from task.exception()
        if loop.time() > deadline:
            server.should_exit = True
            sock.close()
            raise RolloutdError(f"gateway HTTP server not started after {startup_timeout_s} s")
        await asyncio.sleep(0.01)  # polling uvicorn's `started` flag, bounded by the deadline
    if gateway.settings.gateway_public_url is None:
        gateway.set_public_url(f"http://{host}:{bound_port}")
    event_loop = f"{type(loop).__module__}.{type(loop).__name__}"
    log.info(
        "gateway_started",
        host=host,
        port=bound_port,
        http_parser=http_parser,
        event_loop=event_loop,
    )
    return ServerHandle(
        host=host,
        port=bound_port,
        server=server,
        task=task,
        http_parser=http_parser,
        event_loop=event_loop,
    )
