"""The Anthropic Messages routes (Anthropic API reference, "Messages")::

POST /s/{key}/v1/messages[?beta=true]
POST /s/{key}/v1/messages/count_tokens             the token count (no sampling)
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from rolloutd.proxy.dialects import anthropic
from rolloutd.proxy.http.answers import translated_call
from rolloutd.proxy.http.gateway_parts import GatewayParts
from rolloutd.proxy.http.inbound import read_json


def model_calls(gateway: GatewayParts) -> dict[str, Any]:
    """``route path -> handler(request, key)`` of this dialect's model calls
    (:class:`rolloutd.proxy.http.app.ModelCalls` serves them)."""

    async def messages(request: Request, key: str | None) -> Response:
        session = await gateway.sessions.lookup(key)
        return await translated_call(
            gateway,
            request,
            session,
            anthropic,
            lambda body: anthropic.parse(body, memo=session.memo),
        )

    async def count_tokens(request: Request, key: str | None) -> Response:
        session = await gateway.sessions.lookup(key)
        body = await read_json(request, gateway.settings.max_body_bytes)
        internal = anthropic.parse_count_tokens(body)
        return JSONResponse({"input_tokens": await gateway.service.count_tokens(session, internal)})

    return {"/v1/messages": messages, "/v1/messages/count_tokens": count_tokens}
