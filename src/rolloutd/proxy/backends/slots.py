"""What the pool holds per backend in memory (:class:`Slot`), and a call's hold on one
(:class:`Lease`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rolloutd.proxy.backends.base import Backend
from rolloutd.proxy.backends.health import BackendHealth
from rolloutd.proxy.backends.specs import BackendSpec


@dataclass(eq=False)
class Slot:
    """A registered (or retiring) backend in memory."""

    backend: Backend
    spec: BackendSpec
    num_assigned: int = 0
    num_in_flight: int = 0
    removed: bool = False
    health: BackendHealth = field(default_factory=BackendHealth)


@dataclass(eq=False)
class Lease:
    """A sampling call's hold on a backend (released when the call ends).

    Attributes:
        backend: the backend to call.
        policy_version: its policy version when the lease was granted (stamped on the
            completion).
        moved_from: the removed backend the session was pinned to, when it moved now.
    """

    backend: Backend
    policy_version: int
    moved_from: str | None = None
    _slot: Slot | None = field(default=None, repr=False)
