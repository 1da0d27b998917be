"""A session's routes other than model calls::

    GET|HEAD /s/{key}                                  the base URL itself (a client's preconnect)
    GET  /s/{key}/rolloutd/verdict                     the gateway's verdict on the session
    GET  /s/{key}/v1/models[/{model}]                  the served model, in the caller's dialect
    GET  /s/{key}/v1beta/models[/{model}]              (Anthropic and Google SDKs list and
                                                       look up models too)

The model routes also answer without the ``/s/{key}`` prefix, with the key as the API key.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from starlette.exceptions import HTTPException as StarletteHTTPException

from rolloutd.proxy.dialects.common import served_model
from rolloutd.proxy.http.errors import dialect_of
from rolloutd.proxy.http.gateway_parts import GatewayParts
from rolloutd.proxy.http.inbound import api_key


def add_session_routes(app: FastAPI, gateway: GatewayParts) -> None:
    """Register the routes above on ``app``."""

    # Claude Code sends `HEAD {ANTHROPIC_BASE_URL}` at startup to warm the connection; the
    # base URL answers 200 for a valid key, so a client's probe of it is not an error
    @app.api_route("/s/{key}", methods=["GET", "HEAD"])
    @app.api_route("/s/{key}/", methods=["GET", "HEAD"])
    async def session_root(key: str) -> dict[str, Any]:
        await gateway.sessions.lookup(key)
        return {"status": "ok"}

    # the sandbox asks at each heartbeat of a running harness (docs/failures.md): after
    # backend_dead_after_s of unanswered calls it stops the harness
    @app.get("/s/{key}/rolloutd/verdict")
    async def session_verdict(key: str) -> dict[str, Any]:
        session = await gateway.sessions.lookup(key)
        dead_after_s = gateway.settings.backend_dead_after_s
        # a probe only when a call has waited that long: a saturated engine is not dead
        answers = session.liveness.waited(dead_after_s) and await gateway.pool.answers(
            session.state.backend
        )
        return session.liveness.verdict(dead_after_s, backend_answers=answers).model_dump()

    _add_model_routes(app, gateway)


def _add_model_routes(app: FastAPI, gateway: GatewayParts) -> None:
    """``GET .../models`` and ``GET .../models/{model_id}``, with and without the key in
    the path, on OpenAI's ``/v1`` and Google's ``/v1beta``."""

    async def models(
        request: Request, key: str | None, model_id: str | None = None
    ) -> dict[str, Any]:
        """The served model listed, or looked up by ``model_id``, in the caller's dialect."""
        session = await gateway.sessions.lookup(key if key is not None else api_key(request))
        dialect = dialect_of(request.url.path, request.headers)
        if model_id is None:
            return dialect.models_list(session.state.model)  # type: ignore[no-any-return]
        return dialect.model_json(  # type: ignore[no-any-return]
            served_model(session.state.model, model_id)
        )

    async def list_models(request: Request, key: str | None = None) -> dict[str, Any]:
        return await models(request, key)

    async def get_model(request: Request, model_id: str, key: str | None = None) -> dict[str, Any]:
        if ":" in model_id:  # a Gemini method ({model}:generateContent): POST only
            raise StarletteHTTPException(status_code=405)
        return await models(request, key, model_id)

    for path in ("/v1/models", "/v1beta/models"):
        for route in ("/s/{key}" + path, path):
            app.router.add_api_route(route, list_models, methods=["GET"])
            app.router.add_api_route(route + "/{model_id:path}", get_model, methods=["GET"])
