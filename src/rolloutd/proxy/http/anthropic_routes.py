"""The Anthropic Messages routes (Anthropic API reference, "Messages")::

POST /s/{key}/v1/messages[?beta=true]
POST /s/{key}/v1/messages/count_tokens             the token count (no sampling)
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from rolloutd.proxy.dialects import anthropic
from rolloutd.proxy.http.answers import Call, answer, model_call
from rolloutd.proxy.http.gateway_parts import GatewayParts
from rolloutd.proxy.http.inbound import marked_retry, read_json


def model_calls(gateway: GatewayParts) -> dict[str, Any]:
    """``route path -> handler(request, key)`` of this dialect's model calls
    (:class:`rolloutd.proxy.http.app.ModelCalls` serves them)."""

    async def messages(request: Request, key: str | None) -> Response:
        session = await gateway.sessions.lookup(key)

        async def respond(call: Call) -> Response:
            body = await read_json(
                request, gateway.settings.max_body_bytes, reader=session.body_reader
            )
            return await answer(
                gateway.service,
                session,
                call,
                anthropic.parse(body, memo=session.memo),
                anthropic,
                retry=marked_retry(request),
            )

        return await model_call(gateway.service, session, respond)

    async def count_tokens(request: Request, key: str | None) -> Response:
        session = await gateway.sessions.lookup(key)
        body = await read_json(request, gateway.settings.max_body_bytes)
        internal = anthropic.parse_count_tokens(body)
        return JSONResponse({"input_tokens": await gateway.service.count_tokens(session, internal)})

    return {"/v1/messages": messages, "/v1/messages/count_tokens": count_tokens}
