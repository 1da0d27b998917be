"""The ``passthrough`` capture mode of a call: the backend renders the chat (vLLM chat with
``return_token_ids``, or a plain OpenAI-compatible API) and the gateway records what it
returns (trainable only when the backend returns token ids): :func:`call` and :func:`stream`,
which :class:`rolloutd.proxy.calls.service.ChatService` runs on a leased backend for a session
in that mode; plus the stream helpers both modes share.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any, TypeVar

import structlog

from rolloutd.errors import BackendError, ConfigError
from rolloutd.observability.metrics import CallClock
from rolloutd.proxy.backends.base import Backend, ChatDelta, ChatResult, GenerateDelta
from rolloutd.proxy.backends.openai_compat import OpenAIChatBackend
from rolloutd.proxy.backends.pool import BackendPool
from rolloutd.proxy.backends.slots import Lease
from rolloutd.proxy.calls.sampling import resolve_sampling
from rolloutd.proxy.core.call_types import (
    InternalRequest,
    InternalResponse,
    StreamContent,
    StreamEnd,
    StreamEvent,
    StreamReasoning,
    StreamStart,
    Usage,
    chat_body,
)
from rolloutd.proxy.sessions.recorder import Recorder, build_passthrough_completion, new_response_id
from rolloutd.proxy.sessions.session import Session
from rolloutd.types import SamplingUsed

log = structlog.get_logger(__name__)

D = TypeVar("D", GenerateDelta, ChatDelta)


def _body(
    session: Session, request: InternalRequest, lease: Lease
) -> tuple[OpenAIChatBackend, dict[str, Any]]:
    """The chat backend and the upstream body of a ``passthrough`` call.

    Raises:
        ConfigError: the session's backend takes no chat requests.
    """
    backend = lease.backend
    if not isinstance(backend, OpenAIChatBackend):
        raise ConfigError(
            f"backend {backend.name} ({backend.type}) cannot serve capture_mode 'passthrough'"
        )
    sampling = resolve_sampling(session.state.sampling, request.sampling)
    body = {
        **chat_body(request),
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_tokens": sampling.max_tokens,
    }
    return backend, body


async def _record(
    recorder: Recorder,
    session: Session,
    request: InternalRequest,
    body_hash: str,
    lease: Lease,
    result: ChatResult,
    started_at: float,
    started: float,
    answer_id_: str | None = None,
) -> InternalResponse:
    """Record a ``passthrough`` answer (streamed or not: the same completion) and return
    it."""
    content = result.message.get("content")
    response = InternalResponse(
        id=answer_id_ or new_response_id(),
        created=int(started_at),
        model=session.state.model,
        text=content or "",
        content=content,
        reasoning=result.message.get("reasoning_content"),
        tool_calls=list(result.message.get("tool_calls") or []),
        finish_reason=result.finish_reason,
        usage=Usage(
            prompt_tokens=result.num_prompt_tokens or len(result.prompt_ids),
            completion_tokens=result.num_completion_tokens or len(result.response_ids),
        ),
    )
    duration_s = time.monotonic() - started
    sampling = resolve_sampling(session.state.sampling, request.sampling)
    completion = await recorder.record(
        session,
        lambda index: build_passthrough_completion(
            session,
            index=index,
            request=request,
            body_hash=body_hash,
            result=result,
            response=response,
            backend=lease.backend,
            started_at=started_at,
            duration_s=duration_s,
            policy_version=lease.policy_version,
            sampling=SamplingUsed(
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                max_tokens=sampling.max_tokens,
            ),
        ),
    )
    response.completion_index = completion.index
    return response


async def call(
    pool: BackendPool,
    recorder: Recorder,
    session: Session,
    request: InternalRequest,
    body_hash: str,
    lease: Lease,
    clock: CallClock,
) -> InternalResponse:
    """One ``passthrough`` call on a leased backend: the backend renders the chat; the
    gateway records what it returns (untrainable without token ids).

    Args:
        pool: the backend pool (told that the backend answered).
        recorder: records the completion.
        session: the calling session.
        request: the translated request.
        body_hash: the request's identity.
        lease: the lease on the session's backend (an OpenAI-compatible chat backend).
        clock: the call's clock (sent, answered).

    Returns:
        The recorded answer.

    Raises:
        ConfigError: the session's backend takes no chat requests.
        BackendError: the backend failed.
    """
    started_at, started = time.time(), time.monotonic()
    backend, body = _body(session, request, lease)
    clock.sent()
    result = await backend.chat(body)
    clock.answered()
    pool.note_answered(lease)
    return await _record(recorder, session, request, body_hash, lease, result, started_at, started)


async def stream(
    recorder: Recorder,
    session: Session,
    request: InternalRequest,
    body_hash: str,
    lease: Lease,
    clock: CallClock,
) -> AsyncIterator[StreamEvent]:
    """A streamed ``passthrough`` call on a leased backend: the backend's chunks are
    forwarded as they arrive; the completion is recorded from the assembled answer,
    before the end event. Arguments as :func:`call`'s; the caller tells the pool how the
    backend did.

    Yields:
        StreamStart, then content and reasoning events, then StreamEnd (once recorded).
    """
    started_at, started = time.time(), time.monotonic()
    backend, body = _body(session, request, lease)
    clock.sent()
    deltas = backend.chat_stream(body)
    try:
        delta = await next_delta(deltas, backend)
        wire_id = new_response_id()
        yield StreamStart(id=wire_id, created=int(started_at), model=session.state.model)
        sent, sent_reasoning = "", ""
        while delta.result is None:
            if delta.reasoning:
                sent_reasoning += delta.reasoning
                yield StreamReasoning(text=delta.reasoning)
            if delta.content:
                sent += delta.content
                yield StreamContent(text=delta.content)
            delta = await next_delta(deltas, backend)
        clock.answered()
    finally:
        await deltas.aclose()  # type: ignore[attr-defined]
    response = await _record(
        recorder, session, request, body_hash, lease, delta.result, started_at, started, wire_id
    )
    clock.observe(request.dialect, True)
    yield stream_end(response, sent, sent_reasoning, session)


def stream_end(
    response: InternalResponse, sent: str, sent_reasoning: str, session: Session
) -> StreamEnd:
    """The end event of a streamed call whose recorded answer is ``response``, after
    ``sent`` content and ``sent_reasoning`` were streamed: the tails not streamed yet."""
    index = response.completion_index
    return StreamEnd(
        response=response,
        content_tail=stream_tail(response.content or "", sent, "content", session, index),
        reasoning_tail=stream_tail(
            response.reasoning or "", sent_reasoning, "reasoning", session, index
        ),
    )


def stream_tail(final: str, sent: str, part: str, session: Session, index: int | None) -> str:
    """The part of ``final`` not streamed yet (nothing, logged, if the stream diverged)."""
    if final.startswith(sent):
        return final[len(sent) :]
    log.warning(
        "stream_diverged",
        part=part,
        session_id=session.session_id,
        index=index,
        num_sent_chars=len(sent),
        num_final_chars=len(final),
    )
    return ""


async def next_delta(deltas: AsyncIterator[D], backend: Backend) -> D:
    try:
        return await deltas.__anext__()
    except StopAsyncIteration:
        raise BackendError(f"backend {backend.name}: stream ended without a result") from None
