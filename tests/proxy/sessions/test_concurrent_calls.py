"""Concurrent calls of one session (sub-agents) and the retry rule (docs/sessions.md,
"Concurrent calls" and "Request identity").

The first tests are about ordering only and run on the scripted llama.cpp of support.py,
held at a gate so that the test decides when the backend answers. The ``engine`` tests run
the app in-process against a real llama-server (2 slots, so two calls really sample at once).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from rolloutd.proxy.http.server import Gateway
from rolloutd.proxy.sessions.session import Session
from rolloutd.proxy.sessions.state import SessionInfo
from rolloutd.settings import GatewaySettings
from rolloutd.store import CompletionLog
from rolloutd.trajectory import build_traces, check_invariants
from rolloutd.types import BuilderSpec, Completion, SamplingParams
from tests.proxy.support import FAKE_URL, FakeLlamaCpp, asgi_client

DEADLINE_S = 30.0


async def until(condition: Callable[[], bool], what: str, deadline_s: float = DEADLINE_S) -> None:
    """Poll ``condition`` until it holds (fails the test after ``deadline_s``)."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {deadline_s} s: {what}")
        await asyncio.sleep(0.005)


class Gate:
    """The scripted llama.cpp behind a gate: a ``/completion`` request waits until the test
    opens it; ``num_waiting`` counts the requests that reached it."""

    def __init__(self, fake: FakeLlamaCpp) -> None:
        self.fake = fake
        self.opened = asyncio.Event()
        self.num_waiting = 0
        self.transport = httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/completion":
            self.num_waiting += 1
            await self.opened.wait()
        return self.fake.handle(request)


@pytest.fixture
async def gated(
    tmp_path: Path, tokenizer: Any, fake_llama: FakeLlamaCpp
) -> AsyncIterator[tuple[Gateway, Gate, httpx.AsyncClient]]:
    gate = Gate(fake_llama)
    settings = GatewaySettings(
        store_url=str(tmp_path / "store"),
        backend_url=FAKE_URL,
        gateway_public_url="http://gateway.test",
    )
    gateway = Gateway.from_settings(settings, tokenizer=tokenizer, transport=gate.transport)
    async with asgi_client(gateway) as client:
        yield gateway, gate, client
    await gateway.aclose()


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


async def session_of(gateway: Gateway, info: SessionInfo) -> Session:
    return await gateway.sessions.lookup(info.session_key)


def conversation_of(completion: Completion) -> str:
    return completion.messages[0]["content"]


def assert_traces_per_conversation(gateway: Gateway, completions: list[Completion]) -> None:
    """prefix_merging makes one trace per conversation, and the invariants hold."""
    traces, _ = build_traces(
        completions, BuilderSpec(), end_of_turn_id=gateway.template.end_of_turn_id
    )
    check_invariants(traces, completions)
    by_index = {c.index: c for c in completions}
    groups = sorted(sorted(trace.completion_indices) for trace in traces)
    expected = sorted(
        sorted(c.index for c in completions if conversation_of(c) == name)
        for name in {conversation_of(c) for c in completions}
    )
    assert groups == expected, (groups, [(c.index, conversation_of(c)) for c in completions])
    for trace in traces:
        assert len({conversation_of(by_index[i]) for i in trace.completion_indices}) == 1


async def test_two_conversations_sample_at_once_and_keep_their_own_chains(gated: Any) -> None:
    """Scripted backend, ordering only: both conversations' calls reach the backend before
    either is answered (no per-session lock across the call), indices follow the order of
    recording, and each second turn extends its own conversation's first."""
    gateway, gate, client = gated
    gate.fake.answers = ["Answer one.", "Answer two.", "Answer three.", "Answer four."]
    info = await gateway.sessions.open_session("par/0", "par")
    url = f"/s/{info.session_key}/v1/chat/completions"

    async def turn(messages: list[dict[str, Any]]) -> dict[str, Any]:
        response = await client.post(url, json={"model": "m", "messages": messages})
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["message"]

    conversations = {name: [user(name)] for name in ("agent A", "agent B")}
    for num_turns in (1, 2):
        gate.opened.clear()
        calls = {
            name: asyncio.ensure_future(turn(messages)) for name, messages in conversations.items()
        }
        await until(
            lambda n=num_turns: gate.num_waiting == 2 * n,
            "both conversations' calls at the backend at once",
        )
        gate.opened.set()
        for name, call in calls.items():
            conversations[name] += [await call, user("go on")]
    completions = CompletionLog(gateway.store, "par/0").read_all()
    assert [c.index for c in completions] == [0, 1, 2, 3]
    for c in completions[2:]:
        parent = completions[c.extends]
        assert conversation_of(parent) == conversation_of(c) and len(parent.messages) == 1
    assert_traces_per_conversation(gateway, completions)
    assert await gateway.sessions.close_session("par/0") == 4


async def test_a_marked_retry_waits_for_the_identical_call_in_flight(gated: Any) -> None:
    """Scripted backend, ordering only: a client that gave up waiting and retries (marked)
    gets the answer of the call still sampling that request, not a second sample."""
    gateway, gate, client = gated
    info = await gateway.sessions.open_session("wait/0", "wait")
    url = f"/s/{info.session_key}/v1/chat/completions"
    body = {"model": "m", "messages": [user("Hi!")]}
    first = asyncio.ensure_future(client.post(url, json=body))
    await until(lambda: gate.num_waiting == 1, "the first call at the backend")
    retry = asyncio.ensure_future(
        client.post(url, json=body, headers={"x-stainless-retry-count": "1"})
    )
    session = await session_of(gateway, info)
    await until(lambda: session.num_in_flight == 2, "the retry in flight")
    gate.opened.set()
    assert (await first).json() == (await retry).json()
    assert gate.num_waiting == 1
    assert len(CompletionLog(gateway.store, "wait/0")) == 1


async def test_closing_waits_for_every_call_in_flight(gated: Any) -> None:
    """Scripted backend, ordering only: close refuses new calls at once and seals after
    the calls in flight are recorded."""
    gateway, gate, client = gated
    info = await gateway.sessions.open_session("close/0", "close")
    url = f"/s/{info.session_key}/v1/chat/completions"
    calls = [
        asyncio.ensure_future(client.post(url, json={"messages": [user(f"agent {i}")]}))
        for i in range(2)
    ]
    await until(lambda: gate.num_waiting == 2, "both calls at the backend")
    closing = asyncio.ensure_future(gateway.sessions.close_session("close/0"))
    session = await session_of(gateway, info)
    await until(lambda: session.closing, "close started")
    refused = await client.post(url, json={"messages": [user("late")]})
    assert refused.status_code == 401
    assert not closing.done()
    gate.opened.set()
    assert [(await call).status_code for call in calls] == [200, 200]
    assert await closing == 2


# --------------------------------------------------------------------------- real engine


@pytest.fixture
async def engine(
    tmp_path: Path, tokenizer: Any, llama_server: Any, recording_transport: Any
) -> AsyncIterator[tuple[Gateway, httpx.AsyncClient]]:
    settings = GatewaySettings(
        store_url=str(tmp_path / "store"),
        backend_url=llama_server.url,
        gateway_public_url="http://gateway.test",
        backend_timeout_s=300,
    )
    gateway = Gateway.from_settings(settings, tokenizer=tokenizer, transport=recording_transport)
    async with asgi_client(gateway, timeout=300) as client:
        yield gateway, client
    await gateway.aclose()


def overlap(a: Completion, b: Completion) -> bool:
    """Whether two completions were sampling at the same time (their logged wall times)."""
    a_end = a.timings.started_at + a.timings.duration_s
    b_end = b.timings.started_at + b.timings.duration_s
    return a.timings.started_at < b_end and b.timings.started_at < a_end


@pytest.mark.engine
async def test_sub_agents_overlap_in_time_and_both_land_in_traces(
    engine: Any, recording_transport: Any
) -> None:
    gateway, client = engine
    info = await gateway.sessions.open_session(
        "sub/0", "sub", sampling=SamplingParams(temperature=0.7, seed=1, max_tokens=12)
    )
    url = f"/s/{info.session_key}/v1/chat/completions"

    async def agent(task: str) -> None:
        messages = [user(task)]
        for _ in range(2):
            response = await client.post(url, json={"model": "m", "messages": messages})
            assert response.status_code == 200, response.text
            messages += [response.json()["choices"][0]["message"], user("Shorter, please.")]

    await asyncio.gather(
        agent("Write a haiku about rivers."), agent("List three prime numbers and explain why.")
    )
    completions = CompletionLog(gateway.store, "sub/0").read_all()
    assert [c.index for c in completions] == [0, 1, 2, 3]
    assert len(recording_transport.exchanges) == 4
    firsts = [c for c in completions if len(c.messages) == 1]
    assert len(firsts) == 2 and overlap(*firsts), [c.timings for c in completions]
    for c in completions:
        if len(c.messages) > 1:
            assert c.extends is not None and conversation_of(
                completions[c.extends]
            ) == conversation_of(c)
    assert_traces_per_conversation(gateway, completions)


@pytest.mark.engine
async def test_identical_concurrent_first_prompts_are_two_samples(
    engine: Any, recording_transport: Any
) -> None:
    gateway, client = engine
    info = await gateway.sessions.open_session(
        "twins/0", "twins", sampling=SamplingParams(temperature=1.0, max_tokens=8)
    )
    url = f"/s/{info.session_key}/v1/chat/completions"
    body = {"model": "m", "messages": [user("Name a colour.")]}
    answers = await asyncio.gather(client.post(url, json=body), client.post(url, json=body))
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[0].json()["id"] != answers[1].json()["id"]
    completions = CompletionLog(gateway.store, "twins/0").read_all()
    assert len(completions) == 2 == len(recording_transport.exchanges)
    assert completions[0].request_hash == completions[1].request_hash
    assert overlap(*completions), [c.timings for c in completions]
    assert {c.response_id for c in completions} == {a.json()["id"] for a in answers}


async def asgi_post(app: Any, path: str, body: dict[str, Any], *, cut_after: bytes) -> bytes:
    """POST ``body`` to the ASGI app as a client that goes away once it has received a body
    chunk containing ``cut_after``: that write never completes and the server is told the
    client disconnected (what uvicorn does when a connection drops mid-stream)."""
    data = json.dumps(body).encode()
    gone = asyncio.Event()
    request_sent = False
    received = bytearray()

    async def receive() -> dict[str, Any]:
        nonlocal request_sent
        if not request_sent:
            request_sent = True
            return {"type": "http.request", "body": data, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            received.extend(message.get("body", b""))
            if cut_after in message.get("body", b""):
                gone.set()
                await asyncio.Future()  # a write to a dead connection: never completes

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"gateway.test"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 5000),
        "server": ("gateway.test", 80),
    }
    await app(scope, receive, send)
    return bytes(received)


@pytest.mark.engine
async def test_a_retry_after_a_broken_stream_is_answered_from_the_log(
    engine: Any, recording_transport: Any
) -> None:
    gateway, client = engine
    info = await gateway.sessions.open_session(
        "cut/0", "cut", sampling=SamplingParams(temperature=0.7, max_tokens=8)
    )
    url = f"/s/{info.session_key}/v1/chat/completions"
    body = {"model": "m", "messages": [user("Say hello.")], "stream": True}
    cut = await asgi_post(gateway.app, url, body, cut_after=b'"finish_reason":"')
    assert b"[DONE]" not in cut  # the answer's end never reached the client
    session = await session_of(gateway, info)
    await until(lambda: session.num_in_flight == 0, "the cut call ended")
    again = await client.post(url, json=body)  # not marked: the stream broke
    assert again.status_code == 200 and again.text.endswith("data: [DONE]\n\n")

    def content(text: str) -> str:
        chunks = [
            json.loads(line[len("data: ") :])
            for line in text.split("\n")
            if line.startswith("data: {")
        ]
        return "".join(
            c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
        )

    assert content(again.text) == content(cut.decode()) != ""
    assert len(recording_transport.exchanges) == 1
    assert len(CompletionLog(gateway.store, "cut/0")) == 1
    # delivered now: the same request once more is a new call
    third = await client.post(url, json=body)
    assert third.status_code == 200
    assert len(recording_transport.exchanges) == 2


class DropFirstAnswer(httpx.AsyncBaseTransport):
    """The app answers the first request whole; the client's connection then drops before
    it reads the answer (the SDK sees a transport error and retries)."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.retry_counts: list[str | None] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.retry_counts.append(request.headers.get("x-stainless-retry-count"))
        response = await self.inner.handle_async_request(request)
        if len(self.retry_counts) == 1:
            await response.aread()
            raise httpx.ReadError("connection reset by peer", request=request)
        return response


@pytest.mark.engine
async def test_an_sdk_retry_of_a_delivered_answer_is_answered_from_the_log(
    engine: Any, recording_transport: Any
) -> None:
    openai = pytest.importorskip("openai")
    gateway, _ = engine
    info = await gateway.sessions.open_session(
        "sdk/0", "sdk", sampling=SamplingParams(temperature=0.7, max_tokens=8)
    )
    transport = DropFirstAnswer(httpx.ASGITransport(app=gateway.app))
    async with httpx.AsyncClient(transport=transport, timeout=300) as http:
        sdk = openai.AsyncOpenAI(
            base_url=info.openai_base_url, api_key="unused", http_client=http, max_retries=1
        )
        answer = await sdk.chat.completions.create(model="m", messages=[user("Say hello.")])  # type: ignore[list-item]
    assert transport.retry_counts == ["0", "1"]
    [completion] = CompletionLog(gateway.store, "sdk/0").read_all()
    assert answer.id == completion.response_id
    assert answer.choices[0].message.content == completion.response_message["content"]
    assert len(recording_transport.exchanges) == 1
