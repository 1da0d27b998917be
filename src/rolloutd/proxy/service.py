"""The generation pipeline of one call, shared by every dialect and by both answer modes.

For a translated request in a session: refuse sealed sessions; answer a retried request from
the log; build the prompt (token chain or fresh render); resolve sampling and bound
``max_tokens`` by the context left; sample on the session's backend; parse tool calls; record
the completion; answer. Streaming yields content deltas as they are sampled and the final
answer only after the completion is recorded, so both modes record identical completions.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import structlog

from rolloutd.errors import BackendError, ConfigError, ContextLengthError
from rolloutd.proxy.backends.base import Backend, GenerateDelta, GenerateRequest, GenerateResult
from rolloutd.proxy.backends.openai_compat import OpenAIChatBackend
from rolloutd.proxy.backends.pool import BackendPool, Lease
from rolloutd.proxy.chat_template import ChatTemplate, PromptPlan
from rolloutd.proxy.dialects import openai_chat
from rolloutd.proxy.dialects.common import id_suffix
from rolloutd.proxy.internal import (
    InternalRequest,
    InternalResponse,
    SamplingOverrides,
    StreamContent,
    StreamEnd,
    StreamEvent,
    StreamReasoning,
    StreamStart,
    Usage,
)
from rolloutd.proxy.parsers import ReasoningParser, get_reasoning_parser
from rolloutd.proxy.recorder import (
    Recorder,
    build_completion,
    build_passthrough_completion,
    request_hash,
    response_from_completion,
    response_id,
)
from rolloutd.proxy.sessions import Session
from rolloutd.proxy.tool_parsers import get_tool_parser
from rolloutd.types import CaptureMode, Completion, SamplingParams

log = structlog.get_logger(__name__)


def resolve_sampling(task: SamplingParams, harness: SamplingOverrides) -> SamplingParams:
    """The sampling values of one call.

    ``policy == "respect"`` keeps the harness's temperature, top_p and max_tokens where it sent
    them; ``override`` uses the task's values only. top_k and seed always come from the task.

    Args:
        task: the session's sampling parameters.
        harness: the values in the request.

    Returns:
        The values to sample with (``max_tokens`` before the context bound).
    """
    if task.policy != "respect":
        return task
    update = {name: value for name, value in harness.model_dump().items() if value is not None}
    return task.model_copy(update=update)


def bound_max_tokens(max_tokens: int, num_prompt_tokens: int, ctx_size: int) -> int:
    """``max_tokens`` cut to the context left after the prompt.

    Args:
        max_tokens: tokens asked for.
        num_prompt_tokens: P.
        ctx_size: the backend's context window per sequence.

    Returns:
        ``min(max_tokens, ctx_size - P)``, at least 1.

    Raises:
        ContextLengthError: ``P >= ctx_size``: no room for one sampled token.
    """
    room = ctx_size - num_prompt_tokens
    if room < 1:
        raise ContextLengthError(
            f"this model's maximum context length is {ctx_size} tokens, but the prompt has "
            f"{num_prompt_tokens} tokens, which leaves no room for the completion")
    return min(max_tokens, room)


@dataclass
class _Prepared:
    index: int
    body_hash: str
    plan: PromptPlan
    backend: Backend
    generate: GenerateRequest
    started_at: float
    started: float
    policy_version: int


class ChatService:
    """Runs calls: prompt, sample, parse, record, answer.

    Args:
        template: the model's chat template and token chain.
        pool: the backends.
        recorder: the completion recorder.
        tool_parser: name in :data:`rolloutd.proxy.tool_parsers.TOOL_PARSERS`.
        reasoning_parser: name in :data:`rolloutd.proxy.parsers.REASONING_PARSERS`, or None.
    """

    def __init__(self, template: ChatTemplate, pool: BackendPool, recorder: Recorder, *,
                 tool_parser: str = "hermes", reasoning_parser: str | None = None) -> None:
        self.template = template
        self.pool = pool
        self.recorder = recorder
        self.tool_parser = get_tool_parser(tool_parser)
        self.reasoning_parser: ReasoningParser | None = get_reasoning_parser(reasoning_parser)

    async def count_tokens(self, session: Session, request: InternalRequest) -> int:
        """Prompt tokens the request would send: rendered (or chained) with the model's
        template; nothing is sampled and nothing is recorded (Anthropic ``count_tokens``,
        Gemini ``countTokens``).

        Raises:
            rolloutd.errors.InvalidRequestError: the template rejects the messages.
        """
        plan = await asyncio.to_thread(self.template.build_prompt, request.messages,
                                       request.tools, list(session.completions))
        return len(plan.prompt_ids)

    def previous_conversation(self, session: Session, wire_id: str
                              ) -> list[dict[str, object]] | None:
        """The conversation answered by the Responses answer ``wire_id`` (``resp_...``):
        that completion's messages and its answer, or None when the session has none such.

        Reads the append-only completion list; no lock needed.
        """
        for completion in reversed(session.completions):
            if f"resp_{id_suffix(response_id(completion.session_id, completion.index))}" \
                    == wire_id:
                return [*completion.messages, completion.response_message]
        return None

    def _shape(self, text: str, request: InternalRequest
               ) -> tuple[str | None, str | None, list[dict[str, object]]]:
        """(reasoning, content, tool_calls) of sampled text: reasoning first, then tool calls
        in the rest (only when the request offered tools)."""
        reasoning, rest = (self.reasoning_parser.split(text) if self.reasoning_parser
                           else (None, text))
        if request.tools:
            parsed = self.tool_parser.parse(rest)
            return reasoning, parsed.content, parsed.tool_calls
        return reasoning, rest, []

    def _retry(self, session: Session, request: InternalRequest
               ) -> tuple[str, Completion | None]:
        """(request hash, the completion that answered it already or None); refuses sealed
        sessions (call with ``session.lock`` held)."""
        session.ensure_open()
        body_hash = request_hash(request.body)
        answered = self.recorder.find_retry(session, body_hash)
        if answered is not None:
            log.info("retry_answered_from_log", session_id=session.session_id,
                     index=answered.index)
        return body_hash, answered

    async def _lease(self, session: Session) -> Lease:
        """A lease on the session's backend (waits while it is paused); a session pinned to a
        removed backend moves now, and the move is persisted (call with ``session.lock``)."""
        lease = await self.pool.acquire(session.state.backend)
        if lease.moved_from is not None:
            try:
                await session.move_backend(lease.moved_from, lease.backend.name)
            except BaseException:
                self.pool.release_lease(lease)
                raise
        return lease

    async def _prepare(self, session: Session, request: InternalRequest, body_hash: str,
                       lease: Lease) -> _Prepared:
        """Prompt and sampling of a call on ``lease.backend`` (call with ``session.lock``)."""
        started_at, started = time.time(), time.monotonic()
        plan = await asyncio.to_thread(self.template.build_prompt, request.messages,
                                       request.tools, session.completions)
        backend = lease.backend
        sampling = resolve_sampling(session.state.sampling, request.sampling)
        max_tokens = bound_max_tokens(sampling.max_tokens, len(plan.prompt_ids),
                                      await backend.context_size())
        generate = GenerateRequest(prompt_ids=plan.prompt_ids, max_tokens=max_tokens,
                                   temperature=sampling.temperature, top_p=sampling.top_p,
                                   top_k=sampling.top_k, seed=sampling.seed)
        log.debug("call_prepared", session_id=session.session_id, index=session.next_index(),
                  num_prompt_tokens=len(plan.prompt_ids), num_new_tokens=plan.num_new_tokens,
                  extends=plan.extends, max_tokens=max_tokens, backend=backend.name)
        return _Prepared(index=session.next_index(), body_hash=body_hash, plan=plan,
                         backend=backend, generate=generate, started_at=started_at,
                         started=started, policy_version=lease.policy_version)

    async def _answer(self, session: Session, request: InternalRequest, prep: _Prepared,
                      result: GenerateResult) -> InternalResponse:
        """Parse, record and build the answer (call with ``session.lock`` held)."""
        text_ids = result.response_ids[:-1] if result.ended_by_eos else result.response_ids
        # a short answer decodes in microseconds: a thread hop would cost more
        text = self.template.decode(text_ids) if len(text_ids) <= 256 \
            else await asyncio.to_thread(self.template.decode, text_ids)
        reasoning, content, tool_calls = self._shape(text, request)
        response = InternalResponse(
            id=response_id(session.session_id, prep.index),
            created=int(prep.started_at),
            model=session.state.model,
            text=text,
            content=content,
            reasoning=reasoning,
            tool_calls=tool_calls,
            finish_reason="tool_calls" if tool_calls else result.finish_reason,
            usage=Usage(prompt_tokens=len(prep.plan.prompt_ids),
                        completion_tokens=len(result.response_ids)),
        )
        completion = build_completion(
            session, index=prep.index, request=request, body_hash=prep.body_hash,
            plan=prep.plan, result=result, response=response, backend=prep.backend,
            end_of_turn_id=self.template.end_of_turn_id, started_at=prep.started_at,
            duration_s=time.monotonic() - prep.started, policy_version=prep.policy_version,
        )
        await self.recorder.record(session, completion)
        return response

    async def _passthrough(self, session: Session, request: InternalRequest) -> InternalResponse:
        """One ``passthrough`` call (call with ``session.lock`` held): the backend renders the
        chat; the gateway records what it returns (untrainable without token ids).

        Raises:
            ConfigError: the session's backend takes no chat requests.
            BackendError: the backend failed; nothing is recorded.
        """
        body_hash, answered = self._retry(session, request)
        if answered is not None:
            return response_from_completion(answered)
        lease = await self._lease(session)
        try:
            return await self._passthrough_on(session, request, body_hash, lease)
        finally:
            self.pool.release_lease(lease)

    async def _passthrough_on(self, session: Session, request: InternalRequest,
                              body_hash: str, lease: Lease) -> InternalResponse:
        """The ``passthrough`` call on a leased backend."""
        backend = lease.backend
        if not isinstance(backend, OpenAIChatBackend):
            raise ConfigError(f"backend {backend.name} ({backend.type}) cannot serve "
                              "capture_mode 'passthrough'")
        started_at, started = time.time(), time.monotonic()
        sampling = resolve_sampling(session.state.sampling, request.sampling)
        body = {**openai_chat.request_from_internal(request), "temperature": sampling.temperature,
                "top_p": sampling.top_p, "max_tokens": sampling.max_tokens}
        result = await backend.chat(body)
        index = session.next_index()
        content = result.message.get("content")
        response = InternalResponse(
            id=response_id(session.session_id, index), created=int(started_at),
            model=session.state.model, text=content or "", content=content,
            reasoning=result.message.get("reasoning_content"),
            tool_calls=list(result.message.get("tool_calls") or []),
            finish_reason=result.finish_reason,
            usage=Usage(prompt_tokens=result.num_prompt_tokens or len(result.prompt_ids),
                        completion_tokens=result.num_completion_tokens
                        or len(result.response_ids)))
        await self.recorder.record(session, build_passthrough_completion(
            session, index=index, request=request, body_hash=body_hash, result=result,
            response=response, backend=backend, started_at=started_at,
            duration_s=time.monotonic() - started, policy_version=lease.policy_version))
        return response

    async def complete(self, session: Session, request: InternalRequest) -> InternalResponse:
        """Answer one call in one piece.

        Raises:
            rolloutd.errors.AuthenticationError: the session is closed.
            rolloutd.errors.InvalidRequestError: the template rejects the messages.
            ContextLengthError: the prompt fills the context.
            BackendError: the backend failed; nothing is recorded.
        """
        async with session.lock:
            if session.state.capture_mode is CaptureMode.PASSTHROUGH:
                return await self._passthrough(session, request)
            body_hash, answered = self._retry(session, request)
            if answered is not None:
                return response_from_completion(answered)
            lease = await self._lease(session)
            try:
                prep = await self._prepare(session, request, body_hash, lease)
                result = await prep.backend.generate(prep.generate)
                return await self._answer(session, request, prep, result)
            finally:
                self.pool.release_lease(lease)

    async def stream(self, session: Session, request: InternalRequest
                     ) -> AsyncIterator[StreamEvent]:
        """Answer one call as events: :class:`StreamStart`, :class:`StreamContent`...,
        :class:`StreamEnd`.

        Errors before :class:`StreamStart` (closed session, bad messages, context, backend
        refused) are raised before anything is sent, so the caller can answer with a status.
        Reasoning (:class:`StreamReasoning`) streams while it is sampled; content is held back
        from a tool-call marker on; tool calls come with the end event. The streamed reasoning
        and content plus the end event's tails equal the recorded answer's.

        Raises:
            The errors of :meth:`complete`.
        """
        async with session.lock:
            if session.state.capture_mode is CaptureMode.PASSTHROUGH:
                # the upstream answer is taken whole, so the stream is not incremental here
                response = await self._passthrough(session, request)
                yield StreamStart(id=response.id, created=response.created, model=response.model)
                yield StreamEnd(response=response, content_tail=response.content or "",
                                reasoning_tail=response.reasoning or "")
                return
            body_hash, answered = self._retry(session, request)
            if answered is not None:
                response = response_from_completion(answered)
                yield StreamStart(id=response.id, created=response.created, model=response.model)
                yield StreamEnd(response=response, content_tail=response.content or "",
                                reasoning_tail=response.reasoning or "")
                return
            lease = await self._lease(session)
            events = self._stream_on(session, request, body_hash, lease)
            try:
                async for event in events:
                    yield event
            finally:
                await events.aclose()  # type: ignore[attr-defined]
                self.pool.release_lease(lease)

    async def _stream_on(self, session: Session, request: InternalRequest, body_hash: str,
                         lease: Lease) -> AsyncIterator[StreamEvent]:
        """The streamed tokens-mode call on a leased backend (call with ``session.lock``)."""
        prep = await self._prepare(session, request, body_hash, lease)
        streamable = self.tool_parser.streamable if request.tools else str
        deltas = prep.backend.generate_stream(prep.generate)
        try:
            delta = await _next_delta(deltas, prep.backend)
            yield StreamStart(id=response_id(session.session_id, prep.index),
                              created=int(prep.started_at), model=session.state.model)
            text, sent, sent_reasoning = "", "", ""
            while delta.result is None:
                text += delta.text
                if self.reasoning_parser is not None:
                    reasoning, rest = self.reasoning_parser.split_partial(text)
                    if len(reasoning) > len(sent_reasoning) \
                            and reasoning.startswith(sent_reasoning):
                        yield StreamReasoning(text=reasoning[len(sent_reasoning):])
                        sent_reasoning = reasoning
                else:
                    rest = text
                safe = streamable(rest) if rest is not None else ""
                if len(safe) > len(sent) and safe.startswith(sent):
                    yield StreamContent(text=safe[len(sent):])
                    sent = safe
                delta = await _next_delta(deltas, prep.backend)
        finally:
            await deltas.aclose()  # type: ignore[attr-defined]
        response = await self._answer(session, request, prep, delta.result)
        yield StreamEnd(
            response=response,
            content_tail=_tail(response.content or "", sent, "content", session, prep),
            reasoning_tail=_tail(response.reasoning or "", sent_reasoning, "reasoning",
                                 session, prep))


def _tail(final: str, sent: str, part: str, session: Session, prep: _Prepared) -> str:
    """The part of ``final`` not streamed yet (nothing, logged, if the stream diverged)."""
    if final.startswith(sent):
        return final[len(sent):]
    log.warning("stream_diverged", part=part, session_id=session.session_id, index=prep.index,
                num_sent_chars=len(sent), num_final_chars=len(final))
    return ""


async def _next_delta(deltas: AsyncIterator[GenerateDelta], backend: Backend) -> GenerateDelta:
    try:
        return await deltas.__anext__()
    except StopAsyncIteration:
        raise BackendError(f"backend {backend.name}: stream ended without a result") from None
