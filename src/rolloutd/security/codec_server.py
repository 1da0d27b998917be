"""``rolloutd codec-server``: Temporal's remote codec protocol, so the UI and CLI can decode.

Protocol (docs.temporal.io, "Codec Server"; the Temporal UI and ``temporal --codec-endpoint``
speak it)::

    POST {endpoint}/decode   {"payloads": [Payload as protobuf JSON, ...]} -> same shape
    POST {endpoint}/encode   {"payloads": [...]}                          -> same shape

A Payload in protobuf JSON is ``{"metadata": {name: base64}, "data": base64}``. The caller's
namespace comes in the ``X-Namespace`` header (one key ring serves every namespace here).

Authorization: the bearer token ``ROLLOUTD_CODEC_SERVER_TOKEN``, either as
``Authorization: Bearer <token>`` (the CLI's ``--codec-auth``) or as the endpoint's first
path segment, ``http://host:port/<token>``, for the Temporal UI, which cannot add a header of
its own. Anything else gets 401. Browsers reach it only from the configured origins (CORS).
"""

from __future__ import annotations

import secrets
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.middleware.cors import CORSMiddleware
from google.protobuf import json_format
from pydantic import BaseModel, ConfigDict, Field
from temporalio.api.common.v1 import Payload

from rolloutd.security.codec import AesGcmCodec, CodecKeyError


class PayloadsBody(BaseModel):
    """The codec protocol's body: ``{"payloads": [...]}`` (protobuf JSON payloads)."""

    model_config = ConfigDict(extra="allow")

    payloads: list[dict[str, Any]] = Field(default_factory=list)


def _parse(body: PayloadsBody) -> list[Payload]:
    try:
        return [json_format.ParseDict(p, Payload()) for p in body.payloads]
    except json_format.ParseError as e:
        raise HTTPException(400, detail=f"not a Temporal payload: {e}") from None


def _render(payloads: list[Payload]) -> dict[str, Any]:
    return {"payloads": [json_format.MessageToDict(p) for p in payloads]}


def create_codec_app(codec: AesGcmCodec, token: str, *, origins: list[str]) -> FastAPI:
    """The codec server's app.

    Args:
        codec: the key ring's codec (the same keys as the fleets').
        token: the bearer token every encode/decode request carries (non-empty).
        origins: browser origins allowed by CORS, e.g. ``["http://localhost:8233"]``.

    Raises:
        ValueError: an empty token.
    """
    if not token:
        raise ValueError("the codec server needs a token")
    app = FastAPI(
        title="rolloutd codec server",
        version="0.1.0",
        description="Temporal remote codec protocol over rolloutd's AES-GCM codec.",
    )
    app.add_middleware(
        CORSMiddleware,
        allow_origins=origins,
        allow_credentials=True,
        allow_methods=["POST", "OPTIONS"],
        allow_headers=["authorization", "content-type", "x-namespace"],
    )

    def authorize(request: Request, path_token: str | None) -> None:
        given = path_token
        header = request.headers.get("authorization", "")
        if header.lower().startswith("bearer "):
            given = header[7:].strip()
        if not given or not secrets.compare_digest(given.encode(), token.encode()):
            raise HTTPException(
                401,
                detail="codec server: missing or wrong token",
                headers={"WWW-Authenticate": "Bearer"},
            )

    async def run(action: str, body: PayloadsBody) -> dict[str, Any]:
        payloads = _parse(body)
        try:
            out = await (codec.decode(payloads) if action == "decode" else codec.encode(payloads))
        except CodecKeyError as e:
            raise HTTPException(400, detail=str(e)) from None
        return _render(out)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        """Liveness, and the key ids this server decrypts (never the keys)."""
        return {"status": "ok", "key_ids": codec.key_ids, "encrypts_with": codec.key_id}

    @app.post("/decode")
    async def decode(request: Request, body: PayloadsBody) -> dict[str, Any]:
        """Decrypt payloads (the UI and ``temporal workflow show --codec-endpoint``)."""
        authorize(request, None)
        return await run("decode", body)

    @app.post("/encode")
    async def encode(request: Request, body: PayloadsBody) -> dict[str, Any]:
        """Encrypt payloads (the UI, for signals and queries it sends)."""
        authorize(request, None)
        return await run("encode", body)

    @app.post("/{path_token}/decode")
    async def decode_token_path(
        path_token: str, request: Request, body: PayloadsBody
    ) -> dict[str, Any]:
        """:func:`decode` with the token as the endpoint's first path segment."""
        authorize(request, path_token)
        return await run("decode", body)

    @app.post("/{path_token}/encode")
    async def encode_token_path(
        path_token: str, request: Request, body: PayloadsBody
    ) -> dict[str, Any]:
        """:func:`encode` with the token as the endpoint's first path segment."""
        authorize(request, path_token)
        return await run("encode", body)

    return app
