"""End to end against a real llama-server (Qwen2.5-Coder-0.5B): the app in-process through
httpx.ASGITransport, every llama-server exchange recorded raw by the backend's transport."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from rolloutd.proxy.http.server import Gateway
from rolloutd.proxy.sessions.manager import SessionManager
from rolloutd.store import BlobStore, CompletionLog
from rolloutd.types import SamplingParams

pytestmark = pytest.mark.engine

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "city name"}},
                "required": ["city"],
            },
        },
    }
]
SYSTEM = {"role": "system", "content": "You are a helpful assistant. Use the tools when needed."}


def assert_recorded_as_sampled(completions: list[Any], recording: Any) -> None:
    assert len(recording.exchanges) == len(completions)
    for i, completion in enumerate(completions):
        ids, logprobs, prompt = recording.sampled(i)
        assert completion.index == i
        assert completion.prompt_ids == prompt
        assert completion.response_ids == ids
        assert completion.response_logprobs == logprobs
        assert all(lp <= 0.0 for lp in logprobs)


async def test_two_turns_with_a_tool_result(
    engine_gateway: Gateway,
    engine_client: httpx.AsyncClient,
    recording_transport: Any,
    tokenizer: Any,
) -> None:
    assert await engine_gateway.pool.get(engine_gateway.pool.names()[0]).context_size() == 4096
    info = await engine_gateway.sessions.open_session(
        "engine-tools/0", "engine-tools", sampling=SamplingParams(temperature=0.0, max_tokens=48)
    )
    url = f"/s/{info.session_key}/v1/chat/completions"
    messages: list[dict[str, Any]] = [
        SYSTEM,
        {"role": "user", "content": "What's the weather like in Tokyo right now?"},
    ]

    first = await engine_client.post(url, json={"model": "m", "messages": messages, "tools": TOOLS})
    assert first.status_code == 200, first.text
    message = first.json()["choices"][0]["message"]
    assert first.json()["choices"][0]["finish_reason"] == "tool_calls"
    [call] = message["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Tokyo"}

    messages += [
        message,
        {
            "role": "tool",
            "tool_call_id": call["id"],
            "content": '{"temperature_c": 18, "sky": "cloudy"}',
        },
    ]
    second = await engine_client.post(
        url, json={"model": "m", "messages": messages, "tools": TOOLS}
    )
    assert second.status_code == 200, second.text
    assert second.json()["usage"]["completion_tokens"] > 0

    c0, c1 = completions = CompletionLog(engine_gateway.store, "engine-tools/0").read_all()
    assert_recorded_as_sampled(completions, recording_transport)
    assert c0.end_of_turn_sampled and c0.response_ids[-1] == 151645
    assert c1.extends == 0
    head = len(c0.prompt_ids) + len(c0.response_ids)
    assert c1.prompt_ids[:head] == c0.prompt_ids + c0.response_ids
    new_part = tokenizer.decode(c1.prompt_ids[head:])
    assert new_part.startswith("\n<|im_start|>user\n<tool_response>\n")
    assert new_part.endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert second.json()["usage"]["prompt_tokens"] == len(c1.prompt_ids)

    # durable: a gateway restarted over the same store serves the session and its log
    restarted = SessionManager(
        BlobStore(engine_gateway.store.url),
        engine_gateway.pool,
        public_url="http://restarted",
        default_model="m",
    )
    session = await restarted.lookup(info.session_key)
    assert session.completions == completions
    assert await restarted.close_session("engine-tools/0") == 2


async def test_truncated_answer_gets_its_end_of_turn_in_the_chain(
    engine_gateway: Gateway, engine_client: httpx.AsyncClient, recording_transport: Any
) -> None:
    info = await engine_gateway.sessions.open_session(
        "engine-length/0",
        "engine-length",
        sampling=SamplingParams(temperature=0.7, seed=11, max_tokens=4),
    )
    url = f"/s/{info.session_key}/v1/chat/completions"
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Write a long poem."}]
    first = (await engine_client.post(url, json={"messages": messages})).json()
    assert first["choices"][0]["finish_reason"] == "length"
    messages += [first["choices"][0]["message"], {"role": "user", "content": "Stop."}]
    second = await engine_client.post(url, json={"messages": messages})
    assert second.status_code == 200
    c0, c1 = completions = CompletionLog(engine_gateway.store, "engine-length/0").read_all()
    assert_recorded_as_sampled(completions, recording_transport)
    assert len(c0.response_ids) == 4 and not c0.end_of_turn_sampled
    head = len(c0.prompt_ids) + len(c0.response_ids)
    assert c1.extends == 0
    assert c1.prompt_ids[:head] == c0.prompt_ids + c0.response_ids
    assert c1.prompt_ids[head] == engine_gateway.template.end_of_turn_id


async def test_streaming_is_well_formed_and_recorded_like_the_plain_answer(
    engine_gateway: Gateway, engine_client: httpx.AsyncClient, recording_transport: Any
) -> None:
    request = {
        "model": "m",
        "messages": [{"role": "user", "content": "Say hello in French."}],
        "max_tokens": 24,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    sampling = SamplingParams(temperature=0.0, max_tokens=24)
    streamed = await engine_gateway.sessions.open_session(
        "engine-stream/0", "engine-stream", sampling=sampling
    )
    async with engine_client.stream(
        "POST", f"/s/{streamed.session_key}/v1/chat/completions", json=request
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = (await response.aread()).decode()
    blocks = raw.split("\n\n")
    assert blocks[-1] == "" and blocks[-2] == "data: [DONE]"
    chunks = [json.loads(b[len("data: ") :]) for b in blocks[:-2]]
    assert all(b.startswith("data: ") for b in blocks[:-1])
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    with_choices = [c for c in chunks if c["choices"]]
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in with_choices)
    assert with_choices[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] > 0

    [completion] = CompletionLog(engine_gateway.store, "engine-stream/0").read_all()
    assert_recorded_as_sampled([completion], recording_transport)
    assert content == completion.response_message["content"] and content.strip()
    assert chunks[-1]["usage"]["completion_tokens"] == len(completion.response_ids)

    plain = await engine_gateway.sessions.open_session(
        "engine-plain/0", "engine-plain", sampling=sampling
    )
    response = await engine_client.post(
        f"/s/{plain.session_key}/v1/chat/completions", json=request | {"stream": False}
    )
    assert response.json()["choices"][0]["message"]["content"] == content
    [other] = CompletionLog(engine_gateway.store, "engine-plain/0").read_all()
    same = {
        "prompt_ids",
        "response_ids",
        "response_text",
        "response_message",
        "finish_reason",
        "end_of_turn_sampled",
        "extends",
    }
    assert other.model_dump(include=same) == completion.model_dump(include=same)
    # greedy, same prompt: logprobs agree up to numerics (the second call reuses llama.cpp's
    # prompt cache, which evaluates in other batch shapes: differences of ~0.05 were seen)
    assert other.response_logprobs == pytest.approx(completion.response_logprobs, abs=0.15)
