"""Backend health: a backend that refuses connections or times out is unhealthy until it
answers again.

A call that fails because its backend could not be reached (the connection was refused,
reset or dropped, or no answer came within the timeout) marks the backend unhealthy. While
it is, the pool grants it no lease: a call fails at once with ``BackendUnavailableError``
(or moves to a healthy backend that serves the same policy version) instead of waiting out
its timeout on a dead engine. An answer of any status is not a refusal: a 5xx answer is the
backend's error, not its death. Health comes back with the next probe (``GET {url}/health``,
any answer below 500) that succeeds; probes run when a call or the gateway's ``/health``
asks, at most once per backoff (:data:`PROBE_BACKOFF`: doubling from 0.5 s up to 5 s), so a
dead engine costs one connection attempt per backoff, not one per call. A paused backend (a
weight update in progress) is never marked: its engine may be down on purpose.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import httpx
import structlog

from rolloutd.backoff import Backoff
from rolloutd.errors import BackendError

log = structlog.get_logger(__name__)

#: the waits before probing a backend that failed: 0.5 s after the first failure, doubled
#: after each failed probe up to 5 s (the cap bounds how late a restarted engine is seen)
PROBE_BACKOFF = Backoff(initial_s=0.5, max_s=5.0)
#: limit of one probe, seconds (a hung engine must not hold the caller for longer)
PROBE_TIMEOUT_S = 5.0
#: limit of the probe that tells a saturated engine (long queue, slow answers) from a hung
#: one, seconds: its HTTP thread answers ``/health`` while every slot is busy, but on 2 cores
#: at load 16 it took over 5 s (measured), and a false "hung" ends healthy sessions
ANSWERS_PROBE_TIMEOUT_S = 15.0
#: a backend that answered a probe this recently is not probed again to ask, seconds
ANSWERED_FRESH_S = 5.0
#: how long one ask waits for that probe, seconds: an ask (the verdict route, read by the
#: sandbox within 2 s) never waits out ``ANSWERS_PROBE_TIMEOUT_S``; the probe goes on, and
#: a later ask reads its result
ANSWERS_WAIT_S = 1.0


def is_unreachable(error: BaseException) -> bool:
    """Whether a failed call means its backend could not be reached: a ``BackendError``
    raised from a transport failure (refused, reset, dropped, timed out), not from an
    answer the backend gave."""
    return isinstance(error, BackendError) and isinstance(error.__cause__, httpx.TransportError)


@dataclass
class BackendHealth:
    """The health of one backend in the pool.

    Attributes:
        healthy: the last call or probe reached it.
        unhealthy_since: Unix time (s) it was first found unreachable, None while healthy.
        last_error: what the last failed call or probe got.
        next_probe_at: ``time.monotonic()`` from which a probe may run.
        num_failures: failed calls and probes since it was last healthy (the next wait is
            ``PROBE_BACKOFF.delay_s(num_failures)``).
        probing: a probe is running (others do not start one).
        answered_at: ``time.monotonic()`` of its last answered probe (0: none).
        not_answering_at: ``time.monotonic()`` of its last probe that got no answer within
            ``ANSWERS_PROBE_TIMEOUT_S`` (0: none).
        answer_probe: the "does it answer" probe running now, shared by every ask.
    """

    healthy: bool = True
    unhealthy_since: float | None = None
    last_error: str | None = None
    next_probe_at: float = 0.0
    num_failures: int = 0
    probing: bool = False
    answered_at: float = 0.0
    not_answering_at: float = 0.0
    answer_probe: asyncio.Task[str | None] | None = None

    def mark_unreachable(self, error: str) -> bool:
        """Record a failed call or probe; returns whether the backend was healthy before."""
        was_healthy = self.healthy
        if was_healthy:
            self.healthy, self.unhealthy_since = False, time.time()
            self.num_failures = 0
        self.last_error = error[:300]
        self.num_failures += 1
        self.next_probe_at = time.monotonic() + PROBE_BACKOFF.delay_s(self.num_failures)
        return was_healthy

    def mark_answered(self) -> bool:
        """Record an answer; returns whether the backend was unhealthy before."""
        was_unhealthy = not self.healthy
        self.healthy, self.unhealthy_since, self.num_failures = True, None, 0
        return was_unhealthy

    def probe_due(self) -> bool:
        """Whether an unhealthy backend may be probed now."""
        return not self.healthy and not self.probing and time.monotonic() >= self.next_probe_at

    def describe(self) -> dict[str, object]:
        """``{healthy, unhealthy_s, last_error}`` for ``/health`` and the admin list
        (``unhealthy_s``: seconds since it was found unreachable, a duration, so readers on
        other hosts need no synchronised clock)."""
        return {
            "healthy": self.healthy,
            "unhealthy_s": None
            if self.unhealthy_since is None
            else round(time.time() - self.unhealthy_since, 1),
            "last_error": None if self.healthy else self.last_error,
        }


async def probe(
    http: httpx.AsyncClient, url: str, timeout_s: float = PROBE_TIMEOUT_S
) -> str | None:
    """Ask ``GET {url}/health`` (llama-server, vLLM and SGLang serve it; any other answer
    below 500 also proves the server answers).

    Returns:
        None when it answered below 500, else what went wrong (a 503 is a server still
        loading its model: not serving yet).
    """
    try:
        response = await http.get(f"{url}/health", timeout=timeout_s)
    except httpx.HTTPError as e:
        return f"probe failed: {e!r}"
    if response.status_code >= 500:
        return f"probe answered {response.status_code}"
    return None


def dead_message(name: str, policy_version: int, health: BackendHealth) -> str:
    """Why no lease is granted on an unhealthy backend, for the harness and the trainer."""
    return (
        f"no healthy backend serves policy version {policy_version}: backend {name!r} "
        f"unreachable for {health.describe()['unhealthy_s']} s ({health.last_error})"
    )


def pool_health(backends: list[tuple[str, int, bool, BackendHealth]]) -> dict[str, object]:
    """The health of a pool, per policy version.

    Args:
        backends: (name, policy_version, paused, health) of each registered backend.

    Returns:
        ``{"status": "ok" | "unavailable" | "empty", "unavailable": [{policy_version,
        unhealthy_s, message}]}``: a policy version is unavailable when it has backends, none
        healthy and none paused (a weight update is not a death); ``unhealthy_s`` is the
        time since its last backend was found unreachable, seconds.
    """
    by_version: dict[int, list[tuple[str, bool, BackendHealth]]] = {}
    for name, version, paused, health in backends:
        by_version.setdefault(version, []).append((name, paused, health))
    unavailable = []
    for version, members in sorted(by_version.items()):
        if any(health.healthy or paused for _, paused, health in members):
            continue
        name, _, latest = max(members, key=lambda m: m[2].unhealthy_since or 0.0)
        unavailable.append(
            {
                "policy_version": version,
                "unhealthy_s": latest.describe()["unhealthy_s"],
                "message": dead_message(name, version, latest),
            }
        )
    status = "empty" if not backends else "unavailable" if unavailable else "ok"
    return {"status": status, "unavailable": unavailable}
