"""The recorder: every model call becomes a :class:`rolloutd.types.Completion` in the log.

A completion is appended to the session's :class:`rolloutd.store.CompletionLog` before its
response reaches the harness (docs/sessions.md, "The completion log"), with a gap-free index
assigned when it is recorded (append order), in one short critical section under the
session's lock. A retried request (docs/sessions.md, "Request identity") is answered from the
log: no second sample, no second completion.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import Callable
from typing import Any

import structlog

from rolloutd.observability import metrics
from rolloutd.proxy.backends.base import Backend, ChatResult, GenerateResult
from rolloutd.proxy.core.call_types import InternalRequest, InternalResponse, Usage
from rolloutd.proxy.render.chat_template import PromptPlan
from rolloutd.proxy.sessions.session import Session
from rolloutd.routes import store_completion_routes
from rolloutd.types import Completion, SamplingUsed, Timings

log = structlog.get_logger(__name__)


def response_id(session_id: str, index: int) -> str:
    """The answer id of completion ``index`` in a log written before completions kept their
    own (``Completion.response_id``)."""
    digest = hashlib.sha256(f"{session_id}#{index}".encode()).hexdigest()
    return f"chatcmpl-{digest[:24]}"


def new_response_id() -> str:
    """A fresh answer id, ``chatcmpl-`` plus 24 random hex digits: chosen when a call starts
    (a stream names its answer before the completion has its index)."""
    return "chatcmpl-" + secrets.token_hex(12)


def answer_id(completion: Completion) -> str:
    """The id the harness got with ``completion``'s answer."""
    return completion.response_id or response_id(completion.session_id, completion.index)


def build_completion(
    session: Session,
    *,
    index: int,
    request: InternalRequest,
    body_hash: str,
    plan: PromptPlan,
    result: GenerateResult,
    response: InternalResponse,
    backend: Backend,
    end_of_turn_id: int,
    started_at: float,
    duration_s: float,
    policy_version: int | None = None,
    sampling: SamplingUsed | None = None,
) -> Completion:
    """The completion of one answered call (pure).

    Args:
        session: the session (its id, model and capture mode).
        index: the completion's index (given by :meth:`Recorder.record`).
        request: the translated request.
        body_hash: :func:`rolloutd.proxy.core.request_identity.request_hash` of
            ``request.body``.
        plan: the prompt sent (``prompt_ids``, length P, and ``extends``).
        result: what the backend sampled (``response_ids``/``response_logprobs``, length R).
        response: the answer returned to the harness.
        backend: the backend that sampled (name and policy version are recorded).
        end_of_turn_id: the chat template's end-of-turn token.
        started_at: Unix time (s) the call started.
        duration_s: wall time of the call, seconds.
        policy_version: the backend's policy version when the call was sent (default: its
            version now).
        sampling: the sampling parameters the call was sent with.
    """
    if len(result.response_ids) != len(result.response_logprobs):
        raise ValueError(
            f"completion {session.session_id}#{index}: {len(result.response_ids)} "
            f"sampled tokens, {len(result.response_logprobs)} logprobs"
        )
    # built from validated parts: validating again would copy the whole conversation per call
    return Completion.model_construct(
        **_call_fields(session, index, body_hash, request, response, backend, policy_version),
        prompt_ids=plan.prompt_ids,
        response_ids=result.response_ids,
        response_logprobs=result.response_logprobs,
        recomputed_logprob_positions=result.recomputed_logprob_positions,
        end_of_turn_sampled=bool(result.response_ids) and result.response_ids[-1] == end_of_turn_id,
        extends=plan.extends,
        timings=Timings(
            started_at=started_at, first_token_s=result.first_token_s, duration_s=duration_s
        ),
        sampling=sampling,
        num_prompt_tokens=len(plan.prompt_ids),
        num_cached_tokens=result.num_cached_tokens,
    )


def reusable_prefix(completion: Completion, base: Completion | None) -> int:
    """Prompt tokens of ``completion`` its backend could have served from its prefix cache
    because the session's previous call left them there: the tokens ``completion``'s prompt
    shares with ``base``'s prompt + response when ``base`` was sampled on the same backend
    (a cache that keeps a session's last sequence serves at least these), else 0. What
    :func:`rolloutd.observability.metrics.count_prefix_cache` sets the cached tokens
    against, to see a cache that stopped serving (a restart, an evicting slot).

    Args:
        completion: the completion just sampled (``prompt_ids``, length P, and ``backend``).
        base: the completion it extends, else the session's previous one, or None.

    Returns:
        The shared leading tokens, 0 <= n <= P.
    """
    if (
        base is None
        or base.backend != completion.backend
        or base.replayed_from is not None
        or not completion.prompt_ids
    ):
        return 0
    prompt = completion.prompt_ids
    if completion.extends == base.index:  # the prompt continues base's tokens, by construction
        return min(len(base.prompt_ids) + len(base.response_ids), len(prompt))
    n = 0  # a fresh render: compare
    for sequence in (base.prompt_ids, base.response_ids):
        for token in sequence:
            if n >= len(prompt) or prompt[n] != token:
                return n
            n += 1
    return n


def _call_fields(
    session: Session,
    index: int,
    body_hash: str,
    request: InternalRequest,
    response: InternalResponse,
    backend: Backend,
    policy_version: int | None,
) -> dict[str, Any]:
    """What every completion records of its call, however its tokens were captured."""
    return {
        "session_id": session.session_id,
        "index": index,
        "request_hash": body_hash,
        "dialect": request.dialect,
        "capture_mode": session.state.capture_mode,
        "model": response.model,
        "messages": request.messages,
        "tools": request.tools,
        "request": request.body,
        "response_text": response.text,
        "response_message": response.message(),
        "finish_reason": response.finish_reason,
        "backend": backend.name,
        "policy_version": backend.policy_version if policy_version is None else policy_version,
        "response_id": response.id,
        "backend_type": backend.type,
        "logprob_mode": backend.logprob_mode,
        "routed_experts": None,
    }


def build_passthrough_completion(
    session: Session,
    *,
    index: int,
    request: InternalRequest,
    body_hash: str,
    result: ChatResult,
    response: InternalResponse,
    backend: Backend,
    started_at: float,
    duration_s: float,
    policy_version: int | None = None,
    sampling: SamplingUsed | None = None,
) -> Completion:
    """The completion of one ``passthrough`` call (pure): the backend rendered the prompt, so
    token ids are the ones it returned, if any; without them the completion is untrainable.
    """
    trainable = result.trainable  # implies aligned response ids and logprobs
    return Completion.model_construct(
        **_call_fields(session, index, body_hash, request, response, backend, policy_version),
        prompt_ids=result.prompt_ids if trainable else [],
        response_ids=result.response_ids if trainable else [],
        response_logprobs=result.response_logprobs if trainable else [],
        end_of_turn_sampled=trainable,
        trainable=trainable,
        timings=Timings(started_at=started_at, duration_s=duration_s),
        sampling=sampling,
        num_prompt_tokens=result.num_prompt_tokens or len(result.prompt_ids) or None,
        num_cached_tokens=result.num_cached_tokens,
    )


def response_from_completion(completion: Completion) -> InternalResponse:
    """The answer recorded in ``completion``, identical to the one first returned."""
    message = completion.response_message
    return InternalResponse(
        id=answer_id(completion),
        completion_index=completion.index,
        created=int(completion.timings.started_at),
        model=completion.model,
        text=completion.response_text,
        content=message.get("content"),
        tool_calls=list(message.get("tool_calls") or []),
        reasoning=message.get("reasoning_content"),
        finish_reason=completion.finish_reason,  # type: ignore[arg-type]
        usage=Usage(
            prompt_tokens=len(completion.prompt_ids), completion_tokens=len(completion.response_ids)
        ),
    )


class Recorder:
    """Appends completions to their session's log."""

    async def record(
        self, session: Session, build: Callable[[int], Completion], routes: Any = None
    ) -> Completion:
        """Give the next index to the completion ``build(index)`` and append it to the log,
        in one critical section under ``session.lock`` (never held across a backend call):
        the index is the completion's place in append order, gap-free whatever order
        concurrent calls end in. The record reaches the operating system before this
        returns, so before the answer is sent; fsync follows the store's ``sync`` policy
        (:class:`rolloutd.store.BlobStore`). Only what it adds to the completion it continues
        (else the one before) is written (:func:`rolloutd.store.encode_completion`). Its
        answer is then on its way (:meth:`Session.sending`).

        Args:
            session: the session.
            build: the completion of a given index (pure; :func:`build_completion`).
            routes: the call's routed experts, ``(rows, layers, top_k)`` from position 0, or
                None: stored first (:mod:`rolloutd.routes`, only the rows past its base's),
                so a record never names rows that are not there.

        Returns:
            The recorded completion.

        Raises:
            rolloutd.store.BlobExistsError: its index is written already (another writer).
        """
        async with session.lock:
            started = time.monotonic()
            completion = build(session.next_index())
            if session.state.pool == "judge":
                # a judge's call is recorded for its cost and audit, never trained on
                completion.trainable = False
            base = (
                session.completions[completion.extends]
                if completion.extends is not None
                else (session.completions[-1] if session.completions else None)
            )
            writing = time.monotonic()
            if routes is not None:
                routes_base = (
                    session.completions[completion.extends]
                    if completion.extends is not None
                    else None
                )
                completion.routed_experts = await asyncio.to_thread(
                    store_completion_routes, session.log.store, completion, routes, routes_base
                )
            if session.log.store.fast_writes:
                session.log.append(completion, base)  # a small write into the page cache
            else:
                await asyncio.to_thread(session.log.append, completion, base)
            appended = time.monotonic()
            session.completions.append(completion)
            session.extensions.add(completion)
            session.by_hash.setdefault(completion.request_hash, []).append(completion.index)
            session.sending(completion.index)
        metrics.observe_log_write(appended - writing)
        metrics.count_tokens(
            completion.backend, len(completion.prompt_ids), len(completion.response_ids)
        )
        metrics.count_prefix_cache(
            completion.backend,
            completion.num_prompt_tokens or 0,
            completion.num_cached_tokens,
            reusable_prefix(completion, base),
        )
        # per call: DEBUG (an INFO line per call costs more than the rest of the recording)
        log.debug(
            "completion_recorded",
            session_id=session.session_id,
            index=completion.index,
            num_prompt_tokens=len(completion.prompt_ids),
            num_response_tokens=len(completion.response_ids),
            finish_reason=completion.finish_reason,
            extends=completion.extends,
            append_s=round(appended - started, 4),
        )
        return completion
