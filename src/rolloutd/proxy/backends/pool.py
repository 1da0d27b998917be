"""The backend pool: which backends serve, which session is pinned to which, and weight sync.

A session stays on one backend for prefix-cache reuse; a new session goes to the
least-assigned backend. Which backend serves each call is the routing mode's
(:mod:`.routing`: ``sticky``, ``round_robin``, ``cache_aware``; :meth:`BackendPool.route`).
The pool is durable: every admin change (add, remove, clear, pause, resume, policy version)
is written to the blob store before it takes effect, so a gateway that restarts, or a second
gateway over the same store, serves the same pool::

    gateway/backend_pool.json    PoolState: [{name, type, url, policy_version, paused}], managed

Until an admin route changes the pool (``managed`` false), a starting gateway registers the
backends of its settings (``backend_url``) instead, so a restarted engine on a new URL is
picked up; once managed, the stored pool wins.

Several gateway replicas over one store: the replica that serves an admin call applies it
before answering; every other replica reloads the stored pool when it changed, checked at most
every ``refresh_s`` (``ROLLOUTD_POOL_REFRESH_S``, default 1 s) before a call takes its lease
and while a call waits on a paused backend. So a removal or a pause reaches every replica
within ``refresh_s``; a trainer that needs "no new call anywhere" at once pauses, waits
``refresh_s``, then drains (or sends the admin call to every replica).

Every sampling call holds a :class:`Lease` on its backend while it runs. A paused backend
grants no lease: new calls wait (bounded) while the ones in flight finish, which is the drain of
a weight sync (ProRL Agent, arXiv 2603.18815: pause, update, resume). A call pinned to a
removed backend moves to the least-assigned live one; in ``tokens`` mode its token chain stays
valid because prompts are token ids.

A backend that refuses connections or times out is unhealthy (:mod:`.health`) until a probe
reaches it again. An unhealthy backend grants no lease: a session pinned to it moves to a
healthy backend serving the same policy version when the pool has one (its token chain stays
valid, as above); else the call fails at once with ``BackendUnavailableError``, instead of
waiting out its timeout. A paused backend is never unhealthy: a weight update may stop its
engine on purpose. :meth:`BackendPool.health` says, per policy version, since when no
healthy backend serves it (the gateway's ``/health``; the trainer's fleet check reads it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import httpx
import structlog

from rolloutd.errors import BackendUnavailableError, ConfigError, ConflictError, NotFoundError
from rolloutd.http_client import HEALTH_PROBE, new_async_client
from rolloutd.proxy.backends import pool_health
from rolloutd.proxy.backends.base import Backend
from rolloutd.proxy.backends.health import BackendHealth, dead_message
from rolloutd.proxy.backends.quota import TokenQuota
from rolloutd.proxy.backends.routing import Router
from rolloutd.proxy.backends.slots import Lease, Slot
from rolloutd.proxy.backends.specs import (
    POOL_KEY,
    BackendSpec,
    BackendType,
    PoolName,
    PoolState,
    backend_urls,
    load_pool_state,
    make_backend,
    type_of,
)
from rolloutd.settings import GatewaySettings
from rolloutd.store import BlobStore
from rolloutd.types import LogprobMode

log = structlog.get_logger(__name__)


BackendFactory = Callable[[BackendSpec], Backend]


class BackendPool:
    """The backends of this gateway, their sessions, leases, pause state and persistence.

    Args:
        backends: backends registered at start (names must be unique).
        store: the blob store that keeps the pool; None keeps it in memory only.
        factory: builds the client of a backend added at run time (default
            :func:`make_backend` with its defaults).
        managed: whether the pool came from the store's admin-managed state.
        wait_s: how long a call waits for a paused backend, or for any backend at all, before
            it fails with 503.
        judges: names of ``backends`` that form the judge pool (judge sessions only; never
            addressed by a policy update that names no backend).
        router: which backend serves each call (default: ``sticky``).

    Raises:
        ConfigError: two backends share a name.
    """

    def __init__(
        self,
        backends: Iterable[Backend] = (),
        *,
        store: BlobStore | None = None,
        factory: BackendFactory | None = None,
        managed: bool = False,
        wait_s: float = 600.0,
        paused: Iterable[str] = (),
        refresh_s: float = 1.0,
        updated_at: float = 0.0,
        probe_transport: httpx.AsyncBaseTransport | None = None,
        judges: Iterable[str] = (),
        router: Router | None = None,
        judge_tokens_per_minute: int | None = None,
    ) -> None:
        self.store = store
        #: the judge pool's token quota (:mod:`rolloutd.proxy.backends.quota`), or None
        self.judge_quota = TokenQuota(judge_tokens_per_minute) if judge_tokens_per_minute else None
        self.router = router or Router()
        #: the client of health probes (:func:`rolloutd.proxy.backends.health.probe`)
        self._probe_http = new_async_client(HEALTH_PROBE, transport=probe_transport)
        self.refresh_s = refresh_s
        #: ``updated_at`` of the stored state this pool last wrote or loaded
        self._updated_at = updated_at
        self._checked_at = time.monotonic()
        self.factory = factory or (
            lambda spec: make_backend(
                spec.type,
                spec.name,
                spec.url,
                policy_version=spec.policy_version,
                **spec.client_options(),
            )
        )
        self.managed = managed
        self.wait_s = wait_s
        self._slots: dict[str, Slot] = {}
        self._changed = asyncio.Event()
        self._admin_lock = asyncio.Lock()
        self._retiring: list[Slot] = []
        paused_names = set(paused)
        judge_names = set(judges)
        for backend in backends:
            if backend.name in self._slots:
                raise ConfigError(f"backend {backend.name!r} is registered already")
            spec = BackendSpec(
                name=backend.name,
                type=type_of(backend),
                url=backend.url,
                policy_version=backend.policy_version,
                paused=backend.name in paused_names,
                pool="judge" if backend.name in judge_names else "policy",
                added_at=time.time(),
                **backend.options(),
            )
            self._slots[backend.name] = Slot(backend, spec)
            log.info("backend_added", **backend.describe())

    @classmethod
    def from_settings(
        cls,
        settings: GatewaySettings,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        ctx_size: int | None = None,
        store: BlobStore | None = None,
    ) -> BackendPool:
        """The stored pool when an admin has managed it, else one backend per URL of
        ``settings.backend_url`` (policy version ``settings.backend_policy_version``, named
        by URL).

        Args:
            settings: ``backend_url``, ``backend_type``, ``backend_policy_version``,
                ``backend_timeout_s``, ``backend_wait_s``, ``pool_refresh_s``, and
                ``backend_api_key`` (sent to the backends ``backend_url`` names, also once an
                admin manages the pool, and to no other).
            transport: httpx transport for every backend client (tests).
            ctx_size: context window per sequence; None asks each backend.
            store: the blob store that keeps the pool (None: memory only).

        Raises:
            ConfigError: an unknown backend type.
        """

        # the key is for the backends the settings name: never sent to one an admin added
        keyed = set(backend_urls(settings.backend_url)) if settings.backend_api_key else set()

        def factory(spec: BackendSpec) -> Backend:
            return make_backend(
                spec.type,
                spec.name,
                spec.url,
                policy_version=spec.policy_version,
                timeout_s=settings.backend_timeout_s,
                ctx_size=ctx_size,
                transport=transport,
                api_key=settings.backend_api_key if spec.url.rstrip("/") in keyed else None,
                **spec.client_options(),
            )

        stored = load_pool_state(store) if store is not None else None
        if stored is not None and stored.managed:
            pool = cls(
                (factory(spec) for spec in stored.backends),
                store=store,
                factory=factory,
                managed=True,
                wait_s=settings.backend_wait_s,
                paused=[s.name for s in stored.backends if s.paused],
                judges=[s.name for s in stored.backends if s.pool == "judge"],
                refresh_s=settings.pool_refresh_s,
                updated_at=stored.updated_at,
                probe_transport=transport,
                router=Router(settings.routing, max_imbalance=settings.routing_max_imbalance),
                judge_tokens_per_minute=settings.judge_tokens_per_minute,
            )
            log.info("backend_pool_loaded", num_backends=len(stored.backends))
            return pool
        specs = [
            BackendSpec(
                name=url,
                type=settings.backend_type,
                url=url,
                policy_version=settings.backend_policy_version,
                logprob_mode=settings.backend_logprob_mode,
                return_routed_experts=settings.backend_return_routed_experts,
                routed_experts_shape=settings.backend_routed_experts_shape,
            )
            for url in backend_urls(settings.backend_url)
        ] + [
            BackendSpec(
                name=f"judge:{url}", type=settings.judge_backend_type, url=url, pool="judge"
            )
            for url in backend_urls(settings.judge_backend_url)
        ]
        pool = cls(
            (factory(spec) for spec in specs),
            store=store,
            factory=factory,
            judges=[s.name for s in specs if s.pool == "judge"],
            wait_s=settings.backend_wait_s,
            refresh_s=settings.pool_refresh_s,
            probe_transport=transport,
            router=Router(settings.routing, max_imbalance=settings.routing_max_imbalance),
            judge_tokens_per_minute=settings.judge_tokens_per_minute,
        )
        if store is not None:
            state = pool.state()
            store.put_json(POOL_KEY, state)
            pool._updated_at = state.updated_at
        return pool

    # -- reading -----------------------------------------------------------------------------
    def names(self) -> list[str]:
        """Names of the registered backends."""
        return list(self._slots)

    def get(self, name: str) -> Backend:
        """The backend named ``name``.

        Raises:
            BackendUnavailableError: it is not registered (any more).
        """
        try:
            return self._slots[name].backend
        except KeyError:
            raise BackendUnavailableError(f"backend {name!r} is not registered") from None

    def describe(self) -> list[dict[str, Any]]:
        """Each backend: name, type, url, policy_version, paused, num_assigned,
        num_in_flight (the admin list)."""
        return [_describe(slot) for slot in self._slots.values()]

    def state(self) -> PoolState:
        """The durable state of the pool as it is now."""
        return PoolState(
            backends=[s.spec for s in self._slots.values()],
            managed=self.managed,
            updated_at=time.time(),
        )

    # -- sessions ----------------------------------------------------------------------------
    def assign(self, pool: PoolName = "policy") -> Backend:
        """Pin a new session to the least-assigned backend of ``pool`` (first registered on
        ties), among the healthy or paused ones when there are some.

        Args:
            pool: ``policy`` for a harness's session, ``judge`` for a judge's: a session is
                only ever pinned to a backend of its own pool.

        Raises:
            BackendUnavailableError: no backend of ``pool`` is registered.
        """
        members = [s for s in self._slots.values() if s.spec.pool == pool]
        if not members:
            raise BackendUnavailableError(
                "no backend is registered" if pool == "policy" else "no judge backend is registered"
            )
        live = [s for s in members if s.health.healthy or s.spec.paused]
        slot = min(live or members, key=lambda s: s.num_assigned)
        slot.num_assigned += 1
        return slot.backend

    def note_assigned(self, name: str) -> None:
        """Count a session pinned to ``name`` earlier (loaded from the store)."""
        if slot := self._slots.get(name):
            slot.num_assigned += 1

    def release(self, name: str) -> None:
        """A session pinned to ``name`` was closed (or moved away)."""
        if (slot := self._slots.get(name)) and slot.num_assigned > 0:
            slot.num_assigned -= 1

    def num_assigned(self, name: str) -> int:
        """Open sessions pinned to ``name``."""
        slot = self._slots.get(name)
        return slot.num_assigned if slot else 0

    def route(self, pinned: str, messages: list[dict[str, Any]]) -> str:
        """The backend a call of a session pinned to ``pinned`` asks a lease of, by the
        routing mode (:class:`.routing.Router`); ``pinned`` itself in ``sticky`` mode.

        Args:
            pinned: the session's pinned backend.
            messages: the call's conversation (OpenAI chat shape).
        """
        return self.router.choose(pinned, self._slots, messages)

    # -- leases ------------------------------------------------------------------------------
    async def acquire(
        self, name: str, *, wait_s: float | None = None, pool: PoolName = "policy"
    ) -> Lease:
        """A lease on the backend a session is pinned to.

        Waits while that backend is paused, or while the pool is empty; a session pinned to a
        removed backend moves to the least-assigned live one (``Lease.moved_from``), and one
        pinned to an unhealthy backend to the least-assigned healthy one serving the same
        policy version.

        Args:
            name: the session's pinned backend.
            wait_s: limit of the wait (default ``self.wait_s``).
            pool: the session's pool: a move goes to a backend of the same pool only.

        Raises:
            BackendUnavailableError: still paused, or still no backend, after ``wait_s``; at
                once when the backend is unhealthy and no healthy one serves its policy
                version.
            JudgeQuotaError: a judge session's call while the judge pool's token quota is
                spent (:meth:`charge` takes each judge call's tokens).
        """
        if pool == "judge" and self.judge_quota is not None:
            self.judge_quota.admit()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.wait_s if wait_s is None else wait_s)
        moved_from: str | None = None
        while True:
            await self.refresh()
            changed = self._changed
            slot = self._slots.get(name)
            if slot is None and any(s.spec.pool == pool for s in self._slots.values()):
                moved_from = moved_from or name
                name = self.assign(pool).name
                continue
            if slot is not None and not slot.spec.paused and not slot.health.healthy:
                if await pool_health.probe_slot(slot, self._probe_http):
                    self._notify()
                if not slot.health.healthy:
                    other = pool_health.healthy_serving(
                        [s for s in self._slots.values() if s.spec.pool == pool],
                        slot.spec.policy_version,
                    )
                    if other is None:
                        raise BackendUnavailableError(
                            dead_message(slot.spec.name, slot.spec.policy_version, slot.health)
                        )
                    log.info(
                        "backend_session_moved",
                        moved_from=name,
                        moved_to=other.spec.name,
                        policy_version=slot.spec.policy_version,
                        reason=slot.health.last_error,
                    )
                    moved_from = moved_from or name
                    self.release(name)
                    other.num_assigned += 1
                    name = other.spec.name
                    continue
            if slot is not None and not slot.spec.paused:
                slot.num_in_flight += 1
                return Lease(slot.backend, slot.spec.policy_version, moved_from, slot)
            remaining = deadline - loop.time()
            why = f"backend {name!r} is paused" if slot else "no backend is registered"
            if remaining <= 0:
                raise BackendUnavailableError(f"{why}; waited {self.wait_s:g} s")
            # another replica may resume or add: look at the store again after refresh_s
            if self.store is not None:
                remaining = min(remaining, max(self.refresh_s, 0.01))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)

    async def refresh(self, *, force: bool = False) -> bool:
        """Apply the stored pool when another replica changed it (checked at most every
        ``refresh_s`` unless ``force``).

        Returns:
            Whether the pool changed.
        """
        if self.store is None or (
            not force and time.monotonic() - self._checked_at < self.refresh_s
        ):
            return False
        self._checked_at = time.monotonic()
        async with self._admin_lock:
            stored = await asyncio.to_thread(load_pool_state, self.store)
            if stored is None or not stored.managed or stored.updated_at == self._updated_at:
                return False
            new = {
                spec.name: self.factory(spec)
                for spec in stored.backends
                if spec.name not in self._slots
            }
            await self._apply(stored.backends, new=new)
            self._updated_at = stored.updated_at
        log.info(
            "backend_pool_reloaded",
            backends=[s.name for s in stored.backends],
            paused=[s.name for s in stored.backends if s.paused],
        )
        return True

    def release_lease(self, lease: Lease) -> None:
        """End a call's lease (idempotent); the client of a removed backend closes when its
        last call ends."""
        slot, lease._slot = lease._slot, None
        if slot is None:
            return
        slot.num_in_flight -= 1
        if slot.removed and slot.num_in_flight == 0 and slot in self._retiring:
            self._retiring.remove(slot)
            asyncio.get_running_loop().create_task(slot.backend.aclose())
        self._notify()

    @contextlib.asynccontextmanager
    async def lease(self, name: str) -> AsyncIterator[Lease]:
        """:meth:`acquire` and :meth:`release_lease` around a block."""
        held = await self.acquire(name)
        try:
            yield held
        finally:
            self.release_lease(held)

    # -- admin -------------------------------------------------------------------------------
    async def add(
        self,
        url: str,
        *,
        type: BackendType = "llama_cpp",
        name: str | None = None,
        policy_version: int | None = None,
        logprob_mode: LogprobMode | None = None,
        return_routed_experts: bool = False,
        routed_experts_shape: tuple[int, int] | None = None,
        pool: PoolName = "policy",
    ) -> dict[str, Any]:
        """Register a backend (persisted first) in ``pool`` (``judge``: it serves judge
        sessions only). Adding the same name with the same URL, type
        and options again is a no-op that may update the policy version.

        Args:
            url: its base URL.
            type: its kind.
            name: its name (default: the URL).
            policy_version: the version it serves (default 0; for a known name, unchanged).
            logprob_mode, return_routed_experts, routed_experts_shape: the operator's
                options (:class:`BackendSpec`).
            pool: ``policy``, or ``judge`` for the judge pool.

        Returns:
            The backend as :meth:`describe` shows it.

        Raises:
            ConflictError: the name is taken by another URL, type or options (409).
            ValueError: routed-experts options for a kind other than sglang.
        """
        url = url.rstrip("/")
        name = name or url
        options = {
            "logprob_mode": logprob_mode,
            "return_routed_experts": return_routed_experts,
            "routed_experts_shape": routed_experts_shape,
        }
        async with self._admin_lock:
            if slot := self._slots.get(name):
                if (slot.spec.url, slot.spec.type) != (url, type):
                    raise ConflictError(
                        f"backend {name!r} is registered with {slot.spec.type} {slot.spec.url}"
                    )
                if slot.spec.client_options() != options:
                    raise ConflictError(
                        f"backend {name!r} is registered with other options: "
                        f"{slot.spec.client_options()}"
                    )
                if policy_version is not None:
                    await self._commit(
                        [
                            s.model_copy(update={"policy_version": policy_version})
                            if s.name == name
                            else s
                            for s in self._specs()
                        ]
                    )
                return _describe(slot)
            spec = BackendSpec(
                name=name,
                type=type,
                url=url,
                policy_version=policy_version or 0,
                pool=pool,
                added_at=time.time(),
                **options,
            )
            backend = self.factory(spec)
            try:
                await self._commit([*self._specs(), spec], new={name: backend})
            except BaseException:
                await backend.aclose()
                raise
            log.info("backend_added", **backend.describe())
            return _describe(self._slots[name])

    async def remove(self, names: list[str] | None = None) -> list[str]:
        """Remove backends (all of the policy's pool when ``names`` is None). From the moment
        this returns no new lease reaches them; calls in flight finish, then their clients close.

        Returns:
            The names removed.

        Raises:
            NotFoundError: a name is not registered.
        """
        async with self._admin_lock:
            targets = self._targets(names)
            await self._commit([s for s in self._specs() if s.name not in targets])
        for target in targets:
            log.info("backend_removed", name=target)
        return targets

    async def set_paused(
        self, paused: bool, names: list[str] | None = None, *, drain_timeout_s: float = 0.0
    ) -> dict[str, Any]:
        """Pause or resume backends (all of the policy's pool when ``names`` is None); pausing
        then waits up to ``drain_timeout_s`` for their calls in flight to finish.

        Returns:
            ``{"backends": [names], "paused": bool, "drained": bool, "num_in_flight": int}``.

        Raises:
            NotFoundError: a name is not registered.
        """
        async with self._admin_lock:
            targets = self._targets(names)
            await self._commit(
                [
                    s.model_copy(update={"paused": paused}) if s.name in targets else s
                    for s in self._specs()
                ]
            )
            slots = [self._slots[t] for t in targets]
            if paused:  # a pause is for a load: what the engines cached is not to be counted on
                self.router.forget(targets)
            if not paused:  # an engine restarted for the update is given a fresh start
                for slot in slots:
                    slot.health = BackendHealth()
        log.info("backends_paused" if paused else "backends_resumed", names=targets)
        num_in_flight = await self.drain(slots, drain_timeout_s) if paused else 0
        return {
            "backends": targets,
            "paused": paused,
            "drained": num_in_flight == 0,
            "num_in_flight": num_in_flight,
        }

    async def drain(self, slots: list[Slot], timeout_s: float) -> int:
        """Wait up to ``timeout_s`` until no call is in flight on ``slots``.

        Returns:
            Calls still in flight (0: drained).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (num := sum(s.num_in_flight for s in slots)) and loop.time() < deadline:
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), deadline - loop.time())
        return num

    async def set_policy_version(
        self, policy_version: int, names: list[str] | None = None
    ) -> list[str]:
        """Set the policy version stamped on later completions (all of the policy's pool by
        default).

        Raises:
            NotFoundError: a name is not registered.
            ValueError: a negative version.
        """
        if policy_version < 0:
            raise ValueError("policy_version must be >= 0")
        async with self._admin_lock:
            targets = self._targets(names)
            await self._commit(
                [
                    s.model_copy(update={"policy_version": policy_version})
                    if s.name in targets
                    else s
                    for s in self._specs()
                ]
            )
        log.info("policy_version_set", policy_version=policy_version, names=targets)
        return targets

    def _specs(self) -> list[BackendSpec]:
        return [slot.spec for slot in self._slots.values()]

    def _targets(self, names: list[str] | None) -> list[str]:
        # "all backends" of weight sync, pause and versions is the policy's pool: a judge's
        # engine is never reloaded or paused by a policy update (it is addressed by name)
        if names is None:
            return [n for n, s in self._slots.items() if s.spec.pool == "policy"]
        unknown = [n for n in names if n not in self._slots]
        if unknown:
            raise NotFoundError(f"no backend named {', '.join(map(repr, unknown))}")
        return list(dict.fromkeys(names))

    async def _commit(
        self, specs: list[BackendSpec], *, new: dict[str, Backend] | None = None
    ) -> None:
        """Make ``specs`` the pool: persisted first (a failed write changes nothing), then
        applied in memory. Call with the admin lock held.

        Args:
            specs: the whole pool after the change, in order.
            new: clients of backends ``specs`` adds.
        """
        state = PoolState(backends=specs, managed=True, updated_at=time.time())
        if self.store is not None:
            await asyncio.to_thread(self.store.put_json, POOL_KEY, state)
            self._updated_at = state.updated_at
        await self._apply(specs, new=new)

    async def _apply(
        self, specs: list[BackendSpec], *, new: dict[str, Backend] | None = None
    ) -> None:
        """Make ``specs`` the pool in memory (clients of removed backends close when their
        last call ends). Call with the admin lock held."""
        slots: dict[str, Slot] = {}
        for spec in specs:
            slot = self._slots.pop(spec.name, None) or Slot((new or {})[spec.name], spec)
            slot.spec = spec
            slot.backend.policy_version = spec.policy_version
            slots[spec.name] = slot
        self.router.forget([n for n in self._slots if n not in slots])
        for slot in self._slots.values():  # what is left was removed
            slot.removed = True
            if slot.num_in_flight:
                self._retiring.append(slot)
            else:
                await slot.backend.aclose()
        self._slots = slots
        self.managed = True
        self._notify()

    # -- health (the rules: rolloutd.proxy.backends.pool_health) -----------------------------
    async def probe_unhealthy(self) -> None:
        """Probe every unhealthy backend whose backoff allows (the ``/health`` route: the
        health of an idle pool comes back without a call)."""
        came_back = await asyncio.gather(
            *(
                pool_health.probe_slot(s, self._probe_http)
                for s in list(self._slots.values())
                if not s.spec.paused
            )
        )
        if any(came_back):
            self._notify()

    async def answers(self, name: str) -> bool:
        """Whether backend ``name`` answers now (:func:`.pool_health.answers`: a saturated
        engine does, a hung or refusing one does not, a paused one counts as answering)."""
        return await pool_health.answers(self._slots.get(name), self._probe_http)

    def note_answered(self, lease: Lease) -> None:
        """A call on ``lease`` got its answer: its backend is healthy (call before
        :meth:`release_lease`)."""
        slot = lease._slot
        if slot is not None and not slot.health.healthy and pool_health.mark_answered(slot):
            self._notify()

    def note_failed(self, lease: Lease, error: BaseException) -> None:
        """A call on ``lease`` failed: a refusal or a timeout marks its backend unhealthy
        unless it is paused (call before :meth:`release_lease`)."""
        if lease._slot is not None:
            pool_health.note_failed(lease._slot, error)

    def health(self) -> dict[str, Any]:
        """The policy pool's health per policy version (:func:`.health.pool_health`); the
        judge pool's is :meth:`judge_health`."""
        return pool_health.health_by_version(
            [s for s in self._slots.values() if s.spec.pool == "policy"]
        )

    def charge(self, pool: PoolName, num_tokens: int) -> None:
        """Count an answered call's tokens against its pool's quota (the judge pool's
        ``judge_tokens_per_minute``; the policy's pool has none)."""
        if pool == "judge" and self.judge_quota is not None:
            self.judge_quota.charge(num_tokens)

    def judge_health(self) -> dict[str, Any]:
        """The judge pool's health, as :meth:`health` gives the policy pool's."""
        return pool_health.health_by_version(
            [s for s in self._slots.values() if s.spec.pool == "judge"]
        )

    def _notify(self) -> None:
        """Wake every waiter (leases, drains): something changed."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def aclose(self) -> None:
        """Close every backend client."""
        await self._probe_http.aclose()
        for slot in [*self._slots.values(), *self._retiring]:
            await slot.backend.aclose()
        self._retiring.clear()


def _describe(slot: Slot) -> dict[str, Any]:
    return {
        **slot.spec.model_dump(exclude={"added_at"}),
        # the mode in force: the operator's, else the kind's
        "logprob_mode": slot.backend.logprob_mode,
        "num_assigned": slot.num_assigned,
        "num_in_flight": slot.num_in_flight,
        **slot.health.describe(),
    }
