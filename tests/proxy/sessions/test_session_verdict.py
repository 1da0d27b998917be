"""The gateway's verdict on a session (``GET /s/{key}/rolloutd/verdict``): ``backend`` once
its model calls have stood unanswered (failed with a backend-kind error since the last
answer) for ``backend_dead_after_s``; an answered call ends the stretch; a client error
(4xx) does not start one."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from rolloutd.proxy.http.server import Gateway
from rolloutd.settings import GatewaySettings
from rolloutd.types import SamplingParams
from tests.proxy.support import FAKE_URL, FakeLlamaCpp, asgi_client

DEAD_AFTER_S = 1.0


@contextlib.asynccontextmanager
async def verdict_rig(
    tmp_path: Path, tokenizer: Any, handle: Any, task: str
) -> AsyncIterator[tuple[Gateway, httpx.AsyncClient, str]]:
    """A gateway whose backend is ``handle`` (an ``httpx.MockTransport`` handler), a client of
    it, and the base path of session ``{task}/0`` (``max_tokens`` 4); the gateway is closed
    at the end."""
    settings = GatewaySettings(
        store_url=str(tmp_path / "store"),
        backend_url=FAKE_URL,
        gateway_public_url="http://gateway.test",
        backend_dead_after_s=DEAD_AFTER_S,
    )
    gateway = Gateway.from_settings(
        settings, tokenizer=tokenizer, transport=httpx.MockTransport(handle)
    )
    try:
        async with asgi_client(gateway) as c:
            info = await gateway.sessions.open_session(
                f"{task}/0", task, sampling=SamplingParams(max_tokens=4)
            )
            yield gateway, c, f"/s/{info.session_key}"
    finally:
        await gateway.aclose()


async def test_calls_unanswered_for_dead_after_s_give_the_backend_verdict(
    tmp_path: Path, tokenizer: Any
) -> None:
    engine = FakeLlamaCpp(tokenizer)
    state = {"down": False}

    def handle(request: httpx.Request) -> httpx.Response:
        if state["down"] and request.url.path in ("/completion", "/health"):
            raise httpx.ConnectError("connection refused", request=request)
        return engine.handle(request)

    async with verdict_rig(tmp_path, tokenizer, handle, "v") as (_, c, base):

        async def call(text: str) -> int:
            response = await c.post(
                f"{base}/v1/chat/completions",
                json={"messages": [{"role": "user", "content": text}]},
            )
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
        assert await verdict() == {
            "verdict": None,
            "unanswered_s": None,
            "dead_after_s": DEAD_AFTER_S,
            "message": None,
        }


async def test_a_call_queued_on_a_saturated_engine_is_not_unanswered_a_hung_one_is(
    tmp_path: Path, tokenizer: Any
) -> None:
    engine = FakeLlamaCpp(tokenizer)
    state = {"health": True}
    release = asyncio.Event()

    async def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            if not state["health"]:
                raise httpx.ReadTimeout("no answer", request=request)
            return httpx.Response(200, json={"status": "ok"})
        if request.url.path == "/completion":
            await release.wait()  # every slot busy: the call queues
        return engine.handle(request)

    async with verdict_rig(tmp_path, tokenizer, handle, "w") as (gateway, c, base):
        queued = asyncio.ensure_future(
            c.post(
                f"{base}/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "hi"}]},
            )
        )
        started = time.monotonic()
        while time.monotonic() - started < 3 * DEAD_AFTER_S:  # saturated: answers probes
            assert (await c.get(f"{base}/rolloutd/verdict")).json()["verdict"] is None
            await asyncio.sleep(0.2)  # sampling the verdict over a span, not waiting
        state["health"] = False  # hung: the next probe gets no answer
        deadline = time.monotonic() + 30  # a probe answered less than 5 s ago stands
        while (verdict := (await c.get(f"{base}/rolloutd/verdict")).json())["verdict"] is None:
            assert time.monotonic() < deadline, verdict
            await asyncio.sleep(0.2)  # polling the route, bounded by the deadline
        assert verdict["verdict"] == "backend", verdict
        assert verdict["unanswered_s"] >= 3 * DEAD_AFTER_S
        # the waited call is cancelled: the session's close does not wait for it
        await asyncio.wait_for(gateway.sessions.close_session("w/0"), 10)
        release.set()
        await asyncio.wait_for(asyncio.gather(queued, return_exceptions=True), 10)
