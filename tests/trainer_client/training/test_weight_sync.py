"""The weight-sync protocol over the gateway's admin API (in-process, fake llama.cpp upstream),
and the vLLM and SGLang loaders against test doubles of their documented endpoints.

The doubles stand in for servers this machine cannot run (no GPU). Shapes:
- SGLang "Native APIs": ``POST /update_weights_from_disk`` ``{model_path, load_format?,
  weight_version?}`` -> ``{success, message}`` (400 with ``success: false`` on failure);
  ``POST /flush_cache``.
- vLLM server in ``VLLM_SERVER_DEV_MODE=1``: ``POST /collective_rpc`` ``{method, args, kwargs,
  timeout}`` -> ``{results: [...]}``; ``POST /reset_prefix_cache``; without dev mode the routes
  do not exist (404).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rolloutd.engine.models import load_tokenizer
from rolloutd.errors import StackError
from rolloutd.proxy.http.server import Gateway
from rolloutd.store import CompletionLog
from rolloutd.trainer_client.admin import BackendAdmin
from rolloutd.trainer_client.training.weight_sync import (
    EngineLoader,
    SglangLoader,
    VllmLoader,
    WeightSync,
    WeightSyncError,
)
from tests.proxy.support import (
    ADMIN_TOKEN,
    MODEL,
    Backends,
    FakeLlamaCpp,
    chat,
    make_admin_gateway,
    poll,
)


class RecordingControl:
    """An engine control that records each load, can fail, and can be held mid-load."""

    def __init__(self) -> None:
        self.loads: list[tuple[Path, int]] = []
        self.fail = False

    def load_model(self, model_file: Path, policy_version: int, timeout_s: float = 120.0) -> None:
        if self.fail:
            raise StackError("engine not ready after a reload")
        self.loads.append((model_file, policy_version))


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_tokenizer(MODEL)


@pytest.fixture
def backends(tokenizer: Any) -> Backends:
    return Backends(FakeLlamaCpp(tokenizer))


@pytest.fixture
async def gw(tmp_path: Path, tokenizer: Any, backends: Backends) -> AsyncIterator[Gateway]:
    gateway = make_admin_gateway(tmp_path / "store", tokenizer, backends)
    yield gateway
    await gateway.aclose()


@pytest.fixture
async def http(gw: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=gw.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as c:
        yield c


@pytest.fixture
async def admin(gw: Gateway) -> AsyncIterator[BackendAdmin]:
    async with BackendAdmin(
        "http://gateway.test", ADMIN_TOKEN, transport=httpx.ASGITransport(app=gw.app)
    ) as a:
        yield a


async def test_update_waits_for_calls_in_flight_then_stamps_the_new_version(
    admin: BackendAdmin, gw: Gateway, http: httpx.AsyncClient, backends: Backends
) -> None:
    control = RecordingControl()
    sync = WeightSync(admin, [EngineLoader(control)])
    a = await gw.sessions.open_session("t/0", "t")
    b = await gw.sessions.open_session("t/1", "t")
    backends.hold = asyncio.Event()
    in_flight = asyncio.create_task(chat(http, a.session_key))
    await poll(lambda: len(backends.hosts) == 1)
    update = asyncio.create_task(sync.update("/w/p1.gguf", policy_version=1))
    await poll(lambda: gw.pool.describe()[0]["paused"])
    waiting = asyncio.create_task(chat(http, b.session_key))
    for _ in range(50):
        await asyncio.sleep(0)
    assert control.loads == []  # nothing loads while a call is in flight
    backends.hold.set()
    await update
    assert control.loads == [(Path("/w/p1.gguf"), 1)]
    assert (await in_flight).status_code == 200 and (await waiting).status_code == 200
    versions = [CompletionLog(gw.store, s).read_all()[0].policy_version for s in ("t/0", "t/1")]
    assert versions == [0, 1]
    assert not gw.pool.describe()[0]["paused"]


async def test_a_failed_load_keeps_the_backends_paused_until_abort(
    admin: BackendAdmin, gw: Gateway
) -> None:
    control = RecordingControl()
    control.fail = True
    sync = WeightSync(admin, [EngineLoader(control)])
    with pytest.raises(WeightSyncError, match="did not load"):
        await sync.update("/w/p1.gguf", policy_version=1)
    [backend] = gw.pool.describe()
    assert backend["paused"] and backend["policy_version"] == 0
    await sync.abort()
    [backend] = gw.pool.describe()
    assert not backend["paused"] and backend["policy_version"] == 0


async def test_a_drain_that_times_out_raises_and_stays_paused(
    admin: BackendAdmin, gw: Gateway, http: httpx.AsyncClient, backends: Backends
) -> None:
    control = RecordingControl()
    sync = WeightSync(admin, [EngineLoader(control)], drain_timeout_s=0.05)
    a = await gw.sessions.open_session("t/0", "t")
    backends.hold = asyncio.Event()
    in_flight = asyncio.create_task(chat(http, a.session_key))
    await poll(lambda: len(backends.hosts) == 1)
    with pytest.raises(WeightSyncError, match="still in flight"):
        await sync.update("/w/p1.gguf", policy_version=1)
    assert control.loads == [] and gw.pool.describe()[0]["paused"]
    backends.hold.set()
    assert (await in_flight).status_code == 200


def sglang_double(
    seen: list[tuple[str, dict[str, Any]]], *, success: bool = True
) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        seen.append((request.url.path, body))
        if request.url.path == "/update_weights_from_disk":
            if not success:
                return httpx.Response(
                    400, json={"success": False, "message": "Failed to load weights"}
                )
            return httpx.Response(
                200,
                json={
                    "success": True,
                    "message": "Succeeded to update model weights.",
                    "num_paused_requests": 0,
                },
            )
        if request.url.path == "/flush_cache":
            return httpx.Response(200, text="Cache flushed.")
        return httpx.Response(404, json={"detail": "Not Found"})

    return httpx.MockTransport(handle)


async def test_sglang_loads_from_disk_and_flushes_its_cache() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []
    loader = SglangLoader("http://sglang:30000", transport=sglang_double(seen))
    await loader.load(Path("/ckpt/step-3"), 3)
    assert seen == [
        ("/update_weights_from_disk", {"model_path": "/ckpt/step-3", "weight_version": "3"}),
        ("/flush_cache", {}),
    ]
    failing = SglangLoader("http://sglang:30000", transport=sglang_double([], success=False))
    with pytest.raises(WeightSyncError, match="Failed to load weights"):
        await failing.load(Path("/ckpt/step-4"), 4)
    await loader.aclose()
    await failing.aclose()


async def test_vllm_reloads_through_collective_rpc_and_resets_its_prefix_cache() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else {}
        seen.append((request.url.path, body))
        if request.url.path == "/collective_rpc":
            return httpx.Response(200, json={"results": [None]})
        if request.url.path == "/reset_prefix_cache":
            return httpx.Response(200)
        return httpx.Response(404, json={"detail": "Not Found"})

    loader = VllmLoader("http://vllm:8000", transport=httpx.MockTransport(handle), rpc_timeout_s=60)
    await loader.load(Path("/ckpt/step-3"), 3)
    assert [(path, body.get("method")) for path, body in seen] == [
        ("/collective_rpc", "update_config"),
        ("/collective_rpc", "reload_weights"),
        ("/reset_prefix_cache", None),
    ]
    assert seen[0][1] == {
        "method": "update_config",
        "kwargs": {},
        "timeout": 60,
        "args": [{"model_config": {"model": "/ckpt/step-3"}}],
    }
    await loader.aclose()

    no_dev_mode = VllmLoader(
        "http://vllm:8000",
        transport=httpx.MockTransport(
            lambda request: httpx.Response(404, json={"detail": "Not Found"})
        ),
    )
    with pytest.raises(WeightSyncError, match="404"):
        await no_dev_mode.load(Path("/ckpt/step-4"), 4)
    await no_dev_mode.aclose()
