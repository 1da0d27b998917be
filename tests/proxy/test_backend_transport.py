"""The backends' real HTTP transport (httpx over aiohttp) against real sockets that misbehave:
each failure reaches the harness as the same error kind httpcore's did, never a crash."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest

from rolloutd.errors import BackendError, BackendUnavailableError
from rolloutd.proxy.backends.base import GenerateRequest
from rolloutd.proxy.backends.llama_cpp import LlamaCppBackend
from rolloutd.proxy.backends.openai_compat import OpenAIChatBackend
from tests.support.loopback import loopback_server

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ANSWER = {"id": "c", "object": "chat.completion", "created": 1, "model": "m",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"},
                       "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


def _http(body: bytes, status: str = "200 OK") -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


@asynccontextmanager
async def server(answer: Callable[[bytes], bytes | None]) -> AsyncIterator[str]:
    """A loopback server that reads one request head and writes ``answer(head)`` (None:
    closes the connection without a word)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                     number: int) -> None:
        out = answer(await reader.readuntil(b"\r\n\r\n"))
        if out is not None:
            writer.write(out)
            await writer.drain()

    async with loopback_server(handle) as url:
        yield url


async def test_a_real_answer_goes_through() -> None:
    async with server(lambda head: _http(json.dumps(ANSWER).encode())) as url:
        backend = OpenAIChatBackend("b", url)
        try:
            result = await backend.chat(dict(CHAT))
        finally:
            await backend.aclose()
    assert result.message["content"] == "Hello"


async def test_a_refused_connection_is_unavailable() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    backend = OpenAIChatBackend("b", f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(BackendUnavailableError, match="unreachable"):
            await backend.chat(dict(CHAT))
    finally:
        await backend.aclose()


@pytest.mark.parametrize("answer", [
    pytest.param(lambda head: None, id="dropped-without-an-answer"),
    pytest.param(lambda head: b"NOT HTTP AT ALL\r\n\r\n", id="not-http"),
    pytest.param(lambda head: _http(b'{"content": "Hi", "tok')[:-5], id="cut-mid-body"),
])
async def test_a_backend_that_fails_mid_call_is_a_backend_error(
        answer: Callable[[bytes], bytes | None]) -> None:
    """Dropped connections, garbage and cut bodies are 502s ("failed"), not 503s: the
    backend was reached, so it is not "unreachable"."""
    async with server(answer) as url:
        backend = LlamaCppBackend("b", url, ctx_size=4096)
        try:
            with pytest.raises(BackendError) as raised:
                await backend.generate(GenerateRequest(prompt_ids=[1, 2], max_tokens=4))
        finally:
            await backend.aclose()
    assert not isinstance(raised.value, BackendUnavailableError)
    assert raised.value.status_code == 502


async def test_a_backend_that_never_answers_times_out() -> None:
    """Reached but silent past the read timeout: "timed out", a retryable 502-class error."""
    async def never(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    number: int) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.read()  # until the client gives up and closes

    async with loopback_server(never) as url:
        backend = LlamaCppBackend("b", url, ctx_size=4096, timeout_s=0.3)
        try:
            with pytest.raises(BackendError, match="timed out") as raised:
                await backend.generate(GenerateRequest(prompt_ids=[1, 2], max_tokens=4))
        finally:
            await backend.aclose()
    assert not isinstance(raised.value, BackendUnavailableError)
    assert raised.value.retryable
