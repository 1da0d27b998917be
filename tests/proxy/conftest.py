"""Fixtures of the gateway tests: the real Qwen tokenizer, a gateway over the scripted
llama.cpp, a real llama-server (started once per test session, stopped by its pid at the end)
and a gateway over it. What tests share besides fixtures is in :mod:`tests.proxy.support`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rolloutd.proxy.http.server import Gateway
from rolloutd.proxy.render.chat_template import ChatTemplate
from rolloutd.settings import GatewaySettings
from tests.proxy.support import (
    FAKE_URL,
    MODEL,
    FakeLlamaCpp,
    RecordingTransport,
    asgi_client,
    make_engine_gateway,
    start_llama_server,
)


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from rolloutd.engine.models import load_tokenizer

    return load_tokenizer(MODEL)


@pytest.fixture(scope="session")
def template(tokenizer: Any) -> ChatTemplate:
    return ChatTemplate(tokenizer)


@pytest.fixture
def recording_transport() -> RecordingTransport:
    return RecordingTransport()


@pytest.fixture
def fake_llama(tokenizer: Any) -> FakeLlamaCpp:
    return FakeLlamaCpp(tokenizer)


@pytest.fixture
async def gateway(
    tmp_path: Path, tokenizer: Any, fake_llama: FakeLlamaCpp
) -> AsyncIterator[Gateway]:
    settings = GatewaySettings(
        store_url=str(tmp_path / "store"),
        backend_url=FAKE_URL,
        gateway_public_url="http://gateway.test",
    )
    gw = Gateway.from_settings(settings, tokenizer=tokenizer, transport=fake_llama.transport)
    yield gw
    await gw.aclose()


@pytest.fixture
async def client(gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(gateway) as c:
        yield c


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real llama-server on the Qwen2.5-Coder-0.5B GGUF (2 slots, 4096 tokens each)."""
    server = start_llama_server(tmp_path_factory, parallel=2, ctx_size=8192)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def engine_tool_parser() -> str | None:
    """The tool parser of :func:`engine_gateway` (a module overrides it; None: the model's)."""
    return "hermes_lenient"


@pytest.fixture
async def engine_gateway(
    tmp_path: Path,
    tokenizer: Any,
    llama_server: Any,
    recording_transport: RecordingTransport,
    engine_tool_parser: str | None,
) -> AsyncIterator[Gateway]:
    """A gateway over the real llama-server, its exchanges recorded by
    ``recording_transport``."""
    gw = make_engine_gateway(
        tmp_path / "store",
        llama_server,
        tokenizer,
        recording_transport,
        tool_parser=engine_tool_parser,
    )
    yield gw
    await gw.aclose()


@pytest.fixture
async def engine_client(engine_gateway: Gateway) -> AsyncIterator[httpx.AsyncClient]:
    """An in-process client of :func:`engine_gateway` (timeout 120 s)."""
    async with asgi_client(engine_gateway, timeout=120) as client:
        yield client
