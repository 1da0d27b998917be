"""The one httpx client factory (rolloutd.http_client): each profile's timeouts, a call's own
budget, and the backends' client class and transport kept."""

from __future__ import annotations

import httpx

from rolloutd.http_client import (
    BACKEND_CALL,
    CALLBACK,
    CONTROL,
    HEALTH_PROBE,
    PROFILES,
    new_async_client,
)
from rolloutd.proxy.backends.http import BackendClient, BackendTransport, new_client


async def test_each_profile_bounds_every_phase():
    assert set(PROFILES) == {"backend_call", "health_probe", "control", "callback"}
    for profile, seconds in ((HEALTH_PROBE, 5.0), (CONTROL, 120.0), (CALLBACK, 30.0)):
        async with new_async_client(profile) as client:
            assert client.timeout == httpx.Timeout(seconds)
            assert not client.follow_redirects


async def test_a_calls_own_budget_keeps_the_connect_cap():
    assert BACKEND_CALL.timeout(30.0) == httpx.Timeout(30.0, connect=10.0)
    assert BACKEND_CALL.timeout(3.0) == httpx.Timeout(3.0, connect=3.0)
    async with new_async_client(CONTROL, timeout_s=7.5, base_url="http://127.0.0.1:9") as client:
        assert client.timeout == httpx.Timeout(7.5)
        assert client.base_url == "http://127.0.0.1:9"


async def test_the_backend_client_keeps_its_class_and_transport():
    client = new_client("http://127.0.0.1:9", 60.0, None)
    try:
        assert isinstance(client, BackendClient)
        assert isinstance(client._transport, BackendTransport)
        assert client.timeout == httpx.Timeout(60.0, connect=10.0, pool=60.0)
    finally:
        await client.aclose()
