"""The providers' official Python SDKs, made strict, against a gateway served on a real socket.

What a strict client rejects, a harness will one day reject: the OpenAI and Anthropic clients
run with ``_strict_response_validation=True`` (every response and stream event is validated
against the SDK's pydantic types instead of being built unchecked); google-genai always
validates after dropping the fields it does not know, so :func:`strict_gemini` also validates
each raw body against its types with their ``extra="forbid"`` kept (a field Google does not
document fails). Clients never retry (``max_retries=0``): a retry would hide a first failure.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
from google import genai
from google.genai import types as genai_types

from rolloutd.proxy.http.app import create_app
from rolloutd.proxy.http.server import Gateway, serve
from rolloutd.proxy.sessions.state import SessionInfo
from rolloutd.settings import GatewaySettings
from rolloutd.types import SamplingParams


class BodyRecorder:
    """ASGI wrapper: keeps ``(method, path kind, status, response body)`` of every request."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[tuple[str, str, int, bytearray]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = re.sub(r"^/s/[^/]+", "/s/***", scope["path"])
        body = bytearray()

        async def record(message: Any) -> None:
            if message["type"] == "http.response.start":
                self.seen.append((scope["method"], path, message["status"], body))
            elif message["type"] == "http.response.body":
                body.extend(message.get("body", b""))
            await send(message)

        await self.app(scope, receive, record)

    def gemini_chunks(self) -> list[dict[str, Any]]:
        """Every JSON object the Gemini routes answered with (SSE events one by one)."""
        chunks: list[dict[str, Any]] = []
        for _, path, _, body in self.seen:
            if "/models/" not in path:
                continue
            text = body.decode()
            if path.endswith("streamGenerateContent"):
                chunks += [
                    json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")
                ]
            else:
                chunks.append(json.loads(text))
        return chunks


@dataclass
class Served:
    """A gateway on a real socket and the recorder around its app."""

    gateway: Gateway
    recorder: BodyRecorder
    sessions: list[str] = field(default_factory=list)

    async def open(self, name: str, *, max_tokens: int = 16) -> SessionInfo:
        """Open session ``name`` (greedy, seeded, ``max_tokens`` per call)."""
        return await self.gateway.sessions.open_session(
            name,
            name.split("/")[0],
            sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0, seed=1),
        )


@asynccontextmanager
async def served_gateway(
    store: Path, backend_url: str, tokenizer: Any, transport: httpx.AsyncBaseTransport | None = None
) -> AsyncIterator[Served]:
    """A gateway served by uvicorn on ``127.0.0.1`` (any port) in the running event loop."""
    settings = GatewaySettings(
        store_url=str(store),
        backend_url=backend_url,
        model="qwen2.5-coder-0.5b",
        tool_parser="hermes_lenient",
        backend_timeout_s=300,
    )
    gateway = Gateway.from_settings(settings, tokenizer=tokenizer, transport=transport)
    recorder = BodyRecorder(create_app(gateway))
    gateway._app = recorder  # type: ignore[assignment]  # serve() runs gateway.app
    handle = await serve(gateway, "127.0.0.1", 0)
    try:
        yield Served(gateway, recorder)
    finally:
        await handle.shutdown()
        await gateway.aclose()


def strict_openai(info: SessionInfo) -> openai.AsyncOpenAI:
    """An OpenAI client on the session's base URL, strict, without retries."""
    return openai.AsyncOpenAI(
        base_url=info.openai_base_url,
        api_key="unused",
        max_retries=0,
        timeout=300,
        _strict_response_validation=True,
    )


def strict_anthropic(info: SessionInfo) -> anthropic.AsyncAnthropic:
    """An Anthropic client on the session's base URL, strict, without retries."""
    return anthropic.AsyncAnthropic(
        base_url=info.anthropic_base_url,
        api_key="unused",
        max_retries=0,
        timeout=300,
        _strict_response_validation=True,
    )


def gemini_client(info: SessionInfo, api_version: str) -> genai.Client:
    """A google-genai client on the session's base URL and ``api_version`` (its default for
    the Gemini API is ``v1``; ``v1beta`` is what the CLIs use)."""
    return genai.Client(
        api_key="unused",
        http_options=genai_types.HttpOptions(
            base_url=info.gemini_base_url, api_version=api_version, timeout=300_000
        ),
    )


def strict_gemini(recorder: BodyRecorder) -> int:
    """Validate every Gemini body the gateway sent against google-genai's own types, unknown
    fields forbidden (the SDK itself drops them before validating).

    Returns:
        The number of bodies validated.

    Raises:
        pydantic.ValidationError: a body google-genai's types do not describe.
    """
    chunks = recorder.gemini_chunks()
    for chunk in chunks:
        if "totalTokens" in chunk:
            genai_types.CountTokensResponse.model_validate(chunk)
        elif "error" not in chunk:
            genai_types.GenerateContentResponse.model_validate(chunk)
    return len(chunks)
