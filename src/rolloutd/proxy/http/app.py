"""The gateway's HTTP routes (transport only: parsing, auth, rendering; no logic).

Session routes carry the key in the path, so a harness needs nothing but a base URL; the same
routes without the ``/s/{key}`` prefix take the key as the API key (``Authorization: Bearer``,
``x-api-key`` for Anthropic clients, ``x-goog-api-key`` or ``?key=`` for Gemini clients)::

    POST /s/{key}/v1/chat/completions                  OpenAI Chat Completions
    POST /s/{key}/v1/responses                         OpenAI Responses
    POST /s/{key}/v1/responses/input_tokens            OpenAI Responses token count
    POST /s/{key}/v1/messages[?beta=true]              Anthropic Messages
    POST /s/{key}/v1/messages/count_tokens             Anthropic token count (no sampling)
    POST /s/{key}/v1beta/models/{model}:generateContent         Gemini
    POST /s/{key}/v1beta/models/{model}:streamGenerateContent   Gemini (``alt=sse``)
    POST /s/{key}/v1beta/models/{model}:countTokens             Gemini token count
    POST /s/{key}/v1/models/{model}:...                the same three on Gemini API ``v1``
                                                       (google-genai's default version)
    GET  /s/{key}/v1/models[/{model}]                  the served model, in the caller's dialect
    GET  /s/{key}/v1beta/models[/{model}]              (Anthropic and Google SDKs list and
                                                       look up models too); GET /health
    GET|HEAD /s/{key}                                  the base URL itself (a client's preconnect)
    /admin/...                                         the backend pool (admin token;
                                                       rolloutd.proxy.http.admin)
    GET  /metrics                                      Prometheus metrics of the process
                                                       (docs/metrics.md)

Bodies larger than ``settings.max_body_bytes`` get 413, headers larger than
``settings.max_header_bytes`` get 431, each in the dialect's error shape.

Every error is rendered once, here, in the dialect of the route it reached (chosen by path:
OpenAI ``{"error": {...}}``, Anthropic ``{"type": "error", ...}``, Google
``{"error": {"code", "message", "status"}}``); bad input is never a 500.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from rolloutd.errors import (
    HeadersTooLargeError,
    InvalidRequestError,
    NotFoundError,
    RequestFieldError,
    RolloutdError,
)
from rolloutd.observability import metrics
from rolloutd.proxy.calls.service import call_recorded
from rolloutd.proxy.core import fastjson
from rolloutd.proxy.core.call_types import InternalRequest, StreamEnd, StreamEvent, StreamStart
from rolloutd.proxy.dialects import anthropic, gemini, openai_chat, openai_responses
from rolloutd.proxy.dialects.common import Encoder, served_model
from rolloutd.proxy.http.admin import add_admin_routes
from rolloutd.proxy.http.inbound import api_key, read_json

if TYPE_CHECKING:
    from rolloutd.proxy.http.server import Gateway

log = structlog.get_logger(__name__)


def _dialect_of(path: str, headers: Any = None) -> Any:
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


#: the header the OpenAI and Anthropic Python and TypeScript SDKs send on every call: how many
#: times they retried it (``0`` on the first try; openai/_base_client.py,
#: anthropic/_base_client.py)
RETRY_COUNT_HEADER = "x-stainless-retry-count"


def marked_retry(request: Request) -> bool:
    """Whether the client marks the call as a retry of one it sent before
    (:data:`RETRY_COUNT_HEADER` > 0); a value that is not an integer marks nothing."""
    value = request.headers.get(RETRY_COUNT_HEADER)
    if not value:
        return False
    try:
        return int(value) > 0
    except ValueError:
        return False


class FastJSONResponse(JSONResponse):
    """Starlette's ``JSONResponse`` written by :func:`rolloutd.proxy.core.fastjson.dumps` (the same
    bytes contract, through orjson). Not FastAPI's ``ORJSONResponse``: that one writes NaN
    as ``null`` where ``JSONResponse`` refuses it."""

    def render(self, content: Any) -> bytes:
        """The body of ``content``.

        Raises:
            ValueError: NaN or an infinity, as ``JSONResponse`` does.
        """
        return fastjson.dumps(content)


class SettledJSONResponse(FastJSONResponse):
    """A :class:`FastJSONResponse` that reports whether it was handed to the server whole
    (``settle(True)``) or failed on the way (``settle(False)``): the session uses it to tell
    a retry of an undelivered answer from a new call (docs/sessions.md, "Request
    identity"). uvicorn drops the writes of a client that went away without an error, so a
    one-piece answer counts as delivered once written; a stream knows better."""

    def __init__(self, content: Any, settle: Callable[[bool], None]) -> None:
        super().__init__(content)
        self._settle = settle

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except BaseException:
            self._settle(False)
            raise
        self._settle(True)


def _error_response(error: RolloutdError, path: str = "", headers: Any = None) -> JSONResponse:
    status, body = _dialect_of(path, headers).error_body(error)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, headers=headers)


class HeaderLimit:
    """ASGI middleware: a request whose target and headers exceed ``max_header_bytes`` gets
    431 in its dialect's error shape before any route runs (uvicorn's h11 parser bounds the
    raw header block as well; httptools has its own fixed bound).

    Args:
        app: the ASGI app.
        max_header_bytes: ``settings.max_header_bytes``.
    """

    def __init__(self, app: Any, max_header_bytes: int) -> None:
        self.app = app
        self.max_header_bytes = max_header_bytes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
            for name, value in scope["headers"]:
                size += len(name) + len(value) + 4
            if size > self.max_header_bytes:
                error = HeadersTooLargeError(
                    f"the request headers exceed the limit of {self.max_header_bytes} bytes"
                )
                await _error_response(error, scope.get("path", ""))(scope, receive, send)
                return
        await self.app(scope, receive, send)


@dataclass
class _Call:
    """What the app knows of one model call when it fails (for the session's record).

    Attributes:
        started: ``time.monotonic()`` when the call arrived.
        stream: the harness asked for a stream (known once the body is translated).
        request: the translated request, once it is.
    """

    started: float
    stream: bool = False
    request: InternalRequest | None = None


class ClosingStreamingResponse(StreamingResponse):
    """A ``StreamingResponse`` that closes its body iterator when it ends, however it ends.
    Starlette cancels a stream whose client went away and leaves the iterator suspended;
    closed here, the pipeline behind it ends now (its call stops counting as in flight, its
    answer is settled undelivered), not whenever the garbage collector finalises it."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]


def _as_rolloutd_error(error: Exception) -> RolloutdError:
    """``error`` itself, or a 500 that names an unexpected exception's class (never its
    text: it may hold prompt text or paths)."""
    return (
        error
        if isinstance(error, RolloutdError)
        else RolloutdError(f"internal error: {type(error).__name__}")
    )


async def _sse(
    encoder: Encoder,
    start: StreamStart,
    events: AsyncIterator[StreamEvent],
    session_id: str,
    record: Callable[[Exception], Awaitable[bool]],
    settle: Callable[[int, bool], None],
) -> AsyncIterator[bytes]:
    """Serialise one answer's events with the dialect's encoder; a failure mid-stream (in the
    pipeline or in the encoder) is recorded in the session's state through ``record`` (which
    logs it), then ends the stream with the dialect's error event. ``settle(index,
    delivered)`` is told whether the recorded answer's last byte was sent (the server asks for
    the next chunk only once it sent the one before), or the stream ended before that (the
    client went away, the encoder failed)."""
    with structlog.contextvars.bound_contextvars(session_id=session_id):
        failure: Exception | None = None
        end_index: int | None = None
        delivered = False
        try:
            for chunk in encoder.encode(start):
                yield chunk
            async for event in events:
                if isinstance(event, StreamEnd):
                    end_index = event.response.completion_index
                for chunk in encoder.encode(event):
                    yield chunk
            for chunk in encoder.close():
                yield chunk
            delivered = True
        except Exception as e:  # noqa: BLE001 - stream boundary: recorded, sent in the dialect
            failure = e
        finally:
            if end_index is not None:
                settle(end_index, delivered)
            # first: the pipeline counts as a call in flight until it is closed
            await events.aclose()  # type: ignore[attr-defined]
        if failure is None:
            return
        if not await record(failure):
            log.warning(
                "stream_failed",
                error_type=type(failure).__name__,
                error=_as_rolloutd_error(failure).message,
                exc_info=None if isinstance(failure, RolloutdError) else failure,
            )
        for chunk in encoder.error(_as_rolloutd_error(failure)):
            yield chunk


class ModelCalls:
    """ASGI app: model calls (``POST`` to a model-call route, with or without the
    ``/s/{key}`` prefix) go straight to their handler; every other request goes to ``app``.

    A model call thus skips FastAPI's middleware stack and router, which cost more per call
    than the call's own work (benchmarks/gateway_overhead.py); its errors are rendered exactly
    as the app's exception handlers render them (``render_error``).

    Args:
        app: the FastAPI app (admin, health, models, and every route not matched here).
        handlers: ``route path -> handler(request, key)``; the Gemini route's handler takes
            ``(request, key, model_action)`` and is keyed by its ``v1beta`` prefix; it serves
            every prefix of :attr:`GEMINI_PREFIXES`.
        render_error: ``(request, exception) -> Response``, the app's handlers in one.
        dialects: ``route path -> dialect`` of the routes whose calls are counted
            (``rolloutd_gateway_calls_total``, docs/metrics.md); others are not.
    """

    #: the Gemini route's prefix (the model and action follow it)
    GEMINI_PREFIX = "/v1beta/models/"
    #: the Gemini API versions a client may use: google-genai defaults to ``v1``, the CLIs
    #: use ``v1beta``; the methods and bodies are the same
    GEMINI_PREFIXES = (GEMINI_PREFIX, "/v1/models/")

    def __init__(
        self,
        app: Any,
        handlers: dict[str, Any],
        render_error: Any,
        dialects: dict[str, str] | None = None,
    ) -> None:
        self.app = app
        self.handlers = handlers
        self.render_error = render_error
        self.dialects = dialects or {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        key: str | None = None
        route = path
        if path.startswith("/s/"):
            key, slash, route = path[3:].partition("/")
            route = slash + route
            if not key:
                await self.app(scope, receive, send)
                return
        extra: tuple[str, ...] = ()
        handler = self.handlers.get(route)
        dialect = self.dialects.get(route)
        for prefix in self.GEMINI_PREFIXES:
            if route.startswith(prefix):
                handler, extra = self.handlers[self.GEMINI_PREFIX], (route[len(prefix) :],)
                dialect = self.dialects.get(self.GEMINI_PREFIX)
        if handler is None:
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive)
        try:
            response = await handler(request, key if key is not None else api_key(request), *extra)
        except Exception as e:  # noqa: BLE001 - request boundary: rendered in the dialect
            response = await self.render_error(request, e)
        if dialect is not None:
            metrics.count_call(dialect, response.status_code)
        await response(scope, receive, send)


def create_app(gateway: Gateway) -> Any:
    """The gateway's ASGI app: :class:`HeaderLimit` around :class:`ModelCalls` around the
    FastAPI app.

    Args:
        gateway: owns the settings, sessions and chat service the routes use.
    """
    app = FastAPI(title="rolloutd gateway", docs_url=None, redoc_url=None, openapi_url=None)

    # a model call's failure is logged once, where it is recorded in its session's state
    # (rolloutd.proxy.calls.service); the handlers log the others
    @app.exception_handler(RolloutdError)
    async def _rolloutd_error(request: Request, error: RolloutdError) -> JSONResponse:
        if error.status_code >= 500 and not call_recorded(error):
            log.warning(
                "request_failed",
                path_kind=_path_kind(request),
                error_type=type(error).__name__,
                error=error.message,
            )
        return _error_response(error, request.url.path, request.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, error: StarletteHTTPException) -> JSONResponse:
        if error.status_code == 404:
            return _error_response(
                NotFoundError(f"no route {request.method} {_path_kind(request)}"),
                request.url.path,
                request.headers,
            )
        http_error = InvalidRequestError(str(error.detail))
        http_error.status_code = error.status_code
        return _error_response(http_error, request.url.path, request.headers)

    @app.exception_handler(Exception)
    async def _crash(request: Request, error: Exception) -> JSONResponse:
        if not call_recorded(error):
            log.error("request_crashed", path_kind=_path_kind(request), exc_info=error)
        return _error_response(_as_rolloutd_error(error), request.url.path, request.headers)

    async def render_error(request: Request, error: Exception) -> JSONResponse:
        if isinstance(error, RolloutdError):
            return await _rolloutd_error(request, error)
        if isinstance(error, StarletteHTTPException):
            return await _http_error(request, error)
        return await _crash(request, error)

    add_admin_routes(app, gateway)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        # the gateway answers, so its status is ok; the pool's health is apart: a trainer
        # waiting on rollouts reads ``backend_health`` to tell a dead engine from a slow one
        await gateway.pool.probe_unhealthy()
        return {
            "status": "ok",
            "backends": gateway.pool.names(),
            "backend_health": gateway.pool.health(),
        }

    async def model_call(session: Any, respond: Callable[[_Call], Awaitable[Response]]) -> Response:
        """Run ``respond`` for one model call of ``session``; whatever it fails with, even an
        unexpected exception outside the pipeline (reading the body, translating, rendering
        the answer), is recorded in the session's state once and raised to be rendered in
        the dialect's shape."""
        call = _Call(started=time.monotonic())
        with structlog.contextvars.bound_contextvars(session_id=session.session_id):
            try:
                return await respond(call)
            except Exception as e:
                await gateway.service.note_failure(
                    session, e, call.started, stream=call.stream, request=call.request
                )
                raise

    async def answer(
        session: Any,
        call: _Call,
        internal: InternalRequest,
        dialect: Any,
        make_encoder: Any = None,
        *,
        retry: bool = False,
    ) -> Response:
        """Answer a translated request in one piece or as the dialect's SSE stream;
        ``retry``: the client marks it a retry (:func:`marked_retry`)."""
        call.stream, call.request = internal.stream, internal
        if not internal.stream:
            response = await gateway.service.complete(session, internal, marked_retry=retry)
            index = response.completion_index

            def settle_one(delivered: bool) -> None:
                if index is not None:
                    session.settle(index, delivered=delivered)

            try:
                body = dialect.response_json(response, internal)
            except BaseException:
                settle_one(False)
                raise
            return SettledJSONResponse(body, settle_one)
        events = gateway.service.stream(session, internal, marked_retry=retry)
        try:
            start = await anext(events)
        except BaseException:
            await events.aclose()  # type: ignore[attr-defined]
            raise
        if not isinstance(start, StreamStart):
            await events.aclose()  # type: ignore[attr-defined]
            raise RolloutdError(f"stream began with {type(start).__name__}")
        try:
            encoder = (make_encoder or dialect.encoder)(start, internal)
        except BaseException:
            await events.aclose()  # type: ignore[attr-defined]
            raise
        media = "text/event-stream" if getattr(encoder, "sse", True) else "application/json"

        def record(error: Exception) -> Awaitable[bool]:
            return gateway.service.note_failure(
                session, error, call.started, stream=True, request=internal
            )

        def settle(index: int, delivered: bool) -> None:
            session.settle(index, delivered=delivered)

        return ClosingStreamingResponse(
            _sse(encoder, start, events, session.session_id, record, settle),
            media_type=media,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )

    async def chat(request: Request, key: str | None) -> Response:
        session = await gateway.sessions.lookup(key)

        async def respond(call: _Call) -> Response:
            body = await read_json(
                request, gateway.settings.max_body_bytes, reader=session.body_reader
            )
            return await answer(
                session,
                call,
                openai_chat.parse(body, memo=session.memo),
                openai_chat,
                retry=marked_retry(request),
            )

        return await model_call(session, respond)

    async def responses(request: Request, key: str | None) -> Response:
        session = await gateway.sessions.lookup(key)

        async def respond(call: _Call) -> Response:
            body = await read_json(
                request, gateway.settings.max_body_bytes, reader=session.body_reader
            )
            return await answer(
                session,
                call,
                openai_responses.parse(
                    body, previous=previous_of(session, body), memo=session.memo
                ),
                openai_responses,
                retry=marked_retry(request),
            )

        return await model_call(session, respond)

    def previous_of(session: Any, body: Any) -> list[dict[str, Any]] | None:
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

    async def messages(request: Request, key: str | None) -> Response:
        session = await gateway.sessions.lookup(key)

        async def respond(call: _Call) -> Response:
            body = await read_json(
                request, gateway.settings.max_body_bytes, reader=session.body_reader
            )
            return await answer(
                session,
                call,
                anthropic.parse(body, memo=session.memo),
                anthropic,
                retry=marked_retry(request),
            )

        return await model_call(session, respond)

    async def count_tokens(request: Request, key: str | None) -> dict[str, Any]:
        session = await gateway.sessions.lookup(key)
        body = await read_json(request, gateway.settings.max_body_bytes)
        internal = anthropic.parse_count_tokens(body)
        return {"input_tokens": await gateway.service.count_tokens(session, internal)}

    async def generate_content(request: Request, key: str | None, model_action: str) -> Response:
        session = await gateway.sessions.lookup(key)
        model, _, action = model_action.rpartition(":")
        if action not in ("generateContent", "streamGenerateContent", "countTokens") or not model:
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

        async def respond(call: _Call) -> Response:
            body = await read_json(
                request, gateway.settings.max_body_bytes, reader=session.body_reader
            )
            internal = gemini.parse(body, model=model, stream=stream, memo=session.memo)
            return await answer(
                session,
                call,
                internal,
                gemini,
                lambda start, req: gemini.encoder(start, req, sse=sse),
                retry=marked_retry(request),
            )

        return await model_call(session, respond)

    async def models(
        request: Request, key: str | None, model_id: str | None = None
    ) -> dict[str, Any]:
        """The served model listed, or looked up by ``model_id``, in the caller's dialect."""
        session = await gateway.sessions.lookup(key if key is not None else api_key(request))
        dialect = _dialect_of(request.url.path, request.headers)
        if model_id is None:
            return dialect.models_list(session.state.model)  # type: ignore[no-any-return]
        return dialect.model_json(  # type: ignore[no-any-return]
            served_model(session.state.model, model_id)
        )

    async def count_tokens_response(request: Request, key: str | None) -> Response:
        return JSONResponse(await count_tokens(request, key))

    async def responses_input_tokens(request: Request, key: str | None) -> Response:
        session = await gateway.sessions.lookup(key)
        body = await read_json(request, gateway.settings.max_body_bytes)
        internal = openai_responses.parse(body, previous=previous_of(session, body))
        return JSONResponse(
            openai_responses.input_tokens_json(
                await gateway.service.count_tokens(session, internal)
            )
        )

    # The model-call routes are served by ModelCalls in front of this app; the app answers
    # other methods on their paths (405) and every other path.
    model_calls = {
        "/v1/chat/completions": chat,
        "/v1/responses": responses,
        "/v1/responses/input_tokens": responses_input_tokens,
        "/v1/messages": messages,
        "/v1/messages/count_tokens": count_tokens_response,
        ModelCalls.GEMINI_PREFIX: generate_content,
    }
    for path in [*model_calls, *ModelCalls.GEMINI_PREFIXES[1:]]:
        for route in ("/s/{key}" + path, path):
            app.router.add_route(
                route + ("{model_action:path}" if path in ModelCalls.GEMINI_PREFIXES else ""),
                _method_not_allowed,
                methods=["POST"],
            )

    # Claude Code sends `HEAD {ANTHROPIC_BASE_URL}` at startup to warm the connection; the
    # base URL answers 200 for a valid key, so a client's probe of it is not an error
    @app.api_route("/s/{key}", methods=["GET", "HEAD"])
    @app.api_route("/s/{key}/", methods=["GET", "HEAD"])
    async def session_root(key: str) -> dict[str, Any]:
        await gateway.sessions.lookup(key)
        return {"status": "ok"}

    # the sandbox asks at each heartbeat of a running harness (docs/failures.md): after
    # backend_dead_after_s of unanswered calls it stops the harness
    @app.get("/s/{key}/rolloutd/verdict")
    async def session_verdict(key: str) -> dict[str, Any]:
        session = await gateway.sessions.lookup(key)
        dead_after_s = gateway.settings.backend_dead_after_s
        # a probe only when a call has waited that long: a saturated engine is not dead
        answers = session.liveness.waited(dead_after_s) and await gateway.pool.answers(
            session.state.backend
        )
        return session.liveness.verdict(dead_after_s, backend_answers=answers).model_dump()

    async def list_models(request: Request, key: str | None = None) -> dict[str, Any]:
        return await models(request, key)

    async def get_model(request: Request, model_id: str, key: str | None = None) -> dict[str, Any]:
        if ":" in model_id:  # a Gemini method ({model}:generateContent): POST only
            raise StarletteHTTPException(status_code=405)
        return await models(request, key, model_id)

    for path in ("/v1/models", "/v1beta/models"):
        for route in ("/s/{key}" + path, path):
            app.router.add_api_route(route, list_models, methods=["GET"])
            app.router.add_api_route(route + "/{model_id:path}", get_model, methods=["GET"])

    # the Prometheus metrics of this process (docs/metrics.md); a scrape may fetch the
    # Temporal SDK's exporter over loopback, so it runs off the event loop
    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        body = await asyncio.to_thread(generate_latest, REGISTRY)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    call_dialects = {
        "/v1/chat/completions": "openai_chat",
        "/v1/responses": "openai_responses",
        "/v1/messages": "anthropic",
        ModelCalls.GEMINI_PREFIX: "gemini",
    }
    return HeaderLimit(
        ModelCalls(app, model_calls, render_error, call_dialects),
        max_header_bytes=gateway.settings.max_header_bytes,
    )


async def _method_not_allowed(request: Request) -> Response:
    """Never reached by a POST (:class:`ModelCalls` serves those): the route exists so the
    router answers other methods on a model-call path with 405, as before."""
    raise StarletteHTTPException(status_code=405)


def _path_kind(request: Request) -> str:
    """The request path with a session key masked (keys are secrets: never logged)."""
    path = request.url.path
    if path.startswith("/s/"):
        _, _, rest = path[3:].partition("/")
        return f"/s/***/{rest}"
    return path
