"""The OpenAI Responses routes (OpenAI API reference, "Responses")::

    POST /s/{key}/v1/responses
    POST /s/{key}/v1/responses/input_tokens            the token count (no sampling)

A body with ``previous_response_id`` continues the conversation of an earlier answer of the
same session.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from rolloutd.errors import RequestFieldError
from rolloutd.proxy.dialects import openai_responses
from rolloutd.proxy.http.answers import translated_call
from rolloutd.proxy.http.gateway_parts import GatewayParts
from rolloutd.proxy.http.inbound import read_json
from rolloutd.proxy.sessions.session import Session


def previous_of(gateway: GatewayParts, session: Session, body: Any) -> list[dict[str, Any]] | None:
    """The conversation a Responses body continues (``previous_response_id``), or None.

    Raises:
        RequestFieldError: the id names no answer of this session.
    """
    previous_id = body.get("previous_response_id") if isinstance(body, dict) else None
    if not isinstance(previous_id, str):
        return None
    previous = gateway.service.previous_conversation(session, previous_id)
    if previous is None:
        raise RequestFieldError(
            f"previous response {previous_id!r} not found in this session",
            param="previous_response_id",
        )
    return previous


def model_calls(gateway: GatewayParts) -> dict[str, Any]:
    """``route path -> handler(request, key)`` of this dialect's model calls
    (:class:`rolloutd.proxy.http.app.ModelCalls` serves them)."""

    async def responses(request: Request, key: str | None) -> Response:
        session = await gateway.sessions.lookup(key)
        return await translated_call(
            gateway,
            request,
            session,
            openai_responses,
            lambda body: openai_responses.parse(
                body, previous=previous_of(gateway, session, body), memo=session.memo
            ),
        )

    async def input_tokens(request: Request, key: str | None) -> Response:
        session = await gateway.sessions.lookup(key)
        body = await read_json(request, gateway.settings.max_body_bytes)
        internal = openai_responses.parse(body, previous=previous_of(gateway, session, body))
        return JSONResponse(
            openai_responses.input_tokens_json(
                await gateway.service.count_tokens(session, internal)
            )
        )

    return {"/v1/responses": responses, "/v1/responses/input_tokens": input_tokens}
