"""The Gemini routes (Gemini API reference, "models.generateContent")::

    POST /s/{key}/v1beta/models/{model}:generateContent
    POST /s/{key}/v1beta/models/{model}:streamGenerateContent   (``alt=sse``)
    POST /s/{key}/v1beta/models/{model}:countTokens             the token count
    POST /s/{key}/v1/models/{model}:...                the same three on Gemini API ``v1``
                                                       (google-genai's default version)

One handler serves the three methods: :class:`rolloutd.proxy.http.app.ModelCalls` passes it
what follows the prefix (``{model}:{method}``).
"""

from __future__ import annotations

from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from rolloutd.errors import NotFoundError
from rolloutd.proxy.dialects import gemini
from rolloutd.proxy.http.answers import translated_call
from rolloutd.proxy.http.gateway_parts import GatewayParts
from rolloutd.proxy.http.inbound import read_json

#: the Gemini route's prefix (the model and method follow it)
PREFIX = "/v1beta/models/"
#: the Gemini API versions a client may use: google-genai defaults to ``v1``, the CLIs use
#: ``v1beta``; the methods and bodies are the same
PREFIXES = (PREFIX, "/v1/models/")
#: the methods a Gemini route serves
METHODS = ("generateContent", "streamGenerateContent", "countTokens")


def model_calls(gateway: GatewayParts) -> dict[str, Any]:
    """``{PREFIX: handler(request, key, model_action)}``
    (:class:`rolloutd.proxy.http.app.ModelCalls` serves every prefix of :data:`PREFIXES`
    with it)."""

    async def generate_content(request: Request, key: str | None, model_action: str) -> Response:
        session = await gateway.sessions.lookup(key)
        model, _, action = model_action.rpartition(":")
        if action not in METHODS or not model:
            raise NotFoundError(
                f"no method {action!r}: use generateContent, streamGenerateContent or countTokens"
            )
        model = model.removeprefix("models/")
        if action == "countTokens":
            body = await read_json(
                request, gateway.settings.max_body_bytes, reader=session.body_reader
            )
            internal = gemini.parse_count_tokens(body, model=model)
            return JSONResponse(
                {"totalTokens": await gateway.service.count_tokens(session, internal)}
            )
        stream = action == "streamGenerateContent"
        sse = request.query_params.get("alt") == "sse"
        return await translated_call(
            gateway,
            request,
            session,
            gemini,
            lambda body: gemini.parse(body, model=model, stream=stream, memo=session.memo),
            lambda start, req: gemini.encoder(start, req, sse=sse),
        )

    return {PREFIX: generate_content}
