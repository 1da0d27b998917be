"""Anthropic Messages wire shapes: the request bodies (``POST /v1/messages``,
``/v1/messages/count_tokens``), the model objects of ``GET /v1/models`` and the error body.

The translation between these and the internal request and answer is
:mod:`rolloutd.proxy.dialects.anthropic`, which re-exports what the routes use from here.

References: Anthropic API reference, "Messages" https://docs.anthropic.com/en/api/messages ,
"Models" https://docs.anthropic.com/en/api/models-list , "Errors"
https://docs.anthropic.com/en/api/errors .
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rolloutd.errors import (
    AuthenticationError,
    BackendUnavailableError,
    NotFoundError,
    RolloutdError,
)


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class Message(_Wire):
    """One of ``messages``: content a string or a list of blocks. Claude Code (2.1.x) also
    sends ``system`` messages inside ``messages`` (reminders between turns); they become system
    messages of the conversation where they stand."""

    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class Tool(_Wire):
    """A client tool (server tools such as ``web_search_20250305`` have a ``type``)."""

    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None


class MessagesRequest(_Wire):
    """``POST /v1/messages`` body."""

    model: str | None = None
    max_tokens: int = Field(ge=1)
    messages: list[Message] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[Tool] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False


class CountTokensRequest(MessagesRequest):
    """``POST /v1/messages/count_tokens`` body: a request without ``max_tokens``."""

    max_tokens: int = Field(default=1, ge=1)


def model_json(model: str) -> dict[str, Any]:
    """``GET /v1/models/{model}``: Anthropic's ``ModelInfo`` (``lifecycle`` is required by
    anthropic 2.14's types; ``created_at`` is RFC 3339)."""
    return {
        "type": "model",
        "id": model,
        "display_name": model,
        "created_at": "1970-01-01T00:00:00Z",
        "lifecycle": "active",
    }


def models_list(model: str) -> dict[str, Any]:
    """``GET /v1/models``: one page holding the one model a session serves."""
    return {"data": [model_json(model)], "has_more": False, "first_id": model, "last_id": model}


def error_body(error: RolloutdError) -> tuple[int, dict[str, Any]]:
    """The HTTP status and Anthropic error object of ``error``.

    Returns:
        ``(status, {"type": "error", "error": {"type", "message"}})`` with the types of
        https://docs.anthropic.com/en/api/errors (a 502/503 backend failure is
        ``overloaded_error`` or ``api_error``).
    """
    status = error.status_code
    if isinstance(error, AuthenticationError):
        kind = "authentication_error"
    elif isinstance(error, NotFoundError):
        kind = "not_found_error"
    elif isinstance(error, BackendUnavailableError):
        kind = "overloaded_error"
    elif status == 403:
        kind = "permission_error"
    elif status == 413:
        kind = "request_too_large"
    elif status == 429:
        kind = "rate_limit_error"
    elif 400 <= status < 500:
        kind = "invalid_request_error"
    else:
        kind = "api_error"
    return status, {"type": "error", "error": {"type": kind, "message": error.message}}
