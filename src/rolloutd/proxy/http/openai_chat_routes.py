"""The OpenAI Chat Completions routes (OpenAI API reference, "Create chat completion")::

POST /s/{key}/v1/chat/completions
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import Response

from rolloutd.proxy.dialects import openai_chat
from rolloutd.proxy.http.answers import translated_call
from rolloutd.proxy.http.gateway_parts import GatewayParts


def model_calls(gateway: GatewayParts) -> dict[str, Any]:
    """``route path -> handler(request, key)`` of this dialect's model calls
    (:class:`rolloutd.proxy.http.app.ModelCalls` serves them)."""

    async def chat(request: Request, key: str | None) -> Response:
        session = await gateway.sessions.lookup(key)
        return await translated_call(
            gateway,
            request,
            session,
            openai_chat,
            lambda body: openai_chat.parse(body, memo=session.memo),
        )

    return {"/v1/chat/completions": chat}
