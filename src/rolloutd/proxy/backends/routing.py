"""Which backend serves a session's next call (``ROLLOUTD_ROUTING``).

- ``sticky`` (default): the backend the session was pinned to when it opened (the
  least-assigned one); it moves only off a removed or unhealthy backend (:mod:`.pool`).
- ``round_robin``: each call goes to the next backend in turn: no affinity (the baseline a
  prefix cache loses against).
- ``cache_aware``: the backend that already holds the longest prefix of the call's
  conversation, unless that backend runs ``routing_max_imbalance`` or more calls beyond the
  least busy one and more than :data:`REL_IMBALANCE` times as many; then the least busy. A
  session's next turn resends its conversation, so it stays where its previous turn ran; a
  new session whose first messages (a shared system prompt, a group's task) another session
  sent goes where those are cached. This is the policy of SGLang's router (``cache_aware``: a
  per-worker approximate prefix tree, the longest match unless the load is imbalanced by both
  ``--balance-abs-threshold`` and ``--balance-rel-threshold``, 1.5; docs.sglang.io, "SGLang
  Model Gateway"), kept at message granularity: the gateway routes before it renders the
  prompt.

Round robin and cache-aware choose among the backends of the session's pool that serve its
pinned backend's policy version and are healthy and not paused; when the pinned backend is
paused, unhealthy or gone, or no other qualifies, the call goes to the pinned backend as in
``sticky`` (and waits or moves there). The prefix index of each backend is approximate: a
bounded LRU of message-chain hashes (:data:`MAX_PREFIXES` per backend), not the engine's
cache; an engine that evicted a prefix still attracts its session, which a working cache
(llama.cpp's slots, vLLM's and SGLang's prefix caches) then serves from what it kept.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Literal

from rolloutd.proxy.backends.slots import Slot

RoutingMode = Literal["sticky", "round_robin", "cache_aware"]

#: message-chain hashes remembered per backend (LRU): ~64 sessions x 64 messages x 4
MAX_PREFIXES = 16384
#: cache-aware: a backend is too busy for its prefix only when it also runs more than this
#: many times the least busy backend's calls (SGLang router's ``balance_rel_threshold``)
REL_IMBALANCE = 1.5


def message_chain(messages: Sequence[dict[str, Any]]) -> list[tuple[int, int]]:
    """``(hash of messages[: i + 1], characters of messages[: i + 1])`` for each ``i``: a
    prefix of the conversation and its weight. Equal prefixes hash equal within a process
    (Python's ``hash``; never stored)."""
    chain: list[tuple[int, int]] = []
    h, size = 0, 0
    for message in messages:
        content = message.get("content")
        text = content if isinstance(content, str) else repr(content)
        calls = message.get("tool_calls")
        h = hash((h, message.get("role"), text, repr(calls) if calls else None))
        size += len(text)
        chain.append((h, size))
    return chain


class PrefixIndex:
    """The conversation prefixes a backend was sent, most recent last (bounded LRU)."""

    def __init__(self, limit: int = MAX_PREFIXES) -> None:
        self.limit = limit
        self._seen: OrderedDict[int, None] = OrderedDict()

    def match(self, chain: list[tuple[int, int]]) -> int:
        """Characters of the longest prefix of ``chain`` this backend was sent."""
        for h, size in reversed(chain):
            if h in self._seen:
                return size
        return 0

    def add(self, chain: list[tuple[int, int]]) -> None:
        """Remember every prefix of ``chain`` (refreshed when known)."""
        for h, _ in chain:
            self._seen[h] = None
            self._seen.move_to_end(h)
        while len(self._seen) > self.limit:
            self._seen.popitem(last=False)

    def forget(self) -> None:
        """The engine's cache is gone (restart, weight load): nothing is held."""
        self._seen.clear()


class Router:
    """The routing state of one pool: a turn counter and a :class:`PrefixIndex` per backend.

    Args:
        mode: the routing mode (module docstring).
        max_imbalance: cache-aware only: calls in flight beyond the least busy backend's at
            which the longest-prefix backend is passed over, when it also runs more than
            :data:`REL_IMBALANCE` times as many (>= 1).
    """

    def __init__(self, mode: RoutingMode = "sticky", *, max_imbalance: int = 8) -> None:
        if max_imbalance < 1:
            raise ValueError("max_imbalance must be >= 1")
        self.mode = mode
        self.max_imbalance = max_imbalance
        self._turn = itertools.count()
        self._indexes: dict[str, PrefixIndex] = {}

    def choose(self, pinned: str, slots: dict[str, Slot], messages: Sequence[Any]) -> str:
        """The backend of a call of a session pinned to ``pinned``.

        Args:
            pinned: the session's pinned backend.
            slots: the pool's backends by name.
            messages: the call's conversation (OpenAI chat shape).

        Returns:
            A name in ``slots``, or ``pinned``.
        """
        if self.mode == "sticky":
            return pinned
        home = slots.get(pinned)
        if home is None or home.spec.paused or not home.health.healthy:
            return pinned
        candidates = [
            s
            for s in slots.values()
            if s.spec.pool == home.spec.pool
            and s.spec.policy_version == home.spec.policy_version
            and not s.spec.paused
            and s.health.healthy
        ]
        if self.mode == "round_robin":
            return candidates[next(self._turn) % len(candidates)].spec.name
        chain = message_chain(messages)
        least = min(s.num_in_flight for s in candidates)
        matches = {s.spec.name: self.index(s.spec.name).match(chain) for s in candidates}
        # the longest prefix among those within the load bound; ties to the least busy, then
        # to the pinned backend
        within = [
            s
            for s in candidates
            if s.num_in_flight < least + self.max_imbalance
            or s.num_in_flight <= REL_IMBALANCE * least
        ]
        best = max(
            within,
            key=lambda s: (matches[s.spec.name], -s.num_in_flight, s.spec.name == pinned),
        )
        self.index(best.spec.name).add(chain)
        return best.spec.name

    def index(self, name: str) -> PrefixIndex:
        """The prefix index of backend ``name`` (made on first use)."""
        index = self._indexes.get(name)
        if index is None:
            index = self._indexes[name] = PrefixIndex()
        return index

    def forget(self, names: Sequence[str]) -> None:
        """The caches of ``names`` are gone (a pause for a weight load, a removal)."""
        for name in names:
            self._indexes.pop(name, None)
