"""What keeps a long-lived gateway's memory and a session's load bounded: closed sessions
leave the session maps (a late call still gets its clear error, in the caller's dialect),
and a session's calls in flight are bounded (429 in the caller's dialect, the task's
refusal). In-process gateway, fake llama.cpp."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from rolloutd.activities.gateway import GatewayActivities
from rolloutd.activities.models import CloseSessionInput
from rolloutd.fault import Fault, call_fault
from rolloutd.proxy.http.server import Gateway
from rolloutd.settings import GatewaySettings
from tests.proxy.support import FAKE_URL, FakeLlamaCpp, asgi_client


def chat(content: str) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": content}]}


def anthropic(content: str) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": content}]}


async def test_closed_sessions_leave_the_maps_and_a_late_call_is_refused_in_its_dialect(
    gateway: Gateway, client: httpx.AsyncClient
) -> None:
    """40 sessions opened, called and closed through the close activity: the maps hold
    none of them afterwards (the open one stays); a late call with a closed session's key
    gets 401 naming the closed session in the caller's dialect (OpenAI, Anthropic), and
    leaves nothing in the maps; a retried close still answers from the store."""
    activities = GatewayActivities(gateway, "h")
    keys = {}
    still_open = await gateway.sessions.open_session("soak/open", "soak")
    for n in range(40):
        info = await gateway.sessions.open_session(f"soak/{n}", "soak")
        keys[n] = info.session_key
        url = f"/s/{info.session_key}/v1/chat/completions"
        assert (await client.post(url, json=chat(f"q{n}"))).status_code == 200
        closed = await activities.close_session(CloseSessionInput(session_id=f"soak/{n}"))
        assert closed.num_completions == 1
    assert gateway.sessions.counts() == {"in_memory": 1, "open": 1, "keys": 1}
    health = (await client.get("/health")).json()
    assert health["sessions"] == {"in_memory": 1, "open": 1, "keys": 1}

    late = await client.post(f"/s/{keys[3]}/v1/chat/completions", json=chat("late"))
    assert late.status_code == 401
    error = late.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "soak/3 is closed" in error["message"]
    late = await client.post(f"/s/{keys[4]}/v1/messages", json=anthropic("late"))
    assert late.status_code == 401
    assert late.json()["type"] == "error" and "soak/4 is closed" in late.json()["error"]["message"]
    assert gateway.sessions.counts()["in_memory"] == 1

    # a close retried by Temporal after the eviction answers as the first one did
    again = await activities.close_session(CloseSessionInput(session_id="soak/5"))
    assert again.num_completions == 1
    assert gateway.sessions.counts()["in_memory"] == 1
    # the open session is untouched
    url = f"/s/{still_open.session_key}/v1/chat/completions"
    assert (await client.post(url, json=chat("still here"))).status_code == 200


async def test_a_key_whose_session_the_gateway_lost_is_the_infrastructures(
    gateway: Gateway, client: httpx.AsyncClient
) -> None:
    """The key index names a session whose state is gone (the gateway lost it): 404 in the
    caller's dialect, an error class the fault rule charges to the infrastructure."""
    info = await gateway.sessions.open_session("lost/0", "lost")
    gateway.sessions.forget("lost/0")
    for path in Path(gateway.store.url).rglob("session.json"):
        path.unlink()
    response = await client.post(f"/s/{info.session_key}/v1/chat/completions", json=chat("hi"))
    assert response.status_code == 404, response.text
    assert "lost/0 is lost" in response.json()["error"]["message"]
    assert call_fault("SessionLostError", 404) is Fault.INFRASTRUCTURE


async def test_a_sessions_calls_in_flight_are_bounded_with_a_429_in_the_callers_dialect(
    tmp_path: Path, tokenizer: Any
) -> None:
    """With ``max_calls_per_session`` 2 and two calls in flight, a third call gets 429 in
    its dialect's shape (OpenAI chat, Anthropic), the session records it as a refusal the
    task caused (not the infrastructure's: never retried, never replaced), and once a call
    ends the next one is answered."""
    fake = FakeLlamaCpp(tokenizer)
    settings = GatewaySettings(
        store_url=str(tmp_path / "store"),
        backend_url=FAKE_URL,
        gateway_public_url="http://gateway.test",
        max_calls_per_session=2,
    )
    gateway = Gateway.from_settings(settings, tokenizer=tokenizer, transport=fake.transport)
    try:
        async with asgi_client(gateway) as client:
            info = await gateway.sessions.open_session("bound/0", "bound")
            session = await gateway.sessions.get("bound/0")
            session.begin_call()  # two calls in flight (sub-agents waiting on the backend)
            session.begin_call()
            url = f"/s/{info.session_key}/v1/chat/completions"
            refused = await client.post(url, json=chat("third"))
            assert refused.status_code == 429, refused.text
            error = refused.json()["error"]
            assert error["type"] == "rate_limit_error"
            assert "2 model calls in flight" in error["message"]
            refused = await client.post(f"/s/{info.session_key}/v1/messages", json=anthropic("x"))
            assert refused.status_code == 429
            assert refused.json()["error"]["type"] == "rate_limit_error"
            [first, second] = session.state.errors
            assert (first.error_type, first.status_code) == ("TooManyCallsError", 429)
            assert call_fault(first.error_type, first.status_code) is Fault.TASK
            session.end_call()
            assert (await client.post(url, json=chat("fourth"))).status_code == 200
            session.end_call()
            closed = await GatewayActivities(gateway, "h").close_session(
                CloseSessionInput(session_id="bound/0")
            )
            assert closed.num_unrecovered_errors == 0
            assert closed.last_refusal is not None and "429 TooManyCallsError" in (
                closed.last_refusal
            )
    finally:
        await gateway.aclose()
