"""Gemini wire shapes: the ``generateContent`` request models (with :func:`camel_keys`, as the
REST API's JSON mapping accepts snake_case too), the ``Model`` resources of ``GET /models`` and
the error body.

The translation between these and the internal request and answer is
:mod:`rolloutd.proxy.dialects.gemini`, which re-exports what the routes use from here.

References: Gemini API reference, "Generating content"
https://ai.google.dev/api/generate-content , "Models" https://ai.google.dev/api/models ,
errors https://ai.google.dev/gemini-api/docs/troubleshooting
(``{"error": {"code", "message", "status"}}``).
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rolloutd.errors import RolloutdError

_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    431: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def _camel(name: str) -> str:
    return re.sub(r"_([a-z])", lambda m: m.group(1).upper(), name)


def camel_keys(obj: Any, depth: int = 0) -> Any:
    """snake_case keys as camelCase, recursively, except inside free-form values
    (``args``, ``response``, ``parameters``: user data)."""
    if isinstance(obj, list):
        return [camel_keys(v, depth) for v in obj]
    if not isinstance(obj, dict):
        return obj
    out = {}
    for key, value in obj.items():
        new = _camel(key) if isinstance(key, str) else key
        keep = new in (
            "args",
            "response",
            "parameters",
            "parametersJsonSchema",
            "responseSchema",
            "responseJsonSchema",
        )
        out[new] = value if keep else camel_keys(value, depth + 1)
    return out


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


class Content(_Wire):
    """One of ``contents`` (or ``systemInstruction``): a role and its parts."""

    role: Literal["user", "model", "function", "system"] | None = None
    parts: list[dict[str, Any]] = Field(default_factory=list)


class GenerationConfig(_Wire):
    """``generationConfig``."""

    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    topP: float | None = Field(default=None, gt=0.0, le=1.0)
    maxOutputTokens: int | None = Field(default=None, ge=1)
    candidateCount: int | None = None

    @field_validator("candidateCount")
    @classmethod
    def _one(cls, n: int | None) -> int | None:
        if n not in (None, 1):
            raise ValueError("only candidateCount=1 is supported")
        return n


class GenerateContentRequest(_Wire):
    """``generateContent`` body (camelCase after :func:`camel_keys`)."""

    contents: list[Content] = Field(min_length=1)
    systemInstruction: Content | None = None
    tools: list[dict[str, Any]] | None = None
    generationConfig: GenerationConfig | None = None


def model_json(model: str) -> dict[str, Any]:
    """``GET /v1beta/models/{model}``: the Gemini API's ``Model`` resource, with the methods
    the gateway serves for it."""
    return {
        "name": f"models/{model}",
        "baseModelId": model,
        "version": "1",
        "displayName": model,
        "supportedGenerationMethods": ["generateContent", "streamGenerateContent", "countTokens"],
    }


def models_list(model: str) -> dict[str, Any]:
    """``GET /v1beta/models``: the one model a session serves, one page."""
    return {"models": [model_json(model)]}


def error_body(error: RolloutdError) -> tuple[int, dict[str, Any]]:
    """The HTTP status and Google error object: ``{"error": {"code", "message", "status"}}``."""
    status = error.status_code
    return status, {
        "error": {
            "code": status,
            "message": error.message,
            "status": _STATUS.get(status, "INTERNAL"),
        }
    }
