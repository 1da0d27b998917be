"""What every dialect module shares: request validation with a field path, SSE framing, ids.

A dialect module provides (see :class:`Dialect`): ``parse`` (JSON body -> internal request),
``response_json`` (internal response -> wire JSON), an ``Encoder`` (stream events -> SSE
bytes) and ``error_body`` (error -> status and the dialect's error JSON). Translations are pure
functions; the app only moves bytes.
"""

from __future__ import annotations

import json
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from rolloutd.errors import NotFoundError, RequestFieldError, RolloutdError
from rolloutd.proxy.core.call_types import (
    InternalRequest,
    InternalResponse,
    StreamEvent,
    StreamStart,
)

M = TypeVar("M", bound=BaseModel)


def served_model(model: str, requested: str) -> str:
    """``model`` when ``requested`` names it (Google's ``models/`` prefix allowed).

    A model call may name any model (each harness names its own, and the session serves one),
    but a lookup of one model (``GET .../models/{id}``) answers only for the served one, as
    the providers answer 404 for a model they do not serve.

    Raises:
        NotFoundError: ``requested`` is another model.
    """
    if requested.removeprefix("models/") != model:
        raise NotFoundError(f"model {requested!r} not found: this session serves {model!r}")
    return model


def error_path(loc: tuple[int | str, ...], body: Any, *, missing: bool) -> str | None:
    """The dotted path of an error location in the body, without pydantic's union-member tags
    (``messages.0.content.str`` -> ``messages.0.content``)."""
    parts: list[str] = []
    node = body
    for part in loc:
        in_dict = isinstance(node, dict) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if in_dict or in_list:
            node = node[part]  # type: ignore[index]
        elif missing and isinstance(node, dict) and isinstance(part, str):
            parts.append(part)
            break
        else:
            break
        parts.append(str(part))
    return ".".join(parts) or None


def validate(model: type[M], body: Any) -> M:
    """Validate a parsed JSON body against a wire model.

    Raises:
        RequestFieldError: the body is not an object, or a field is invalid (``param`` names
            the first invalid field).
    """
    if not isinstance(body, dict):
        raise RequestFieldError("the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as e:
        first = e.errors()[0]
        param = error_path(first["loc"], body, missing=first["type"] == "missing")
        where = f"{param}: " if param else ""
        raise RequestFieldError(f"invalid request: {where}{first['msg']}", param=param) from None


def dumps(payload: Any) -> str:
    """Compact JSON, UTF-8 kept."""
    if isinstance(payload, BaseModel):
        return payload.model_dump_json()
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"))


def sse_data(payload: Any) -> bytes:
    """``data: {json}\\n\\n`` (a str payload is sent as is, e.g. ``[DONE]``)."""
    text = payload if isinstance(payload, str) else dumps(payload)
    return f"data: {text}\n\n".encode()


def sse_named(event: str, payload: Any) -> bytes:
    """``event: {name}\\ndata: {json}\\n\\n`` (Responses and Anthropic name their events)."""
    return f"event: {event}\ndata: {dumps(payload)}\n\n".encode()


def arguments_object(arguments: str) -> Any:
    """Tool call arguments (a JSON string) as an object for dialects that carry objects
    (Anthropic ``input``, Gemini ``args``); unparseable text is kept as ``{"_raw": text}``."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError:
        return {"_raw": arguments}
    return value if isinstance(value, dict) else {"_value": value}


def arguments_json(value: Any) -> str:
    """The inverse of :func:`arguments_object`: an object as a JSON string."""
    if isinstance(value, dict) and set(value) == {"_raw"} and isinstance(value["_raw"], str):
        return value["_raw"]
    if isinstance(value, dict) and set(value) == {"_value"}:
        value = value["_value"]
    return json.dumps(value if value is not None else {}, ensure_ascii=False)


class Encoder(Protocol):
    """Turns one answer's stream events into SSE bytes in a dialect's own event sequence."""

    def encode(self, event: StreamEvent) -> list[bytes]:
        """Bytes for ``event``."""

    def close(self) -> list[bytes]:
        """Bytes after the last event (``data: [DONE]`` for OpenAI Chat)."""

    def error(self, error: RolloutdError) -> list[bytes]:
        """Bytes reporting a failure mid-stream, in the dialect's error shape."""


class Dialect(Protocol):
    """What the app needs from a dialect module."""

    DIALECT: str

    def error_body(self, error: RolloutdError) -> tuple[int, dict[str, Any]]:
        """Status and error JSON."""

    def response_json(self, response: InternalResponse, request: InternalRequest) -> dict[str, Any]:
        """Wire JSON of a non-streamed answer."""

    def encoder(self, start: StreamStart, request: InternalRequest) -> Encoder:
        """A stream encoder for one answer."""
