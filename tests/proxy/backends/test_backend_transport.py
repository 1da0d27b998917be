"""The backends' one HTTP path (httpx over aiohttp) against real sockets: GETs, model calls
and streams share one pool, and each failure reaches the harness as the same error kind
httpcore's did, never a crash."""

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
from rolloutd.proxy.backends.vllm import VllmBackend
from tests.support.loopback import loopback_server, read_request

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
ANSWER = {
    "id": "c",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Hello"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


def _http(body: bytes, status: str = "200 OK") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


@asynccontextmanager
async def server(answer: Callable[[bytes], bytes | None]) -> AsyncIterator[str]:
    """A loopback server that reads one request head and writes ``answer(head)`` (None:
    closes the connection without a word)."""

    async def handle(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int
    ) -> None:
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


def _chunk(delta: dict[str, str], finish: str | None = None) -> bytes:
    return (
        b"data: "
        + json.dumps(
            {
                "id": "c",
                "object": "chat.completion.chunk",
                "created": 1,
                "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
        ).encode()
        + b"\n\n"
    )


async def test_a_get_and_a_stream_go_over_one_pooled_connection() -> None:
    """``GET /v1/models``, then a streamed chat call: one connection serves both."""
    connections: list[int] = []
    models = json.dumps({"data": [{"id": "m", "max_model_len": 4096}]}).encode()
    events = (
        _chunk({"role": "assistant", "content": "Hel"})
        + _chunk({"content": "lo"}, "stop")
        + b"data: [DONE]\n\n"
    )

    async def handle(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int
    ) -> None:
        while True:
            head, _ = await read_request(reader)
            connections.append(number)
            if head.startswith(b"GET /v1/models "):
                writer.write(_http(models))
            else:
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Content-Length: %d\r\n\r\n%s" % (len(events), events)
                )
            await writer.drain()

    async with loopback_server(handle) as url:
        backend = VllmBackend("b", url)
        try:
            assert await backend.context_size() == 4096
            deltas = [delta async for delta in backend.chat_stream(dict(CHAT))]
        finally:
            await backend.aclose()
    assert "".join(d.content for d in deltas) == "Hello"
    assert deltas[-1].result is not None
    assert deltas[-1].result.message["content"] == "Hello"
    assert connections == [1, 1]


async def test_a_stream_cut_short_is_a_backend_error() -> None:
    """The connection drops in the middle of a stream's body: "failed", not "unreachable"."""

    async def handle(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int
    ) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Content-Length: 10000\r\n\r\n" + _chunk({"content": "Hel"})
        )
        await writer.drain()

    async with loopback_server(handle) as url:
        backend = OpenAIChatBackend("b", url)
        try:
            with pytest.raises(BackendError) as raised:
                _ = [delta async for delta in backend.chat_stream(dict(CHAT))]
        finally:
            await backend.aclose()
    assert not isinstance(raised.value, BackendUnavailableError)
    assert raised.value.status_code == 502


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


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(lambda head: None, id="dropped-without-an-answer"),
        pytest.param(lambda head: b"NOT HTTP AT ALL\r\n\r\n", id="not-http"),
        pytest.param(lambda head: _http(b'{"content": "Hi", "tok')[:-5], id="cut-mid-body"),
    ],
)
async def test_a_backend_that_fails_mid_call_is_a_backend_error(
    answer: Callable[[bytes], bytes | None],
) -> None:
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

    async def never(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, number: int
    ) -> None:
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
