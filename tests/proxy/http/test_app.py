"""The gateway app in-process (httpx.ASGITransport) over a fake llama.cpp: routes, errors,
recording, retries, streaming."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from rolloutd.proxy.backends.http import new_client
from rolloutd.proxy.http.server import Gateway
from rolloutd.proxy.sessions.state import SessionInfo
from rolloutd.store import CompletionLog
from tests.proxy.support import open_session, openai_error

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def chat_url(info: SessionInfo) -> str:
    return f"/s/{info.session_key}/v1/chat/completions"


def body(content: str = "Hi!", **extra: Any) -> dict[str, Any]:
    return {"model": "whatever", "messages": [{"role": "user", "content": content}], **extra}


def assert_openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    error = openai_error(response, status)
    assert isinstance(error["message"], str) and error["message"]
    return error


def sse_events(text: str) -> list[Any]:
    assert text.endswith("\n\n")
    events = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        payload = block[len("data: ") :]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


async def test_health(client: httpx.AsyncClient) -> None:
    response = await client.get("/health")
    assert response.status_code == 200
    assert response.json()["status"] == "ok"


async def test_models_by_path_and_by_bearer_key(
    gateway: Gateway, client: httpx.AsyncClient
) -> None:
    info = await open_session(gateway)
    by_path = await client.get(f"/s/{info.session_key}/v1/models")
    by_key = await client.get("/v1/models", headers={"Authorization": f"Bearer {info.session_key}"})
    assert by_path.status_code == by_key.status_code == 200
    assert by_path.json() == by_key.json()
    assert by_path.json()["data"][0]["id"] == "Qwen2.5-Coder-0.5B-Instruct"


async def test_chat_answers_and_records_before_returning(
    gateway: Gateway, client: httpx.AsyncClient, fake_llama: Any
) -> None:
    info = await open_session(gateway, max_tokens=64)
    assert info.openai_base_url == f"http://gateway.test/s/{info.session_key}/v1"
    response = await client.post(chat_url(info), json=body())
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": "Hello there!"}
    assert answer["choices"][0]["finish_reason"] == "stop"
    [completion] = CompletionLog(gateway.store, "mytask/0").read_all()
    sent = fake_llama.requests[0]
    assert completion.prompt_ids == sent["prompt"]
    assert completion.response_ids[-1] == gateway.template.end_of_turn_id
    assert completion.end_of_turn_sampled
    assert completion.response_logprobs == [
        -0.01 * (i + 1) for i in range(len(completion.response_ids))
    ]
    assert answer["usage"] == {
        "prompt_tokens": len(sent["prompt"]),
        "completion_tokens": len(completion.response_ids),
        "total_tokens": len(sent["prompt"]) + len(completion.response_ids),
    }
    assert completion.request == body()
    assert completion.response_text == "Hello there!"
    assert completion.backend == "http://fake-llama" and completion.policy_version == 0
    assert sent["n_probs"] == 1 and sent["return_tokens"] and sent["cache_prompt"]
    assert sent["min_p"] == 0.0 and sent["n_predict"] == 64


async def test_bearer_route_records_in_the_same_session(
    gateway: Gateway, client: httpx.AsyncClient
) -> None:
    info = await open_session(gateway)
    response = await client.post(
        "/v1/chat/completions", json=body(), headers={"Authorization": f"Bearer {info.session_key}"}
    )
    assert response.status_code == 200
    assert len(CompletionLog(gateway.store, "mytask/0")) == 1


async def test_a_marked_retry_is_answered_from_the_log(
    gateway: Gateway, client: httpx.AsyncClient, fake_llama: Any
) -> None:
    """A delivered answer is given again only to a request the client marks as a retry (the
    OpenAI and Anthropic SDKs send ``x-stainless-retry-count``); the same body unmarked is a
    new call (a sub-agent with the same first prompt) and is sampled."""
    fake_llama.answers = ["First answer.", "Second answer.", "Third answer."]
    info = await open_session(gateway)
    first = await client.post(chat_url(info), json=body(), headers={"x-stainless-retry-count": "0"})
    retried = await client.post(
        chat_url(info),
        content=json.dumps(body(), indent=2),
        headers={"content-type": "application/json", "x-stainless-retry-count": "1"},
    )
    assert retried.status_code == 200
    assert retried.json() == first.json()
    assert len(fake_llama.requests) == 1
    assert len(CompletionLog(gateway.store, "mytask/0")) == 1
    again = await client.post(chat_url(info), json=body())
    assert again.json()["choices"][0]["message"]["content"] == "Second answer."
    other = await client.post(chat_url(info), json=body("Something else"))
    assert other.json()["choices"][0]["message"]["content"] == "Third answer."
    assert CompletionLog(gateway.store, "mytask/0").indices() == [0, 1, 2]


async def test_second_turn_extends_the_first(
    gateway: Gateway, client: httpx.AsyncClient, fake_llama: Any
) -> None:
    fake_llama.answers = [CALL_TEXT, "It is sunny."]
    info = await open_session(gateway)
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    first = (await client.post(chat_url(info), json={"messages": messages, "tools": TOOLS})).json()
    message = first["choices"][0]["message"]
    assert first["choices"][0]["finish_reason"] == "tool_calls"
    assert message["content"] is None
    call = message["tool_calls"][0]
    messages += [message, {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
    second = await client.post(chat_url(info), json={"messages": messages, "tools": TOOLS})
    assert second.json()["choices"][0]["message"]["content"] == "It is sunny."
    c0, c1 = CompletionLog(gateway.store, "mytask/0").read_all()
    assert c1.extends == 0
    assert (
        c1.prompt_ids[: len(c0.prompt_ids) + len(c0.response_ids)]
        == c0.prompt_ids + c0.response_ids
    )
    assert c0.response_message["tool_calls"] == message["tool_calls"]
    # the backend got the recorded prompts (the second written as a continuation of the first)
    assert [sent["prompt"] for sent in fake_llama.requests] == [c0.prompt_ids, c1.prompt_ids]


async def test_respect_policy_uses_harness_values(
    gateway: Gateway, client: httpx.AsyncClient, fake_llama: Any
) -> None:
    respect = await open_session(gateway, "a/0", policy="respect", temperature=1.0, max_tokens=100)
    override = await open_session(
        gateway, "b/0", policy="override", temperature=1.0, max_tokens=100
    )
    for info in (respect, override):
        await client.post(chat_url(info), json=body(temperature=0.2, max_tokens=7))
    assert (fake_llama.requests[0]["temperature"], fake_llama.requests[0]["n_predict"]) == (0.2, 7)
    assert (fake_llama.requests[1]["temperature"], fake_llama.requests[1]["n_predict"]) == (
        1.0,
        100,
    )


async def test_max_tokens_is_bounded_by_the_context_left(
    gateway: Gateway, client: httpx.AsyncClient, fake_llama: Any
) -> None:
    fake_llama.n_ctx = 40
    info = await open_session(gateway, max_tokens=1000)
    response = await client.post(chat_url(info), json=body())
    prompt = fake_llama.requests[0]["prompt"]
    assert fake_llama.requests[0]["n_predict"] == 40 - len(prompt)
    assert response.status_code == 200


async def test_prompt_without_room_is_a_context_length_error(
    gateway: Gateway, client: httpx.AsyncClient, fake_llama: Any
) -> None:
    fake_llama.n_ctx = 20
    info = await open_session(gateway)
    error = assert_openai_error(await client.post(chat_url(info), json=body()), 400)
    assert error["code"] == "context_length_exceeded"
    assert fake_llama.requests == []
    assert len(CompletionLog(gateway.store, "mytask/0")) == 0


@pytest.mark.parametrize(
    "raw, status, param",
    [
        (b"{not json", 400, None),
        (b"", 400, None),
        (b"[1, 2]", 400, None),
        (json.dumps({"model": "m"}).encode(), 400, "messages"),
        (json.dumps({"messages": []}).encode(), 400, "messages"),
        (json.dumps({"messages": "hi"}).encode(), 400, "messages"),
        (
            json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode(),
            400,
            "messages.0.role",
        ),
        (json.dumps({"messages": [{"role": "user", "content": "x"}], "n": 2}).encode(), 400, "n"),
        (
            json.dumps(
                {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}
            ).encode(),
            400,
            "temperature",
        ),
        (
            json.dumps(
                {
                    "messages": [
                        {
                            "role": "user",
                            "content": [{"type": "image_url", "image_url": {"url": "http://x"}}],
                        }
                    ]
                }
            ).encode(),
            400,
            None,
        ),
        (
            json.dumps({"messages": [{"role": "user", "content": {"a": 1}}]}).encode(),
            400,
            "messages.0.content",
        ),
        (
            json.dumps(
                {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}
            ).encode(),
            400,
            "tools.0.function",
        ),
        (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', 400, None),
        (b'{"messages": [{"role": "user", "content": "ok \\uDFFF"}]}', 400, None),
        (b"\xff\xfe", 400, None),
    ],
)
async def test_bad_requests_get_openai_errors_never_500(
    gateway: Gateway, client: httpx.AsyncClient, raw: bytes, status: int, param: str | None
) -> None:
    info = await open_session(gateway)
    response = await client.post(
        chat_url(info), content=raw, headers={"content-type": "application/json"}
    )
    error = assert_openai_error(response, status)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert len(CompletionLog(gateway.store, "mytask/0")) == 0


async def test_a_lone_surrogate_resent_in_a_longer_body_is_still_refused(
    gateway: Gateway, client: httpx.AsyncClient
) -> None:
    """The session's body reader reuses the text its last body sent; a body refused for a
    lone surrogate escape leaves nothing to reuse, so the next one is searched whole."""
    info = await open_session(gateway)
    first = b'{"messages": [{"role": "user", "content": "bad \\udc00"}'
    for raw in (first + b"]}", first + b', {"role": "user", "content": "more"}]}'):
        response = await client.post(
            chat_url(info), content=raw, headers={"content-type": "application/json"}
        )
        assert_openai_error(response, 400)
    assert len(CompletionLog(gateway.store, "mytask/0")) == 0


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer wrong-key"}, {"Authorization": "Basic abc"}]
)
async def test_missing_or_wrong_key_is_401(
    gateway: Gateway, client: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    await open_session(gateway)
    error = assert_openai_error(
        await client.post("/v1/chat/completions", json=body(), headers=headers), 401
    )
    assert error["code"] == "invalid_api_key"
    assert_openai_error(await client.post("/s/wrong-key/v1/chat/completions", json=body()), 401)
    assert_openai_error(await client.get("/s/wrong-key/v1/models"), 401)


async def test_closed_session_refuses_calls(gateway: Gateway, client: httpx.AsyncClient) -> None:
    info = await open_session(gateway)
    assert (await client.post(chat_url(info), json=body())).status_code == 200
    assert await gateway.sessions.close_session("mytask/0") == 1
    error = assert_openai_error(await client.post(chat_url(info), json=body("again")), 401)
    assert "closed" in error["message"]
    assert len(CompletionLog(gateway.store, "mytask/0")) == 1


async def test_unknown_route_and_method_get_openai_errors(client: httpx.AsyncClient) -> None:
    assert_openai_error(await client.get("/nope"), 404)
    assert_openai_error(await client.get("/v1/chat/completions"), 405)


async def test_backend_failures_are_502_and_503(
    gateway: Gateway, client: httpx.AsyncClient, fake_llama: Any
) -> None:
    info = await open_session(gateway)

    def broken(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/props":
            return httpx.Response(200, json={"default_generation_settings": {"n_ctx": 4096}})
        return httpx.Response(500, json={"error": {"code": 500, "message": "boom"}})

    backend = gateway.pool.get(info.backend)
    backend.client = new_client(backend.url, 10.0, httpx.MockTransport(broken))
    error = assert_openai_error(await client.post(chat_url(info), json=body()), 502)
    assert error["code"] == "backend_error"

    def refused(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    backend.client = new_client(backend.url, 10.0, httpx.MockTransport(refused))
    assert_openai_error(await client.post(chat_url(info), json=body("x")), 503)
    assert len(CompletionLog(gateway.store, "mytask/0")) == 0


async def test_streaming_matches_the_recorded_completion(
    gateway: Gateway, client: httpx.AsyncClient, fake_llama: Any
) -> None:
    fake_llama.answers = ["Hello there, streaming world!"]
    info = await open_session(gateway)
    response = await client.post(
        chat_url(info), json=body(stream=True, stream_options={"include_usage": True})
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    assert len([c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]) > 3
    [completion] = CompletionLog(gateway.store, "mytask/0").read_all()
    assert content == completion.response_message["content"] == "Hello there, streaming world!"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == len(completion.response_ids)
    assert fake_llama.requests[0]["stream"] is True

    # the non-streaming path records the same completion for the same sampled tokens
    other = await open_session(gateway, "other/0")
    await client.post(
        chat_url(other),
        json=body(stream=True, stream_options={"include_usage": True}) | {"stream": False},
    )
    [plain] = CompletionLog(gateway.store, "other/0").read_all()
    same = {
        "prompt_ids",
        "response_ids",
        "response_logprobs",
        "response_text",
        "response_message",
        "finish_reason",
        "end_of_turn_sampled",
        "extends",
    }
    assert plain.model_dump(include=same) == completion.model_dump(include=same)


async def test_streamed_tool_calls_come_whole_and_never_as_content(
    gateway: Gateway, client: httpx.AsyncClient, fake_llama: Any
) -> None:
    fake_llama.answers = ["Checking.\n" + CALL_TEXT]
    info = await open_session(gateway)
    response = await client.post(
        chat_url(info),
        json={
            "messages": [{"role": "user", "content": "Weather?"}],
            "tools": TOOLS,
            "stream": True,
        },
    )
    chunks = sse_events(response.text)[:-1]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    content = "".join(d.get("content") or "" for d in deltas)
    assert content == "Checking."
    [calls] = [d["tool_calls"] for d in deltas if "tool_calls" in d]
    assert calls[0]["index"] == 0 and calls[0]["function"]["name"] == "get_weather"
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    [completion] = CompletionLog(gateway.store, "mytask/0").read_all()
    assert completion.response_message["tool_calls"][0]["id"] == calls[0]["id"]


async def test_streamed_retry_is_replayed_from_the_log(
    gateway: Gateway, client: httpx.AsyncClient, fake_llama: Any
) -> None:
    info = await open_session(gateway)
    first = await client.post(chat_url(info), json=body(stream=True))
    again = await client.post(
        chat_url(info), json=body(stream=True), headers={"x-stainless-retry-count": "2"}
    )

    def content(text: str) -> str:
        return "".join(c["choices"][0]["delta"].get("content") or "" for c in sse_events(text)[:-1])

    assert content(first.text) == content(again.text) == "Hello there!"
    assert len(fake_llama.requests) == 1
    assert len(CompletionLog(gateway.store, "mytask/0")) == 1
