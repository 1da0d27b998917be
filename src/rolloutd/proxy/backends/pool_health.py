"""The health rules of :mod:`rolloutd.proxy.backends.health` applied to the backend pool's
slots: free functions over :class:`~rolloutd.proxy.backends.slots.Slot` (what each takes and
gives is explicit); :class:`~rolloutd.proxy.backends.pool.BackendPool` calls them and wakes
its waiters when a backend comes back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

import httpx
import structlog

from rolloutd.proxy.backends.health import (
    ANSWERED_FRESH_S,
    ANSWERS_PROBE_TIMEOUT_S,
    ANSWERS_WAIT_S,
    BackendHealth,
    is_unreachable,
    pool_health,
    probe,
)
from rolloutd.proxy.backends.slots import Slot

log = structlog.get_logger(__name__)


def healthy_serving(slots: Iterable[Slot], policy_version: int) -> Slot | None:
    """The least-assigned healthy, unpaused backend serving ``policy_version``, or None."""
    serving = [
        s
        for s in slots
        if s.health.healthy and not s.spec.paused and s.spec.policy_version == policy_version
    ]
    return min(serving, key=lambda s: s.num_assigned) if serving else None


def mark_answered(slot: Slot) -> bool:
    """A call or a probe of ``slot`` got an answer: its backend is healthy.

    Returns:
        True when the backend was unhealthy until now (the pool wakes its waiters).
    """
    if slot.health.mark_answered():
        log.info("backend_healthy", name=slot.spec.name)
        return True
    return False


async def probe_slot(slot: Slot, http: httpx.AsyncClient) -> bool:
    """Probe an unhealthy backend when its backoff allows (:mod:`.health`).

    Args:
        slot: the backend's slot.
        http: the client of health probes.

    Returns:
        True when the probe found it answering again (it is healthy now).
    """
    if not slot.health.probe_due():
        return False
    slot.health.probing = True
    try:
        error = await probe(http, slot.spec.url)
    finally:
        slot.health.probing = False
    if error is None:
        return mark_answered(slot)
    slot.health.mark_unreachable(error)
    return False


async def answers(slot: Slot | None, http: httpx.AsyncClient) -> bool:
    """Whether a backend answers now: a saturated engine does (its calls queue, it is not
    dead), a hung or refusing one does not. The pool's health is left to the calls (a slow
    probe of a starved engine must not fail every session's calls). A paused backend counts
    as answering: a weight update is not a death.

    One probe runs at a time per backend, shared by every ask, and an ask waits for it at
    most ``ANSWERS_WAIT_S``: a probe of a hung backend takes up to ``ANSWERS_PROBE_TIMEOUT_S``,
    longer than an ask may (the sandbox reads the verdict within 2 s). Until the probe has
    its result the backend counts as answering (the benefit of the doubt: a saturated engine
    is slow to answer); a probe that got no answer counts for ``ANSWERED_FRESH_S``, as one
    that got an answer does.

    Args:
        slot: the backend's slot; None: no such backend (it does not answer).
        http: the client of health probes.
    """
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
            probe(http, slot.spec.url, ANSWERS_PROBE_TIMEOUT_S)
        )
        name = slot.spec.name
        running.add_done_callback(lambda task: _answer_probed(name, health, task))
    done, _ = await asyncio.wait({running}, timeout=ANSWERS_WAIT_S)
    if not done or running.cancelled():
        return True  # still probing: the next ask reads its result
    return running.exception() is None and running.result() is None


def _answer_probed(name: str, health: BackendHealth, task: asyncio.Task[str | None]) -> None:
    """Keep what a "does it answer" probe found (:func:`answers`)."""
    health.answer_probe = None
    if task.cancelled():
        return
    error = task.exception() or task.result()
    if error is None:
        health.answered_at = time.monotonic()
    else:
        health.not_answering_at = time.monotonic()
        log.warning("backend_not_answering", name=name, error=str(error))


def note_failed(slot: Slot, error: BaseException) -> None:
    """A call on ``slot`` failed: a refusal or a timeout marks its backend unhealthy unless it
    is paused (:func:`.health.is_unreachable` decides)."""
    if slot.spec.paused or not is_unreachable(error):
        return
    if slot.health.mark_unreachable(str(error)):
        log.warning(
            "backend_unhealthy",
            name=slot.spec.name,
            error=str(error)[:300],
            policy_version=slot.spec.policy_version,
        )


def health_by_version(slots: Iterable[Slot]) -> dict[str, Any]:
    """The pool's health per policy version (:func:`.health.pool_health`)."""
    return pool_health(
        [(s.spec.name, s.spec.policy_version, s.spec.paused, s.health) for s in slots]
    )
