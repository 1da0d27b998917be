"""A model call that failed, as a session records it, and the rule that says when the
harness made it good.

A failed call is never a completion: the session's state keeps it as a :class:`CallError`
(the most recent :data:`MAX_RECORDED_ERRORS`, plus every one not made good yet). A later
completion recovers it when it answers the same request or the same conversation (equal
messages, not a longer list: :class:`RecoveryIndex`); a failure of the backend or the gateway
is the infrastructure's (:func:`is_backend_error`, after :mod:`rolloutd.fault`;
docs/failures.md).
"""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import Field

from rolloutd.fault import Fault, call_fault
from rolloutd.payload import Payload
from rolloutd.proxy.core.fastjson import canonical_json
from rolloutd.types import Completion

#: failed calls whose details a session keeps (the most recent); ``num_errors`` counts all.
MAX_RECORDED_ERRORS = 20


class CallError(Payload):
    """A call that failed: answered with an error, recorded in the session's state, never a
    completion (the completion log holds answered calls only; the failures are counted apart).
    """

    at_index: int = Field(
        ge=0,
        description="completions recorded before it (it failed between ``at_index - 1`` and "
        "``at_index``)",
    )
    at: float = Field(description="Unix time (s) it failed")
    error_type: str = Field(
        description="the error's class (``BackendError``, ``BackendUnavailableError``, "
        "``ContextLengthError``, ...)"
    )
    message: str = Field(description="what the harness was told (at most 500 characters)")
    status_code: int = Field(
        description="the HTTP status the harness got (before a stream started), or the one it "
        "would have got (in the stream's error event)"
    )
    backend: str = Field(description="the session's backend")
    duration_s: float = Field(ge=0, description="from the call's start to the failure, seconds")
    stream: bool = Field(default=False, description="the harness asked for a stream")
    request_hash: str = Field(
        default="",
        description="sha256 of the failed request's canonical body (the completion log's "
        "``request_hash``); empty when the call failed before its body was understood",
    )
    num_messages: int = Field(
        default=0, ge=0, description="messages of the failed request's conversation (0: unknown)"
    )
    conversation_hash: str = Field(
        default="", description=":func:`conversation_hash` of those messages (empty: unknown)"
    )

    def describe(self) -> str:
        """One line for people: ``"502 BackendError: backend x: ..."``."""
        return f"{self.status_code} {self.error_type}: {self.message}"


def conversation_hash(messages: list[dict[str, Any]]) -> str:
    """sha256 (hex) of the canonical JSON of a conversation (OpenAI chat-shape messages)."""
    return hashlib.sha256(canonical_json(messages).encode()).hexdigest()


class RecoveryIndex:
    """What recovers a failed call in one session (:meth:`recovered`), kept up as the
    session's completions are recorded, so that each question costs O(1) amortized and the
    whole session's work stays linear in its completions.

    A completion's request hash is indexed as it is seen; its conversation hash is computed
    at most once, and only for a completion whose conversation has the length of some failed
    call asked about (most completions of a session are never hashed twice, or at all).

    Args:
        completions: the session's completion log, in index order; the index reads the
            completions appended to this list since it last looked (the list is shared with
            the session, never copied).
    """

    def __init__(self, completions: list[Completion]) -> None:
        self._completions = completions
        self._seen = 0
        #: request_hash -> index of its latest completion
        self._last_by_request: dict[str, int] = {}
        #: conversation length -> indices of completions of that length not hashed yet
        self._unhashed: dict[int, list[int]] = {}
        #: conversation lengths some failed call asked about (completions of these lengths
        #: are hashed as they are seen)
        self._wanted: set[int] = set()
        #: conversation_hash -> index of its latest completion (wanted lengths only)
        self._last_by_conversation: dict[str, int] = {}

    def _catch_up(self) -> None:
        completions = self._completions
        for index in range(self._seen, len(completions)):
            completion = completions[index]
            self._last_by_request[completion.request_hash] = index
            length = len(completion.messages)
            if length in self._wanted:
                self._hash(index)
            else:
                self._unhashed.setdefault(length, []).append(index)
        self._seen = len(completions)

    def _hash(self, index: int) -> None:
        digest = conversation_hash(self._completions[index].messages)
        if self._last_by_conversation.get(digest, -1) < index:
            self._last_by_conversation[digest] = index

    def recovered(self, error: CallError) -> bool:
        """Whether the harness made good a failed call: a completion recorded after it
        answers the same request (equal ``request_hash``: the harness retried it) or the same
        conversation (its messages equal the failed request's, not a longer list that goes on
        past the failure without its answer). A failure before the request was understood
        (no hash) counts as recovered by any later completion.

        Args:
            error: the failed call.
        """
        self._catch_up()
        if not error.request_hash and not error.conversation_hash:
            return len(self._completions) > error.at_index
        if (
            error.request_hash
            and self._last_by_request.get(error.request_hash, -1) >= error.at_index
        ):
            return True
        if not error.conversation_hash:
            return False
        length = error.num_messages
        if length not in self._wanted:
            self._wanted.add(length)
            for index in self._unhashed.pop(length, ()):
                self._hash(index)
        return self._last_by_conversation.get(error.conversation_hash, -1) >= error.at_index


def recovered(error: CallError, completions: list[Completion]) -> bool:
    """Whether a completion of ``completions`` (a session's log, in index order) made good
    the failed call ``error`` (:meth:`RecoveryIndex.recovered`; one question: a session asks
    its own :class:`RecoveryIndex`)."""
    return RecoveryIndex(completions).recovered(error)


def is_backend_error(error: CallError) -> bool:
    """Whether a failed call is the infrastructure's (:func:`rolloutd.fault.call_fault`: a
    backend error type or a 5xx answer; docs/failures.md, kind ``backend``).
    ``ContextLengthError`` (the conversation grew too long: the policy's) and
    ``InvalidRequestError`` (the harness's) are 4xx: the task's."""
    return call_fault(error.error_type, error.status_code) is Fault.INFRASTRUCTURE


def still_open(
    errors: list[CallError], error: CallError, recovery: RecoveryIndex
) -> list[CallError]:
    """``errors`` (the failed calls not made good so far) with ``error`` added: those a
    completion recovered since are dropped, and an earlier failure of the same request
    (equal ``request_hash``) gives way to ``error`` (whatever recovers the later one
    recovers the earlier), so the list grows with distinct failed requests only.

    Args:
        errors: the open failed calls, oldest first.
        error: the call that just failed.
        recovery: the session's :class:`RecoveryIndex` (each question O(1) amortized).
    """
    kept = [
        e
        for e in errors
        if not recovery.recovered(e)
        and not (error.request_hash and e.request_hash == error.request_hash)
    ]
    return [*kept, error]


def call_waiting_at(
    moment: float,
    completions: list[Completion],
    errors: list[CallError],
    cut_calls: list[tuple[float, float]] | None = None,
) -> bool:
    """Whether a model call of the session was waiting on the backend at Unix time
    ``moment``: a completion, a failed call or a call cut off that started before it and
    ended after it.

    Args:
        moment: Unix time, seconds (the run phase's deadline, when the harness was stopped).
        completions: the session's completions (``timings.started_at``, ``duration_s``).
        errors: its failed calls (``at`` is their end, ``duration_s`` their length).
        cut_calls: (start, end) Unix times of calls cut off (:meth:`Session.note_cut`).
    """
    if any(start <= moment <= end for start, end in cut_calls or []):
        return True
    for completion in reversed(completions):
        start = completion.timings.started_at
        if start and start <= moment <= start + completion.timings.duration_s:
            return True
        if start and start + completion.timings.duration_s < moment:
            # completions are recorded as they end: an earlier one ended before this one
            break
    return any(e.at - e.duration_s <= moment <= e.at for e in errors)
