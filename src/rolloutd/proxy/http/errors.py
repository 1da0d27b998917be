"""Every error the gateway answers, rendered once in the dialect of the route it reached.

The dialect is chosen by path: OpenAI ``{"error": {...}}``, Anthropic ``{"type": "error",
...}``, Google ``{"error": {"code", "message", "status"}}``; bad input is never a 500. A model
call's failure is logged once, where it is recorded in its session's state
(:mod:`rolloutd.proxy.calls.service`); :func:`render_error` logs the others.
"""

from __future__ import annotations

import math
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from rolloutd.errors import InvalidRequestError, NotFoundError, RolloutdError
from rolloutd.proxy.calls.failures import call_recorded
from rolloutd.proxy.dialects import anthropic, gemini, openai_chat
from rolloutd.proxy.http.inbound import path_kind

log = structlog.get_logger(__name__)


def dialect_of(path: str, headers: Any = None) -> Any:
    """The dialect module whose error shape a path gets: a Gemini method on ``/v1/models/``
    (``{model}:{method}``) is Google's. ``/v1/models`` is shared by the three SDKs: there
    the header each SDK always sends decides (``anthropic-version``, ``x-goog-api-key``),
    else OpenAI's."""
    if "/v1/messages" in path:
        return anthropic
    if "/v1beta/" in path or ("/v1/models/" in path and ":" in path.rpartition("/")[2]):
        return gemini
    if headers is not None and "/v1/models" in path:
        if "anthropic-version" in headers:
            return anthropic
        if "x-goog-api-key" in headers:
            return gemini
    return openai_chat


def error_response(error: RolloutdError, path: str = "", headers: Any = None) -> JSONResponse:
    """``error`` in the error shape of the dialect of ``path`` (:func:`dialect_of`), with
    ``WWW-Authenticate: Bearer`` on a 401 and ``Retry-After`` (whole seconds, rounded up) on
    an error that says when to ask again (:class:`rolloutd.errors.JudgeQuotaError`)."""
    status, body = dialect_of(path, headers).error_body(error)
    extra: dict[str, str] = {}
    if status == 401:
        extra["WWW-Authenticate"] = "Bearer"
    retry_after = getattr(error, "retry_after_s", None)
    if retry_after is not None:
        extra["Retry-After"] = str(max(1, math.ceil(retry_after)))
    return JSONResponse(body, status_code=status, headers=extra or None)


def as_rolloutd_error(error: Exception) -> RolloutdError:
    """``error`` itself, or a 500 that names an unexpected exception's class (never its
    text: it may hold prompt text or paths)."""
    return (
        error
        if isinstance(error, RolloutdError)
        else RolloutdError(f"internal error: {type(error).__name__}")
    )


async def rolloutd_error(request: Request, error: RolloutdError) -> JSONResponse:
    """The answer to a :class:`RolloutdError`; a 5xx not recorded in a session is logged."""
    if error.status_code >= 500 and not call_recorded(error):
        log.warning(
            "request_failed",
            path_kind=path_kind(request),
            error_type=type(error).__name__,
            error=error.message,
        )
    return error_response(error, request.url.path, request.headers)


async def http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
    """The answer to Starlette's own errors (no route: 404, a method not allowed: 405)."""
    if error.status_code == 404:
        return error_response(
            NotFoundError(f"no route {request.method} {path_kind(request)}"),
            request.url.path,
            request.headers,
        )
    http_error = InvalidRequestError(str(error.detail))
    http_error.status_code = error.status_code
    return error_response(http_error, request.url.path, request.headers)


async def crash(request: Request, error: Exception) -> JSONResponse:
    """The answer to an unexpected exception: a 500 naming its class; logged unless its
    model call recorded it."""
    if not call_recorded(error):
        log.error("request_crashed", path_kind=path_kind(request), exc_info=error)
    return error_response(as_rolloutd_error(error), request.url.path, request.headers)


async def render_error(request: Request, error: Exception) -> JSONResponse:
    """Whatever ``error`` is, its answer: the app's three exception handlers in one (the
    model-call fast path renders with it, so its errors are the app's)."""
    if isinstance(error, RolloutdError):
        return await rolloutd_error(request, error)
    if isinstance(error, StarletteHTTPException):
        return await http_error(request, error)
    return await crash(request, error)


def add_error_handlers(app: FastAPI) -> None:
    """Register :func:`rolloutd_error`, :func:`http_error` and :func:`crash` on ``app``."""
    app.add_exception_handler(RolloutdError, rolloutd_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, crash)
