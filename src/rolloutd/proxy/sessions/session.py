"""A session in gateway memory: its state, its completions, its calls in flight and what
became of their answers.
"""

from __future__ import annotations

import asyncio
import enum
import time

import structlog

from rolloutd.errors import AuthenticationError, TooManyCallsError
from rolloutd.proxy.core.fastjson import BodyReader, ListJson
from rolloutd.proxy.core.request_identity import RequestMemo
from rolloutd.proxy.render.messages import ExtensionIndex
from rolloutd.proxy.sessions.call_errors import (
    MAX_RECORDED_ERRORS,
    CallError,
    RecoveryIndex,
    still_open,
)
from rolloutd.proxy.sessions.liveness import Liveness
from rolloutd.proxy.sessions.replay_source import ReplaySource
from rolloutd.proxy.sessions.state import BackendMove, SessionState, session_state_key
from rolloutd.store import CompletionLog
from rolloutd.types import Completion

log = structlog.get_logger(__name__)


class Delivery(str, enum.Enum):
    """Whether a completion's answer reached its harness (in gateway memory only).

    ``sending``: recorded, its answer on its way; ``delivered``: the answer was handed to
    the HTTP server whole (the last byte of a stream, or the one-piece body, sent without
    error); ``undelivered``: the call ended before that (the client went away, the stream
    broke). A completion loaded from the store after a restart has no entry: unknown, read
    as undelivered (the restart may have cut its answer).
    """

    SENDING = "sending"
    DELIVERED = "delivered"
    UNDELIVERED = "undelivered"


class Session:
    """A session in gateway memory: its state, its completions and its critical sections.

    Concurrency (docs/sessions.md, "Concurrent calls"): calls of one session run
    concurrently (sub-agents); each finds the completion its prompt continues (its
    conversation's chain tail) and samples without any lock. ``lock`` guards only short
    critical sections: assigning the next index and appending to the log
    (:meth:`rolloutd.proxy.sessions.recorder.Recorder.record`), writing the persisted state
    (:meth:`record_error`, :meth:`move_backend`) and sealing. It is never held across a
    backend call.

    Attributes:
        state: the persisted state.
        completions: the completion log so far, in index order (append order).
        by_hash: request_hash -> indices of the completions that answered it, in order.
        delivery: completion index -> :class:`Delivery` of its answer (absent: unknown).
        memo: what the last calls computed for their messages (translation, hash state), reused
            by the next call that resends them (:mod:`rolloutd.proxy.core.request_identity`).
        body_reader: reads the session's request bodies without parsing again the
            conversation its last body sent (:class:`rolloutd.proxy.core.fastjson.BodyReader`).
        extensions: the completions a call can continue, by conversation length and answer
            (:class:`rolloutd.proxy.render.chat_template.ExtensionIndex`).
        prompt_json: writes the JSON of the session's prompts, each continuing the last
            (:class:`rolloutd.proxy.core.fastjson.ListJson`).
        sampling_calls: request_hash -> the outcome (completion index, or None: failed) of
            the call sampling that request now (the first, when several do), which a marked
            retry arriving meanwhile waits for (:meth:`start_sampling`).
        num_in_flight: calls between :meth:`begin_call` and :meth:`end_call`.
        max_calls: the bound of ``num_in_flight`` (None: unbounded); a call over it is
            refused (:meth:`begin_call`).
        closing: :meth:`SessionManager.close_session` started: new calls are refused.
    """

    def __init__(
        self,
        state: SessionState,
        completions: list[Completion],
        log_: CompletionLog,
        *,
        max_calls: int | None = None,
    ) -> None:
        self.state = state
        self.completions = completions
        self.log = log_
        self.lock = asyncio.Lock()
        self.by_hash: dict[str, list[int]] = {}
        self.delivery: dict[int, Delivery] = {}
        self.body_reader = BodyReader()
        self.memo = RequestMemo(reader=self.body_reader)
        self.prompt_json = ListJson()
        self.extensions = ExtensionIndex(completions)
        #: what recovers a failed call (:class:`RecoveryIndex`, over ``completions``)
        self.recovery = RecoveryIndex(completions)
        self.sampling_calls: dict[str, asyncio.Future[int | None]] = {}
        self.num_in_flight = 0
        self.max_calls = max_calls
        self.closing = False
        #: monotonic time of the last call's start or end (or of the load)
        self.last_used = time.monotonic()
        self._idle = asyncio.Event()
        self._idle.set()
        #: (start, end) Unix times of calls cut off before they ended (:meth:`note_cut`);
        #: kept in memory only: the gateway serving the session closes it
        self.cut_calls: list[tuple[float, float]] = []
        #: whether its calls stand unanswered (:mod:`rolloutd.proxy.sessions.liveness`)
        self.liveness = Liveness()
        #: the earlier attempts' completions this session may replay (None: no source)
        self.replay = (
            ReplaySource(log_.store, state.replay_from, state.replay_max_staleness)
            if state.replay_from
            else None
        )
        for completion in completions:
            self.by_hash.setdefault(completion.request_hash, []).append(completion.index)

    @property
    def session_id(self) -> str:
        """The session's id."""
        return self.state.session_id

    def begin_call(self) -> None:
        """Count a call in flight (:meth:`SessionManager.close_session` waits for it);
        refuses a sealed or closing session, and a call over the session's bound.

        Raises:
            AuthenticationError: as :meth:`ensure_open`.
            TooManyCallsError: ``max_calls`` calls are in flight already (429: the task's
                refusal, never retried or replaced by rolloutd).
        """
        self.ensure_open()
        if self.max_calls is not None and self.num_in_flight >= self.max_calls:
            raise TooManyCallsError(
                f"session {self.session_id} has {self.num_in_flight} model calls in flight, "
                f"its bound (max_calls_per_session); wait for one to end"
            )
        self.num_in_flight += 1
        self.last_used = time.monotonic()
        self._idle.clear()

    def end_call(self) -> None:
        """The call counted by :meth:`begin_call` ended (answered, failed or cut)."""
        self.last_used = time.monotonic()
        self.num_in_flight -= 1
        if self.num_in_flight <= 0:
            self.num_in_flight = 0
            self._idle.set()

    async def wait_idle(self) -> None:
        """Return once no call is in flight."""
        while self.num_in_flight:
            await self._idle.wait()

    def find_retry(self, body_hash: str, *, marked: bool) -> Completion | None:
        """The recorded completion a request with identity ``body_hash`` is a retry of, if
        any (docs/sessions.md, "Request identity"): the latest completion of that identity
        whose answer was not delivered (or whose delivery is unknown), or, when the client
        marks the request as a retry (``marked``), the latest one of that identity whatever
        its delivery. A completion whose answer is still being sent is not undelivered: an
        identical request arriving meanwhile is another call (two sub-agents with the same
        first prompt), and samples.

        Args:
            body_hash: :func:`rolloutd.proxy.core.request_identity.request_hash` of the request.
            marked: the client says it retries (``x-stainless-retry-count`` > 0).
        """
        for index in reversed(self.by_hash.get(body_hash, ())):
            if marked or self.delivery.get(index, Delivery.UNDELIVERED) is Delivery.UNDELIVERED:
                return self.completions[index]
        return None

    def start_sampling(self, body_hash: str) -> asyncio.Future[int | None] | None:
        """Note that a call samples the request ``body_hash``: a client that gave up
        waiting for it (a timeout) and retries, marked, waits for its outcome instead of
        sampling the same request twice. Returns the future to resolve with
        :meth:`end_sampling`, or None when another call samples that request already."""
        if body_hash in self.sampling_calls:
            return None
        future: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self.sampling_calls[body_hash] = future
        return future

    def end_sampling(
        self, body_hash: str, future: asyncio.Future[int | None] | None, index: int | None
    ) -> None:
        """The call that :meth:`start_sampling` returned ``future`` to recorded completion
        ``index`` (None: it failed or was cut)."""
        if future is None:
            return
        if self.sampling_calls.get(body_hash) is future:
            del self.sampling_calls[body_hash]
        if not future.done():
            future.set_result(index)

    def sending(self, index: int) -> None:
        """Completion ``index``'s answer is on its way (recorded, or answered again)."""
        self.delivery[index] = Delivery.SENDING

    def settle(self, index: int, *, delivered: bool) -> None:
        """Completion ``index``'s answer reached the harness whole (``delivered``), or its
        call ended before that."""
        self.delivery[index] = Delivery.DELIVERED if delivered else Delivery.UNDELIVERED

    async def move_backend(self, moved_from: str, moved_to: str) -> None:
        """Pin the session to ``moved_to`` (its backend ``moved_from`` was removed) and
        persist the move; a concurrent call that moved it already wins (takes ``lock``)."""
        async with self.lock:
            if self.state.backend != moved_from:
                return
            move = BackendMove(
                moved_from=moved_from, moved_to=moved_to, at_index=self.next_index(), at=time.time()
            )
            state = self.state.model_copy(
                update={"backend": moved_to, "backend_moves": [*self.state.backend_moves, move]}
            )
            await asyncio.to_thread(
                self.log.store.put_json, session_state_key(self.session_id), state
            )
            self.state = state
        log.info(
            "session_moved",
            session_id=self.session_id,
            moved_from=moved_from,
            moved_to=moved_to,
            at_index=move.at_index,
        )

    async def record_error(self, error: CallError, cause: BaseException | None = None) -> bool:
        """Count a failed call and keep its details in the persisted state (takes
        ``lock``). The completion log is untouched: a failed call is not a completion.

        Args:
            error: the failed call.
            cause: an unexpected exception (not a ``RolloutdError``): its traceback goes into
                the one log event of the failure.

        Returns:
            Whether it was recorded (False: the session is sealed already).
        """
        async with self.lock:
            if self.state.closed:
                return False
            state = self.state.model_copy(
                update={
                    "num_errors": self.state.num_errors + 1,
                    "errors": [*self.state.errors, error][-MAX_RECORDED_ERRORS:],
                    # every unrecovered failure, not the last 20: one that scrolled out of
                    # ``errors`` still decides the session's failure cause
                    "open_errors": still_open(
                        self.state.errors
                        if self.state.open_errors is None
                        else self.state.open_errors,
                        error,
                        self.recovery,
                    ),
                }
            )
            await asyncio.to_thread(
                self.log.store.put_json, session_state_key(self.session_id), state
            )
            self.state = state
        log.warning(
            "call_failed",
            session_id=self.session_id,
            at_index=error.at_index,
            error_type=error.error_type,
            status_code=error.status_code,
            backend=error.backend,
            duration_s=round(error.duration_s, 4),
            message=error.message,
            exc_info=cause,
        )
        return True

    def note_cut(self, started_at: float) -> None:
        """Remember a call cut off before it ended (its harness went away, or the gateway
        was cancelled): neither a completion nor a failed call, but it was waiting on the
        backend from ``started_at`` (Unix time, s) until now (:func:`call_waiting_at`)."""
        self.cut_calls.append((started_at, time.time()))

    def next_index(self) -> int:
        """Index the next recorded completion gets (final only under ``lock``)."""
        return len(self.completions)

    def ensure_open(self) -> None:
        """Raise when the session is sealed or being sealed.

        Raises:
            AuthenticationError: the session is closed; its key no longer authorises calls
                (401 rather than 409, so harnesses stop instead of retrying).
        """
        if self.state.closed or self.closing:
            raise AuthenticationError(
                f"session {self.session_id} is closed: its key no longer accepts calls"
            )
