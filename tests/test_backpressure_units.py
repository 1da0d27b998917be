"""Backpressure rules without servers: the buffer's in-flight target, the gateway's bound of
open sessions with configured slots, and the settings' bounds (docs/tenancy.md)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from rolloutd.proxy.backends.pool import BackendPool
from rolloutd.proxy.backends.saturation import BackendCapacity
from rolloutd.proxy.backends.specs import make_backend
from rolloutd.settings import GatewaySettings
from rolloutd.workflows.buffer.capacity import target
from rolloutd.workflows.buffer.models import BufferConfig


@pytest.mark.parametrize(
    ("num_in_flight", "num_samples", "sessions", "expected"),
    [
        (10, 1, 2, 4),  # 2 x 2 sessions / 1 per task
        (10, 8, 16, 4),  # 2 x 16 / 8
        (10, 8, 3, 1),  # fewer sessions than one task: still one task
        (10, 4, 100, 10),  # the configured target caps it
        (10, 4, None, 10),  # nothing observed: the configured target
        (10, 3, 4, 3),  # ceil(8 / 3)
    ],
)
def test_the_in_flight_target(
    num_in_flight: int, num_samples: int, sessions: int | None, expected: int
) -> None:
    assert target(num_in_flight, num_samples, sessions) == expected


async def test_the_bound_counts_configured_slots_of_every_backend() -> None:
    pool = BackendPool(
        [
            make_backend("openai", "a", "http://127.0.0.1:9"),
            make_backend("openai", "b", "http://127.0.0.1:10"),
        ]
    )
    capacity = BackendCapacity(pool, max_sessions_per_slot=1.5, backend_slots=3)
    try:
        await capacity.refresh()
        assert capacity.check().max_sessions == 9  # ceil(1.5 x (3 + 3))
        for _ in range(8):
            pool.assign()
        assert not capacity.check().saturated
        pool.assign()
        load = capacity.check()
        assert (load.num_sessions_open, load.num_slots, load.saturated) == (9, 6, True)
        pool.release("a")
        assert not capacity.check().saturated
        unbounded = BackendCapacity(pool, max_sessions_per_slot=None, backend_slots=None)
        await unbounded.refresh()  # OpenAI-compatible backends count 1 slot, asked nothing
        assert (unbounded.check().max_sessions, unbounded.check().num_slots) == (None, 2)
    finally:
        await pool.aclose()


def test_settings_and_config_bounds() -> None:
    with pytest.raises(ValidationError):
        GatewaySettings(max_sessions_per_slot=0)
    with pytest.raises(ValidationError):
        GatewaySettings(backend_slots=0)
    with pytest.raises(ValidationError, match="adapt_in_flight needs num_samples"):
        BufferConfig(buffer_id="b", adapt_in_flight=True)
    assert BufferConfig(buffer_id="b", adapt_in_flight=True, num_samples=4).adapt_in_flight
