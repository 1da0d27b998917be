"""The Responses, Anthropic and Gemini routes in-process (httpx.ASGITransport) over the fake
llama.cpp: answers, streams, tool calls, reasoning, token counts, retries, and error shapes.

Wire shapes: https://platform.openai.com/docs/api-reference/responses ,
https://platform.openai.com/docs/api-reference/responses-streaming ,
https://docs.anthropic.com/en/api/messages , https://docs.anthropic.com/en/api/errors ,
https://docs.anthropic.com/en/api/messages-count-tokens ,
https://ai.google.dev/api/generate-content , https://ai.google.dev/api/tokens .
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import structlog

from rolloutd.proxy.backends.http import new_client
from rolloutd.proxy.http.server import Gateway
from rolloutd.proxy.sessions.state import SessionInfo
from rolloutd.settings import GatewaySettings
from tests.proxy.support import completions, open_session, openai_error

CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER = {
    "name": "get_weather",
    "description": "weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def responses_url(info: SessionInfo) -> str:
    return f"/s/{info.session_key}/v1/responses"


def messages_url(info: SessionInfo) -> str:
    return f"/s/{info.session_key}/v1/messages?beta=true"


def gemini_url(info: SessionInfo, action: str = "generateContent") -> str:
    return f"/s/{info.session_key}/v1beta/models/qwen:{action}"


def named_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in text.split("\n\n")[:-1]:
        event_line, data_line = block.split("\n")
        name = event_line.removeprefix("event: ")
        payload = json.loads(data_line.removeprefix("data: "))
        assert payload["type"] == name
        out.append((name, payload))
    return out


def data_events(text: str) -> list[dict[str, Any]]:
    return [json.loads(b.removeprefix("data: ")) for b in text.split("\n\n")[:-1]]


# --------------------------------------------------------------------------- Responses


async def test_responses_answer_and_stream(gateway: Gateway, client: httpx.AsyncClient) -> None:
    info = await open_session(gateway, "t/0", max_tokens=64)
    body = {
        "model": "x",
        "instructions": "Be brief.",
        "input": "Hi!",
        "store": False,
        "unknown_field": {"tolerated": True},
    }
    plain = await client.post(responses_url(info), json=body)
    assert plain.status_code == 200, plain.text
    answer = plain.json()
    assert answer["object"] == "response" and answer["status"] == "completed"
    assert answer["id"].startswith("resp_")
    assert answer["output"] == [
        {
            "type": "message",
            "id": answer["output"][0]["id"],
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hello there!", "annotations": []}],
        }
    ]
    streamed = await client.post(
        responses_url(info), json={**body, "stream": True, "input": "Again"}
    )
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = named_events(streamed.text)
    kinds = [k for k, _ in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e["sequence_number"] for _, e in events] == list(range(len(events)))
    text = "".join(e["delta"] for k, e in events if k == "response.output_text.delta")
    assert text == "Hello there!"
    final = events[-1][1]["response"]
    assert final["output"][0]["content"][0]["text"] == "Hello there!"
    logged = completions(gateway, "t/0")
    assert [c.dialect for c in logged] == ["openai_responses"] * 2
    assert logged[0].messages[0] == {"role": "system", "content": "Be brief."}
    assert logged[0].response_ids == logged[1].response_ids


async def test_responses_tool_call_then_previous_response_id_extends(
    gateway: Gateway, client: httpx.AsyncClient, fake_llama: Any
) -> None:
    info = await open_session(gateway, "t/0", max_tokens=64)
    fake_llama.answers = [CALL_TEXT, "It is sunny."]
    tools = [{"type": "function", **WEATHER}, {"type": "web_search"}]
    first = (
        await client.post(
            responses_url(info),
            json={
                "input": [{"role": "user", "content": [{"type": "input_text", "text": "Paris?"}]}],
                "tools": tools,
            },
        )
    ).json()
    call = first["output"][-1]
    assert call["type"] == "function_call" and call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    second = await client.post(
        responses_url(info),
        json={
            "previous_response_id": first["id"],
            "tools": tools,
            "input": [
                {"type": "function_call_output", "call_id": call["call_id"], "output": "sunny"}
            ],
        },
    )
    assert second.status_code == 200, second.text
    logged = completions(gateway, "t/0")
    assert logged[1].extends == 0
    assert logged[1].messages[-1] == {
        "role": "tool",
        "tool_call_id": call["call_id"],
        "content": "sunny",
    }
    assert logged[0].tools == logged[1].tools == [{"type": "function", "function": WEATHER}]
    missing = await client.post(
        responses_url(info), json={"previous_response_id": "resp_x", "input": "hi"}
    )
    assert missing.status_code == 400
    assert missing.json()["error"]["param"] == "previous_response_id"


# --------------------------------------------------------------------------- Anthropic


async def test_anthropic_answer_stream_and_retry(
    gateway: Gateway, client: httpx.AsyncClient, fake_llama: Any
) -> None:
    info = await open_session(gateway, "t/0", max_tokens=64)
    body = {
        "model": "claude-x",
        "max_tokens": 32,
        "system": [{"type": "text", "text": "Sys"}],
        "messages": [{"role": "user", "content": "Hi!"}],
        "metadata": {"user_id": "u"},
    }
    plain = await client.post(messages_url(info), json=body)
    assert plain.status_code == 200, plain.text
    message = plain.json()
    assert message["type"] == "message" and message["id"].startswith("msg_")
    assert message["content"] == [{"type": "text", "text": "Hello there!"}]
    assert message["stop_reason"] == "end_turn"
    # the Anthropic SDK marks its retries; Claude Code's per-process metadata.user_id is no
    # part of a request's identity
    retried = await client.post(
        messages_url(info),
        json={**body, "metadata": {"user_id": "another process"}},
        headers={"x-stainless-retry-count": "1"},
    )
    assert retried.json() == message
    assert len(completions(gateway, "t/0")) == 1 and len(fake_llama.requests) == 1
    assert fake_llama.requests[0]["n_predict"] == 64  # the task's policy is `override`
    streamed = await client.post(
        messages_url(info),
        json={**body, "stream": True, "messages": [{"role": "user", "content": "Yo"}]},
    )
    events = named_events(streamed.text)
    kinds = [k for k, _ in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert (
        "".join(e["delta"]["text"] for k, e in events if k == "content_block_delta")
        == "Hello there!"
    )
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"
    # message_start carries the prompt's tokens, as Anthropic's stream does; the same count
    # as the final usage and as the recorded prompt
    prompt_tokens = events[0][1]["message"]["usage"]["input_tokens"]
    assert (
        prompt_tokens
        == events[-2][1]["usage"]["input_tokens"]
        == len(completions(gateway, "t/0")[-1].prompt_ids)
        > 0
    )


async def test_anthropic_tool_use_round(
    gateway: Gateway, client: httpx.AsyncClient, fake_llama: Any
) -> None:
    info = await open_session(gateway, "t/0", max_tokens=64)
    fake_llama.answers = [CALL_TEXT, "Sunny."]
    tools = [
        {
            "name": "get_weather",
            "description": "weather of a city",
            "input_schema": WEATHER["parameters"],
        }
    ]
    user = {"role": "user", "content": [{"type": "text", "text": "Paris?"}]}
    first = (
        await client.post(
            messages_url(info),
            json={"max_tokens": 64, "tools": tools, "messages": [user], "stream": True},
        )
    ).text
    events = named_events(first)
    start = next(
        e
        for k, e in events
        if k == "content_block_start" and e["content_block"]["type"] == "tool_use"
    )
    args = "".join(
        e["delta"]["partial_json"]
        for k, e in events
        if k == "content_block_delta" and e["delta"]["type"] == "input_json_delta"
    )
    assert json.loads(args) == {"city": "Paris"}
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    tool_use = {
        "type": "tool_use",
        "id": start["content_block"]["id"],
        "name": "get_weather",
        "input": {"city": "Paris"},
    }
    second = await client.post(
        messages_url(info),
        json={
            "max_tokens": 64,
            "tools": tools,
            "messages": [
                user,
                {"role": "assistant", "content": [tool_use]},
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": tool_use["id"],
                            "content": [{"type": "text", "text": "sunny"}],
                        }
                    ],
                },
            ],
        },
    )
    assert second.status_code == 200, second.text
    assert completions(gateway, "t/0")[1].extends == 0


async def test_count_tokens_samples_and_records_nothing(
    gateway: Gateway, client: httpx.AsyncClient, fake_llama: Any, template: Any
) -> None:
    info = await open_session(gateway, "t/0", max_tokens=64)
    body = {"model": "x", "system": "Sys", "messages": [{"role": "user", "content": "Hi!"}]}
    counted = await client.post(f"/s/{info.session_key}/v1/messages/count_tokens", json=body)
    assert counted.status_code == 200, counted.text
    expected = len(
        template.render([{"role": "system", "content": "Sys"}, {"role": "user", "content": "Hi!"}])
    )
    assert counted.json() == {"input_tokens": expected}
    gemini_count = await client.post(
        gemini_url(info, "countTokens"),
        json={
            "systemInstruction": {"parts": [{"text": "Sys"}]},
            "contents": [{"role": "user", "parts": [{"text": "Hi!"}]}],
        },
    )
    assert gemini_count.json() == {"totalTokens": expected}
    assert fake_llama.requests == [] and completions(gateway, "t/0") == []


async def test_api_key_headers_on_routes_without_prefix(
    gateway: Gateway, client: httpx.AsyncClient
) -> None:
    info = await open_session(gateway, "t/0", max_tokens=64)
    anthropic_answer = await client.post(
        "/v1/messages",
        headers={"x-api-key": info.session_key},
        json={"max_tokens": 8, "messages": [{"role": "user", "content": "a"}]},
    )
    gemini_answer = await client.post(
        "/v1beta/models/qwen:generateContent",
        headers={"x-goog-api-key": info.session_key},
        json={"contents": [{"parts": [{"text": "b"}]}]},
    )
    assert anthropic_answer.status_code == gemini_answer.status_code == 200
    assert len(completions(gateway, "t/0")) == 2


# --------------------------------------------------------------------------- Gemini


async def test_gemini_answer_and_sse_stream(
    gateway: Gateway, client: httpx.AsyncClient, fake_llama: Any
) -> None:
    info = await open_session(gateway, "t/0", max_tokens=64)
    fake_llama.answers = ["Hello there!", CALL_TEXT]
    body = {
        "contents": [{"role": "user", "parts": [{"text": "Hi!"}]}],
        "generation_config": {"temperature": 0.5},
        "safetySettings": [],
    }
    plain = await client.post(gemini_url(info), json=body)
    assert plain.status_code == 200, plain.text
    candidate = plain.json()["candidates"][0]
    assert candidate["content"] == {"role": "model", "parts": [{"text": "Hello there!"}]}
    assert candidate["finishReason"] == "STOP"
    assert plain.json()["usageMetadata"]["candidatesTokenCount"] > 0
    streamed = await client.post(
        gemini_url(info, "streamGenerateContent") + "?alt=sse",
        json={**body, "tools": [{"functionDeclarations": [WEATHER]}]},
    )
    chunks = data_events(streamed.text)
    parts = [p for c in chunks for p in c["candidates"][0]["content"]["parts"]]
    assert parts == [
        {
            "functionCall": {
                "id": parts[0]["functionCall"]["id"],
                "name": "get_weather",
                "args": {"city": "Paris"},
            }
        }
    ]
    assert chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    assert [c.dialect for c in completions(gateway, "t/0")] == ["gemini", "gemini"]


# --------------------------------------------------------------------------- reasoning


async def test_think_reasoning_reaches_each_dialect(
    tmp_path: Path, tokenizer: Any, fake_llama: Any
) -> None:
    settings = GatewaySettings(
        store_url=str(tmp_path / "store"),
        backend_url="http://fake",
        gateway_public_url="http://gateway.test",
    )
    gw = Gateway.from_settings(
        settings, tokenizer=tokenizer, transport=fake_llama.transport, reasoning_parser="think"
    )
    fake_llama.answers = ["<think>Let me see.</think>Hi!"]
    transport = httpx.ASGITransport(app=gw.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway.test") as client:
        info = await open_session(gw, "t/0", max_tokens=64)
        chat = (
            await client.post(
                f"/s/{info.session_key}/v1/chat/completions",
                json={"messages": [{"role": "user", "content": "1"}]},
            )
        ).json()
        assert chat["choices"][0]["message"] == {
            "role": "assistant",
            "content": "Hi!",
            "reasoning_content": "Let me see.",
        }
        msg = (
            await client.post(
                messages_url(info),
                json={"max_tokens": 9, "messages": [{"role": "user", "content": "2"}]},
            )
        ).json()
        assert msg["content"][0] == {"type": "thinking", "thinking": "Let me see.", "signature": ""}
        streamed = (
            await client.post(responses_url(info), json={"input": "3", "stream": True})
        ).text
        events = named_events(streamed)
        assert (
            "".join(e["delta"] for k, e in events if k == "response.reasoning_summary_text.delta")
            == "Let me see."
        )
        assert "".join(e["delta"] for k, e in events if k == "response.output_text.delta") == "Hi!"
        recorded = completions(gw, "t/0")
        assert recorded[0].response_message["reasoning_content"] == "Let me see."
        assert recorded[0].response_text == "<think>Let me see.</think>Hi!"
    await gw.aclose()


# --------------------------------------------------------------------------- errors


def assert_anthropic_error(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}


def assert_gemini_error(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["code"] == status and isinstance(error["status"], str) and error["message"]


BAD_RESPONSES = [
    [],
    {"model": "x"},
    {"input": 3},
    {"input": [{"type": "bogus"}]},
    {"input": [{"type": "function_call", "name": "f"}]},
    {"input": [{"role": "user", "content": [{"type": "input_image"}]}]},
    {"input": "x", "temperature": "hot"},
    {"input": "x", "max_output_tokens": 0},
    {"input": [{"role": "wizard", "content": "x"}]},
    {"input": []},
]
BAD_MESSAGES = [
    [],
    {"messages": [{"role": "user", "content": "x"}]},
    {"max_tokens": 5, "messages": []},
    {"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
    {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "zip"}]}]},
    {
        "max_tokens": 5,
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image", "source": {"type": "base64", "data": "AA"}}],
            }
        ],
    },
    {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "tool_result"}]}]},
    {"max_tokens": 5, "temperature": 3, "messages": [{"role": "user", "content": "x"}]},
]
BAD_GEMINI = [
    [],
    {},
    {"contents": []},
    {"contents": [{"parts": [{"weird": 1}]}]},
    {"contents": [{"role": "model", "parts": [{"functionCall": {"args": {}}}]}]},
    {"contents": [{"parts": [{"text": "x"}]}], "generationConfig": {"candidateCount": 2}},
    {"contents": [{"role": "alien", "parts": [{"text": "x"}]}]},
    {"contents": [{"parts": [{"inlineData": {"mimeType": "image/png", "data": "AA"}}]}]},
]


@pytest.mark.parametrize("body", BAD_RESPONSES)
async def test_bad_responses_requests_get_openai_errors(
    gateway: Gateway, client: httpx.AsyncClient, body: Any
) -> None:
    info = await open_session(gateway, "t/0", max_tokens=64)
    openai_error(await client.post(responses_url(info), json=body), 400)


@pytest.mark.parametrize("body", BAD_MESSAGES)
async def test_bad_anthropic_requests_get_anthropic_errors(
    gateway: Gateway, client: httpx.AsyncClient, body: Any
) -> None:
    info = await open_session(gateway, "t/0", max_tokens=64)
    assert_anthropic_error(await client.post(messages_url(info), json=body), 400)
    count_url = f"/s/{info.session_key}/v1/messages/count_tokens"
    if isinstance(body, dict) and "max_tokens" not in body and body.get("messages"):
        return  # count_tokens takes no max_tokens: this body is valid there
    assert_anthropic_error(await client.post(count_url, json=body), 400)


@pytest.mark.parametrize("body", BAD_GEMINI)
async def test_bad_gemini_requests_get_google_errors(
    gateway: Gateway, client: httpx.AsyncClient, body: Any
) -> None:
    info = await open_session(gateway, "t/0", max_tokens=64)
    assert_gemini_error(await client.post(gemini_url(info), json=body), 400)


async def test_auth_routes_and_bodies_in_each_dialect(
    gateway: Gateway, client: httpx.AsyncClient
) -> None:
    info = await open_session(gateway, "t/0", max_tokens=64)
    openai_error(await client.post("/s/nope/v1/responses", json={"input": "x"}), 401)
    assert_anthropic_error(await client.post("/v1/messages", json={}), 401)
    assert_gemini_error(await client.post("/v1beta/models/m:generateContent", json={}), 401)
    assert_gemini_error(await client.post(gemini_url(info, "embedContent"), json={}), 404)
    assert_gemini_error(await client.get(f"/s/{info.session_key}/v1beta/nothing"), 404)
    assert_anthropic_error(await client.get(f"/s/{info.session_key}/v1/messages"), 405)
    not_json = {"content": b"{oops", "headers": {"content-type": "application/json"}}
    assert_anthropic_error(await client.post(messages_url(info), **not_json), 400)
    assert_gemini_error(await client.post(gemini_url(info), **not_json), 400)
    openai_error(await client.post(responses_url(info), **not_json), 400)
    await gateway.sessions.close_session("t/0")
    assert_anthropic_error(
        await client.post(
            messages_url(info),
            json={"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        ),
        401,
    )


async def test_backend_failure_in_each_dialect(
    gateway: Gateway, client: httpx.AsyncClient, fake_llama: Any
) -> None:
    info = await open_session(gateway, "t/0", max_tokens=64)
    fake_llama.transport = None
    backend = gateway.pool.get(gateway.pool.names()[0])
    backend.client = new_client(
        backend.url,
        10.0,
        httpx.MockTransport(
            lambda request: httpx.Response(500, json={"error": {"message": "boom"}})
        ),
    )
    assert_anthropic_error(
        await client.post(
            messages_url(info),
            json={"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        ),
        502,
    )
    assert_gemini_error(
        await client.post(gemini_url(info), json={"contents": [{"parts": [{"text": "x"}]}]}), 502
    )
    assert completions(gateway, "t/0") == []


async def test_edge_paths_of_the_model_call_routes(
    gateway: Gateway, client: httpx.AsyncClient
) -> None:
    """Model calls skip FastAPI's router (app.ModelCalls); the paths it does not serve, and
    methods other than POST, still get the router's answers in the dialect's shape."""
    info = await open_session(gateway, "t/0", max_tokens=64)
    key = info.session_key
    assert_gemini_error(await client.post(f"/s/{key}/v1beta/models/", json={}), 404)
    assert_gemini_error(
        await client.post("/v1beta/models/", json={}, headers={"x-goog-api-key": key}), 404
    )
    openai_error(await client.post("/s//v1/chat/completions", json={}), 404)
    openai_error(await client.post(f"/s/{key}/v1/nothing", json={}), 404)
    openai_error(await client.put(f"/s/{key}/v1/chat/completions", json={}), 405)
    assert_anthropic_error(await client.delete("/v1/messages/count_tokens"), 405)
    assert_gemini_error(await client.get(f"/s/{key}/v1beta/models/m:generateContent"), 405)
    assert completions(gateway, "t/0") == []


async def test_a_crash_is_a_500_in_the_dialect_and_is_logged(
    gateway: Gateway, client: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = await open_session(gateway, "t/0", max_tokens=64)

    async def crash(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr(gateway.service, "complete", crash)
    with structlog.testing.capture_logs() as logs:
        response = await client.post(
            messages_url(info),
            json={"max_tokens": 5, "messages": [{"role": "user", "content": "x"}]},
        )
    assert_anthropic_error(response, 500)
    assert response.json()["error"]["message"] == "internal error: RuntimeError"
    # logged once, with the session, where the failed call is counted in its state
    [crashed] = [e for e in logs if e["log_level"] in ("warning", "error")]
    assert crashed["event"] == "call_failed" and crashed["session_id"] == "t/0"
    assert (await gateway.sessions.get("t/0")).state.num_errors == 1
    assert completions(gateway, "t/0") == []
