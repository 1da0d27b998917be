"""The session's base URL itself, which clients probe before their first model call.

Claude Code 2.1 sends ``HEAD {ANTHROPIC_BASE_URL}`` at startup to warm the connection (the
Anthropic and Gemini base URLs are ``/s/{key}``); the gateway answers it like any session
route: 200 for a valid key, 401 in the error shape otherwise, and nothing is recorded.
"""

from __future__ import annotations

import httpx
import pytest

from rolloutd.proxy.http.server import Gateway
from rolloutd.store import CompletionLog
from rolloutd.types import SamplingParams


@pytest.mark.parametrize("method", ["HEAD", "GET"])
@pytest.mark.parametrize("slash", ["", "/"])
async def test_base_url_answers_a_valid_key(
    gateway: Gateway, client: httpx.AsyncClient, method: str, slash: str
) -> None:
    info = await gateway.sessions.open_session("probe/0", "probe", sampling=SamplingParams())
    assert (
        info.anthropic_base_url
        == info.gemini_base_url
        == f"http://gateway.test/s/{info.session_key}"
    )
    response = await client.request(method, f"/s/{info.session_key}{slash}")
    assert response.status_code == 200, response.text
    if method == "HEAD":
        assert response.content == b""
    else:
        assert response.json() == {"status": "ok"}
    assert len(CompletionLog(gateway.store, "probe/0")) == 0


@pytest.mark.parametrize("method", ["HEAD", "GET"])
async def test_base_url_refuses_a_wrong_key(
    gateway: Gateway, client: httpx.AsyncClient, method: str
) -> None:
    await gateway.sessions.open_session("probe/0", "probe", sampling=SamplingParams())
    response = await client.request(method, "/s/wrong-key")
    assert response.status_code == 401
    if method == "GET":
        assert response.json()["error"]["code"] == "invalid_api_key"
