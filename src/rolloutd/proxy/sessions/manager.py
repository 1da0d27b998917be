"""Gateway sessions: open, look up, close.

Blob-store keys (besides :mod:`rolloutd.store`'s completion log)::

    sessions/{session_id}/session.json          SessionState (the key's sha256, never the key)
    gateway/session_keys/{sha256(key)}.json     {"session_id": ...}: key -> session id

The gateway only verifies keys, so it keeps their hashes: neither the store nor a
listing holds a usable key. The key itself travels once, in the open's answer (an activity
result, encrypted in the workflow history when the payload codec is on). An open retried by
Temporal gets a new key, which replaces the earlier one (that attempt's answer reached no
one). A gateway that restarts (or another gateway process) loads a session on first use of
its key. An open retried on another gateway (the first attempt timed out while its gateway
lived) leaves a copy on the first one that no call will use: :meth:`SessionManager.drop_superseded`
drops such copies and gives their backend's place back.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any, Literal

import structlog

from rolloutd.errors import (
    AuthenticationError,
    BackendSaturatedError,
    NotFoundError,
    SessionClosedError,
    SessionLostError,
)
from rolloutd.proxy.backends.pool import BackendPool
from rolloutd.proxy.backends.saturation import BackendCapacity
from rolloutd.proxy.sessions.session import Session
from rolloutd.proxy.sessions.state import (
    SessionInfo,
    SessionState,
    hash_session_key,
    prefix_cache_usage,
    session_key_index,
    session_state_key,
)
from rolloutd.store import BlobStore, CompletionLog
from rolloutd.types import CaptureMode, Completion, SamplingParams

log = structlog.get_logger(__name__)

#: seconds an open session is idle here before the store is asked whether another gateway
#: took it over (:meth:`SessionManager.drop_superseded`)
SUPERSEDED_IDLE_S = 60.0


class SessionManager:
    """Opens, finds and closes sessions; loads them from the store after a restart.

    Only open sessions stay in memory: a closed one is evicted once its closing activity is
    done with it (:meth:`evict`); its log and state are in the store, and a late request
    with its key loads its state to be refused (401 in the caller's dialect) without being
    kept. So the maps hold the open sessions only, however long the gateway runs.

    Args:
        store: the blob store.
        pool: the backend pool (a new session is pinned to its least-assigned backend).
        public_url: base URL harnesses use, without a trailing slash.
        default_model: model name shown to harnesses when a task sets none.
        max_calls_per_session: each session's bound of calls in flight (None: unbounded;
            :meth:`Session.begin_call`).
    """

    def __init__(
        self,
        store: BlobStore,
        pool: BackendPool,
        *,
        public_url: str,
        default_model: str,
        max_calls_per_session: int | None = None,
        default_capture_mode: CaptureMode | str = CaptureMode.TOKENS,
    ) -> None:
        self.max_calls_per_session = max_calls_per_session
        #: the capture mode of a session opened without one (the gateway's ``capture_mode``)
        self.default_capture_mode = CaptureMode(default_capture_mode)
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
        if session.state.closed:
            return session  # in the store; a closed session is never kept in memory
        self._by_key[session.state.session_key_sha256] = session
        self._by_id[session.session_id] = session
        return session

    def counts(self) -> dict[str, int]:
        """The session maps' sizes: ``in_memory`` (sessions held), ``open`` (of those, not
        sealed), ``keys`` (key hashes held). After :meth:`evict` of every closed session,
        all three equal the open sessions."""
        return {
            "in_memory": len(self._by_id),
            "open": sum(1 for s in self._by_id.values() if not s.state.closed),
            "keys": len(self._by_key),
        }

    def _session(self, state: SessionState, completions: list[Completion]) -> Session:
        return Session(
            state,
            completions,
            CompletionLog(self.store, state.session_id),
            max_calls=self.max_calls_per_session,
        )

    async def _load_by_id(self, session_id: str, *, completions: bool = True) -> Session | None:
        """The session from the store (None: no state there); ``completions``: read its
        completion log too (a closed session loaded only to refuse a late call needs none)."""
        key = session_state_key(session_id)
        if not await asyncio.to_thread(self.store.exists, key):
            return None
        state = await asyncio.to_thread(self.store.get_model, key, SessionState)
        if not completions and state.closed:
            return self._session(state, [])
        completion_log = CompletionLog(self.store, session_id)
        logged = await asyncio.to_thread(completion_log.read_all)
        if [c.index for c in logged] != list(range(len(logged))):
            log.warning("completion_log_gap", session_id=session_id, num_completions=len(logged))
        if not state.closed:
            self.pool.note_assigned(state.backend)
        log.info(
            "session_loaded",
            session_id=session_id,
            num_completions=len(logged),
            closed=state.closed,
        )
        return self._remember(self._session(state, logged))

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
            SessionLostError: a key the gateway issued whose session it no longer has.
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
                session = await self._load_by_id(session_id, completions=False)
                if session is None:
                    # the gateway issued this key and no longer has its session: its fault
                    raise SessionLostError(
                        f"session {session_id} is lost: the gateway has no state for it"
                    )
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
        capture_mode: CaptureMode | str | None = None,
        replay_from: list[str] | None = None,
        replay_max_staleness: int = 0,
        wait_for_backends: bool = False,
        pool: Literal["policy", "judge"] = "policy",
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
                ``passthrough`` (the backend renders; needs a chat backend); None: the
                gateway's default (``default_capture_mode``).
            replay_from: gateway session ids of the sample's earlier attempts, newest
                first: requests identical to theirs are answered from their logs
                (:mod:`rolloutd.proxy.sessions.replay_source`); None or empty: no replay.
            replay_max_staleness: policy versions a replayed completion may lag behind the
                backend's current one.
            pool: ``judge`` pins a judge session to the judge pool (its completions are
                recorded untrainable).
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
        mode = self.default_capture_mode if capture_mode is None else CaptureMode(capture_mode)
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
        backend = self.pool.assign(pool)
        if pool == "judge" and backend.type in ("openai", "vllm"):
            # a judge's model is not the policy's: its server renders with its own template
            mode = CaptureMode.PASSTHROUGH
        session_key = secrets.token_urlsafe(24)
        state = SessionState(
            session_id=session_id,
            task_id=task_id,
            session_key_sha256=hash_session_key(session_key),
            sampling=sampling or SamplingParams(),
            model=model or self.default_model,
            capture_mode=mode,
            backend=backend.name,
            pool=pool,
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
        self._remember(self._session(state, []))
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
            session.last_used = time.monotonic()
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
                        "prefix_cache": prefix_cache_usage(session.completions),
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

    async def drop_superseded(self, idle_s: float = SUPERSEDED_IDLE_S) -> list[str]:
        """Drop the open sessions another gateway has taken over or sealed.

        An open session idle here for ``idle_s`` (no call in flight, none begun or ended) is
        compared with its state in the store: sealed there, or holding another key's hash (a
        retried open another gateway answered), it is dropped from memory and its backend's
        assignment given back, so the pool's counts and the maps follow the sessions this
        gateway serves. A session this gateway serves keeps its key and stays.

        Returns:
            The ids of the sessions dropped.
        """
        now = time.monotonic()
        dropped: list[str] = []
        for session in list(self._by_id.values()):
            if session.state.closed or session.closing or session.num_in_flight:
                continue
            if now - session.last_used < idle_s:
                continue
            mine = session.state.session_key_sha256
            try:
                stored = await asyncio.to_thread(
                    self.store.get_model, session_state_key(session.session_id), SessionState
                )
            except NotFoundError:
                continue  # its state is gone: a call will say so (SessionLostError)
            if not stored.closed and stored.session_key_sha256 == mine:
                session.last_used = now  # served here: asked again after another idle_s
                continue
            if (
                self._by_id.get(session.session_id) is not session
                or session.state.session_key_sha256 != mine  # re-keyed here meanwhile
                or session.state.closed
                or session.closing
                or session.num_in_flight
            ):
                continue
            self.forget(session.session_id)
            self.pool.release(session.state.backend)
            dropped.append(session.session_id)
            log.info(
                "session_superseded",
                session_id=session.session_id,
                backend=session.state.backend,
                closed_elsewhere=stored.closed,
            )
        return dropped

    async def drop_superseded_forever(self, every_s: float = SUPERSEDED_IDLE_S) -> None:
        """:meth:`drop_superseded` every ``every_s`` until cancelled (the gateway fleet runs
        it beside its workers); a failed round is logged and the next one runs."""
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.drop_superseded(every_s)
            except Exception as e:  # noqa: BLE001 - a background loop: the next round runs
                log.warning("drop_superseded_failed", error=repr(e))

    def evict(self, session_id: str) -> bool:
        """Drop a closed session from memory: its log and state are in the store (a late
        request with its key is refused from there; :meth:`get` loads it again for a
        retried close). An open one stays. Returns whether it was dropped."""
        session = self._by_id.get(session_id)
        if session is None or not session.state.closed:
            return False
        self.forget(session_id)
        log.debug("session_evicted", session_id=session_id)
        return True
