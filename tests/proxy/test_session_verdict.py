"""The gateway's verdict on a session (``GET /s/{key}/rolloutd/verdict``): ``backend`` once
its model calls have stood unanswered (failed with a backend-kind error since the last
answer) for ``backend_dead_after_s``; an answered call ends the stretch; a client error
(4xx) does not start one."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx

from rolloutd.proxy.gateway import Gateway
from rolloutd.settings import GatewaySettings
from rolloutd.types import SamplingParams
from tests.proxy.conftest import FAKE_URL, FakeLlamaCpp

DEAD_AFTER_S = 1.0


async def test_calls_unanswered_for_dead_after_s_give_the_backend_verdict(
        tmp_path: Path, tokenizer: Any) -> None:
    engine = FakeLlamaCpp(tokenizer)
    state = {"down": False}

    def handle(request: httpx.Request) -> httpx.Response:
        if state["down"] and request.url.path in ("/completion", "/health"):
            raise httpx.ConnectError("connection refused", request=request)
        return engine.handle(request)

    settings = GatewaySettings(store_url=str(tmp_path / "store"), backend_url=FAKE_URL,
                               gateway_public_url="http://gateway.test",
                               backend_dead_after_s=DEAD_AFTER_S)
    gateway = Gateway.from_settings(settings, tokenizer=tokenizer,
                                    transport=httpx.MockTransport(handle))
    transport = httpx.ASGITransport(app=gateway.app, raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as c:
            info = await gateway.sessions.open_session(
                "v/0", "v", sampling=SamplingParams(max_tokens=4))
            base = f"/s/{info.session_key}"

            async def call(text: str) -> int:
                response = await c.post(f"{base}/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": text}]})
                return response.status_code

            async def verdict() -> dict[str, Any]:
                return (await c.get(f"{base}/rolloutd/verdict")).json()

            assert await call("one") == 200
            assert (await verdict())["verdict"] is None
            bad = await c.post(f"{base}/v1/chat/completions", json={"messages": "not a list"})
            assert bad.status_code == 400
            assert (await verdict())["unanswered_s"] is None  # the harness's error: no stretch

            state["down"] = True
            assert await call("two") >= 500
            first = await verdict()
            assert first["verdict"] is None and first["unanswered_s"] is not None
            deadline = time.monotonic() + 10 * DEAD_AFTER_S
            while (now := await verdict())["verdict"] is None:
                assert time.monotonic() < deadline, now
                await asyncio.sleep(0.1)  # polling the route, bounded by the deadline
            assert now["verdict"] == "backend" and now["unanswered_s"] >= DEAD_AFTER_S
            assert "BackendUnavailableError" in now["message"]

            state["down"] = False  # back: a probe lets the next call through, and it answers
            deadline = time.monotonic() + 30
            while await call("three") != 200:
                assert time.monotonic() < deadline, "the backend's health did not come back"
                await asyncio.sleep(0.2)  # the probe's backoff, bounded by the deadline
            assert await verdict() == {"verdict": None, "unanswered_s": None,
                                       "dead_after_s": DEAD_AFTER_S, "message": None}
    finally:
        await gateway.aclose()
