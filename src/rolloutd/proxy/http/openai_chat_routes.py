"""The OpenAI Chat Completions routes (OpenAI API reference, "Create chat completion")::

POST /s/{key}/v1/chat/completions
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response

from rolloutd.proxy.dialects import openai_chat
from rolloutd.proxy.http.answers import Call, answer, model_call
from rolloutd.proxy.http.gateway_parts import GatewayParts
from rolloutd.proxy.http.inbound import marked_retry, read_json


def model_calls(gateway: GatewayParts) -> dict[str, Any]:
    """``route path -> handler(request, key)`` of this dialect's model calls
    (:class:`rolloutd.proxy.http.app.ModelCalls` serves them)."""

    async def chat(request: Request, key: str | None) -> Response:
        session = await gateway.sessions.lookup(key)

        async def respond(call: Call) -> Response:
            body = await read_json(
                request, gateway.settings.max_body_bytes, reader=session.body_reader
            )
            return await answer(
                gateway.service,
                session,
                call,
                openai_chat.parse(body, memo=session.memo),
                openai_chat,
                retry=marked_retry(request),
            )

        return await model_call(gateway.service, session, respond)

    return {"/v1/chat/completions": chat}
