"""Replay across attempts in the gateway, against a real llama-server: a second
session opened with the first one's log as its replay source answers the requests identical to
the recorded ones without an engine request (every ``/completion`` exchange is recorded by the
backend's transport), with the recorded answer ids, then samples and continues the chain."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from rolloutd.proxy.http.server import Gateway
from rolloutd.settings import GatewaySettings
from rolloutd.store import CompletionLog
from rolloutd.types import SamplingParams
from tests.proxy.support import RecordingTransport, make_engine_gateway

pytestmark = pytest.mark.engine

SAMPLING = SamplingParams(temperature=0.0, max_tokens=8)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_clock",
            "description": "Read the clock",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]


@pytest.fixture
async def gw(
    tmp_path: Path, tokenizer: Any, llama_server: Any, recording_transport: Any
) -> AsyncIterator[Gateway]:
    gateway = make_engine_gateway(tmp_path / "store", llama_server, tokenizer, recording_transport)
    yield gateway
    await gateway.aclose()


class Harness:
    """A scripted harness: ``turns`` user messages, each answer sent back as the next
    request's assistant message; ``volatile`` changes per process (Codex's
    ``prompt_cache_key``); turn ``i`` in ``streamed`` asks for a stream."""

    def __init__(
        self, gateway: Gateway, key: str, *, volatile: str, streamed: frozenset[int] = frozenset()
    ) -> None:
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=gateway.app, raise_app_exceptions=False),
            base_url="http://gateway.test",
            timeout=120,
        )
        self.url = f"/s/{key}/v1/chat/completions"
        self.volatile = volatile
        self.streamed = streamed
        self.messages: list[dict[str, Any]] = [{"role": "user", "content": "Say one word."}]
        self.ids: list[str] = []

    async def call(self, turn: int, user: str) -> None:
        body = {"model": "m", "messages": self.messages, "prompt_cache_key": self.volatile}
        if turn in self.streamed:
            async with self.client.stream(
                "POST", self.url, json={**body, "stream": True}
            ) as response:
                assert response.status_code == 200
                text, first_id = "", None
                async for line in response.aiter_lines():
                    if line.startswith("data: {"):
                        chunk = httpx.Response(200, content=line[6:]).json()
                        first_id = first_id or chunk["id"]
                        for choice in chunk["choices"]:
                            text += choice["delta"].get("content") or ""
            self.ids.append(first_id)
            message = {"role": "assistant", "content": text}
        else:
            response = await self.client.post(self.url, json=body)
            assert response.status_code == 200, response.text
            self.ids.append(response.json()["id"])
            message = response.json()["choices"][0]["message"]
            message = {"role": "assistant", "content": message.get("content") or ""}
        self.messages = [*self.messages, message, {"role": "user", "content": user}]

    async def run(self, users: list[str], start: int = 0) -> None:
        for turn, user in enumerate(users, start):
            await self.call(turn, user)

    async def aclose(self) -> None:
        await self.client.aclose()


USERS = ["Another word.", "One more.", "And another.", "Last one.", "Thanks.", "Bye."]


async def test_second_attempt_replays_then_samples_and_continues_the_chain(
    gw: Gateway, recording_transport: Any
) -> None:
    first = await gw.sessions.open_session("rp/0", "rp", sampling=SAMPLING)
    one = Harness(gw, first.session_key, volatile="process-1", streamed=frozenset({1}))
    await one.run(USERS[:4])
    await gw.sessions.close_session("rp/0")
    assert len(recording_transport.exchanges) == 4
    recorded = CompletionLog(gw.store, "rp/0").read_all()

    second = await gw.sessions.open_session(
        "rp/0.attempt-2", "rp", sampling=SAMPLING, replay_from=["rp/0"]
    )
    two = Harness(gw, second.session_key, volatile="process-2", streamed=frozenset({1}))
    await two.run(USERS[:4])
    # the 4 recorded calls: no engine request, the recorded answers and ids
    assert len(recording_transport.exchanges) == 4
    assert two.ids == one.ids and two.messages == one.messages
    await two.run(USERS[4:], start=4)
    assert len(recording_transport.exchanges) == 6  # the rest is sampled
    await gw.sessions.close_session("rp/0.attempt-2")

    log = CompletionLog(gw.store, "rp/0.attempt-2").read_all()
    assert [c.index for c in log] == list(range(6))
    assert [c.replayed_from for c in log] == [f"rp/0#{i}" for i in range(4)] + [None, None]
    for copy, source in zip(log, recorded, strict=False):
        assert copy.session_id == "rp/0.attempt-2"
        assert (
            copy.response_ids,
            copy.response_logprobs,
            copy.prompt_ids,
            copy.policy_version,
        ) == (
            source.response_ids,
            source.response_logprobs,
            source.prompt_ids,
            source.policy_version,
        )
        assert copy.extends == source.extends
        assert copy.request["prompt_cache_key"] == "process-2"
    # the first sampled call continues the replayed chain: no chain break
    assert log[4].extends == 3
    assert (
        log[4].prompt_ids[: len(log[3].prompt_ids) + len(log[3].response_ids)]
        == log[3].prompt_ids + log[3].response_ids
    )

    session = await gw.sessions.get("rp/0.attempt-2")
    assert session.replay is not None
    stats = session.replay.stats(session.completions)
    assert (stats.num_replayed, stats.num_source_completions, stats.num_not_replayed) == (4, 4, 0)
    assert stats.num_response_tokens_saved == sum(len(c.response_ids) for c in recorded)
    assert [(e.last_index, e.reason) for e in stats.ends] == [(3, "source_ended")]

    # a third attempt replays the second's log: its copies and its sampled calls
    third = await gw.sessions.open_session(
        "rp/0.attempt-3", "rp", sampling=SAMPLING, replay_from=["rp/0.attempt-2", "rp/0"]
    )
    three = Harness(gw, third.session_key, volatile="process-3", streamed=frozenset({1}))
    await three.run(USERS)
    assert len(recording_transport.exchanges) == 6
    assert three.ids == two.ids
    await one.aclose(), await two.aclose(), await three.aclose()


async def test_replay_ends_at_the_first_differing_request(
    gw: Gateway, recording_transport: Any
) -> None:
    first = await gw.sessions.open_session("rd/0", "rd", sampling=SAMPLING)
    one = Harness(gw, first.session_key, volatile="a")
    await one.run(["It is 10:00:01.", "More.", "Again."])
    await gw.sessions.close_session("rd/0")

    second = await gw.sessions.open_session(
        "rd/0.attempt-2", "rd", sampling=SAMPLING, replay_from=["rd/0"]
    )
    two = Harness(gw, second.session_key, volatile="b")
    # the second request differs (the "tool output" changed): replay ends after the first
    await two.run(["It is 10:00:07.", "More.", "Again."])
    assert len(recording_transport.exchanges) == 3 + 2
    session = await gw.sessions.get("rd/0.attempt-2")
    assert [c.replayed_from for c in session.completions] == ["rd/0#0", None, None]
    stats = session.replay.stats(session.completions)  # type: ignore[union-attr]
    assert (stats.num_replayed, stats.num_not_replayed) == (1, 2)
    assert [(e.last_index, e.reason) for e in stats.ends] == [(0, "body_differed")]
    await one.aclose(), await two.aclose()


async def test_a_gateway_restart_mid_replay_resumes_at_the_right_position(
    tmp_path: Path, tokenizer: Any, llama_server: Any, recording_transport: Any
) -> None:
    store = tmp_path / "store"
    gw = make_engine_gateway(store, llama_server, tokenizer, recording_transport)
    first = await gw.sessions.open_session("rr/0", "rr", sampling=SAMPLING)
    one = Harness(gw, first.session_key, volatile="a")
    await one.run(USERS[:4])
    await gw.sessions.close_session("rr/0")
    second = await gw.sessions.open_session(
        "rr/0.attempt-2", "rr", sampling=SAMPLING, replay_from=["rr/0"]
    )
    two = Harness(gw, second.session_key, volatile="b")
    await two.run(USERS[:2])
    await two.aclose()
    await gw.aclose()

    assert len(recording_transport.exchanges) == 4
    # a new gateway process on the same store: the session loads with its position
    transport2 = RecordingTransport()
    gw2 = make_engine_gateway(store, llama_server, tokenizer, transport2)
    try:
        again = Harness(gw2, second.session_key, volatile="c")
        again.messages, again.ids = two.messages, two.ids
        await again.run(USERS[2:5], start=2)
        assert len(transport2.exchanges) == 1  # calls 2 and 3 replayed, call 4 sampled
        assert again.ids[:4] == one.ids
        session = await gw2.sessions.get("rr/0.attempt-2")
        assert [c.replayed_from for c in session.completions] == [
            "rr/0#0",
            "rr/0#1",
            "rr/0#2",
            "rr/0#3",
            None,
        ]
        assert session.completions[4].extends == 3
        await again.aclose()
    finally:
        await gw2.aclose()
    await one.aclose()


async def test_staleness_bounds_what_is_replayed(gw: Gateway, recording_transport: Any) -> None:
    first = await gw.sessions.open_session("rs/0", "rs", sampling=SAMPLING)
    one = Harness(gw, first.session_key, volatile="a")
    await one.run(USERS[:2])
    await gw.sessions.close_session("rs/0")
    await gw.pool.set_policy_version(1)

    stale = await gw.sessions.open_session(
        "rs/0.attempt-2", "rs", sampling=SAMPLING, replay_from=["rs/0"]
    )
    two = Harness(gw, stale.session_key, volatile="b")
    await two.run(USERS[:1])
    assert len(recording_transport.exchanges) == 2 + 1  # version 0 is one behind: sampled
    session = await gw.sessions.get("rs/0.attempt-2")
    assert session.completions[0].replayed_from is None
    assert session.completions[0].policy_version == 1

    allowed = await gw.sessions.open_session(
        "rs/0.attempt-3", "rs", sampling=SAMPLING, replay_from=["rs/0"], replay_max_staleness=1
    )
    three = Harness(gw, allowed.session_key, volatile="c")
    await three.run(USERS[:2])
    assert len(recording_transport.exchanges) == 3  # both replayed, keeping version 0
    session = await gw.sessions.get("rs/0.attempt-3")
    assert [(c.replayed_from, c.policy_version) for c in session.completions] == [
        ("rs/0#0", 0),
        ("rs/0#1", 0),
    ]
    await one.aclose(), await two.aclose(), await three.aclose()


async def test_passthrough_sessions_replay_too(
    tmp_path: Path, tokenizer: Any, llama_server: Any
) -> None:
    """``passthrough``: llama-server's own chat endpoint renders; replay is by identity alike."""
    from rolloutd.proxy.backends.openai_compat import OpenAIChatBackend
    from rolloutd.proxy.backends.pool import BackendPool

    calls: list[str] = []

    class Counting(httpx.AsyncHTTPTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            calls.append(request.url.path)
            return await super().handle_async_request(request)

    settings = GatewaySettings(
        store_url=str(tmp_path / "store"), gateway_public_url="http://gateway.test"
    )
    gw = Gateway.from_settings(settings, tokenizer=tokenizer)
    gw.pool = BackendPool([OpenAIChatBackend("chat", llama_server.url, transport=Counting())])
    gw.sessions.pool = gw.service.pool = gw.pool
    try:
        first = await gw.sessions.open_session(
            "pt/0", "pt", sampling=SAMPLING, capture_mode="passthrough"
        )
        one = Harness(gw, first.session_key, volatile="a", streamed=frozenset({1}))
        await one.run(USERS[:3])
        await gw.sessions.close_session("pt/0")
        assert len(calls) == 3
        second = await gw.sessions.open_session(
            "pt/0.attempt-2",
            "pt",
            sampling=SAMPLING,
            capture_mode="passthrough",
            replay_from=["pt/0"],
        )
        two = Harness(gw, second.session_key, volatile="b", streamed=frozenset({1}))
        await two.run(USERS[:4])
        assert len(calls) == 4 and two.ids[:3] == one.ids
        session = await gw.sessions.get("pt/0.attempt-2")
        assert [c.replayed_from for c in session.completions] == [
            "pt/0#0",
            "pt/0#1",
            "pt/0#2",
            None,
        ]
        stats = session.replay.stats(session.completions)  # type: ignore[union-attr]
        assert [(e.last_index, e.reason) for e in stats.ends] == [(2, "source_ended")]
        await one.aclose(), await two.aclose()
    finally:
        await gw.aclose()
