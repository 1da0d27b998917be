"""The generation pipeline of one call, shared by every dialect and by both answer modes.

For a translated request in a session: refuse sealed sessions; answer a retry from the log;
build the prompt (the token chain of the conversation it continues, or a fresh render);
resolve sampling and bound ``max_tokens`` by the context left; sample on the session's
backend; parse tool calls; record the completion; answer. Streaming yields content deltas as
they are sampled and the final answer only after the completion is recorded, so both modes
record identical completions.

Calls of one session run concurrently (sub-agents, parallel tool calls): nothing here holds a
lock across a backend call. Only the session's short critical sections (the recorder's index
assignment and append, state writes) take ``session.lock`` (docs/sessions.md, "Concurrent
calls").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import structlog

from rolloutd.errors import BackendError, BackendUnavailableError
from rolloutd.observability.metrics import CallClock
from rolloutd.proxy.backends.base import (
    Backend,
    GenerateRequest,
    GenerateResult,
)
from rolloutd.proxy.backends.pool import BackendPool
from rolloutd.proxy.backends.slots import Lease
from rolloutd.proxy.calls import passthrough
from rolloutd.proxy.calls.failures import call_recorded, record_failure
from rolloutd.proxy.calls.passthrough import next_delta, stream_end
from rolloutd.proxy.calls.sampling import bound_max_tokens, resolve_sampling
from rolloutd.proxy.core.call_types import (
    InternalRequest,
    InternalResponse,
    StreamContent,
    StreamEnd,
    StreamEvent,
    StreamReasoning,
    StreamStart,
    Usage,
    id_suffix,
)
from rolloutd.proxy.render.chat_template import ChatTemplate, PromptPlan
from rolloutd.proxy.render.reasoning_parsers import ReasoningParser, get_reasoning_parser
from rolloutd.proxy.render.tool_parsers import get_tool_parser
from rolloutd.proxy.sessions.recorder import (
    Recorder,
    answer_id,
    build_completion,
    new_response_id,
    response_from_completion,
)
from rolloutd.proxy.sessions.replay import answer_from_source
from rolloutd.proxy.sessions.session import Session
from rolloutd.types import CaptureMode, Completion, SamplingUsed

log = structlog.get_logger(__name__)

#: renders up to this many characters (:meth:`ChatTemplate.render_chars`) run on the event loop
#: (well under a millisecond); larger ones in a worker thread.
INLINE_RENDER_CHARS = 16_000


@dataclass
class _Prepared:
    response_id: str
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
        tool_parser: name in :data:`rolloutd.proxy.render.tool_parsers.TOOL_PARSERS`.
        reasoning_parser: name in
            :data:`rolloutd.proxy.render.reasoning_parsers.REASONING_PARSERS`, or None.
    """

    def __init__(
        self,
        template: ChatTemplate,
        pool: BackendPool,
        recorder: Recorder,
        *,
        tool_parser: str = "hermes",
        reasoning_parser: str | None = None,
    ) -> None:
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
        previous = self.template.find_extended(request.messages, request.tools, session.extensions)
        plan = await asyncio.to_thread(
            self.template.build_prompt,
            request.messages,
            request.tools,
            session.extensions,
            previous=previous,
        )
        return len(plan.prompt_ids)

    def previous_conversation(
        self, session: Session, wire_id: str
    ) -> list[dict[str, object]] | None:
        """The conversation answered by the Responses answer ``wire_id`` (``resp_...``):
        that completion's messages and its answer, or None when the session has none such.

        Reads the append-only completion list; no lock needed.
        """
        for completion in reversed(session.completions):
            if f"resp_{id_suffix(answer_id(completion))}" == wire_id:
                return [*completion.messages, completion.response_message]
        return None

    def _shape(
        self, text: str, request: InternalRequest
    ) -> tuple[str | None, str | None, list[dict[str, object]], bool]:
        """(reasoning, content, tool_calls, a tool call could not be read) of sampled text:
        reasoning first, then tool calls in the rest (only when the request offered
        tools)."""
        reasoning, rest = (
            self.reasoning_parser.split(text) if self.reasoning_parser else (None, text)
        )
        if request.tools:
            parsed = self.tool_parser.parse(rest)
            return reasoning, parsed.content, parsed.tool_calls, parsed.num_unreadable > 0
        return reasoning, rest, [], False

    def _retry(
        self, session: Session, request: InternalRequest, marked: bool
    ) -> tuple[str, Completion | None]:
        """(request identity, the completion this call is a retry of, or None)
        (:meth:`rolloutd.proxy.sessions.session.Session.find_retry`). A completion found is marked
        as being sent again in the same step (no await between), so a concurrent identical
        request does not take it too."""
        body_hash = session.memo.request_hash(request.body, request.dialect)
        answered = session.find_retry(body_hash, marked=marked)
        if answered is not None:
            session.sending(answered.index)
            log.info(
                "retry_answered_from_log",
                session_id=session.session_id,
                index=answered.index,
                marked=marked,
            )
        return body_hash, answered

    async def _find_answer(
        self, session: Session, request: InternalRequest, marked: bool
    ) -> tuple[str, Completion | None]:
        """:meth:`_retry`; a marked retry of a request that another call of the session is
        sampling now (the client timed out and retried) waits for that call and answers with
        its completion, so one request is sampled once."""
        body_hash, answered = self._retry(session, request, marked)
        if answered is None and session.replay is not None:
            # a new attempt: the earlier attempt's record of this request
            answered = await answer_from_source(
                session, self.recorder, self.pool, request, body_hash
            )
            if answered is not None:
                return body_hash, answered
        waiting = session.sampling_calls.get(body_hash) if marked and answered is None else None
        if waiting is not None:
            index = await asyncio.shield(waiting)
            if index is not None:
                answered = session.completions[index]
                session.sending(index)
                log.info(
                    "retry_answered_from_log",
                    session_id=session.session_id,
                    index=index,
                    marked=marked,
                    waited=True,
                )
        return body_hash, answered

    async def _lease(self, session: Session, request: InternalRequest) -> Lease:
        """A lease on the backend the routing mode chooses for the call (the session's own in
        ``sticky`` mode; waits while it is paused); a session pinned to a removed backend
        moves now, and the move is persisted."""
        lease = await self.pool.acquire(
            self.pool.route(session.state.backend, request.messages), pool=session.state.pool
        )
        if lease.moved_from is not None:
            try:
                await session.move_backend(lease.moved_from, lease.backend.name)
            except BaseException:
                self.pool.release_lease(lease)
                raise
        return lease

    async def _build_prompt(self, session: Session, request: InternalRequest) -> PromptPlan:
        """The call's prompt: rendered inline when small (a thread hop costs more than a
        render of a few messages), in a worker thread when large (the event loop serves
        every session)."""
        template = self.template
        previous = template.find_extended(request.messages, request.tools, session.extensions)
        if (
            not template.busy
            and template.render_chars(request.messages, request.tools, previous)
            <= INLINE_RENDER_CHARS
        ):
            return template.build_prompt(
                request.messages, request.tools, session.extensions, previous=previous
            )
        return await asyncio.to_thread(
            template.build_prompt,
            request.messages,
            request.tools,
            session.extensions,
            previous=previous,
        )

    async def _prepare(
        self, session: Session, request: InternalRequest, body_hash: str, lease: Lease
    ) -> _Prepared:
        """Prompt and sampling of a call on ``lease.backend``: the prompt continues the
        completion whose conversation and answer the request extends (its chain's tail,
        whichever conversation of the session that is), else renders afresh."""
        started_at, started = time.time(), time.monotonic()
        plan = await self._build_prompt(session, request)
        backend = lease.backend
        sampling = resolve_sampling(session.state.sampling, request.sampling)
        max_tokens = bound_max_tokens(
            sampling.max_tokens, len(plan.prompt_ids), await backend.context_size()
        )
        base = session.completions[plan.extends].prompt_ids if plan.extends is not None else None
        generate = GenerateRequest(
            prompt_ids=plan.prompt_ids,
            max_tokens=max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            seed=sampling.seed,
            prompt_json=session.prompt_json.dumps(plan.prompt_ids, base),
        )
        log.debug(
            "call_prepared",
            session_id=session.session_id,
            num_prompt_tokens=len(plan.prompt_ids),
            num_new_tokens=plan.num_new_tokens,
            extends=plan.extends,
            max_tokens=max_tokens,
            backend=backend.name,
        )
        return _Prepared(
            response_id=new_response_id(),
            body_hash=body_hash,
            plan=plan,
            backend=backend,
            generate=generate,
            started_at=started_at,
            started=started,
            policy_version=lease.policy_version,
        )

    async def _answer(
        self, session: Session, request: InternalRequest, prep: _Prepared, result: GenerateResult
    ) -> InternalResponse:
        """Parse, record and build the answer (the completion's index is given when it is
        recorded)."""
        text_ids = result.response_ids[:-1] if result.ended_by_eos else result.response_ids
        # a short answer decodes in microseconds: a thread hop would cost more
        text = (
            self.template.decode(text_ids)
            if len(text_ids) <= 256
            else await asyncio.to_thread(self.template.decode, text_ids)
        )
        reasoning, content, tool_calls, unreadable = self._shape(text, request)
        response = InternalResponse(
            id=prep.response_id,
            created=int(prep.started_at),
            model=session.state.model,
            text=text,
            content=content,
            reasoning=reasoning,
            tool_calls=tool_calls,
            finish_reason="tool_calls" if tool_calls else result.finish_reason,
            usage=Usage(
                prompt_tokens=len(prep.plan.prompt_ids), completion_tokens=len(result.response_ids)
            ),
        )
        duration_s = time.monotonic() - prep.started

        def build(index: int) -> Completion:
            completion = build_completion(
                session,
                index=index,
                request=request,
                body_hash=prep.body_hash,
                plan=prep.plan,
                result=result,
                response=response,
                backend=prep.backend,
                end_of_turn_id=self.template.end_of_turn_id,
                started_at=prep.started_at,
                duration_s=duration_s,
                policy_version=prep.policy_version,
                sampling=SamplingUsed(
                    temperature=prep.generate.temperature,
                    top_p=prep.generate.top_p,
                    top_k=prep.generate.top_k,
                    max_tokens=prep.generate.max_tokens,
                    seed=prep.generate.seed,
                ),
            )
            # the model's doing: its tokens stay; the task may force the session's reward
            completion.tool_call_parse_failed = unreadable
            return completion

        recorded = await self.recorder.record(session, build, result.routed_experts)
        response.completion_index = recorded.index
        return response

    async def note_failure(
        self,
        session: Session,
        error: Exception,
        started: float,
        *,
        stream: bool,
        request: InternalRequest | None = None,
    ) -> bool:
        """Record a call that failed outside :meth:`complete` and :meth:`stream` (reading or
        translating its body, rendering its answer, encoding its stream) as they record
        theirs; a failure recorded already, or one of a sealed session, is left alone.

        Call without ``session.lock`` (it is taken briefly: the session's state is written).

        Args:
            session: the session the call was made in.
            error: what the call failed with.
            started: ``time.monotonic()`` when the call arrived.
            stream: the harness asked for a stream.
            request: the translated request, when the call got that far.

        Returns:
            Whether ``error`` is recorded in the session's state (now or before).
        """
        if call_recorded(error):
            return True
        if session.state.closed:
            return False
        return await record_failure(session, error, started, stream=stream, request=request)

    async def _complete(
        self, session: Session, request: InternalRequest, marked: bool, token: int, clock: CallClock
    ) -> InternalResponse:
        body_hash, answered = await self._find_answer(session, request, marked)
        if answered is not None:
            return response_from_completion(answered)
        own = session.start_sampling(body_hash)
        index: int | None = None
        try:
            lease = await self._lease(session, request)
            session.liveness.leased(token)
            try:
                if session.state.capture_mode is CaptureMode.PASSTHROUGH:
                    response = await passthrough.call(
                        self.pool, self.recorder, session, request, body_hash, lease, clock
                    )
                else:
                    prep = await self._prepare(session, request, body_hash, lease)
                    clock.sent()
                    result = await prep.backend.generate(prep.generate)
                    clock.answered()
                    self.pool.note_answered(lease)
                    response = await self._answer(session, request, prep, result)
                clock.observe(request.dialect, False)
                self.pool.charge(
                    session.state.pool,
                    response.usage.prompt_tokens + response.usage.completion_tokens,
                )
            except BackendError as e:
                self.pool.note_failed(lease, e)
                raise
            finally:
                self.pool.release_lease(lease)
            index = response.completion_index
            return response
        finally:
            session.end_sampling(body_hash, own, index)

    async def complete(
        self, session: Session, request: InternalRequest, *, marked_retry: bool = False
    ) -> InternalResponse:
        """Answer one call in one piece.

        The answer's ``completion_index`` names the completion that holds it; the caller
        tells the session whether it reached the harness
        (:meth:`rolloutd.proxy.sessions.session.Session.settle`). A call of an open session that
        fails is recorded in the session's state
        (:meth:`rolloutd.proxy.sessions.session.Session.record_error`), never in its log.

        Args:
            session: the session.
            request: the translated request.
            marked_retry: the client marks the call as a retry (``x-stainless-retry-count``
                > 0): an earlier completion of the same identity answers it even when its
                answer was delivered.

        Raises:
            rolloutd.errors.AuthenticationError: the session is closed.
            rolloutd.errors.InvalidRequestError: the template rejects the messages.
            ContextLengthError: the prompt fills the context.
            BackendError: the backend failed; nothing is recorded in the log.
        """
        session.begin_call()
        started, started_at = time.monotonic(), time.time()
        token = session.liveness.started()
        try:
            response = await self._complete(
                session, request, marked_retry, token, CallClock(started)
            )
            session.liveness.answered(token)
            return response
        except Exception as e:
            session.liveness.failed(token, e)
            await record_failure(session, e, started, stream=False, request=request)
            raise
        except BaseException as e:
            ended = _verdict_failure(session, token, e)
            if ended is not None:
                # the backend never answered: a failed call of the backend's, recorded
                session.liveness.failed(token, ended)
                await record_failure(session, ended, started, stream=False, request=request)
                raise ended from None
            session.liveness.cut(token)
            session.note_cut(started_at)
            raise
        finally:
            session.end_call()

    async def stream(
        self, session: Session, request: InternalRequest, *, marked_retry: bool = False
    ) -> AsyncIterator[StreamEvent]:
        """Answer one call as events: :class:`StreamStart`, :class:`StreamContent`...,
        :class:`StreamEnd`.

        Errors before :class:`StreamStart` (closed session, bad messages, context, backend
        refused) are raised before anything is sent, so the caller can answer with a status.
        Reasoning (:class:`StreamReasoning`) streams while it is sampled; content is held back
        from a tool-call marker on; tool calls come with the end event. The streamed reasoning
        and content plus the end event's tails equal the recorded answer's. In
        ``passthrough`` mode the backend's chunks are forwarded as they arrive. A failed call
        is recorded in the session's state, as in :meth:`complete`. The end event's answer
        names its completion (``completion_index``); the caller settles its delivery, and a
        stream closed before the end event was taken leaves it undelivered.

        Raises:
            The errors of :meth:`complete`.
        """
        session.begin_call()
        started, started_at = time.monotonic(), time.time()
        token = session.liveness.started()
        end_index: int | None = None
        own: asyncio.Future[int | None] | None = None
        body_hash = ""
        try:
            body_hash, answered = await self._find_answer(session, request, marked_retry)
            if answered is not None:
                session.liveness.answered(token)
                response = response_from_completion(answered)
                end_index = answered.index
                yield StreamStart(
                    id=response.id,
                    created=response.created,
                    model=response.model,
                    prompt_tokens=response.usage.prompt_tokens,
                )
                yield StreamEnd(
                    response=response,
                    content_tail=response.content or "",
                    reasoning_tail=response.reasoning or "",
                )
                return
            own = session.start_sampling(body_hash)
            lease = await self._lease(session, request)
            session.liveness.leased(token)
            clock = CallClock(started)
            events = (
                passthrough.stream(self.recorder, session, request, body_hash, lease, clock)
                if session.state.capture_mode is CaptureMode.PASSTHROUGH
                else self._stream_on(session, request, body_hash, lease, clock)
            )
            try:
                async for event in events:
                    if isinstance(event, StreamEnd):
                        end_index = event.response.completion_index
                        usage = event.response.usage
                        self.pool.charge(
                            session.state.pool, usage.prompt_tokens + usage.completion_tokens
                        )
                    yield event
                self.pool.note_answered(lease)
                session.liveness.answered(token)
            except BackendError as e:
                self.pool.note_failed(lease, e)
                raise
            finally:
                await events.aclose()  # type: ignore[attr-defined]
                self.pool.release_lease(lease)
        except Exception as e:
            session.liveness.failed(token, e)
            if end_index is not None:
                session.settle(end_index, delivered=False)
            await record_failure(session, e, started, stream=True, request=request)
            raise
        except BaseException as e:
            ended = _verdict_failure(session, token, e)
            if ended is not None:
                session.liveness.failed(token, ended)
                if end_index is not None:
                    session.settle(end_index, delivered=False)
                await record_failure(session, ended, started, stream=True, request=request)
                raise ended from None
            session.liveness.cut(token)
            if end_index is not None:
                session.settle(end_index, delivered=False)
            session.note_cut(started_at)
            raise
        finally:
            session.end_sampling(body_hash, own, end_index)
            session.end_call()

    async def _stream_on(
        self,
        session: Session,
        request: InternalRequest,
        body_hash: str,
        lease: Lease,
        clock: CallClock,
    ) -> AsyncIterator[StreamEvent]:
        """The streamed tokens-mode call on a leased backend."""
        prep = await self._prepare(session, request, body_hash, lease)
        streamable = self.tool_parser.streamable if request.tools else str
        clock.sent()
        deltas = prep.backend.generate_stream(prep.generate)
        try:
            delta = await next_delta(deltas, prep.backend)
            yield StreamStart(
                id=prep.response_id,
                created=int(prep.started_at),
                model=session.state.model,
                prompt_tokens=len(prep.generate.prompt_ids),
            )
            text, sent, sent_reasoning = "", "", ""
            while delta.result is None:
                text += delta.text
                if self.reasoning_parser is not None:
                    reasoning, rest = self.reasoning_parser.split_partial(text)
                    if len(reasoning) > len(sent_reasoning) and reasoning.startswith(
                        sent_reasoning
                    ):
                        yield StreamReasoning(text=reasoning[len(sent_reasoning) :])
                        sent_reasoning = reasoning
                else:
                    rest = text
                safe = streamable(rest) if rest is not None else ""
                if len(safe) > len(sent) and safe.startswith(sent):
                    yield StreamContent(text=safe[len(sent) :])
                    sent = safe
                delta = await next_delta(deltas, prep.backend)
            clock.answered()
        finally:
            await deltas.aclose()  # type: ignore[attr-defined]
        response = await self._answer(session, request, prep, delta.result)
        clock.observe(request.dialect, True)
        yield stream_end(response, sent, sent_reasoning, session)


def _verdict_failure(session: Session, token: int, error: BaseException) -> BackendError | None:
    """The call ``token`` was cancelled by the session's ``backend`` verdict (its backend
    did not answer for ``backend_dead_after_s``): the cancellation is undone
    (``Task.uncancel``, Python 3.11) and the call fails with ``BackendUnavailableError``,
    which the harness gets in its dialect and the session records as a failed call of the
    backend's (docs/failures.md). None: cancelled otherwise (the harness went away)."""
    if not isinstance(error, asyncio.CancelledError):
        return None
    why = session.liveness.ended_by_verdict(token)
    if why is None:
        return None
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
    return BackendUnavailableError(why)
