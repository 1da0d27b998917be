"""The gateway's ASGI app (transport only: parsing, auth, rendering; no logic).

Session routes carry the key in the path, so a harness needs nothing but a base URL; the same
routes without the ``/s/{key}`` prefix take the key as the API key (``Authorization: Bearer``,
``x-api-key`` for Anthropic clients, ``x-goog-api-key`` or ``?key=`` for Gemini clients).
Each dialect's routes are in its router module::

    POST /s/{key}/v1/chat/completions                  openai_chat_routes
    POST /s/{key}/v1/responses[/input_tokens]          openai_responses_routes
    POST /s/{key}/v1/messages[/count_tokens]           anthropic_routes
    POST /s/{key}/v1beta/models/{model}:{method}       gemini_routes (also on ``/v1/models/``)
    GET  /s/{key}[/rolloutd/verdict|/v1/models...]     session_routes
    /admin/...                                         admin_routes (the backend pool, admin
                                                       token)
    GET  /health                                       the gateway and its backends' health
    GET  /metrics                                      Prometheus metrics of the process
                                                       (docs/metrics.md)

Bodies larger than ``settings.max_body_bytes`` get 413, headers larger than
``settings.max_header_bytes`` get 431, each in the dialect's error shape.

Every error is rendered once, in the dialect of the route it reached
(:mod:`rolloutd.proxy.http.errors`); bad input is never a 500.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from rolloutd.errors import HeadersTooLargeError
from rolloutd.observability import metrics
from rolloutd.proxy.http import (
    anthropic_routes,
    gemini_routes,
    openai_chat_routes,
    openai_responses_routes,
)
from rolloutd.proxy.http.admin_routes import add_admin_routes
from rolloutd.proxy.http.errors import add_error_handlers, error_response, render_error
from rolloutd.proxy.http.gateway_parts import GatewayParts
from rolloutd.proxy.http.inbound import api_key
from rolloutd.proxy.http.session_routes import add_session_routes


class HeaderLimit:
    """ASGI middleware: a request whose target and headers exceed ``max_header_bytes`` gets
    431 in its dialect's error shape before any route runs (uvicorn's h11 parser bounds the
    raw header block as well; httptools has its own fixed bound).

    Args:
        app: the ASGI app.
        max_header_bytes: ``settings.max_header_bytes``.
    """

    def __init__(self, app: Any, max_header_bytes: int) -> None:
        self.app = app
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
            for name, value in scope["headers"]:
                size += len(name) + len(value) + 4
            if size > self.max_header_bytes:
                error = HeadersTooLargeError(
                    f"the request headers exceed the limit of {self.max_header_bytes} bytes"
                )
                await error_response(error, scope.get("path", ""))(scope, receive, send)
                return
        await self.app(scope, receive, send)


class ModelCalls:
    """ASGI app: model calls (``POST`` to a model-call route, with or without the
    ``/s/{key}`` prefix) go straight to their handler; every other request goes to ``app``.

    A model call thus skips FastAPI's middleware stack and router, which cost more per call
    than the call's own work (benchmarks/gateway_overhead.py); its errors are rendered exactly
    as the app's exception handlers render them (``render_error``).

    Args:
        app: the FastAPI app (admin, health, models, and every route not matched here).
        handlers: ``route path -> handler(request, key)``; the Gemini route's handler takes
            ``(request, key, model_action)`` and is keyed by its ``v1beta`` prefix; it serves
            every prefix of :attr:`GEMINI_PREFIXES`.
        render_error: ``(request, exception) -> Response``, the app's handlers in one.
        dialects: ``route path -> dialect`` of the routes whose calls are counted
            (``rolloutd_gateway_calls_total``, docs/metrics.md); others are not.
    """

    #: the Gemini route's prefix (the model and action follow it)
    GEMINI_PREFIX = gemini_routes.PREFIX
    #: the Gemini API versions a client may use (:data:`gemini_routes.PREFIXES`)
    GEMINI_PREFIXES = gemini_routes.PREFIXES

    def __init__(
        self,
        app: Any,
        handlers: dict[str, Any],
        render_error: Any,
        dialects: dict[str, str] | None = None,
    ) -> None:
        self.app = app
        self.handlers = handlers
        self.render_error = render_error
        self.dialects = dialects or {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        key: str | None = None
        route = path
        if path.startswith("/s/"):
            key, slash, route = path[3:].partition("/")
            route = slash + route
            if not key:
                await self.app(scope, receive, send)
                return
        extra: tuple[str, ...] = ()
        handler = self.handlers.get(route)
        dialect = self.dialects.get(route)
        for prefix in self.GEMINI_PREFIXES:
            if route.startswith(prefix):
                handler, extra = self.handlers[self.GEMINI_PREFIX], (route[len(prefix) :],)
                dialect = self.dialects.get(self.GEMINI_PREFIX)
        if handler is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            response = await handler(request, key if key is not None else api_key(request), *extra)
        except Exception as e:  # noqa: BLE001 - request boundary: rendered in the dialect
            response = await self.render_error(request, e)
        if dialect is not None:
            metrics.count_call(dialect, response.status_code)
        await response(scope, receive, send)


#: the model-call routes whose calls are counted, by dialect (docs/metrics.md)
CALL_DIALECTS = {
    "/v1/chat/completions": "openai_chat",
    "/v1/responses": "openai_responses",
    "/v1/messages": "anthropic",
    ModelCalls.GEMINI_PREFIX: "gemini",
}


def create_app(gateway: GatewayParts) -> Any:
    """The gateway's ASGI app: :class:`HeaderLimit` around :class:`ModelCalls` around the
    FastAPI app.

    Args:
        gateway: owns the settings, sessions and chat service the routes use
            (:class:`rolloutd.proxy.http.server.Gateway`).
    """
    app = FastAPI(title="rolloutd gateway", docs_url=None, redoc_url=None, openapi_url=None)
    add_error_handlers(app)
    add_admin_routes(app, gateway)
    _add_process_routes(app, gateway)
    model_calls = {
        **openai_chat_routes.model_calls(gateway),
        **openai_responses_routes.model_calls(gateway),
        **anthropic_routes.model_calls(gateway),
        **gemini_routes.model_calls(gateway),
    }
    _add_model_call_paths(app, model_calls)
    add_session_routes(app, gateway)
    return HeaderLimit(
        ModelCalls(app, model_calls, render_error, CALL_DIALECTS),
        max_header_bytes=gateway.settings.max_header_bytes,
    )


def _add_process_routes(app: FastAPI, gateway: GatewayParts) -> None:
    """``GET /health`` and ``GET /metrics``: the gateway process, no session."""

    @app.get("/health")
    async def health() -> dict[str, Any]:
        # the gateway answers, so its status is ok; the pool's health is apart: a trainer
        # waiting on rollouts reads ``backend_health`` to tell a dead engine from a slow one
        await gateway.pool.probe_unhealthy()
        return {
            "status": "ok",
            "backends": gateway.pool.names(),
            "backend_health": gateway.pool.health(),
            # the session maps' sizes: open sessions only, closed ones are evicted
            "sessions": gateway.sessions.counts(),
        }

    # the Prometheus metrics of this process (docs/metrics.md); a scrape may fetch the
    # Temporal SDK's exporter over loopback, so it runs off the event loop
    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        body = await asyncio.to_thread(generate_latest, REGISTRY)
        return Response(body, media_type=CONTENT_TYPE_LATEST)


def _add_model_call_paths(app: FastAPI, model_calls: dict[str, Any]) -> None:
    """The model-call routes are served by :class:`ModelCalls` in front of the app; the app
    answers other methods on their paths (405) and every other path."""
    for path in [*model_calls, *ModelCalls.GEMINI_PREFIXES[1:]]:
        for route in ("/s/{key}" + path, path):
            app.router.add_route(
                route + ("{model_action:path}" if path in ModelCalls.GEMINI_PREFIXES else ""),
                _method_not_allowed,
                methods=["POST"],
            )


async def _method_not_allowed(request: Request) -> Response:
    """Never reached by a POST (:class:`ModelCalls` serves those): the route exists so the
    router answers other methods on a model-call path with 405, as before."""
    raise StarletteHTTPException(status_code=405)
