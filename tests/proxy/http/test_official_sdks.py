"""Each dialect driven by its provider's official Python SDK, strict, against a real
llama-server (Qwen2.5-Coder-0.5B) behind a gateway on a real socket: plain, streamed,
tool-calling (a tool definition and a tool result turn) and token-counting calls, on every
API version path the SDK uses. See tests/proxy/http/sdk_clients.py for what "strict" means per SDK.

Every call is short (16 to 48 tokens, greedy): engine time on a shared 2-core CPU is scarce.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from google.genai import types as genai_types

from tests.proxy.http.sdk_clients import (
    Served,
    gemini_client,
    served_gateway,
    strict_anthropic,
    strict_gemini,
    strict_openai,
)
from tests.proxy.support import completions

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
ASK = "What is the weather in Paris? Use the tool."


@pytest.fixture(scope="module")
async def served(
    llama_server: Any, tokenizer: Any, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Served]:
    async with served_gateway(
        tmp_path_factory.mktemp("sdk") / "store", llama_server.url, tokenizer
    ) as s:
        yield s


async def test_openai_chat_completions(served: Served) -> None:
    info = await served.open("oai-chat/0", max_tokens=48)
    client = strict_openai(info)
    messages: list[Any] = [{"role": "user", "content": "Say hi."}]
    plain = await client.chat.completions.create(model="gpt-x", messages=messages)
    assert plain.choices[0].message.content and plain.usage and plain.usage.completion_tokens
    stream = await client.chat.completions.create(
        model="gpt-x", messages=messages, stream=True, stream_options={"include_usage": True}
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].usage is not None
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    tools = [{"type": "function", "function": WEATHER}]
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    turn = [
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C."},
    ]
    answered = await client.chat.completions.create(model="gpt-x", messages=turn, tools=tools)
    assert answered.choices[0].finish_reason in ("stop", "length", "tool_calls")
    asked = await client.chat.completions.create(
        model="gpt-x", messages=turn[:1], tools=tools, stream=True
    )
    async for _ in asked:
        pass
    assert len(completions(served.gateway, "oai-chat/0")) == 4


async def test_openai_responses(served: Served) -> None:
    info = await served.open("oai-resp/0", max_tokens=48)
    client = strict_openai(info)
    plain = await client.responses.create(model="gpt-x", instructions="Be brief.", input="Say hi.")
    assert plain.output_text and plain.usage and plain.usage.output_tokens
    async with client.responses.stream(model="gpt-x", input="Say hi.") as stream:
        events = [event.type async for event in stream]
        final = await stream.get_final_response()
    assert events[0] == "response.created" and final.status in ("completed", "incomplete")
    tools: list[Any] = [{"type": "function", **WEATHER, "strict": False}]
    turn: list[Any] = [
        {"role": "user", "content": ASK},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": "Sunny, 21 C."},
    ]
    answered = await client.responses.create(model="gpt-x", input=turn, tools=tools)
    assert answered.status in ("completed", "incomplete")
    counted = await client.responses.input_tokens.count(model="gpt-x", input=turn, tools=tools)
    assert counted.input_tokens > 20
    assert len(completions(served.gateway, "oai-resp/0")) == 3


async def test_anthropic_messages(served: Served) -> None:
    info = await served.open("anth/0", max_tokens=48)
    client = strict_anthropic(info)
    messages: list[Any] = [{"role": "user", "content": "Say hi."}]
    plain = await client.messages.create(model="claude-x", max_tokens=16, messages=messages)
    assert plain.content and plain.usage.output_tokens
    async with client.messages.stream(
        model="claude-x", max_tokens=16, system="Be brief.", messages=messages
    ) as stream:
        text = "".join([t async for t in stream.text_stream])
        final = await stream.get_final_message()
    assert text and final.stop_reason in ("end_turn", "max_tokens")
    tools: list[Any] = [
        {
            "name": WEATHER["name"],
            "description": WEATHER["description"],
            "input_schema": WEATHER["parameters"],
        }
    ]
    turn: list[Any] = [
        {"role": "user", "content": ASK},
        {
            "role": "assistant",
            "content": [
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                }
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 21 C."}
            ],
        },
    ]
    # Claude Code uses the beta path (?beta=true) with beta headers
    answered = await client.beta.messages.create(
        model="claude-x",
        max_tokens=48,
        messages=turn,
        tools=tools,
        betas=["interleaved-thinking-2025-05-14"],
    )
    assert answered.stop_reason in ("end_turn", "max_tokens", "tool_use")
    counted = await client.messages.count_tokens(model="claude-x", messages=turn, tools=tools)
    beta_counted = await client.beta.messages.count_tokens(
        model="claude-x", messages=turn, tools=tools
    )
    assert counted.input_tokens == beta_counted.input_tokens > 20
    assert len(completions(served.gateway, "anth/0")) == 3


@pytest.mark.parametrize("api_version", ["v1beta", "v1"])
async def test_google_genai(served: Served, api_version: str) -> None:
    info = await served.open(f"gem-{api_version}/0", max_tokens=48)
    models = gemini_client(info, api_version).aio.models
    config = genai_types.GenerateContentConfig(max_output_tokens=16, system_instruction="Be brief.")
    plain = await models.generate_content(model="gemini-x", contents="Say hi.", config=config)
    assert plain.text and plain.usage_metadata and plain.usage_metadata.candidates_token_count
    streamed = [
        chunk
        async for chunk in await models.generate_content_stream(
            model="gemini-x", contents="Say hello.", config=config
        )
    ]
    assert streamed[-1].candidates and streamed[-1].candidates[0].finish_reason in (
        genai_types.FinishReason.STOP,
        genai_types.FinishReason.MAX_TOKENS,
    )
    tool = genai_types.Tool(
        function_declarations=[
            genai_types.FunctionDeclaration(
                name=WEATHER["name"],
                description=WEATHER["description"],
                parameters_json_schema=WEATHER["parameters"],
            )
        ]
    )
    turn = [
        genai_types.Content(role="user", parts=[genai_types.Part(text=ASK)]),
        genai_types.Content(
            role="model",
            parts=[
                genai_types.Part(
                    function_call=genai_types.FunctionCall(
                        name="get_weather", args={"city": "Paris"}
                    )
                )
            ],
        ),
        genai_types.Content(
            role="user",
            parts=[
                genai_types.Part(
                    function_response=genai_types.FunctionResponse(
                        name="get_weather", response={"result": "Sunny, 21 C."}
                    )
                )
            ],
        ),
    ]
    answered = await models.generate_content(
        model="gemini-x",
        contents=turn,
        config=genai_types.GenerateContentConfig(tools=[tool], max_output_tokens=48),
    )
    assert answered.candidates
    counted = await models.count_tokens(model="gemini-x", contents=turn)
    assert counted.total_tokens and counted.total_tokens > 20
    assert strict_gemini(served.recorder) >= 4
    assert len(completions(served.gateway, f"gem-{api_version}/0")) == 3
