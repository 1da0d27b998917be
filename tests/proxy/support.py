"""What the gateway tests share besides fixtures: the scripted llama.cpp, the recording
transport, the real llama-server, and small helpers to open sessions, build gateways and read
what they recorded.

The fake llama.cpp (:class:`FakeLlamaCpp`) answers ``/props`` and ``/completion`` like
llama-server does (field names checked against the real server), from a script of texts, so
app tests run in milliseconds: a test double, because the point of those tests is the
gateway, and the real server is covered by the engine-marked tests.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from rolloutd.proxy.backends.llama_cpp import STREAM_SLACK_TOKENS
from rolloutd.proxy.http.server import Gateway
from rolloutd.proxy.sessions.state import SessionInfo
from rolloutd.settings import GatewaySettings
from rolloutd.store import CompletionLog
from rolloutd.types import Completion, SamplingParams

MODEL = "qwen2.5-coder-0.5b"
FAKE_URL = "http://fake-llama"
#: the admin token of the gateways :func:`make_admin_gateway` builds
ADMIN_TOKEN = "admin-secret"


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


class Backends:
    """Fake llama.cpp servers at any host: records which host every ``/completion`` reached,
    and can hold calls until released (an in-flight call)."""

    def __init__(self, fake: FakeLlamaCpp) -> None:
        self.fake = fake
        self.hosts: list[str] = []
        self.hold: asyncio.Event | None = None
        self.transport = httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/completion":
            self.hosts.append(request.url.host)
            if self.hold is not None:
                await self.hold.wait()
        return self.fake.handle(request)


def make_admin_gateway(store: Path, tokenizer: Any, backends: Backends, **settings: Any) -> Gateway:
    """A gateway over :class:`Backends` (first backend ``http://a``) with the admin token
    :data:`ADMIN_TOKEN`; ``settings`` override :class:`GatewaySettings` fields."""
    values: dict[str, Any] = {
        "store_url": str(store),
        "backend_url": "http://a",
        "gateway_public_url": "http://gateway.test",
        "admin_token": ADMIN_TOKEN,
        **settings,
    }
    return Gateway.from_settings(
        GatewaySettings(**values), tokenizer=tokenizer, transport=backends.transport
    )


def make_engine_gateway(
    store: Path, llama_server: Any, tokenizer: Any, transport: Any, **options: Any
) -> Gateway:
    """A gateway over the real llama-server (backend timeout 120 s); ``options`` go to
    :meth:`Gateway.from_settings` (``tool_parser``)."""
    settings = GatewaySettings(
        store_url=str(store),
        backend_url=llama_server.url,
        gateway_public_url="http://gateway.test",
        backend_timeout_s=120,
    )
    return Gateway.from_settings(settings, tokenizer=tokenizer, transport=transport, **options)


@asynccontextmanager
async def asgi_client(gateway: Gateway, **options: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An httpx client of ``gateway``'s app in-process (``httpx.ASGITransport``)."""
    transport = httpx.ASGITransport(app=gateway.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://gateway.test", **options
    ) as client:
        yield client


async def open_session(
    gateway: Gateway, session_id: str = "mytask/0", **sampling: Any
) -> SessionInfo:
    """Open ``session_id`` (its task: what comes before the ``/``) with ``sampling``."""
    return await gateway.sessions.open_session(
        session_id, session_id.split("/")[0], sampling=SamplingParams(**sampling)
    )


def completions(gateway: Gateway, session_id: str) -> list[Completion]:
    """The completion log of ``session_id`` in ``gateway``'s store."""
    return CompletionLog(gateway.store, session_id).read_all()


def sse_response(*events: Any) -> httpx.Response:
    """A ``text/event-stream`` answer of ``data:`` events (JSON objects, or strings as
    they are: ``[DONE]``)."""
    text = "".join(f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n" for e in events)
    return httpx.Response(200, content=text.encode(), headers={"content-type": "text/event-stream"})


async def chat(http: httpx.AsyncClient, key: str, content: str = "Hi!") -> httpx.Response:
    """POST one short chat completion to the session of ``key``."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 16,
    }
    return await http.post(f"/s/{key}/v1/chat/completions", json=body)


async def poll(predicate: Any, timeout_s: float = 5.0) -> None:
    """Wait until ``predicate()`` holds, checking every 5 ms, for at most ``timeout_s``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        assert loop.time() < deadline, "condition not reached before the deadline"
        await asyncio.sleep(0.005)


def openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    """The ``error`` object of an OpenAI-shaped error answer, after checking its status and
    that it has exactly OpenAI's four fields."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error  # type: ignore[no-any-return]
