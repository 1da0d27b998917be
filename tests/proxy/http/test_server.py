"""serve(): uvicorn inside the running event loop, on a real socket."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from rolloutd.errors import ConfigError
from rolloutd.proxy.http.server import Gateway, serve, served_model_name
from rolloutd.settings import GatewaySettings
from rolloutd.workers import loop_factory


async def test_serve_binds_answers_and_shuts_down(gateway: Gateway) -> None:
    handle = await serve(gateway, host="127.0.0.1", port=0)
    try:
        assert handle.port > 0
        async with httpx.AsyncClient(base_url=handle.url, timeout=10) as http:
            assert (await http.get("/health")).json()["status"] == "ok"
            # gateway_public_url is set in the fixture: session URLs keep it
            info = await gateway.sessions.open_session("served/0", "served")
            assert info.openai_base_url.startswith("http://gateway.test/s/")
            answer = await http.post(
                f"/s/{info.session_key}/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "hi"}]},
            )
            assert answer.json()["choices"][0]["message"]["content"] == "Hello there!"
    finally:
        await handle.shutdown()
    assert handle.task.done()
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient(timeout=2) as http:
            await http.get(f"{handle.url}/health")


async def test_serve_sets_the_public_url_from_the_bound_port(
    tmp_path: Path, tokenizer: Any, fake_llama: Any
) -> None:
    settings = GatewaySettings(store_url=str(tmp_path), backend_url="http://fake-llama")
    gw = Gateway.from_settings(settings, tokenizer=tokenizer, transport=fake_llama.transport)
    handle = await serve(gw, host="127.0.0.1", port=0)
    try:
        info = await gw.sessions.open_session("p/0", "p")
        assert info.openai_base_url == f"http://127.0.0.1:{handle.port}/s/{info.session_key}/v1"
    finally:
        await handle.shutdown()
        await gw.aclose()


async def test_serve_refuses_admin_routes_off_loopback_without_a_token(
    tmp_path: Path, tokenizer: Any, fake_llama: Any
) -> None:
    settings = GatewaySettings(
        store_url=str(tmp_path), backend_url="http://fake-llama", admin_token=None
    )
    gw = Gateway.from_settings(settings, tokenizer=tokenizer, transport=fake_llama.transport)
    try:
        with pytest.raises(ConfigError, match="ROLLOUTD_ADMIN_TOKEN"):
            await serve(gw, host="0.0.0.0", port=0)
        gw.settings = settings.model_copy(update={"admin_token": "t"})
        handle = await serve(gw, host="0.0.0.0", port=0)  # with a token it serves
        await handle.shutdown()
    finally:
        await gw.aclose()


async def test_serve_on_a_busy_port_raises(gateway: Gateway) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        with pytest.raises(OSError):
            await serve(gateway, host="127.0.0.1", port=busy.getsockname()[1])


def test_served_model_name() -> None:
    assert served_model_name("qwen2.5-coder-0.5b") == "Qwen2.5-Coder-0.5B-Instruct"
    assert served_model_name("/models/mine") == "/models/mine"


def test_the_gateway_fleet_runs_on_uvloop_the_workflows_fleet_on_asyncio() -> None:
    import uvloop  # a dependency (pyproject.toml): its absence is a failure, not a skip

    assert loop_factory("gateway") is uvloop.new_event_loop
    assert loop_factory("workflows") is None


def test_the_gateway_process_serves_with_httptools_on_uvloop(
    tmp_path: Path, tokenizer: Any, fake_llama: Any
) -> None:
    # as `rolloutd worker --fleet gateway` runs it (rolloutd.workers.run_process)
    async def serve_one_call() -> tuple[str, str, str]:
        settings = GatewaySettings(store_url=str(tmp_path), backend_url="http://fake-llama")
        gw = Gateway.from_settings(settings, tokenizer=tokenizer, transport=fake_llama.transport)
        handle = await serve(gw, host="127.0.0.1", port=0)
        try:
            info = await gw.sessions.open_session("uv/0", "uv")
            async with httpx.AsyncClient(base_url=handle.url, timeout=10) as http:
                answer = await http.post(
                    f"/s/{info.session_key}/v1/chat/completions",
                    json={"messages": [{"role": "user", "content": "hi"}]},
                )
            return (
                handle.http_parser,
                handle.event_loop,
                answer.json()["choices"][0]["message"]["content"],
            )
        finally:
            await handle.shutdown()
            await gw.aclose()

    with asyncio.Runner(loop_factory=loop_factory("gateway")) as runner:
        parser, loop, content = runner.run(serve_one_call())
    assert (parser, loop, content) == ("httptools", "uvloop.Loop", "Hello there!")


def test_startup_objects_are_frozen_and_later_garbage_is_still_collected() -> None:
    """What the gateway fleet's process does once started (run in a child process: freezing
    is for a whole process's life): the objects held then leave the collector's walks, and
    cycles made afterwards are collected as before."""
    code = (
        "import gc, json\n"
        "from rolloutd.workers import freeze_startup_objects\n"
        "kept = [[i] for i in range(50_000)]\n"
        "frozen = freeze_startup_objects()\n"
        "class Node: pass\n"
        "node = Node(); node.me = node; del node\n"
        "print(json.dumps({'frozen': frozen, 'collected': gc.collect(),\n"
        "                  'tracked': len(gc.get_objects())}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["frozen"] >= 50_000
    assert out["collected"] >= 1
    assert out["tracked"] < 5_000
