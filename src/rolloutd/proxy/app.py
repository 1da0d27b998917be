"""The gateway's HTTP routes (transport only: parsing, auth, rendering; no logic).

Session routes carry the key in the path, so a harness needs nothing but a base URL; the same
routes without the prefix take the key as the API key (``Authorization: Bearer <key>``)::

    POST /s/{key}/v1/chat/completions    POST /v1/chat/completions
    GET  /s/{key}/v1/models              GET  /v1/models
    GET  /health

Every error is rendered once, here, in the OpenAI shape ``{"error": {"message", "type",
"param", "code"}}`` with the error's status; bad input is never a 500.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from rolloutd.errors import InvalidRequestError, NotFoundError, RolloutdError
from rolloutd.proxy.dialects import openai_chat
from rolloutd.proxy.internal import StreamEvent, StreamStart

if TYPE_CHECKING:
    from rolloutd.proxy.gateway import Gateway

log = structlog.get_logger(__name__)


def _error_response(error: RolloutdError) -> JSONResponse:
    status, body = openai_chat.error_body(error)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, headers=headers)


def bearer_key(request: Request) -> str | None:
    """The session key from ``Authorization: Bearer <key>``, or None."""
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


async def read_json(request: Request, max_body_bytes: int) -> Any:
    """The request's JSON body.

    Raises:
        InvalidRequestError: too large, not UTF-8, or not JSON.
    """
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > max_body_bytes:
        raise InvalidRequestError(f"request body exceeds {max_body_bytes} bytes")
    raw = await request.body()
    if len(raw) > max_body_bytes:
        raise InvalidRequestError(f"request body exceeds {max_body_bytes} bytes")
    try:
        body = json.loads(raw)
        # \ud800-style escapes decode to lone surrogates, which no UTF-8 consumer accepts
        json.dumps(body, ensure_ascii=False).encode()
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidRequestError(f"the request body is not valid JSON: {e}") from None
    except UnicodeEncodeError:
        raise InvalidRequestError("the request body holds invalid Unicode (a lone surrogate)") \
            from None
    return body


async def _sse(start: StreamStart, events: AsyncIterator[StreamEvent], *, include_usage: bool,
               session_id: str) -> AsyncIterator[bytes]:
    """Serialise one answer's events as SSE; a failure mid-stream ends with an error event."""
    chunks = openai_chat.ChunkStream(start, include_usage=include_usage)
    with structlog.contextvars.bound_contextvars(session_id=session_id):
        try:
            for chunk in chunks.chunks(start):
                yield openai_chat.sse(chunk)
            async for event in events:
                for chunk in chunks.chunks(event):
                    yield openai_chat.sse(chunk)
            yield openai_chat.sse("[DONE]")
        except RolloutdError as e:
            log.warning("stream_failed", error_type=type(e).__name__, error=e.message)
            yield openai_chat.sse(openai_chat.error_body(e)[1])
        except Exception as e:
            log.exception("stream_crashed")
            yield openai_chat.sse({"error": {"message": f"internal error: {type(e).__name__}",
                                             "type": "server_error", "param": None,
                                             "code": None}})
        finally:
            await events.aclose()  # type: ignore[attr-defined]


def create_app(gateway: Gateway) -> FastAPI:
    """The gateway's FastAPI app.

    Args:
        gateway: owns the settings, sessions and chat service the routes use.
    """
    app = FastAPI(title="rolloutd gateway", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RolloutdError)
    async def _rolloutd_error(request: Request, error: RolloutdError) -> JSONResponse:
        if error.status_code >= 500:
            log.warning("request_failed", path_kind=_path_kind(request),
                        error_type=type(error).__name__, error=error.message)
        return _error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        if error.status_code == 404:
            return _error_response(
                NotFoundError(f"no route {request.method} {_path_kind(request)}"))
        return JSONResponse({"error": {"message": str(error.detail),
                                       "type": "invalid_request_error", "param": None,
                                       "code": None}}, status_code=error.status_code)

    @app.exception_handler(Exception)
    async def _crash(request: Request, error: Exception) -> JSONResponse:
        log.exception("request_crashed", path_kind=_path_kind(request))
        return JSONResponse({"error": {"message": f"internal error: {type(error).__name__}",
                                       "type": "server_error", "param": None, "code": None}},
                            status_code=500)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "backends": gateway.pool.names()}

    async def chat(request: Request, key: str | None) -> Response:
        session = await gateway.sessions.lookup(key)
        body = await read_json(request, gateway.settings.max_body_bytes)
        internal = openai_chat.to_internal(openai_chat.parse_request(body), body)
        with structlog.contextvars.bound_contextvars(session_id=session.session_id):
            if not internal.stream:
                response = await gateway.service.complete(session, internal)
                return JSONResponse(openai_chat.response_json(response))
            events = gateway.service.stream(session, internal)
            try:
                start = await anext(events)
            except BaseException:
                await events.aclose()  # type: ignore[attr-defined]
                raise
            if not isinstance(start, StreamStart):
                await events.aclose()  # type: ignore[attr-defined]
                raise RolloutdError(f"stream began with {type(start).__name__}")
            return StreamingResponse(
                _sse(start, events, include_usage=internal.include_usage,
                     session_id=session.session_id),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )

    async def models(key: str | None) -> dict[str, Any]:
        session = await gateway.sessions.lookup(key)
        return openai_chat.models_list(session.state.model)

    @app.post("/s/{key}/v1/chat/completions")
    async def session_chat(key: str, request: Request) -> Response:
        return await chat(request, key)

    @app.get("/s/{key}/v1/models")
    async def session_models(key: str) -> dict[str, Any]:
        return await models(key)

    @app.post("/v1/chat/completions")
    async def bearer_chat(request: Request) -> Response:
        return await chat(request, bearer_key(request))

    @app.get("/v1/models")
    async def bearer_models(request: Request) -> dict[str, Any]:
        return await models(bearer_key(request))

    return app


def _path_kind(request: Request) -> str:
    """The request path with a session key masked (keys are secrets: never logged)."""
    path = request.url.path
    if path.startswith("/s/"):
        _, _, rest = path[3:].partition("/")
        return f"/s/***/{rest}"
    return path
