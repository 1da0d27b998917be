"""Routing modes of the backend pool: which backend a session's call asks a lease of
(pure choice over the pool's slots; the replay benchmark, benchmarks/prefix_routing.py,
measures what each mode does to real llama-servers' prefix caches)."""

from __future__ import annotations

from typing import Any

import pytest

from rolloutd.proxy.backends.pool import BackendPool
from rolloutd.proxy.backends.routing import PrefixIndex, Router, message_chain
from rolloutd.proxy.backends.specs import make_backend
from rolloutd.settings import GatewaySettings


def pool(mode: str, *, max_imbalance: int = 4, names: str = "abc") -> BackendPool:
    return BackendPool(
        [make_backend("llama_cpp", n, f"http://127.0.0.1:9/{n}") for n in names],
        router=Router(mode, max_imbalance=max_imbalance),  # type: ignore[arg-type]
    )


def conversation(task: str, turns: int) -> list[dict[str, Any]]:
    messages = [{"role": "system", "content": "You are an agent."}]
    messages.append({"role": "user", "content": f"Task {task}"})
    for i in range(turns):
        messages.append({"role": "assistant", "content": f"step {i}"})
        messages.append({"role": "tool", "content": f"output {i} of {task}"})
    return messages


def test_message_chain_prefixes_hash_equal_and_weigh_characters() -> None:
    a, b = message_chain(conversation("x", 2)), message_chain(conversation("x", 1))
    assert a[: len(b)] == b and len(a) == len(b) + 2
    assert a[-1][1] == sum(len(m["content"]) for m in conversation("x", 2))
    assert message_chain(conversation("y", 1))[1][0] != b[1][0]
    index = PrefixIndex(limit=3)
    index.add(b)  # 4 prefixes, the oldest dropped
    assert index.match(b) == b[-1][1] and index.match(b[:1]) == 0


def test_sticky_keeps_the_pinned_backend() -> None:
    backends = pool("sticky")
    assert {backends.route("b", conversation("x", i)) for i in range(5)} == {"b"}


def test_round_robin_turns_through_the_backends() -> None:
    backends = pool("round_robin")
    assert [backends.route("a", conversation("x", i)) for i in range(6)] == list("abcabc")


def test_cache_aware_follows_the_prefix_within_the_load_bound() -> None:
    backends = pool("cache_aware", max_imbalance=2)
    slots = backends._slots
    # a new conversation: no backend holds it, the least busy takes it (pinned one on a tie)
    slots["a"].num_in_flight = 1
    first = backends.route("a", conversation("x", 0))
    assert first == "b"
    # its next turns go where its prefix is, though the pinned backend is idle
    slots["a"].num_in_flight = 0
    assert [backends.route("a", conversation("x", i)) for i in range(1, 4)] == ["b"] * 3
    # another session with the same system prompt and task (a group's sample) joins it
    assert backends.route("c", conversation("x", 0)) == "b"
    # a busy holder (2 calls beyond the least busy) is passed over for the least busy
    slots["b"].num_in_flight = 2
    moved = backends.route("a", conversation("x", 4))
    assert moved in {"a", "c"}
    # ... which now holds the prefix too, and keeps it once the load evens out
    slots["b"].num_in_flight = 0
    slots[moved].num_in_flight = 0
    assert backends.route("a", conversation("x", 5)) == moved


@pytest.mark.parametrize("mode", ["round_robin", "cache_aware"])
async def test_paused_unhealthy_or_other_version_backends_are_not_chosen(mode: str) -> None:
    backends = pool(mode)
    await backends.set_paused(True, ["b"])
    await backends.set_policy_version(3, ["c"])
    assert {backends.route("a", conversation(str(i), 1)) for i in range(6)} == {"a"}
    # a session pinned to a paused backend waits for it, as in sticky mode
    assert backends.route("b", conversation("x", 1)) == "b"


async def test_a_pause_forgets_what_a_backend_held() -> None:
    backends = pool("cache_aware", names="ab")
    assert backends.route("a", conversation("x", 0)) == "a"
    backends._slots["a"].num_in_flight = 1  # b is less busy, a holds the prefix
    assert backends.route("b", conversation("x", 1)) == "a"
    await backends.set_paused(True, ["a"])
    await backends.set_paused(False, ["a"])
    assert backends.route("b", conversation("x", 2)) == "b"


def test_settings_choose_the_mode() -> None:
    settings = GatewaySettings(backend_url="http://a,http://b", routing="cache_aware")
    backends = BackendPool.from_settings(settings)
    assert backends.router.mode == "cache_aware" and backends.router.max_imbalance == 8
    with pytest.raises(ValueError, match="max_imbalance"):
        Router("cache_aware", max_imbalance=0)
