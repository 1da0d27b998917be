"""The health side of the backend pool (:class:`PoolHealth`): the rules of
:mod:`rolloutd.proxy.backends.health` applied to the pool's slots and leases."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import structlog

from rolloutd.proxy.backends.health import (
    ANSWERED_FRESH_S,
    ANSWERS_PROBE_TIMEOUT_S,
    ANSWERS_WAIT_S,
    is_unreachable,
    pool_health,
    probe,
)
from rolloutd.proxy.backends.slots import Lease, Slot

log = structlog.get_logger(__name__)


class PoolHealth:
    """The health side of :class:`~rolloutd.proxy.backends.pool.BackendPool`: marking a
    backend unhealthy or healthy from its calls, probing it with backoff, and the pool's
    health per policy version (the rules are in this module's docstring)."""

    _slots: dict[str, Slot]
    #: the client of health probes (:func:`probe`)
    _probe_http: httpx.AsyncClient

    def _notify(self) -> None:
        """Wake every waiter of the pool (defined by the pool)."""
        raise NotImplementedError

    def _healthy_serving(self, policy_version: int) -> Slot | None:
        """The least-assigned healthy, unpaused backend serving ``policy_version``."""
        slots = [
            s
            for s in self._slots.values()
            if s.health.healthy and not s.spec.paused and s.spec.policy_version == policy_version
        ]
        return min(slots, key=lambda s: s.num_assigned) if slots else None

    async def _probe(self, slot: Slot) -> None:
        """Probe an unhealthy backend when its backoff allows (:mod:`.health`)."""
        if not slot.health.probe_due():
            return
        slot.health.probing = True
        try:
            error = await probe(self._probe_http, slot.spec.url)
        finally:
            slot.health.probing = False
        if error is None:
            self._mark_answered(slot)
        else:
            slot.health.mark_unreachable(error)

    async def probe_unhealthy(self) -> None:
        """Probe every unhealthy backend whose backoff allows (the ``/health`` route: the
        health of an idle pool comes back without a call)."""
        await asyncio.gather(
            *(self._probe(s) for s in list(self._slots.values()) if not s.spec.paused)
        )

    async def answers(self, name: str) -> bool:
        """Whether backend ``name`` answers now: a saturated engine does (its calls queue,
        it is not dead), a hung or refusing one does not. The pool's health is left to the
        calls (a slow probe of a starved engine must not fail every session's calls). A
        paused backend counts as answering: a weight update is not a death.

        One probe runs at a time per backend, shared by every ask, and an ask waits for it
        at most ``ANSWERS_WAIT_S``: a probe of a hung backend takes up to
        ``ANSWERS_PROBE_TIMEOUT_S``, longer than an ask may (the sandbox reads the verdict
        within 2 s). Until the probe has its result the backend counts as answering (the
        benefit of the doubt: a saturated engine is slow to answer); a probe that got no
        answer counts for ``ANSWERED_FRESH_S``, as one that got an answer does."""
        slot = self._slots.get(name)
        if slot is None or slot.spec.paused:
            return slot is not None
        health = slot.health
        if not health.healthy:
            return False
        now = time.monotonic()
        if now - health.answered_at < ANSWERED_FRESH_S:
            return True
        if now - health.not_answering_at < ANSWERED_FRESH_S:
            return False
        running = health.answer_probe
        if running is None:
            running = health.answer_probe = asyncio.create_task(
                probe(self._probe_http, slot.spec.url, ANSWERS_PROBE_TIMEOUT_S)
            )
            running.add_done_callback(lambda task: self._answer_probed(name, health, task))
        done, _ = await asyncio.wait({running}, timeout=ANSWERS_WAIT_S)
        if not done or running.cancelled():
            return True  # still probing: the next ask reads its result
        return running.exception() is None and running.result() is None

    @staticmethod
    def _answer_probed(name: str, health: Any, task: asyncio.Task[str | None]) -> None:
        """Keep what a "does it answer" probe found (:meth:`answers`)."""
        health.answer_probe = None
        if task.cancelled():
            return
        error = task.exception() or task.result()
        if error is None:
            health.answered_at = time.monotonic()
        else:
            health.not_answering_at = time.monotonic()
            log.warning("backend_not_answering", name=name, error=str(error))

    def _mark_answered(self, slot: Slot) -> None:
        if slot.health.mark_answered():
            log.info("backend_healthy", name=slot.spec.name)
            self._notify()

    def note_answered(self, lease: Lease) -> None:
        """A call on ``lease`` got its answer: its backend is healthy (call before
        :meth:`release_lease`)."""
        if lease._slot is not None and not lease._slot.health.healthy:
            self._mark_answered(lease._slot)

    def note_failed(self, lease: Lease, error: BaseException) -> None:
        """A call on ``lease`` failed: a refusal or a timeout marks its backend unhealthy
        unless it is paused (call before :meth:`release_lease`)."""
        slot = lease._slot
        if slot is None or slot.spec.paused or not is_unreachable(error):
            return
        if slot.health.mark_unreachable(str(error)):
            log.warning(
                "backend_unhealthy",
                name=slot.spec.name,
                error=str(error)[:300],
                policy_version=slot.spec.policy_version,
            )

    def health(self) -> dict[str, Any]:
        """The pool's health per policy version (:func:`.health.pool_health`)."""
        return pool_health(
            [
                (s.spec.name, s.spec.policy_version, s.spec.paused, s.health)
                for s in self._slots.values()
            ]
        )
