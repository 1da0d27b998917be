"""Gateway sessions: keys, durable state, completion history, open and close.

Blob-store keys (besides :mod:`rolloutd.store`'s completion log)::

    sessions/{session_id}/session.json          SessionState (the key's sha256, never the key)
    gateway/session_keys/{sha256(key)}.json     {"session_id": ...}: key -> session id

The gateway only verifies keys, so it keeps their hashes (issue 20): neither the store nor a
listing holds a usable key. The key itself travels once, in the open's answer (an activity
result, encrypted in the workflow history when the payload codec is on). An open retried by
Temporal gets a new key, which replaces the earlier one (that attempt's answer reached no
one). A gateway that restarts (or another gateway process) loads a session on first use of
its key.
"""

from __future__ import annotations

import asyncio
import enum
import hashlib
import secrets
import time
from typing import Any

import structlog
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rolloutd.errors import (
    AuthenticationError,
    BackendSaturatedError,
    NotFoundError,
    SessionClosedError,
)
from rolloutd.proxy.backends.pool import BackendPool
from rolloutd.proxy.backends.saturation import BackendCapacity
from rolloutd.proxy.core.fastjson import BodyReader, ListJson
from rolloutd.proxy.render.messages import ExtensionIndex
from rolloutd.proxy.sessions.call_errors import (
    BACKEND_ERROR_TYPES,
    MAX_RECORDED_ERRORS,
    CallError,
    call_waiting_at,
    conversation_hash,
    is_backend_error,
    recovered,
    still_open,
)
from rolloutd.proxy.sessions.liveness import Liveness
from rolloutd.proxy.sessions.replay_source import ReplaySource
from rolloutd.proxy.sessions.request_identity import RequestMemo
from rolloutd.store import BlobStore, CompletionLog, session_prefix
from rolloutd.types import CaptureMode, Completion, SamplingParams

log = structlog.get_logger(__name__)

#: the failed-call helpers live in :mod:`rolloutd.proxy.sessions.call_errors`; callers still import
#: these from here
__all__ = ["BACKEND_ERROR_TYPES", "call_waiting_at", "conversation_hash", "is_backend_error"]


def session_state_key(session_id: str) -> str:
    """Blob-store key of a session's gateway state."""
    return f"{session_prefix(session_id)}/session.json"


def hash_session_key(session_key: str) -> str:
    """The sha256 of a session key, hex: what the gateway stores and compares."""
    return hashlib.sha256(session_key.encode()).hexdigest()


def session_key_index(session_key: str) -> str:
    """Blob-store key mapping a session key (by its sha256) to its session id."""
    return f"gateway/session_keys/{hash_session_key(session_key)}.json"


class BackendMove(BaseModel):
    """A session moved off a removed backend (its token chain stays valid: prompts are ids).

    Attributes:
        moved_from: the removed backend.
        moved_to: the live backend that took the session.
        at_index: index of the first completion sampled on ``moved_to``.
        at: Unix time (s) of the move.
    """

    moved_from: str
    moved_to: str
    at_index: int
    at: float


def unrecovered_errors(state: SessionState, completions: list[Completion]) -> list[CallError]:
    """Every failed call that no later completion made good (:func:`recovered`), oldest
    first: ``state.open_errors`` (all of them, one per distinct request), or for a state
    written before that list existed, the last :data:`MAX_RECORDED_ERRORS` failed calls."""
    candidates = state.errors if state.open_errors is None else state.open_errors
    return [error for error in candidates if not recovered(error, completions)]


class SessionState(BaseModel):
    """What the gateway persists about a session.

    Attributes:
        session_id: ``{task_id}/{sample_index}``.
        session_key_sha256: the sha256 (hex) of the secret (``secrets.token_urlsafe(24)``);
            a state written with the key in clear is read as its hash.
        sampling: the task's sampling parameters.
        model: the model name shown to the harness.
        backend: name of the pinned backend.
        closed: sealed: no further call is accepted.
        num_completions: completions in the log when it was sealed.
        backend_moves: the moves off removed backends, in order.
        num_errors: calls that failed (answered with an error, nothing recorded in the log).
        errors: the most recent :data:`MAX_RECORDED_ERRORS` of them.
        open_errors: every failed call no completion has made good yet (:func:`still_open`),
            however many; None in a state written before it was kept.
        replay_from: gateway session ids of the sample's earlier attempts, newest first,
            whose logs answer requests identical to theirs
            (:mod:`rolloutd.proxy.sessions.replay_source`).
        replay_max_staleness: policy versions a replayed completion may lag behind.
    """

    model_config = ConfigDict(extra="allow")

    session_id: str
    task_id: str
    session_key_sha256: str
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    model: str
    capture_mode: CaptureMode = CaptureMode.TOKENS
    backend: str
    created_at: float = 0.0
    closed: bool = False
    closed_at: float | None = None
    num_completions: int = 0
    backend_moves: list[BackendMove] = Field(default_factory=list)
    num_errors: int = Field(default=0, ge=0)
    errors: list[CallError] = Field(default_factory=list)
    open_errors: list[CallError] | None = None
    replay_from: list[str] = Field(default_factory=list)
    replay_max_staleness: int = Field(default=0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _hash_a_clear_key(cls, data: Any) -> Any:
        # a state written before keys were hashed: keep only the hash, in memory and on the
        # next write
        if isinstance(data, dict) and "session_key" in data:
            data = dict(data)
            key = data.pop("session_key")
            data.setdefault("session_key_sha256", hash_session_key(key))
        return data


class SessionInfo(BaseModel):
    """What opening a session returns: everything a harness adapter needs.

    Attributes:
        openai_base_url: ``{public_url}/s/{key}/v1`` (OpenAI chat/responses clients).
        anthropic_base_url: ``{public_url}/s/{key}`` (Anthropic clients append ``/v1``).
        gemini_base_url: ``{public_url}/s/{key}`` (Gemini clients append ``/v1beta``).
    """

    model_config = ConfigDict(extra="allow")

    session_id: str
    session_key: str
    openai_base_url: str
    anthropic_base_url: str
    gemini_base_url: str
    model: str
    backend: str


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
            by the next call that resends them (:mod:`rolloutd.proxy.sessions.request_identity`).
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
        closing: :meth:`SessionManager.close_session` started: new calls are refused.
    """

    def __init__(
        self, state: SessionState, completions: list[Completion], log_: CompletionLog
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
        self.sampling_calls: dict[str, asyncio.Future[int | None]] = {}
        self.num_in_flight = 0
        self.closing = False
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
        refuses a sealed or closing session.

        Raises:
            AuthenticationError: as :meth:`ensure_open`.
        """
        self.ensure_open()
        self.num_in_flight += 1
        self._idle.clear()

    def end_call(self) -> None:
        """The call counted by :meth:`begin_call` ended (answered, failed or cut)."""
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
            body_hash: :func:`rolloutd.proxy.sessions.request_identity.request_hash` of the request.
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
                        self.completions,
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


class SessionManager:
    """Opens, finds and closes sessions; loads them from the store after a restart.

    Args:
        store: the blob store.
        pool: the backend pool (a new session is pinned to its least-assigned backend).
        public_url: base URL harnesses use, without a trailing slash.
        default_model: model name shown to harnesses when a task sets none.
    """

    def __init__(
        self, store: BlobStore, pool: BackendPool, *, public_url: str, default_model: str
    ) -> None:
        self.store = store
        self.pool = pool
        self.public_url = public_url.rstrip("/")
        self.default_model = default_model
        #: open sessions per backend slot (backpressure); None: never saturated
        self.capacity: BackendCapacity | None = None
        self._by_key: dict[str, Session] = {}
        self._by_id: dict[str, Session] = {}
        self._load_lock = asyncio.Lock()

    def info(self, state: SessionState, session_key: str) -> SessionInfo:
        """The :class:`SessionInfo` of ``state`` and its key, with this gateway's public URL."""
        base = f"{self.public_url}/s/{session_key}"
        return SessionInfo(
            session_id=state.session_id,
            session_key=session_key,
            openai_base_url=f"{base}/v1",
            anthropic_base_url=base,
            gemini_base_url=base,
            model=state.model,
            backend=state.backend,
        )

    def _remember(self, session: Session) -> Session:
        self._by_key[session.state.session_key_sha256] = session
        self._by_id[session.session_id] = session
        return session

    async def _load_by_id(self, session_id: str) -> Session | None:
        key = session_state_key(session_id)
        if not await asyncio.to_thread(self.store.exists, key):
            return None
        state = await asyncio.to_thread(self.store.get_model, key, SessionState)
        completion_log = CompletionLog(self.store, session_id)
        completions = await asyncio.to_thread(completion_log.read_all)
        if [c.index for c in completions] != list(range(len(completions))):
            log.warning(
                "completion_log_gap", session_id=session_id, num_completions=len(completions)
            )
        if not state.closed:
            self.pool.note_assigned(state.backend)
        log.info(
            "session_loaded",
            session_id=session_id,
            num_completions=len(completions),
            closed=state.closed,
        )
        return self._remember(Session(state, completions, completion_log))

    async def get(self, session_id: str) -> Session:
        """The session ``session_id``, loaded from the store when not in memory.

        Raises:
            NotFoundError: no such session.
        """
        if session := self._by_id.get(session_id):
            return session
        async with self._load_lock:
            if session := self._by_id.get(session_id):
                return session
            if session := await self._load_by_id(session_id):
                return session
        raise NotFoundError(f"session {session_id!r} not found")

    async def lookup(self, session_key: str | None) -> Session:
        """The session a key authorises (open or closed; callers check ``ensure_open``).

        Args:
            session_key: the key from the URL path or the ``Authorization`` header.

        Raises:
            AuthenticationError: no key, or a key of no session.
        """
        if not session_key:
            raise AuthenticationError(
                "no session key: use the session's base URL or send "
                "`Authorization: Bearer <session key>`"
            )
        key_hash = hash_session_key(session_key)
        if session := self._by_key.get(key_hash):
            return session
        index_key = session_key_index(session_key)
        async with self._load_lock:
            if session := self._by_key.get(key_hash):
                return session
            try:
                entry: dict[str, Any] = await asyncio.to_thread(self.store.get_json, index_key)
            except NotFoundError:
                entry = {}
            session_id = entry.get("session_id")
            session = self._by_id.get(session_id) if session_id else None
            if session is None and session_id:
                session = await self._load_by_id(session_id)
        if session is None or not secrets.compare_digest(
            session.state.session_key_sha256, key_hash
        ):
            raise AuthenticationError("invalid session key")
        return session

    async def open_session(
        self,
        session_id: str,
        task_id: str,
        *,
        sampling: SamplingParams | None = None,
        model: str | None = None,
        capture_mode: CaptureMode | str = CaptureMode.TOKENS,
        replay_from: list[str] | None = None,
        replay_max_staleness: int = 0,
        wait_for_backends: bool = False,
    ) -> SessionInfo:
        """Open a session: new key, pinned backend, state persisted before returning.

        Opening an open session again (a Temporal retry) returns its info with a new key,
        which replaces the earlier one: the gateway keeps only hashes, and the earlier
        attempt's answer reached no one.

        Args:
            session_id: ``{task_id}/{sample_index}``, e.g. ``"mytask/0"``.
            task_id: the task.
            sampling: the task's sampling parameters (default :class:`SamplingParams`).
            model: model name shown to the harness; default the gateway's model.
            capture_mode: ``tokens`` (the gateway renders and sends token ids) or
                ``passthrough`` (the backend renders; needs a chat backend).
            replay_from: gateway session ids of the sample's earlier attempts, newest
                first: requests identical to theirs are answered from their logs
                (:mod:`rolloutd.proxy.sessions.replay_source`); None or empty: no replay.
            replay_max_staleness: policy versions a replayed completion may lag behind the
                backend's current one.
            wait_for_backends: refuse a new session while the pool is saturated
                (:mod:`rolloutd.proxy.backends.saturation`).

        Returns:
            The session's key and base URLs.

        Raises:
            BackendSaturatedError: ``wait_for_backends`` and the pool holds its bound of open
                sessions; nothing was opened.
            SessionClosedError: the session exists and is closed already.
            BackendUnavailableError: no backend is registered.
            ValueError: an unknown ``capture_mode``.
        """
        mode = CaptureMode(capture_mode)
        capacity = self.capacity if wait_for_backends else None
        if capacity is not None and capacity.max_sessions_per_slot is None:
            capacity = None  # unbounded: no slot lookup on the open path
        if capacity is not None:
            await capacity.refresh()
        try:
            existing = await self.get(session_id)
        except NotFoundError:
            existing = None
        if existing is not None:
            if existing.state.closed:
                raise SessionClosedError(f"session {session_id} is closed")
            return await self._rekey(existing)
        # no await from this check to the pinning: concurrent opens see each other's counts
        if capacity is not None and (load := capacity.check()).saturated:
            raise BackendSaturatedError(
                f"backends saturated: {load.num_sessions_open} sessions open, bound "
                f"{load.max_sessions} ({load.num_slots} slots, {load.num_in_flight} calls "
                "in flight)"
            )
        backend = self.pool.assign()
        session_key = secrets.token_urlsafe(24)
        state = SessionState(
            session_id=session_id,
            task_id=task_id,
            session_key_sha256=hash_session_key(session_key),
            sampling=sampling or SamplingParams(),
            model=model or self.default_model,
            capture_mode=mode,
            backend=backend.name,
            created_at=time.time(),
            replay_from=list(replay_from or []),
            replay_max_staleness=replay_max_staleness,
        )
        try:
            await asyncio.to_thread(self.store.put_json, session_state_key(session_id), state)
            await asyncio.to_thread(
                self.store.put_json, session_key_index(session_key), {"session_id": session_id}
            )
        except BaseException:
            self.pool.release(backend.name)
            raise
        self._remember(Session(state, [], CompletionLog(self.store, session_id)))
        log.info(
            "session_opened",
            session_id=session_id,
            task_id=task_id,
            backend=backend.name,
            model=state.model,
        )
        return self.info(state, session_key)

    async def _rekey(self, session: Session) -> SessionInfo:
        """A new key for an open session (a retried open); the earlier key stops working."""
        session_key = secrets.token_urlsafe(24)
        async with session.lock:
            state = session.state.model_copy(
                update={"session_key_sha256": hash_session_key(session_key)}
            )
            await asyncio.to_thread(
                self.store.put_json,
                session_key_index(session_key),
                {"session_id": session.session_id},
            )
            await asyncio.to_thread(
                self.store.put_json, session_state_key(session.session_id), state
            )
            self._by_key.pop(session.state.session_key_sha256, None)
            session.state = state
            self._by_key[state.session_key_sha256] = session
        log.info("session_reopened", session_id=session.session_id)
        return self.info(state, session_key)

    async def close_session(self, session_id: str) -> int:
        """Seal a session: refuses new calls, waits for the calls in flight, then seals.

        Idempotent. Failed calls are in the sealed state (``num_errors``, ``errors``:
        :meth:`get`), not in the log.

        Returns:
            The number of completions in its log.

        Raises:
            NotFoundError: no such session.
        """
        session = await self.get(session_id)
        # calls already running are answered and recorded; none starts from here on
        session.closing = True
        await session.wait_idle()
        async with session.lock:
            if not session.state.closed:
                # sealed means durable: the group commit's window ends here
                await asyncio.to_thread(self.store.flush)
                state = session.state.model_copy(
                    update={
                        "closed": True,
                        "closed_at": time.time(),
                        "num_completions": len(session.completions),
                    }
                )
                await asyncio.to_thread(self.store.put_json, session_state_key(session_id), state)
                session.state = state
                self.pool.release(state.backend)
                log.info(
                    "session_closed",
                    session_id=session_id,
                    num_completions=len(session.completions),
                    num_errors=state.num_errors,
                )
            return len(session.completions)

    def forget(self, session_id: str) -> None:
        """Drop a session from memory (it stays in the store and loads again on use)."""
        session = self._by_id.pop(session_id, None)
        if session is not None:
            self._by_key.pop(session.state.session_key_sha256, None)
