"""Fixtures of the gateway tests: the real Qwen tokenizer, a fake llama.cpp, a real llama-server.

The fake llama.cpp (:class:`FakeLlamaCpp`) answers ``/props`` and ``/completion`` like
llama-server does (field names checked against the real server), from a script of texts, so
app tests run in milliseconds. Engine tests (``@pytest.mark.engine``) use the real server,
started once per test session and stopped by its pid at the end.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rolloutd.proxy.backends.llama_cpp import STREAM_SLACK_TOKENS
from rolloutd.proxy.http.server import Gateway
from rolloutd.proxy.render.chat_template import ChatTemplate
from rolloutd.settings import GatewaySettings

MODEL = "qwen2.5-coder-0.5b"
FAKE_URL = "http://fake-llama"


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from rolloutd.engine.models import load_tokenizer

    return load_tokenizer(MODEL)


@pytest.fixture(scope="session")
def template(tokenizer: Any) -> ChatTemplate:
    return ChatTemplate(tokenizer)


class FakeLlamaCpp:
    """An httpx transport that answers like llama-server's ``/completion`` and ``/props``.

    Args:
        tokenizer: encodes the scripted answers.
        n_ctx: context per slot reported by ``/props``.

    Attributes:
        answers: texts to sample next, in order (the last one repeats).
        end_of_turn_id: appended to an answer that fits in ``n_predict`` (stop_type eos).
        requests: every ``/completion`` body received.
    """

    def __init__(self, tokenizer: Any, *, n_ctx: int = 4096) -> None:
        self.tokenizer = tokenizer
        self.n_ctx = n_ctx
        self.answers: list[str] = ["Hello there!"]
        self.end_of_turn_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.requests: list[dict[str, Any]] = []
        self.transport = httpx.MockTransport(self.handle)

    def _sample(self, body: dict[str, Any]) -> tuple[list[int], list[float], str]:
        text = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        ids = list(self.tokenizer.encode(text, add_special_tokens=False)) + [self.end_of_turn_id]
        stop_type = "eos"
        if len(ids) > body["n_predict"]:
            ids, stop_type = ids[: body["n_predict"]], "limit"
        logprobs = [-0.01 * (i + 1) for i in range(len(ids))]
        return ids, logprobs, stop_type

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/props":
            return httpx.Response(200, json={"default_generation_settings": {"n_ctx": self.n_ctx}})
        if request.url.path != "/completion":
            return httpx.Response(404, json={"error": {"code": 404, "message": "not found"}})
        body = json.loads(request.content)
        self.requests.append(body)
        ids, logprobs, stop_type = self._sample(body)
        probs = [
            {
                "id": i,
                "token": "",
                "bytes": [],
                "logprob": lp,
                "top_logprobs": [{"id": i, "logprob": lp}],
            }
            for i, lp in zip(ids, logprobs, strict=True)
        ]
        final = {
            "stop": True,
            "stop_type": stop_type,
            "tokens_evaluated": len(body["prompt"]),
            "timings": {"cache_n": 0},
        }
        text_ids = ids[:-1] if stop_type == "eos" else ids
        if not body.get("stream"):
            return httpx.Response(
                200,
                json={
                    "content": self.tokenizer.decode(text_ids),
                    "tokens": ids,
                    "completion_probabilities": probs,
                    **final,
                },
            )
        events = []
        for i, (token_id, prob) in enumerate(zip(ids, probs, strict=True)):
            piece = (
                self.tokenizer.decode([token_id])
                if token_id != self.end_of_turn_id or stop_type != "eos"
                else ""
            )
            events.append(
                {
                    "content": piece,
                    "tokens": [token_id],
                    "completion_probabilities": [prob],
                    "stop": False,
                    "tokens_predicted": i + 1,
                }
            )
        events.append({"content": "", "tokens": [], **final})
        data = "".join(f"data: {json.dumps(e)}\n\n" for e in events)
        return httpx.Response(
            200, content=data.encode(), headers={"content-type": "text/event-stream"}
        )


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
    transport = httpx.ASGITransport(app=gateway.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as c:
        yield c


# --------------------------------------------------------------------------- real engine


def start_llama_server(
    tmp_path_factory: pytest.TempPathFactory, *, parallel: int, ctx_size: int
) -> Any:
    """Start llama-server on the Qwen2.5-Coder-0.5B GGUF, or skip when it is not installed.

    Args:
        parallel: slots; each gets ``ctx_size / parallel`` tokens of context.
        ctx_size: total context, tokens.

    Returns:
        The started :class:`~rolloutd.engine.server.LlamaServer`; the caller stops it.
    """
    from rolloutd.engine.server import LlamaServer, llama_server_binary
    from rolloutd.errors import ConfigError

    try:
        llama_server_binary()
    except ConfigError as e:
        pytest.skip(f"llama-server not available: {e}")
    log_path = tmp_path_factory.mktemp("engine") / "llama-server.log"
    return LlamaServer(MODEL, parallel=parallel, ctx_size=ctx_size, log_path=log_path).start()


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real llama-server on the Qwen2.5-Coder-0.5B GGUF (2 slots, 4096 tokens each)."""
    server = start_llama_server(tmp_path_factory, parallel=2, ctx_size=8192)
    try:
        yield server
    finally:
        server.stop()


class _TeeStream(httpx.AsyncByteStream):
    def __init__(self, inner: httpx.AsyncByteStream, sink: bytearray) -> None:
        self.inner = inner
        self.sink = sink

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.sink.extend(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class RecordingTransport(httpx.AsyncBaseTransport):
    """A real HTTP transport that keeps every ``/completion`` request and raw response body.

    Attributes:
        exchanges: ``(request body, response bytes)`` per sampling ``/completion`` call, in
            order; the bytes fill in as the response is read (streaming stays incremental).
        scoring: the same for the calls that score a left-out logprob again
            (``proxy/backends/llama_cpp_logprobs.py``: one forced token, ``logit_bias``).
    """

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport(retries=0)
        self.exchanges: list[tuple[dict[str, Any], bytearray]] = []
        self.scoring: list[tuple[dict[str, Any], bytearray]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path != "/completion":
            return response
        sink = bytearray()
        body = json.loads(request.content)
        # a call that scores a left-out logprob again (one forced token) samples nothing
        (
            self.scoring if "logit_bias" in body and body.get("n_predict") == 1 else self.exchanges
        ).append((body, sink))
        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_TeeStream(response.stream, sink),  # type: ignore[arg-type]
            extensions=response.extensions,
        )

    async def aclose(self) -> None:
        await self.inner.aclose()

    def sampled(self, i: int) -> tuple[list[int], list[float], list[int]]:
        """(sampled ids, their logprobs, prompt ids) of exchange ``i`` as llama-server sent them,
        for a plain JSON answer or an SSE stream.

        A token that ends inside a character has no logprob here, and no id in a stream: the
        recorded completion lists it in ``recomputed_logprob_positions``. A stream's tokens past
        ``max_tokens`` (``STREAM_SLACK_TOKENS``, sampled then cut) are left out."""
        body, raw = self.exchanges[i]
        text = raw.decode()
        if body.get("stream"):
            limit = body["n_predict"] - STREAM_SLACK_TOKENS
            events = [
                event
                for line in text.splitlines()
                if line.startswith("data:")
                if (event := json.loads(line[5:])).get("tokens_predicted", 0) <= limit
            ]
        else:
            events = [json.loads(text)]
        ids, logprobs = [], []
        for event in events:
            ids += event.get("tokens") or []
            logprobs += [p["logprob"] for p in event.get("completion_probabilities") or []]
        assert all(math.isfinite(lp) for lp in logprobs)
        return ids, logprobs, body["prompt"]
