"""How a model call's answer leaves the gateway: in one piece or as the dialect's SSE stream,
telling the session whether it went out whole; a failure anywhere is recorded in the
session's state once, then raised to be rendered in the dialect's error shape
(:mod:`rolloutd.proxy.http.errors`).

Every dialect's router (``*_routes.py``) runs its model calls through :func:`model_call` and
:func:`answer`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import structlog
from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from rolloutd.errors import RolloutdError
from rolloutd.proxy.calls.service import ChatService
from rolloutd.proxy.core import fastjson
from rolloutd.proxy.core.call_types import InternalRequest, StreamEnd, StreamEvent, StreamStart
from rolloutd.proxy.dialects.common import Encoder
from rolloutd.proxy.http.errors import as_rolloutd_error
from rolloutd.proxy.http.gateway_parts import GatewayParts
from rolloutd.proxy.http.inbound import marked_retry, read_json
from rolloutd.proxy.sessions.session import Session

log = structlog.get_logger(__name__)


class FastJSONResponse(JSONResponse):
    """Starlette's ``JSONResponse`` written by :func:`rolloutd.proxy.core.fastjson.dumps` (the
    same bytes contract, through orjson). Not FastAPI's ``ORJSONResponse``: that one writes
    NaN as ``null`` where ``JSONResponse`` refuses it."""

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


@dataclass
class Call:
    """What the app knows of one model call when it fails (for the session's record).

    Attributes:
        started: ``time.monotonic()`` when the call arrived.
        stream: the harness asked for a stream (known once the body is translated).
        request: the translated request, once it is.
    """

    started: float
    stream: bool = False
    request: InternalRequest | None = None


async def sse(
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
                error=as_rolloutd_error(failure).message,
                exc_info=None if isinstance(failure, RolloutdError) else failure,
            )
        for chunk in encoder.error(as_rolloutd_error(failure)):
            yield chunk


async def model_call(
    service: ChatService, session: Session, respond: Callable[[Call], Awaitable[Response]]
) -> Response:
    """Run ``respond`` for one model call of ``session``; whatever it fails with, even an
    unexpected exception outside the pipeline (reading the body, translating, rendering
    the answer), is recorded in the session's state once and raised to be rendered in
    the dialect's shape."""
    call = Call(started=time.monotonic())
    with structlog.contextvars.bound_contextvars(session_id=session.session_id):
        try:
            return await respond(call)
        except Exception as e:
            await service.note_failure(
                session, e, call.started, stream=call.stream, request=call.request
            )
            raise


async def answer(
    service: ChatService,
    session: Session,
    call: Call,
    internal: InternalRequest,
    dialect: Any,
    make_encoder: Any = None,
    *,
    retry: bool = False,
) -> Response:
    """Answer a translated request in one piece or as the dialect's SSE stream;
    ``retry``: the client marks it a retry
    (:func:`rolloutd.proxy.http.inbound.marked_retry`)."""
    call.stream, call.request = internal.stream, internal
    if not internal.stream:
        return await _answer_whole(service, session, internal, dialect, retry=retry)
    events = service.stream(session, internal, marked_retry=retry)
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
        return service.note_failure(session, error, call.started, stream=True, request=internal)

    def settle(index: int, delivered: bool) -> None:
        session.settle(index, delivered=delivered)

    return ClosingStreamingResponse(
        sse(encoder, start, events, session.session_id, record, settle),
        media_type=media,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def translated_call(
    gateway: GatewayParts,
    request: Request,
    session: Session,
    dialect: Any,
    translate: Callable[[Any], InternalRequest],
    make_encoder: Any = None,
) -> Response:
    """One model call of a dialect's route: read the body (``session.body_reader``), translate
    it with ``translate(body)``, and :func:`answer` it inside :func:`model_call` (a failure
    anywhere is recorded once); the client's retry mark is read after the translation.

    Args:
        gateway: the gateway's parts (settings, sessions, call service).
        request: the harness's request.
        session: the session the route's key names (looked up by the route).
        dialect: the dialect module (``parse``, ``encoder``, ``render``).
        translate: the request body (parsed JSON) -> the internal request.
        make_encoder: ``(start, internal) -> Encoder`` in place of ``dialect.encoder``.

    Returns:
        The answer, in one piece or as the dialect's SSE stream.
    """

    async def respond(call: Call) -> Response:
        body = await read_json(request, gateway.settings.max_body_bytes, reader=session.body_reader)
        return await answer(
            gateway.service,
            session,
            call,
            translate(body),
            dialect,
            make_encoder,
            retry=marked_retry(request),
        )

    return await model_call(gateway.service, session, respond)


async def _answer_whole(
    service: ChatService,
    session: Session,
    internal: InternalRequest,
    dialect: Any,
    *,
    retry: bool,
) -> Response:
    """The one-piece answer of :func:`answer`, settled once the server has it whole."""
    response = await service.complete(session, internal, marked_retry=retry)
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
