"""Replay across attempts, the answering half: a call answered from the session's replay
source (:mod:`rolloutd.proxy.sessions.replay_source`, which sits below the session) is
recorded through the recorder as a copy of the earlier attempt's completion."""

from __future__ import annotations

import asyncio

import structlog

from rolloutd.errors import RolloutdError
from rolloutd.proxy.backends.pool import BackendPool
from rolloutd.proxy.core.call_types import InternalRequest
from rolloutd.proxy.sessions.recorder import Recorder, answer_id
from rolloutd.proxy.sessions.replay_source import replayed_copy
from rolloutd.proxy.sessions.session import Session
from rolloutd.types import Completion

log = structlog.get_logger(__name__)


async def answer_from_source(
    session: Session,
    recorder: Recorder,
    pool: BackendPool,
    request: InternalRequest,
    body_hash: str,
) -> Completion | None:
    """The earlier attempt's completion of this request's identity, not replayed yet and not
    staler than the session allows, copied into the session's log (next index, ``extends``
    remapped, ``replayed_from``, the source's answer ids) before the answer is sent; None when
    there is none (the call samples as usual).

    Args:
        session: a session with a replay source (``session.replay``).
        recorder: appends the copy to the session's log.
        pool: the backends (the current policy version of the session's backend).
        request: the translated request (its raw body goes into the copy).
        body_hash: the request's identity
            (:func:`rolloutd.proxy.core.request_identity.request_hash`).

    Raises:
        rolloutd.store.BlobExistsError: as :meth:`Recorder.record`; the source completion is
            offered again.
    """
    replay = session.replay
    if replay is None:
        return None
    await replay.ensure_loaded(session.completions)
    try:
        version = pool.get(session.state.backend).policy_version
    except RolloutdError:  # the backend was removed: the session moves on its next lease
        version = max((c.policy_version for c in session.completions), default=0)
    source = replay.take(body_hash, version)
    if source is None:
        return None

    def build(index: int) -> Completion:
        copy = replayed_copy(
            source,
            session_id=session.session_id,
            index=index,
            extends=replay.remap(source),
            request=request.body,
            body_hash=body_hash,
            response_id=answer_id(source),
        )
        replay.placed(source, index)
        return copy

    routes = (
        await asyncio.to_thread(replay.source_routes, source)
        if source.routed_experts is not None
        else None
    )
    try:
        completion = await recorder.record(session, build, routes)
    except BaseException:
        replay.release(source)
        raise
    log.info(
        "call_replayed",
        session_id=session.session_id,
        index=completion.index,
        replayed_from=completion.replayed_from,
        num_response_tokens=len(completion.response_ids),
    )
    return completion
