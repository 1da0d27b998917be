"""Backend saturation: open sessions per engine slot, the gateway's backpressure signal.

A session opened with ``wait_for_backends`` (the session workflow's first attempt) is refused
with :class:`~rolloutd.errors.BackendSaturatedError` while the pool holds
``max_sessions_per_slot x slots`` open sessions or more; the workflow waits on a durable timer
and asks again, before it provisions a runtime (docs/tenancy.md). The check and the pinning
of the new session run without an await between them, so one gateway never opens more than
its bound however many sessions ask at once.

A backend's slots are what it decodes at once: ``ROLLOUTD_BACKEND_SLOTS`` when set, else
llama-server's ``total_slots`` (its ``--parallel``, from ``GET /props``, read once per
backend), else 1 (vLLM, SGLang and OpenAI-compatible backends: set the setting).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import httpx
import structlog

from rolloutd.proxy.backends.llama_cpp import LlamaCppBackend
from rolloutd.proxy.backends.pool import BackendPool

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Saturation:
    """The pool's load as a new session sees it.

    Attributes:
        num_sessions_open: sessions pinned to a registered backend and not closed.
        num_slots: the registered backends' slots, summed.
        num_in_flight: sampling calls running now.
        max_sessions: open sessions the pool takes (``ceil(max_sessions_per_slot x
            num_slots)``, at least 1); None when unbounded.
        saturated: ``num_sessions_open >= max_sessions``.
    """

    num_sessions_open: int
    num_slots: int
    num_in_flight: int
    max_sessions: int | None
    saturated: bool

    def describe(self) -> dict[str, object]:
        """The fields as a dict (``/health``, error messages)."""
        return asdict(self)


class BackendCapacity:
    """Slots per backend and the saturation of a pool.

    Args:
        pool: the gateway's backend pool.
        max_sessions_per_slot: open sessions allowed per slot (> 0); None: never saturated.
        backend_slots: slots of every backend; None: ask llama-server, else 1.
    """

    def __init__(
        self, pool: BackendPool, *, max_sessions_per_slot: float | None, backend_slots: int | None
    ) -> None:
        self.pool = pool
        self.max_sessions_per_slot = max_sessions_per_slot
        self.backend_slots = backend_slots
        self._slots: dict[tuple[str, str], int] = {}

    async def refresh(self) -> None:
        """Learn the slots of backends not asked yet (one ``GET /props`` each for
        llama-server; a backend that does not answer counts 1 slot until it does)."""
        for name in self.pool.names():
            backend = self.pool.get(name)
            key = (name, backend.url)
            if key in self._slots:
                continue
            if self.backend_slots is not None:
                self._slots[key] = self.backend_slots
            elif isinstance(backend, LlamaCppBackend):
                try:
                    response = await backend.client.get("/props")
                    total = response.json().get("total_slots")
                except (httpx.HTTPError, ValueError, AttributeError) as e:
                    log.warning("backend_slots_unknown", name=name, error=str(e))
                    continue
                if isinstance(total, int) and total >= 1:
                    self._slots[key] = total
                    log.info("backend_slots", name=name, num_slots=total)
            else:
                self._slots[key] = 1

    def check(self) -> Saturation:
        """The pool's saturation now (no I/O: call :meth:`refresh` first)."""
        # the policy's pool only: judge sessions neither fill it nor wait for it
        rows = [r for r in self.pool.describe() if r.get("pool", "policy") == "policy"]
        num_slots = sum(self._slots.get((r["name"], r["url"]), 1) for r in rows)
        num_open = sum(int(r["num_assigned"]) for r in rows)
        max_sessions = (
            None
            if self.max_sessions_per_slot is None
            else max(1, math.ceil(self.max_sessions_per_slot * num_slots))
        )
        return Saturation(
            num_sessions_open=num_open,
            num_slots=num_slots,
            num_in_flight=sum(int(r["num_in_flight"]) for r in rows),
            max_sessions=max_sessions,
            saturated=max_sessions is not None and num_open >= max_sessions,
        )
