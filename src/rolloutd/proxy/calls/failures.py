"""A model call that failed, recorded in its session's state once: the harness gets the
error, the session keeps it (:class:`rolloutd.proxy.sessions.call_errors.CallError`), the
completion log stays as it was. The failure is logged where it is recorded, and the error is
marked so the layers it passes on its way out neither count nor log it again.
"""

from __future__ import annotations

import time
from typing import Any

import structlog

from rolloutd.errors import RolloutdError
from rolloutd.proxy.core.call_types import InternalRequest
from rolloutd.proxy.core.request_identity import request_hash
from rolloutd.proxy.sessions.call_errors import CallError, conversation_hash
from rolloutd.proxy.sessions.session import Session

log = structlog.get_logger(__name__)

#: attribute set on an exception once its failed call is in the session's state
_RECORDED = "_rolloutd_call_recorded"


def call_recorded(error: BaseException) -> bool:
    """Whether ``error``'s failed call is recorded (and logged) in its session's state
    already: the gateway's layers count and log a failure once."""
    return getattr(error, _RECORDED, False)


async def record_failure(
    session: Session,
    error: Exception,
    started: float,
    *,
    stream: bool,
    request: InternalRequest | None = None,
) -> bool:
    """Record a failed call in the session's state (under its lock, briefly): the
    harness gets the error, the session keeps it, the log stays as it was; the failure
    is logged here, once, and ``error`` is marked (:func:`call_recorded`) so the layers
    it passes through on its way out neither count nor log it again. Never raises.
    Returns whether it was recorded (not in a sealed session).

    Args:
        request: the translated request, when the call got that far (its hashes
            let :func:`rolloutd.proxy.sessions.call_errors.recovered` find a later completion
            that made the failure good).
    """
    status = error.status_code if isinstance(error, RolloutdError) else 500
    message = (
        error.message
        if isinstance(error, RolloutdError)
        else f"internal error: {type(error).__name__}"
    )
    recorded = False
    try:
        hashes: dict[str, Any] = {}
        if request is not None:
            hashes = {
                "request_hash": request_hash(request.body, request.dialect),
                "num_messages": len(request.messages),
                "conversation_hash": conversation_hash(request.messages),
            }
        recorded = await session.record_error(
            CallError(
                at_index=session.next_index(),
                at=time.time(),
                error_type=type(error).__name__,
                message=message[:500],
                status_code=status,
                backend=session.state.backend,
                duration_s=time.monotonic() - started,
                stream=stream,
                **hashes,
            ),
            cause=None if isinstance(error, RolloutdError) else error,
        )
    except Exception:
        log.exception("call_error_not_recorded", session_id=session.session_id)
    setattr(error, _RECORDED, True)
    return recorded
